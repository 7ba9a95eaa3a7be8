//! The appservice ping (spec 1.7, MSC2659): bridges check at start that the homeserver can
//! reach them.

use actix_web::web::Data;
use ruma::api::client::appservice::request_ping::v1 as ping;

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::Services,
};

/// `POST /_matrix/client/v1/appservice/{appserviceId}/ping`
pub async fn ping_route(
    services: Data<Services>,
    body: Ruma<ping::Request>,
) -> Result<RumaResponse<ping::Response>> {
    let caller = body.caller()?;
    let appservice = caller
        .appservice
        .as_ref()
        .filter(|a| a.id == body.body.appservice_id)
        .ok_or_else(|| {
            Error::forbidden("Only the application service itself may ping it (its as_token)")
        })?;
    let duration = services
        .appservices
        .ping(
            appservice,
            body.body.transaction_id.as_deref().map(|t| t.as_str()),
        )
        .await?;
    // It is up: what waits for it goes now, not after its backoff.
    if let Err(err) = services
        .appservice_sender
        .appservice_is_up(&appservice.id)
        .await
    {
        tracing::warn!(appservice = %appservice.id, "could not end the backoff: {err}");
    }
    Ok(ping::Response::new(duration).into())
}
