//! Sending and reading events: messages, state, redactions, single events and context.

use actix_web::{web::Data, Either, HttpRequest, HttpResponse};
use ruma::{
    api::{
        client::{
            context::get_context::v3 as context,
            message::send_message_event::v3 as send_message,
            redact::redact_event::v3 as redact,
            room::{
                get_event_by_timestamp::v1 as timestamp_to_event, get_room_event::v3 as get_event,
            },
            state::{
                get_state_event_for_key::v3::{self as get_state_event, StateEventFormat},
                get_state_events::v3 as get_state,
                send_state_event::v3 as send_state,
            },
        },
        Direction,
    },
    serde::Raw,
    EventId, MilliSecondsSinceUnixEpoch, UInt,
};
use serde_json::Value;

use super::{
    delayed_events::{requested_delay, scheduled_response},
    rooms::to_raw,
};
use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::{
        rooms::send::{Origin, Sender},
        sessions::Caller,
        sync::EventFilter,
        Services,
    },
};

/// `PUT /_matrix/client/v3/rooms/{roomId}/send/{eventType}/{txnId}`
pub async fn send_message_route(
    services: Data<Services>,
    body: Ruma<send_message::Request>,
    req: HttpRequest,
) -> Result<Either<RumaResponse<send_message::Response>, HttpResponse>> {
    let caller = body.caller()?;
    let request = &body.body;
    let content: Value = serde_json::from_str(request.body.json().get())
        .map_err(|e| Error::bad_json(e.to_string()))?;
    if let Some(delay_ms) = requested_delay(&req)? {
        let delay_id = services
            .delayed_events
            .schedule(
                &caller.user_id,
                caller.device_id.as_str(),
                Some(request.txn_id.as_str()),
                &request.room_id,
                &request.event_type.to_string(),
                None,
                &content,
                delay_ms,
            )
            .await?;
        return Ok(Either::Right(scheduled_response(&delay_id)));
    }
    let sender = Sender {
        user_id: &caller.user_id,
        txn: Some((caller.device_id.as_str(), request.txn_id.as_str())),
        ts: massaged_ts(caller, request.timestamp),
        origin: Origin::Client,
    };
    let event_type = request.event_type.to_string();
    let event_id = services
        .rooms
        .send_event(sender, &request.room_id, &event_type, None, content)
        .await?;
    Ok(Either::Left(send_message::Response::new(event_id).into()))
}

/// `PUT /_matrix/client/v3/rooms/{roomId}/state/{eventType}/{stateKey}`
pub async fn send_state_route(
    services: Data<Services>,
    body: Ruma<send_state::Request>,
    req: HttpRequest,
) -> Result<Either<RumaResponse<send_state::Response>, HttpResponse>> {
    let caller = body.caller()?;
    let request = &body.body;
    let content: Value = serde_json::from_str(request.body.json().get())
        .map_err(|e| Error::bad_json(e.to_string()))?;
    let kind = request.event_type.to_string();
    if let Some(delay_ms) = requested_delay(&req)? {
        let delay_id = services
            .delayed_events
            .schedule(
                &caller.user_id,
                caller.device_id.as_str(),
                None,
                &request.room_id,
                &kind,
                Some(&request.state_key),
                &content,
                delay_ms,
            )
            .await?;
        return Ok(Either::Right(scheduled_response(&delay_id)));
    }
    let sender = Sender {
        user_id: &caller.user_id,
        txn: None,
        ts: massaged_ts(caller, request.timestamp),
        origin: Origin::Client,
    };
    let event_id = services
        .rooms
        .send_state_as(sender, &request.room_id, &kind, &request.state_key, content)
        .await?;
    Ok(Either::Left(send_state::Response::new(event_id).into()))
}

/// The `?ts=` an event is stamped with: an appservice's only (timestamp massaging, which
/// bridges use to keep a bridged message's original time); anyone else's is ignored.
fn massaged_ts(caller: &Caller, ts: Option<MilliSecondsSinceUnixEpoch>) -> Option<i64> {
    caller.appservice.as_ref()?;
    ts.map(|ts| i64::from(ts.get()))
}

/// `GET /_matrix/client/v3/rooms/{roomId}/state`
pub async fn get_state_route(
    services: Data<Services>,
    body: Ruma<get_state::Request>,
) -> Result<RumaResponse<get_state::Response>> {
    let caller = body.caller()?;
    let events = services
        .rooms
        .room_state(&caller.user_id, &body.body.room_id)
        .await?;
    Ok(get_state::Response::new(events.into_iter().map(Raw::from_json).collect()).into())
}

/// `GET /_matrix/client/v3/rooms/{roomId}/state/{eventType}/{stateKey}`
pub async fn get_state_event_route(
    services: Data<Services>,
    body: Ruma<get_state_event::Request>,
) -> Result<RumaResponse<get_state_event::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    let event = services
        .rooms
        .room_state_event(
            &caller.user_id,
            &request.room_id,
            &request.event_type.to_string(),
            &request.state_key,
        )
        .await?;
    let value = match request.format {
        StateEventFormat::Event => event,
        _ => event.get("content").cloned().unwrap_or_default(),
    };
    let raw = serde_json::value::to_raw_value(&value).map_err(Error::internal)?;
    Ok(get_state_event::Response::new(raw).into())
}

/// `PUT /_matrix/client/v3/rooms/{roomId}/redact/{eventId}/{txnId}`
pub async fn redact_route(
    services: Data<Services>,
    body: Ruma<redact::Request>,
) -> Result<RumaResponse<redact::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    let sender = Sender {
        user_id: &caller.user_id,
        txn: Some((caller.device_id.as_str(), request.txn_id.as_str())),
        ts: None,
        origin: Origin::Client,
    };
    let event_id = services
        .rooms
        .redact(
            sender,
            &request.room_id,
            &request.event_id,
            request.reason.as_deref(),
        )
        .await?;
    Ok(redact::Response::new(event_id).into())
}

/// `GET /_matrix/client/v3/rooms/{roomId}/event/{eventId}`
pub async fn get_event_route(
    services: Data<Services>,
    body: Ruma<get_event::Request>,
) -> Result<RumaResponse<get_event::Response>> {
    let caller = body.caller()?;
    let event = services
        .rooms
        .event(
            &caller.user_id,
            &body.body.room_id,
            body.body.event_id.as_str(),
        )
        .await?;
    Ok(get_event::Response::new(to_raw(&event)?).into())
}

/// `GET /_matrix/client/v3/rooms/{roomId}/context/{eventId}`
pub async fn context_route(
    services: Data<Services>,
    body: Ruma<context::Request>,
) -> Result<RumaResponse<context::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    let limit = u64::from(request.limit).min(100) as i64;
    let found = services
        .rooms
        .context(
            &caller.user_id,
            &request.room_id,
            request.event_id.as_str(),
            limit,
            &EventFilter::from_room_filter(&request.filter),
        )
        .await?;
    let mut response = context::Response::new();
    response.start = Some(found.start);
    response.end = Some(found.end);
    response.event = Some(to_raw(&found.event)?);
    response.events_before = found.before.iter().map(to_raw).collect::<Result<_>>()?;
    response.events_after = found.after.iter().map(to_raw).collect::<Result<_>>()?;
    response.state = found.state.iter().map(to_raw).collect::<Result<_>>()?;
    Ok(response.into())
}

/// `GET /_matrix/client/v1/rooms/{roomId}/timestamp_to_event`
pub async fn timestamp_to_event_route(
    services: Data<Services>,
    body: Ruma<timestamp_to_event::Request>,
) -> Result<RumaResponse<timestamp_to_event::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    let ts = i64::try_from(u64::from(request.ts.0))
        .map_err(|_| Error::invalid_param("ts out of range"))?;
    let forward = request.dir == Direction::Forward;
    let (event_id, origin_ts) = services
        .rooms
        .event_near_timestamp(&caller.user_id, &request.room_id, ts, forward)
        .await?;
    let event_id = EventId::parse(event_id).map_err(Error::internal)?;
    let origin =
        ruma::MilliSecondsSinceUnixEpoch(UInt::new(origin_ts.max(0) as u64).unwrap_or_default());
    Ok(timestamp_to_event::Response::new(event_id, origin).into())
}
