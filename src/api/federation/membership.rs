//! Membership handshakes with this server as the resident: `make_join` and `send_join` (v2).

use actix_web::web::Data;
use ruma::api::federation::membership::{create_join_event, prepare_join_event};
use serde_json::value::to_raw_value;

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::Services,
};

/// `GET /_matrix/federation/v1/make_join/{roomId}/{userId}`: a join event template.
pub async fn make_join_route(
    services: Data<Services>,
    body: Ruma<prepare_join_event::v1::Request>,
) -> Result<RumaResponse<prepare_join_event::v1::Response>> {
    let request = &body.body;
    let (version, template) = services
        .federation
        .make_join(
            body.origin()?,
            &request.room_id,
            &request.user_id,
            &request.ver,
        )
        .await?;
    let mut response =
        prepare_join_event::v1::Response::new(to_raw_value(&template).map_err(Error::internal)?);
    response.room_version = Some(version);
    Ok(response.into())
}

/// `PUT /_matrix/federation/v2/send_join/{roomId}/{eventId}`: the signed join; answers the
/// room's state before it and the auth chain.
pub async fn send_join_route(
    services: Data<Services>,
    body: Ruma<create_join_event::v2::Request>,
) -> Result<RumaResponse<create_join_event::v2::Response>> {
    let request = &body.body;
    let (state, auth_chain) = services
        .federation
        .send_join(
            &services.rooms,
            body.origin()?,
            &request.room_id,
            &request.event_id,
            &request.pdu,
        )
        .await?;
    let mut room_state = create_join_event::v2::RoomState::new();
    room_state.state = state;
    room_state.auth_chain = auth_chain;
    Ok(create_join_event::v2::Response::new(room_state).into())
}
