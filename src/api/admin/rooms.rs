//! `/_synapse/admin/.../rooms/...`: the room list, one room's details, members and state,
//! blocking, deleting a room (at once in v1, in the background in v2), and purging its
//! history.

use std::collections::HashMap;

use actix_web::{http::Method, web, web::Data, HttpResponse};
use serde_json::{json, Map, Value};

use super::{
    backwards_param, bool_param, ensure_admin, int_param, parse_room, path_arg, Query, RouteTable,
};
use crate::{
    api::ruma::{Authenticated, JsonBody},
    error::{Error, Result},
    service::{
        admin::{Admin, DeleteRoom, NewRoom, PurgePoint},
        Services,
    },
    storage::admin_rooms::{RoomOrder, RoomQuery},
};

/// Rooms per page unless `limit` says otherwise (Synapse's default).
const DEFAULT_LIMIT: i64 = 100;

/// Registers the room routes.
pub fn routes(t: &mut RouteTable) {
    let v1 = "/_synapse/admin/v1/rooms";
    t.raw(Method::GET, v1, list_rooms_route);
    let room = format!("{v1}/{{room_id}}");
    t.raw(Method::GET, &room, get_room_route);
    t.raw(Method::DELETE, &room, delete_room_v1_route);
    t.raw(Method::GET, &format!("{room}/members"), members_route);
    t.raw(Method::GET, &format!("{room}/state"), state_route);
    t.raw(Method::GET, &format!("{room}/block"), get_block_route);
    t.raw(Method::PUT, &format!("{room}/block"), put_block_route);
    let v2 = "/_synapse/admin/v2/rooms";
    t.raw(
        Method::DELETE,
        &format!("{v2}/{{room_id}}"),
        delete_room_v2_route,
    );
    t.raw(
        Method::GET,
        &format!("{v2}/{{room_id}}/delete_status"),
        room_delete_status_route,
    );
    t.raw(
        Method::GET,
        &format!("{v2}/delete_status/{{delete_id}}"),
        delete_status_route,
    );
    let purge = "/_synapse/admin/v1/purge_history/{room_id}";
    t.raw(Method::POST, purge, purge_history_route);
    t.raw(
        Method::POST,
        &format!("{purge}/{{event_id}}"),
        purge_history_at_event_route,
    );
    t.raw(
        Method::GET,
        "/_synapse/admin/v1/purge_history_status/{purge_id}",
        purge_history_status_route,
    );
}

fn room_query(query: &HashMap<String, String>) -> Result<RoomQuery> {
    let order = match query.get("order_by") {
        None => RoomOrder::Name,
        Some(value) => RoomOrder::parse(value)
            .ok_or_else(|| Error::invalid_param("Unknown value for order_by"))?,
    };
    Ok(RoomQuery {
        search_term: query.get("search_term").filter(|t| !t.is_empty()).cloned(),
        public_rooms: bool_param(query, "public_rooms")?,
        empty_rooms: bool_param(query, "empty_rooms")?,
        order: Some((order, backwards_param(query, false)?)),
    })
}

/// `GET /_synapse/admin/v1/rooms`: `offset` and `total_rooms`, with `next_batch` when more
/// follow and `prev_batch` when this is not the first page.
pub async fn list_rooms_route(
    services: Data<Services>,
    caller: Authenticated,
    query: Query,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let from = int_param(&query, "from", 0)?;
    let limit = int_param(&query, "limit", DEFAULT_LIMIT)?;
    let page = services
        .admin
        .list_rooms(&room_query(&query)?, from, limit)
        .await?;
    let mut body = json!({ "rooms": page.rooms, "offset": from, "total_rooms": page.total });
    if from + limit < page.total {
        body["next_batch"] = json!(from + limit);
    }
    if from > 0 {
        body["prev_batch"] = json!((from - limit).max(0));
    }
    Ok(HttpResponse::Ok().json(body))
}

/// `GET /_synapse/admin/v1/rooms/{roomId}`
pub async fn get_room_route(
    services: Data<Services>,
    caller: Authenticated,
    room_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let room = services.admin.get_room(&parse_room(&room_id)?).await?;
    Ok(HttpResponse::Ok().json(room))
}

/// `GET /_synapse/admin/v1/rooms/{roomId}/members`
pub async fn members_route(
    services: Data<Services>,
    caller: Authenticated,
    room_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let members = services.admin.room_members(&parse_room(&room_id)?).await?;
    Ok(HttpResponse::Ok().json(members))
}

/// `GET /_synapse/admin/v1/rooms/{roomId}/state`: the whole current state, whoever the admin
/// is in the room.
pub async fn state_route(
    services: Data<Services>,
    caller: Authenticated,
    room_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let state = services
        .rooms
        .current_state_unchecked(&parse_room(&room_id)?)
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "state": state })))
}

/// `GET /_synapse/admin/v1/rooms/{roomId}/block`
pub async fn get_block_route(
    services: Data<Services>,
    caller: Authenticated,
    room_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let block = services.admin.room_block(&parse_room(&room_id)?).await?;
    Ok(HttpResponse::Ok().json(block))
}

/// `PUT /_synapse/admin/v1/rooms/{roomId}/block`, body `{"block": bool}`.
pub async fn put_block_route(
    services: Data<Services>,
    caller: Authenticated,
    room_id: web::Path<String>,
    body: JsonBody<Map<String, Value>>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let room_id = parse_room(&room_id)?;
    let block = match body.0.get("block") {
        Some(Value::Bool(block)) => *block,
        Some(_) => return Err(Error::invalid_param("'block' must be a boolean")),
        None => return Err(Error::missing_param("Missing param block")),
    };
    services
        .admin
        .set_room_block(&room_id, &caller.0.user_id, block)
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "block": block })))
}

/// The options of a room deletion. `new_room_user_id` must be a local user (who need not
/// have an account), as in Synapse.
fn delete_options(services: &Services, body: &Map<String, Value>) -> Result<DeleteRoom> {
    let flag = |name: &str, default: bool| match body.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(value)) => Ok(*value),
        Some(_) => Err(Error::invalid_param(format!("'{name}' must be a boolean"))),
    };
    let text = |name: &str| match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(value)) => Ok(Some(value.clone())),
        Some(_) => Err(Error::invalid_param(format!("'{name}' must be a string"))),
    };
    let new_room = match body.get("new_room_user_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(user_id)) => {
            let creator = ruma::UserId::parse(user_id)
                .map_err(|_| Error::invalid_param("new_room_user_id is not a user ID"))?;
            if creator.server_name() != services.config.server_name {
                return Err(Error::unknown(format!("User must be our own: {creator}")));
            }
            Some(NewRoom::new(creator, text("room_name")?, text("message")?))
        }
        Some(_) => return Err(Error::invalid_param("'new_room_user_id' must be a string")),
    };
    Ok(DeleteRoom {
        block: flag("block", false)?,
        purge: flag("purge", true)? || flag("force_purge", false)?,
        new_room,
    })
}

/// `DELETE /_synapse/admin/v1/rooms/{roomId}`: shuts the room down before answering, with
/// `kicked_users`, `failed_to_kick_users`, `local_aliases` and `new_room_id`.
pub async fn delete_room_v1_route(
    services: Data<Services>,
    caller: Authenticated,
    room_id: web::Path<String>,
    body: JsonBody<Map<String, Value>>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let room_id = parse_room(&room_id)?;
    let options = delete_options(&services, &body.0)?;
    let result = services
        .admin
        .shutdown_room(&services.rooms, &room_id, &caller.0.user_id, &options)
        .await?;
    Ok(HttpResponse::Ok().json(result))
}

/// `DELETE /_synapse/admin/v2/rooms/{roomId}`: starts the shutdown in the background and
/// returns its `delete_id` for the status endpoints.
pub async fn delete_room_v2_route(
    services: Data<Services>,
    caller: Authenticated,
    room_id: web::Path<String>,
    body: JsonBody<Map<String, Value>>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let room_id = parse_room(&room_id)?;
    let options = delete_options(&services, &body.0)?;
    let delete_id =
        Admin::start_room_deletion(services.into_inner(), &room_id, &caller.0.user_id, options)
            .await?;
    Ok(HttpResponse::Ok().json(json!({ "delete_id": delete_id })))
}

/// `GET /_synapse/admin/v2/rooms/delete_status/{deleteId}`
pub async fn delete_status_route(
    services: Data<Services>,
    caller: Authenticated,
    delete_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    Ok(HttpResponse::Ok().json(services.admin.room_deletion(&delete_id).await?))
}

/// `GET /_synapse/admin/v2/rooms/{roomId}/delete_status`
pub async fn room_delete_status_route(
    services: Data<Services>,
    caller: Authenticated,
    room_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let room_id = parse_room(&room_id)?;
    Ok(HttpResponse::Ok().json(services.admin.room_deletions(&room_id).await?))
}

/// `POST /_synapse/admin/v1/purge_history/{roomId}`: `purge_up_to_event_id` or
/// `purge_up_to_ts`, and `delete_local_events`; answers `{purge_id}` and purges in the
/// background.
pub async fn purge_history_route(
    services: Data<Services>,
    caller: Authenticated,
    room_id: web::Path<String>,
    body: JsonBody<Map<String, Value>>,
) -> Result<HttpResponse> {
    purge_history(services, &caller, &room_id, None, &body.0).await
}

/// `POST /_synapse/admin/v1/purge_history/{roomId}/{eventId}`: the event in the path.
pub async fn purge_history_at_event_route(
    services: Data<Services>,
    caller: Authenticated,
    path: web::Path<(String, String)>,
    body: JsonBody<Map<String, Value>>,
) -> Result<HttpResponse> {
    let (room_id, event_id) = path.into_inner();
    purge_history(services, &caller, &room_id, Some(&event_id), &body.0).await
}

/// Both purge routes: the point from the path or the body, then the purge in the background.
async fn purge_history(
    services: Data<Services>,
    caller: &Authenticated,
    room_id: &str,
    path_event_id: Option<&str>,
    body: &Map<String, Value>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let room_id = parse_room(room_id)?;
    let delete_local_events = match body.get("delete_local_events") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(value)) => *value,
        Some(_) => {
            return Err(Error::invalid_param(
                "'delete_local_events' must be a boolean",
            ))
        }
    };
    let event_id = match path_event_id {
        Some(raw) => Some(path_arg(raw)?),
        None => match body.get("purge_up_to_event_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(id)) => Some(id.clone()),
            Some(_) => return Err(Error::bad_json("purge_up_to_event_id must be a string")),
        },
    };
    let point = match (event_id, body.get("purge_up_to_ts")) {
        (Some(event_id), _) => PurgePoint::Event(
            ruma::EventId::parse(&event_id)
                .map_err(|_| Error::invalid_param("Invalid event ID"))?,
        ),
        (None, Some(ts)) => PurgePoint::Ts(
            ts.as_i64()
                .ok_or_else(|| Error::bad_json("purge_up_to_ts must be an int"))?,
        ),
        (None, None) => {
            return Err(Error::bad_json(
                "must specify purge_up_to_event_id or purge_up_to_ts",
            ))
        }
    };
    let purge_id =
        Admin::start_history_purge(services.into_inner(), &room_id, &point, delete_local_events)
            .await?;
    Ok(HttpResponse::Ok().json(json!({ "purge_id": purge_id })))
}

/// `GET /_synapse/admin/v1/purge_history_status/{purgeId}`: `status` (`active`, `complete`
/// or `failed`, with `error`).
pub async fn purge_history_status_route(
    services: Data<Services>,
    caller: Authenticated,
    purge_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    Ok(HttpResponse::Ok().json(services.admin.history_purge(&purge_id).await?))
}
