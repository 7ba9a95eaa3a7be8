//! Membership handshakes with this server as the resident: `make_join` and `send_join` (v2),
//! `make_knock` and `send_knock`, `make_leave` and `send_leave` (v2), and invites (v2).

use actix_web::web::Data;
use ruma::api::federation::membership::{
    create_invite, create_join_event, create_knock_event, create_leave_event, prepare_join_event,
    prepare_knock_event, prepare_leave_event, RawStrippedState,
};
use serde_json::value::to_raw_value;

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::{federation::invite::IncomingInvite, Services},
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
            &services.rooms,
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
    let answer = services
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
    room_state.state = answer.state;
    room_state.auth_chain = answer.auth_chain;
    room_state.event = answer.event;
    Ok(create_join_event::v2::Response::new(room_state).into())
}

/// `PUT /_matrix/federation/v2/invite/{roomId}/{eventId}`: another server invites one of our
/// users; answers the invite with our signature added.
pub async fn invite_route(
    services: Data<Services>,
    body: Ruma<create_invite::v2::Request>,
) -> Result<RumaResponse<create_invite::v2::Response>> {
    let request = &body.body;
    #[allow(deprecated)]
    let state: Vec<Box<serde_json::value::RawValue>> = request
        .invite_room_state
        .iter()
        .filter_map(|entry| match entry {
            RawStrippedState::Pdu(pdu) => Some(pdu.clone()),
            RawStrippedState::Stripped(stripped) => Some(stripped.json().to_owned()),
            _ => None,
        })
        .collect();
    let signed = services
        .federation
        .receive_invite(
            &services.rooms,
            body.origin()?,
            IncomingInvite {
                room_id: &request.room_id,
                event_id: &request.event_id,
                version: &request.room_version,
                event: &request.event,
                invite_room_state: &state,
            },
        )
        .await?;
    Ok(create_invite::v2::Response::new(to_raw_value(&signed).map_err(Error::internal)?).into())
}

/// `GET /_matrix/federation/v1/make_leave/{roomId}/{userId}`: a leave event template.
pub async fn make_leave_route(
    services: Data<Services>,
    body: Ruma<prepare_leave_event::v1::Request>,
) -> Result<RumaResponse<prepare_leave_event::v1::Response>> {
    let request = &body.body;
    let (version, template) = services
        .federation
        .make_leave(body.origin()?, &request.room_id, &request.user_id)
        .await?;
    Ok(prepare_leave_event::v1::Response::new(
        Some(version),
        to_raw_value(&template).map_err(Error::internal)?,
    )
    .into())
}

/// `PUT /_matrix/federation/v2/send_leave/{roomId}/{eventId}`: the signed leave.
pub async fn send_leave_route(
    services: Data<Services>,
    body: Ruma<create_leave_event::v2::Request>,
) -> Result<RumaResponse<create_leave_event::v2::Response>> {
    let request = &body.body;
    services
        .federation
        .send_leave(
            &services.rooms,
            body.origin()?,
            &request.room_id,
            &request.event_id,
            &request.pdu,
        )
        .await?;
    Ok(create_leave_event::v2::Response::new().into())
}

/// `GET /_matrix/federation/v1/make_knock/{roomId}/{userId}`: a knock event template.
pub async fn make_knock_route(
    services: Data<Services>,
    body: Ruma<prepare_knock_event::v1::Request>,
) -> Result<RumaResponse<prepare_knock_event::v1::Response>> {
    let request = &body.body;
    let (version, template) = services
        .federation
        .make_knock(
            body.origin()?,
            &request.room_id,
            &request.user_id,
            &request.ver,
        )
        .await?;
    Ok(prepare_knock_event::v1::Response::new(
        version,
        to_raw_value(&template).map_err(Error::internal)?,
    )
    .into())
}

/// `PUT /_matrix/federation/v1/send_knock/{roomId}/{eventId}`: the signed knock; answers the
/// room state a knocker sees.
pub async fn send_knock_route(
    services: Data<Services>,
    body: Ruma<create_knock_event::v1::Request>,
) -> Result<RumaResponse<create_knock_event::v1::Response>> {
    let request = &body.body;
    let knock_room_state = services
        .federation
        .send_knock(
            &services.rooms,
            body.origin()?,
            &request.room_id,
            &request.event_id,
            &request.pdu,
        )
        .await?;
    Ok(create_knock_event::v1::Response::new(knock_room_state).into())
}
