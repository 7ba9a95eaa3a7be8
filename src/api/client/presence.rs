//! `GET/PUT /presence/{userId}/status`.

use actix_web::{web::Data, HttpResponse};
use ruma::api::client::presence::{
    get_presence::v3 as get_presence, set_presence::v3 as set_presence,
};

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::Services,
};

/// `PUT /_matrix/client/v3/presence/{userId}/status`
pub async fn set_presence_route(
    services: Data<Services>,
    body: Ruma<set_presence::Request>,
) -> Result<RumaResponse<set_presence::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    if request.user_id != caller.user_id {
        return Err(Error::forbidden("You can only set your own presence"));
    }
    if caller.shadow_banned {
        return Ok(set_presence::Response::new().into());
    }
    services
        .presence
        .set(
            &caller.user_id,
            &request.presence,
            request.status_msg.as_deref(),
        )
        .await?;
    Ok(set_presence::Response::new().into())
}

/// `GET /_matrix/client/v3/presence/{userId}/status`
pub async fn get_presence_route(
    services: Data<Services>,
    body: Ruma<get_presence::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let presence = services
        .presence
        .get(&caller.user_id, &body.body.user_id)
        .await?;
    Ok(HttpResponse::Ok().json(presence))
}
