//! `PUT /_matrix/federation/v1/send/{txnId}`.

use actix_web::{web::Data, HttpResponse};
use ruma::api::federation::transactions::send_transaction_message;

use crate::{
    api::ruma::Ruma,
    error::{Error, Result},
    service::{federation::transactions::Transaction, Services},
};

/// `PUT /_matrix/federation/v1/send/{txnId}`: another server's PDUs and EDUs. The answer
/// (also to a replay) is the stored one.
///
/// The work runs in its own task, to the end even when the sender hangs up (a server killed
/// mid-transaction): stopped halfway, a room's database transaction would go back to the pool
/// unfinished, still holding the room's lock until that connection is next taken out.
pub async fn send_transaction_route(
    services: Data<Services>,
    body: Ruma<send_transaction_message::v1::Request>,
) -> Result<HttpResponse> {
    let origin = body.origin()?.to_owned();
    let request = body.body;
    let answer = actix_web::rt::spawn(async move {
        services
            .federation
            .receive_transaction(
                &services.e2ee_keys,
                &services.rooms,
                &origin,
                Transaction {
                    txn_id: request.transaction_id.as_str(),
                    origin: &request.origin,
                    pdus: &request.pdus,
                    edus: &request.edus,
                },
            )
            .await
    })
    .await
    .map_err(Error::internal)??;
    Ok(HttpResponse::Ok().json(answer))
}
