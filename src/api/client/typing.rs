//! `PUT /rooms/{roomId}/typing/{userId}`.

use actix_web::web::Data;
use ruma::api::client::typing::create_typing_event::v3::{self as create_typing, Typing};

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::Services,
};

/// `PUT /_matrix/client/v3/rooms/{roomId}/typing/{userId}`
pub async fn typing_route(
    services: Data<Services>,
    body: Ruma<create_typing::Request>,
) -> Result<RumaResponse<create_typing::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    if request.user_id != caller.user_id {
        return Err(Error::forbidden("You can only set your own typing state"));
    }
    if caller.shadow_banned {
        return Ok(create_typing::Response::new().into());
    }
    let timeout = match &request.state {
        Typing::Yes(info) => Some(info.timeout),
        Typing::No => None,
    };
    services
        .rooms
        .set_typing(&caller.user_id, &request.room_id, timeout)
        .await?;
    Ok(create_typing::Response::new().into())
}
