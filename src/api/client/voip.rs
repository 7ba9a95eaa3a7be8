//! VoIP: TURN server credentials.

use actix_web::{web::Data, HttpResponse};

use crate::{
    api::ruma::Authenticated,
    error::Result,
    service::{voip::turn_server, Services},
};

/// `GET /_matrix/client/v3/voip/turnServer`: `{}` when no TURN server is configured (ruma's
/// response type cannot say that, hence a plain handler).
pub async fn turn_server_route(
    services: Data<Services>,
    caller: Authenticated,
) -> Result<HttpResponse> {
    let now_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    Ok(HttpResponse::Ok().json(turn_server(
        &services.config.turn,
        &caller.0.user_id,
        now_secs,
    )))
}
