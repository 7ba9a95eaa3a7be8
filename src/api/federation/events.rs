//! Reading a room's events over federation: `/event`, `/state`, `/state_ids`, `/event_auth`,
//! `/backfill`, `/get_missing_events` and `/timestamp_to_event`. Who may read what is decided in one place,
//! `service/federation/room_access.rs`.

use actix_web::web::Data;
use ruma::{
    api::federation::{
        authorization::get_event_authorization,
        backfill::get_backfill,
        event::{
            get_event, get_event_by_timestamp, get_missing_events, get_room_state,
            get_room_state_ids,
        },
    },
    MilliSecondsSinceUnixEpoch, UInt,
};

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::Services,
};

/// `GET /_matrix/federation/v1/event/{eventId}`: one event as a transaction of one PDU.
pub async fn get_event_route(
    services: Data<Services>,
    body: Ruma<get_event::v1::Request>,
) -> Result<RumaResponse<get_event::v1::Response>> {
    let pdu = services
        .federation
        .get_event_for_server(body.origin()?, &body.body.event_id)
        .await?;
    Ok(get_event::v1::Response::new(
        services.config.server_name.clone(),
        MilliSecondsSinceUnixEpoch::now(),
        pdu,
    )
    .into())
}

/// `GET /_matrix/federation/v1/state/{roomId}?event_id=`: the state before the event and its
/// auth chain.
pub async fn get_room_state_route(
    services: Data<Services>,
    body: Ruma<get_room_state::v1::Request>,
) -> Result<RumaResponse<get_room_state::v1::Response>> {
    let request = &body.body;
    let (pdus, auth_chain) = services
        .federation
        .get_state_for_server(body.origin()?, &request.room_id, &request.event_id)
        .await?;
    Ok(get_room_state::v1::Response::new(auth_chain, pdus).into())
}

/// `GET /_matrix/federation/v1/state_ids/{roomId}?event_id=`: the IDs of the state before the
/// event and of its auth chain.
pub async fn get_room_state_ids_route(
    services: Data<Services>,
    body: Ruma<get_room_state_ids::v1::Request>,
) -> Result<RumaResponse<get_room_state_ids::v1::Response>> {
    let request = &body.body;
    let (pdu_ids, auth_chain_ids) = services
        .federation
        .get_state_ids_for_server(body.origin()?, &request.room_id, &request.event_id)
        .await?;
    Ok(get_room_state_ids::v1::Response::new(auth_chain_ids, pdu_ids).into())
}

/// `GET /_matrix/federation/v1/event_auth/{roomId}/{eventId}`: the event's auth chain.
pub async fn get_event_authorization_route(
    services: Data<Services>,
    body: Ruma<get_event_authorization::v1::Request>,
) -> Result<RumaResponse<get_event_authorization::v1::Response>> {
    let request = &body.body;
    let auth_chain = services
        .federation
        .get_event_auth_for_server(body.origin()?, &request.room_id, &request.event_id)
        .await?;
    Ok(get_event_authorization::v1::Response::new(auth_chain).into())
}

/// `GET /_matrix/federation/v1/backfill/{roomId}?v=&limit=`: history before (and including)
/// the events `v`, newest first, at most 100 events.
pub async fn get_backfill_route(
    services: Data<Services>,
    body: Ruma<get_backfill::v1::Request>,
) -> Result<RumaResponse<get_backfill::v1::Response>> {
    let request = &body.body;
    let pdus = services
        .federation
        .backfill_for_server(
            body.origin()?,
            &request.room_id,
            &request.v,
            request.limit.into(),
        )
        .await?;
    Ok(get_backfill::v1::Response::new(
        services.config.server_name.clone(),
        MilliSecondsSinceUnixEpoch::now(),
        pdus,
    )
    .into())
}

/// `POST /_matrix/federation/v1/get_missing_events/{roomId}`: the events before
/// `latest_events` the asker lacks, oldest first, at most 20.
pub async fn get_missing_events_route(
    services: Data<Services>,
    body: Ruma<get_missing_events::v1::Request>,
) -> Result<RumaResponse<get_missing_events::v1::Response>> {
    let request = &body.body;
    let events = services
        .federation
        .get_missing_events_for_server(
            body.origin()?,
            &request.room_id,
            &request.earliest_events,
            &request.latest_events,
            request.limit.into(),
            request.min_depth.into(),
        )
        .await?;
    Ok(get_missing_events::v1::Response::new(events).into())
}

/// `GET /_matrix/federation/v1/timestamp_to_event/{roomId}`: the room's event nearest a time.
pub async fn timestamp_to_event_route(
    services: Data<Services>,
    body: Ruma<get_event_by_timestamp::v1::Request>,
) -> Result<RumaResponse<get_event_by_timestamp::v1::Response>> {
    let request = &body.body;
    let ts = i64::try_from(u64::from(request.ts.0))
        .map_err(|_| Error::invalid_param("ts out of range"))?;
    let forward = request.dir == ruma::api::Direction::Forward;
    let (event_id, origin_ts) = services
        .federation
        .timestamp_to_event_for_server(body.origin()?, &request.room_id, ts, forward)
        .await?;
    let origin_ts =
        MilliSecondsSinceUnixEpoch(UInt::new(origin_ts.max(0) as u64).unwrap_or_default());
    Ok(get_event_by_timestamp::v1::Response::new(event_id, origin_ts).into())
}
