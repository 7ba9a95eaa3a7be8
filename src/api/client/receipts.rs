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
    service::Services,
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
    match &request.receipt_type {
        ReceiptType::FullyRead => {
            services
                .rooms
                .set_fully_read(&caller.user_id, &request.room_id, event_id)
                .await?
        }
        // A shadow-banned user's read receipts stay their own.
        ReceiptType::Read if caller.shadow_banned => {
            services
                .rooms
                .set_receipt(
                    &caller.user_id,
                    &request.room_id,
                    "m.read.private",
                    event_id,
                    thread.as_deref(),
                )
                .await?
        }
        other => {
            let kind = other.to_string();
            services
                .rooms
                .set_receipt(
                    &caller.user_id,
                    &request.room_id,
                    &kind,
                    event_id,
                    thread.as_deref(),
                )
                .await?
        }
    }
    Ok(create_receipt::Response::new().into())
}

/// `POST /_matrix/client/v3/rooms/{roomId}/read_markers`
pub async fn read_markers_route(
    services: Data<Services>,
    body: Ruma<read_markers::Request>,
) -> Result<RumaResponse<read_markers::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    let rooms = &services.rooms;
    if let Some(event_id) = &request.fully_read {
        rooms
            .set_fully_read(&caller.user_id, &request.room_id, event_id.as_str())
            .await?;
    }
    if let Some(event_id) = &request.read_receipt {
        rooms
            .set_receipt(
                &caller.user_id,
                &request.room_id,
                match caller.shadow_banned {
                    true => "m.read.private",
                    false => "m.read",
                },
                event_id.as_str(),
                None,
            )
            .await?;
    }
    if let Some(event_id) = &request.private_read_receipt {
        rooms
            .set_receipt(
                &caller.user_id,
                &request.room_id,
                "m.read.private",
                event_id.as_str(),
                None,
            )
            .await?;
    }
    Ok(read_markers::Response::new().into())
}
