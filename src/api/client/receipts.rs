//! Read receipts and read markers.

use actix_web::web::Data;
use ruma::{
    api::client::{
        read_marker::set_read_marker::v3 as read_markers,
        receipt::create_receipt::v3::{self as create_receipt, ReceiptType},
    },
    events::receipt::ReceiptThread,
};

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::{rooms::receipts::Receipt, Services},
};

/// `POST /_matrix/client/v3/rooms/{roomId}/receipt/{receiptType}/{eventId}`
pub async fn create_receipt_route(
    services: Data<Services>,
    body: Ruma<create_receipt::Request>,
) -> Result<RumaResponse<create_receipt::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    let thread = match &request.thread {
        ReceiptThread::Unthreaded => None,
        ReceiptThread::Main => Some("main".to_owned()),
        ReceiptThread::Thread(root) => Some(root.to_string()),
        _ => return Err(Error::invalid_param("Unsupported thread_id")),
    };
    let event_id = request.event_id.as_str();
    let rooms = &services.rooms;
    let receipt_type = match &request.receipt_type {
        ReceiptType::FullyRead => {
            rooms
                .set_fully_read(&caller.user_id, &request.room_id, event_id)
                .await?;
            return Ok(create_receipt::Response::new().into());
        }
        // A shadow-banned user's read receipts stay their own.
        ReceiptType::Read if caller.shadow_banned => "m.read.private".to_owned(),
        other => other.to_string(),
    };
    let receipt = Receipt {
        receipt_type: &receipt_type,
        event_id,
        thread_id: thread.as_deref(),
    };
    rooms
        .set_receipt(&caller.user_id, &request.room_id, receipt)
        .await?;
    Ok(create_receipt::Response::new().into())
}

/// `POST /_matrix/client/v3/rooms/{roomId}/read_markers`
pub async fn read_markers_route(
    services: Data<Services>,
    body: Ruma<read_markers::Request>,
) -> Result<RumaResponse<read_markers::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    // A shadow-banned user's read receipts stay their own.
    let public = match caller.shadow_banned {
        true => "m.read.private",
        false => "m.read",
    };
    let receipts: Vec<Receipt> = [
        (public, &request.read_receipt),
        ("m.read.private", &request.private_read_receipt),
    ]
    .into_iter()
    .filter_map(|(receipt_type, event_id)| {
        Some(Receipt {
            receipt_type,
            event_id: event_id.as_ref()?.as_str(),
            thread_id: None,
        })
    })
    .collect();
    services
        .rooms
        .set_read_markers(
            &caller.user_id,
            &request.room_id,
            request.fully_read.as_ref().map(|id| id.as_str()),
            &receipts,
        )
        .await?;
    Ok(read_markers::Response::new().into())
}
