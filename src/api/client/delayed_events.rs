//! Delayed events (MSC4140): scheduling through `/send` and `/state` with
//! `?org.matrix.msc4140.delay=`, and managing them by delay ID. Management is authorised by
//! the delay ID alone (an access token is optional), as Synapse serves it: the ID is an
//! unguessable capability a client may hand to another party (a call's SFU) to keep the
//! timer running.

use actix_web::{
    web::{Data, Path, Query},
    HttpRequest, HttpResponse,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{
    api::ruma::{authenticate, Authenticated, JsonBody},
    error::{Error, Result},
    service::Services,
    storage::delayed_events::DelayedEventRow,
};

/// The query parameter that turns a send into a delayed one.
const DELAY_PARAM: &str = "org.matrix.msc4140.delay";

/// The delay a `/send` or `/state` request asks for, in milliseconds, if any.
pub fn requested_delay(req: &HttpRequest) -> Result<Option<u64>> {
    let query = Query::<Vec<(String, String)>>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .unwrap_or_default();
    let Some((_, value)) = query.into_iter().find(|(key, _)| key == DELAY_PARAM) else {
        return Ok(None);
    };
    value.parse::<u64>().map(Some).map_err(|_| {
        Error::invalid_param(format!(
            "{DELAY_PARAM} must be a non-negative integer number of milliseconds"
        ))
    })
}

/// The `{"delay_id": ...}` answer of a delayed send.
pub fn scheduled_response(delay_id: &str) -> HttpResponse {
    HttpResponse::Ok().json(json!({ "delay_id": delay_id }))
}

/// `{"action": ...}` of the combined management endpoint.
#[derive(Deserialize)]
pub struct ActionBody {
    action: Option<Value>,
}

/// `POST /_matrix/client/unstable/org.matrix.msc4140/delayed_events/{delayId}`
pub async fn update_route(
    services: Data<Services>,
    req: HttpRequest,
    delay_id: Path<String>,
    body: JsonBody<ActionBody>,
) -> Result<HttpResponse> {
    let action = match body.0.action {
        None => return Err(Error::missing_param("'action' is missing")),
        Some(Value::String(action)) => action,
        Some(_) => return Err(invalid_action()),
    };
    act(&services, &req, &delay_id, &action).await
}

/// `POST /_matrix/client/unstable/org.matrix.msc4140/delayed_events/{delayId}/cancel`
pub async fn cancel_route(
    services: Data<Services>,
    req: HttpRequest,
    delay_id: Path<String>,
) -> Result<HttpResponse> {
    act(&services, &req, &delay_id, "cancel").await
}

/// `POST /_matrix/client/unstable/org.matrix.msc4140/delayed_events/{delayId}/restart`
pub async fn restart_route(
    services: Data<Services>,
    req: HttpRequest,
    delay_id: Path<String>,
) -> Result<HttpResponse> {
    act(&services, &req, &delay_id, "restart").await
}

/// `POST /_matrix/client/unstable/org.matrix.msc4140/delayed_events/{delayId}/send`
pub async fn send_route(
    services: Data<Services>,
    req: HttpRequest,
    delay_id: Path<String>,
) -> Result<HttpResponse> {
    act(&services, &req, &delay_id, "send").await
}

async fn act(
    services: &Services,
    req: &HttpRequest,
    delay_id: &str,
    action: &str,
) -> Result<HttpResponse> {
    // A token is optional, but one that is sent must be valid.
    authenticate(req, services, false).await?;
    let delayed = &services.delayed_events;
    match action {
        "cancel" => delayed.cancel(delay_id).await?,
        "restart" => delayed.restart(delay_id).await?,
        "send" => delayed.send_now(&services.rooms, delay_id).await?,
        _ => return Err(invalid_action()),
    }
    Ok(HttpResponse::Ok().json(json!({})))
}

fn invalid_action() -> Error {
    Error::invalid_param("'action' is not one of 'cancel', 'restart', 'send'")
}

/// `GET /_matrix/client/unstable/org.matrix.msc4140/delayed_events`
pub async fn list_route(services: Data<Services>, caller: Authenticated) -> Result<HttpResponse> {
    let rows = services.delayed_events.scheduled(&caller.0.user_id).await?;
    let events: Vec<Value> = rows
        .iter()
        .map(|row| {
            let mut item = describe(row);
            // Field names of earlier MSC4140 drafts, which clients still read (as Synapse).
            item["delay"] = row.delay_ms.into();
            item["running_since"] = (row.send_ts - row.delay_ms).into();
            item
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "delayed_events": events })))
}

/// `GET /_matrix/client/unstable/org.matrix.msc4140/delayed_events/{delayId}`
pub async fn get_route(
    services: Data<Services>,
    caller: Authenticated,
    delay_id: Path<String>,
) -> Result<HttpResponse> {
    let row = services
        .delayed_events
        .scheduled_one(&caller.0.user_id, &delay_id)
        .await?;
    Ok(HttpResponse::Ok().json(describe(&row)))
}

fn describe(row: &DelayedEventRow) -> Value {
    let mut item = json!({
        "delay_id": row.delay_id,
        "room_id": row.room_id,
        "type": row.event_type,
        "delay_ms": row.delay_ms,
        "delayed_since_ts": row.send_ts - row.delay_ms,
        "content": row.content,
    });
    if let Some(state_key) = &row.state_key {
        item["state_key"] = state_key.as_str().into();
    }
    item
}
