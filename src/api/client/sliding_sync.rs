//! Simplified sliding sync (MSC4186): `POST /_matrix/client/unstable/org.matrix.simplified_msc3575/sync`
//! and the merged MSC's `POST /_matrix/client/v4/sync`.
//!
//! Both wire forms are read into one model: the unstable one clients speak (`pos`/`timeout`
//! in the query, `ranges`, tuple `required_state` with `*`, `$LAZY`, `$ME`, `is_invite`) and
//! the merged MSC's (`pos`/`timeout` in the body, `range`, object `required_state`,
//! `is_invited`). Unknown fields are ignored.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::Duration,
};

use actix_web::{web, web::Data, HttpRequest, HttpResponse};
use ruma::{presence::PresenceState, OwnedRoomId, UserId};
use serde::Deserialize;
use serde_json::Value;

use crate::{
    api::ruma::{Authenticated, JsonBody},
    error::{Error, Result},
    service::{
        sessions::Caller,
        sync::sliding::model::{
            Extensions, ListFilters, ListRequest, Narrowed, RequiredState, RoomConfig, Scope,
            SlidingRequest, ToDeviceExtension, MAX_LISTS, MAX_NAME_BYTES, MAX_RANGES,
            MAX_SUBSCRIPTIONS, MAX_TIMELINE_LIMIT, WILDCARD,
        },
        Services,
    },
};

/// The unstable path clients use today.
pub const UNSTABLE_PATH: &str = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync";
/// The merged MSC's path.
pub const STABLE_PATH: &str = "/_matrix/client/v4/sync";

/// `POST` at either path.
///
/// As on `/sync`, the request is taken apart in a boxed step before the wait: this future
/// stays allocated while the request is parked.
pub async fn sliding_sync_route(
    services: Data<Services>,
    Authenticated(caller): Authenticated,
    req: HttpRequest,
    JsonBody(body): JsonBody<Value>,
) -> Result<HttpResponse> {
    let request = Box::pin(prepare_sliding_sync(&services, caller, req, body)).await?;
    let (response, resumed) = services
        .sync
        .sliding_sync(&services.rooms, &request)
        .await?;
    super::sync::json_counted(&response, "sliding", resumed)
}

/// Reads the request (body and query) into the model and marks the user as syncing (their
/// presence).
async fn prepare_sliding_sync(
    services: &Services,
    caller: Caller,
    req: HttpRequest,
    body: Value,
) -> Result<SlidingRequest> {
    let query = web::Query::<HashMap<String, String>>::from_query(req.query_string())
        .map_err(|_| Error::invalid_param("Malformed query string"))?
        .into_inner();
    let wire: WireRequest =
        serde_json::from_value(body).map_err(|e| Error::bad_json(e.to_string()))?;
    let request = to_model(wire, &query, &caller.user_id, caller.device_id.as_str())?;
    // As on `/sync`: the client says how its user appears while it syncs (default online);
    // a shadow-banned user's presence is never shared.
    let presence = match query.get("set_presence").map(String::as_str) {
        None | Some("online") => PresenceState::Online,
        Some("offline") => PresenceState::Offline,
        Some("unavailable") => PresenceState::Unavailable,
        Some(_) => return Err(Error::invalid_param("Unknown set_presence")),
    };
    if !caller.shadow_banned {
        services
            .presence
            .syncing(&caller.user_id, &presence)
            .await?;
    }
    Ok(request)
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireRequest {
    conn_id: Option<String>,
    txn_id: Option<String>,
    pos: Option<String>,
    timeout: Option<u64>,
    lists: Option<BTreeMap<String, WireList>>,
    room_subscriptions: Option<BTreeMap<String, WireRoomConfig>>,
    extensions: Option<WireExtensions>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireList {
    ranges: Option<Vec<(u64, u64)>>,
    range: Option<(u64, u64)>,
    required_state: Option<Value>,
    timeline_limit: Option<u64>,
    filters: Option<WireFilters>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireRoomConfig {
    required_state: Option<Value>,
    timeline_limit: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireFilters {
    is_dm: Option<bool>,
    is_encrypted: Option<bool>,
    is_invite: Option<bool>,
    is_invited: Option<bool>,
    room_types: Option<Vec<Option<String>>>,
    not_room_types: Option<Vec<Option<String>>>,
    spaces: Option<Vec<String>>,
    room_name_like: Option<String>,
    tags: Option<Vec<String>>,
    not_tags: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireExtensions {
    to_device: Option<WireToDevice>,
    e2ee: Option<WireScoped>,
    account_data: Option<WireScoped>,
    receipts: Option<WireScoped>,
    typing: Option<WireScoped>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireToDevice {
    enabled: Option<bool>,
    limit: Option<u64>,
    since: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireScoped {
    enabled: Option<bool>,
    lists: Option<Vec<String>>,
    rooms: Option<Vec<String>>,
}

fn to_model(
    wire: WireRequest,
    query: &HashMap<String, String>,
    user_id: &UserId,
    device_id: &str,
) -> Result<SlidingRequest> {
    let timeout = match query.get("timeout") {
        Some(t) => Some(
            t.parse::<u64>()
                .map_err(|_| Error::invalid_param("timeout must be a number of milliseconds"))?,
        ),
        None => wire.timeout,
    };
    let conn_id = wire.conn_id.unwrap_or_default();
    if conn_id.len() > MAX_NAME_BYTES {
        return Err(Error::invalid_param("conn_id is too long"));
    }
    let lists_in = wire.lists.unwrap_or_default();
    if lists_in.len() > MAX_LISTS {
        return Err(Error::invalid_param(format!("At most {MAX_LISTS} lists")));
    }
    let mut lists = BTreeMap::new();
    for (name, list) in lists_in {
        if name.len() > MAX_NAME_BYTES {
            return Err(Error::invalid_param("A list name is too long"));
        }
        let ranges = match (list.ranges, list.range) {
            (Some(ranges), _) => Some(ranges),
            (None, Some(range)) => Some(vec![range]),
            (None, None) => None,
        };
        if let Some(ranges) = &ranges {
            if ranges.len() > MAX_RANGES {
                return Err(Error::invalid_param(format!(
                    "At most {MAX_RANGES} ranges per list"
                )));
            }
            if ranges.iter().any(|(start, end)| start > end) {
                return Err(Error::invalid_param("A range starts after its end"));
            }
        }
        let filters = list.filters.unwrap_or_default();
        lists.insert(
            name,
            ListRequest {
                ranges,
                config: room_config(list.required_state, list.timeline_limit, user_id)?,
                filters: ListFilters {
                    is_dm: filters.is_dm,
                    is_encrypted: filters.is_encrypted,
                    is_invite: filters.is_invite.or(filters.is_invited),
                    room_types: filters.room_types,
                    not_room_types: filters.not_room_types.unwrap_or_default(),
                    spaces: filters.spaces,
                    room_name_like: filters.room_name_like,
                    tags: filters.tags,
                    not_tags: filters.not_tags.unwrap_or_default(),
                },
            },
        );
    }
    let subscriptions_in = wire.room_subscriptions.unwrap_or_default();
    if subscriptions_in.len() > MAX_SUBSCRIPTIONS {
        return Err(Error::invalid_param(format!(
            "At most {MAX_SUBSCRIPTIONS} room subscriptions"
        )));
    }
    let mut subscriptions = BTreeMap::new();
    for (room_id, config) in subscriptions_in {
        let room_id = OwnedRoomId::try_from(room_id.as_str())
            .map_err(|_| Error::invalid_param(format!("Invalid room ID: {room_id}")))?;
        subscriptions.insert(
            room_id,
            room_config(config.required_state, config.timeline_limit, user_id)?,
        );
    }
    let ext = wire.extensions.unwrap_or_default();
    let enabled = |e: &Option<WireScoped>| e.as_ref().is_some_and(|e| e.enabled == Some(true));
    let scope = |e: Option<WireScoped>| {
        e.filter(|e| e.enabled == Some(true)).map(|e| Scope {
            lists: e.lists,
            rooms: e.rooms,
        })
    };
    let to_device = match ext.to_device.filter(|t| t.enabled == Some(true)) {
        Some(t) => Some(ToDeviceExtension {
            since: match t.since.as_deref() {
                Some(since) => Some(
                    since
                        .parse::<i64>()
                        .ok()
                        .filter(|s| *s >= 0)
                        .ok_or_else(|| Error::invalid_param("Invalid to_device since"))?,
                ),
                None => None,
            },
            limit: t.limit.unwrap_or(100).clamp(1, 100) as i64,
        }),
        None => None,
    };
    Ok(SlidingRequest {
        user_id: user_id.to_owned(),
        device_id: device_id.to_owned(),
        conn_id,
        pos: query.get("pos").cloned().or(wire.pos),
        timeout: Duration::from_millis(timeout.unwrap_or(0)),
        lists,
        subscriptions,
        extensions: Extensions {
            to_device,
            e2ee: enabled(&ext.e2ee),
            account_data: scope(ext.account_data),
            receipts: scope(ext.receipts),
            typing: scope(ext.typing),
        },
        txn_id: wire.txn_id,
    })
}

/// Reads a room config: `required_state` as tuples (`[["m.room.member", "$LAZY"], ...]`) or
/// as the merged MSC's `{include, exclude, lazy_members}`.
fn room_config(
    required_state: Option<Value>,
    timeline_limit: Option<u64>,
    user_id: &UserId,
) -> Result<RoomConfig> {
    let timeline_limit = timeline_limit.unwrap_or(0);
    if timeline_limit > MAX_TIMELINE_LIMIT {
        return Err(Error::invalid_param(format!(
            "timeline_limit is at most {MAX_TIMELINE_LIMIT}"
        )));
    }
    let mut state = RequiredState::default();
    let me = |key: &str| {
        if key == "$ME" {
            user_id.to_string()
        } else {
            key.to_owned()
        }
    };
    let bad = || Error::bad_json("required_state must be [[type, state_key], ...]");
    match required_state {
        None | Some(Value::Null) => {}
        Some(Value::Array(entries)) => {
            for entry in entries {
                let pair = entry.as_array().filter(|p| p.len() == 2).ok_or_else(bad)?;
                let (Some(kind), Some(key)) = (pair[0].as_str(), pair[1].as_str()) else {
                    return Err(bad());
                };
                if key == "$LAZY" {
                    if kind == "m.room.member" {
                        state.lazy_members = true;
                    }
                    continue;
                }
                state.entries.insert((kind.to_owned(), me(key)));
            }
        }
        Some(Value::Object(object)) => {
            if object.get("lazy_members").and_then(Value::as_bool) == Some(true) {
                state.lazy_members = true;
            }
            let pairs = |name: &str| -> Result<BTreeSet<(String, String)>> {
                let mut pairs = BTreeSet::new();
                for entry in object
                    .get(name)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let field = |name: &str| match entry.get(name) {
                        None | Some(Value::Null) => Ok(WILDCARD.to_owned()),
                        Some(Value::String(s)) => Ok(me(s)),
                        Some(_) => Err(Error::bad_json("required_state entries are strings")),
                    };
                    pairs.insert((field("type")?, field("state_key")?));
                }
                Ok(pairs)
            };
            let (include, exclude) = (pairs("include")?, pairs("exclude")?);
            if exclude.is_empty() {
                state.entries = include;
            } else if !include.is_empty() {
                state.narrowed.insert(Narrowed { include, exclude });
            }
        }
        Some(_) => return Err(bad()),
    }
    Ok(RoomConfig {
        timeline_limit,
        required_state: state,
    })
}
