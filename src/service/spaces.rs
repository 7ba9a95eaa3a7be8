//! The client `/hierarchy` (a space's tree, depth first) and `/room_summary` (one room's
//! preview). Rooms this server is in are read here; others are asked of their via servers.
//! Who may see what is [`crate::service::rooms::summary`]'s rule: a room the caller may not
//! preview is left out of a hierarchy, and its summary is 404 `M_NOT_FOUND` like an unknown
//! room's, so neither tells whether it exists.
//!
//! Pagination is stateless: `next_batch` says how many rooms earlier pages returned and with
//! which `suggested_only` and `max_depth`, and the next page walks the tree again from the
//! root, skipping those. Any server process can answer it, and a token used with other
//! parameters is refused with 400 `M_INVALID_PARAM`.

use std::collections::{HashMap, HashSet};

use ruma::{OwnedRoomId, OwnedServerName, RoomAliasId, RoomId, RoomOrAliasId, UserId};
use serde_json::{json, Map, Value};

use super::{
    federation::Federation,
    rooms::{summary::via_of, Rooms},
};
use crate::error::{Error, Result};

/// Rooms one hierarchy page returns by default and at most (Synapse's limit).
pub const MAX_PAGE: usize = 50;

/// Most rooms one hierarchy request looks at, however deep or wide the tree is.
const MAX_VISITED: usize = 1000;

/// A `/hierarchy` request.
pub struct HierarchyRequest<'a> {
    /// The root.
    pub room_id: &'a RoomId,
    /// A `next_batch` of an earlier page.
    pub from: Option<&'a str>,
    /// Rooms per page.
    pub limit: Option<u64>,
    /// How deep to go (0: the root alone).
    pub max_depth: Option<u64>,
    /// Only children marked `suggested`.
    pub suggested_only: bool,
}

/// A room waiting to be looked at.
struct Pending {
    room_id: OwnedRoomId,
    via: Vec<OwnedServerName>,
    depth: u64,
}

/// A room's hierarchy entry and its children to look at next.
struct Found {
    entry: Map<String, Value>,
    children: Vec<(OwnedRoomId, Vec<OwnedServerName>)>,
    inaccessible: HashSet<OwnedRoomId>,
}

fn pagination_token(skip: usize, request: &HierarchyRequest<'_>) -> String {
    let depth = request
        .max_depth
        .map_or_else(|| "n".to_owned(), |d| d.to_string());
    format!("{skip}_{}_{depth}", u8::from(request.suggested_only))
}

/// How many rooms earlier pages returned, from a token made with the same parameters.
fn parse_token(token: &str, request: &HierarchyRequest<'_>) -> Result<usize> {
    let skip = token
        .split_once('_')
        .and_then(|(skip, _)| skip.parse::<usize>().ok())
        .filter(|skip| pagination_token(*skip, request) == token);
    skip.ok_or_else(|| Error::invalid_param("Unknown pagination token"))
}

/// Children named in a hierarchy entry's `children_state`.
fn children_of(entry: &Map<String, Value>) -> Vec<(OwnedRoomId, Vec<OwnedServerName>)> {
    entry
        .get("children_state")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|event| event.get("type").and_then(Value::as_str) == Some("m.space.child"))
        .filter_map(|event| {
            let room_id = RoomId::parse(event.get("state_key")?.as_str()?).ok()?;
            let via = via_of(event.get("content")?);
            (!via.is_empty()).then_some((room_id, via))
        })
        .collect()
}

/// A space's tree for a user (`GET /_matrix/client/v1/rooms/{roomId}/hierarchy`).
pub async fn hierarchy(
    rooms: &Rooms,
    federation: &Federation,
    user_id: &UserId,
    request: &HierarchyRequest<'_>,
) -> Result<Value> {
    let limit = match request.limit {
        Some(0) => return Err(Error::invalid_param("limit must be greater than zero")),
        Some(limit) => usize::try_from(limit).unwrap_or(MAX_PAGE).min(MAX_PAGE),
        None => MAX_PAGE,
    };
    let skip = match request.from {
        Some(token) => parse_token(token, request)?,
        None => 0,
    };
    // A root we are not in can only be asked of the server its ID names (rooms before v12).
    let mut stack = vec![Pending {
        room_id: request.room_id.to_owned(),
        via: request
            .room_id
            .server_name()
            .map(ToOwned::to_owned)
            .into_iter()
            .collect(),
        depth: 0,
    }];
    let mut seen: HashSet<OwnedRoomId> = HashSet::new();
    // Summaries of non-space children another server gave with their parent: used as they
    // are rather than asked for again.
    let mut remote_children: HashMap<OwnedRoomId, Map<String, Value>> = HashMap::new();
    let mut produced = 0usize;
    let mut page = Vec::new();
    while page.len() < limit {
        let Some(pending) = stack.pop() else { break };
        if !seen.insert(pending.room_id.clone()) {
            continue;
        }
        if seen.len() > MAX_VISITED {
            stack.clear();
            break;
        }
        let at_max_depth = request.max_depth.is_some_and(|max| pending.depth >= max);
        let found = look_at(
            rooms,
            federation,
            user_id,
            &pending,
            request.suggested_only,
            at_max_depth,
            &mut remote_children,
        )
        .await?;
        let Some(found) = found else {
            if pending.depth == 0 {
                return Err(Error::forbidden(
                    "You may not see this room: you are not in it and it cannot be previewed",
                ));
            }
            continue;
        };
        if produced >= skip {
            page.push(Value::Object(found.entry));
        }
        produced += 1;
        if !at_max_depth {
            // Pushed in reverse, so the first child is looked at next.
            stack.extend(
                found
                    .children
                    .into_iter()
                    .rev()
                    .filter(|(room_id, _)| !found.inaccessible.contains(room_id))
                    .map(|(room_id, via)| Pending {
                        room_id,
                        via,
                        depth: pending.depth + 1,
                    }),
            );
        }
    }
    let more = stack.iter().any(|p| !seen.contains(&p.room_id));
    let mut response = json!({ "rooms": page });
    if more {
        response["next_batch"] = json!(pagination_token(produced, request));
    }
    Ok(response)
}

/// One room of the tree as the user may see it: from our state when we are in it, otherwise
/// from what its parent's server said or from its via servers; `None` when the user may not
/// see it or nobody answers.
async fn look_at(
    rooms: &Rooms,
    federation: &Federation,
    user_id: &UserId,
    pending: &Pending,
    suggested_only: bool,
    at_max_depth: bool,
    remote_children: &mut HashMap<OwnedRoomId, Map<String, Value>>,
) -> Result<Option<Found>> {
    let room_id = &pending.room_id;
    if let Some(facts) = rooms.facts_for_user(room_id, Some(user_id)).await? {
        let mut entry = facts.summary();
        entry.insert(
            "children_state".to_owned(),
            Value::Array(facts.children_state(suggested_only)),
        );
        let children = facts
            .children(suggested_only)
            .into_iter()
            .map(|c| (c.room_id, c.via))
            .collect();
        return Ok(Some(Found {
            entry,
            children,
            inaccessible: HashSet::new(),
        }));
    }
    if rooms.is_resident(room_id).await? {
        // We are in it and the user may not see it: no other server is asked.
        return Ok(None);
    }
    let known = remote_children.remove(room_id).filter(|summary| {
        summary.get("room_type").and_then(Value::as_str) != Some("m.space") || at_max_depth
    });
    let (mut entry, inaccessible) = match known {
        Some(summary) => (summary, HashSet::new()),
        None => {
            let Some(remote) = federation
                .remote_hierarchy(room_id, &pending.via, suggested_only)
                .await
            else {
                return Ok(None);
            };
            remote_children.extend(remote.children);
            (remote.room, remote.inaccessible)
        }
    };
    if !rooms
        .user_may_preview_remote(room_id, &entry, Some(user_id))
        .await?
    {
        return Ok(None);
    }
    entry
        .entry("children_state")
        .or_insert_with(|| Value::Array(Vec::new()));
    let children = children_of(&entry);
    Ok(Some(Found {
        entry,
        children,
        inaccessible,
    }))
}

/// A room's preview (`GET /_matrix/client/v1/room_summary/{roomIdOrAlias}`), with the
/// caller's membership when they are logged in (`leave` when they have none).
pub async fn room_summary(
    rooms: &Rooms,
    federation: &Federation,
    user_id: Option<&UserId>,
    room: &RoomOrAliasId,
    via: &[OwnedServerName],
) -> Result<Value> {
    let not_found = || Error::not_found("Room not found or is not accessible");
    let mut via = via.to_vec();
    let room_id: OwnedRoomId = match <&RoomId>::try_from(room) {
        Ok(room_id) => room_id.to_owned(),
        Err(alias) => {
            let alias: &RoomAliasId = alias;
            if alias.server_name() == federation.client.origin() {
                rooms.resolve_room(room).await?
            } else {
                let (room_id, servers) = federation.remote_alias(alias).await?;
                via.extend(servers);
                room_id
            }
        }
    };
    let mut summary = match rooms.facts_for_user(&room_id, user_id).await? {
        Some(facts) => facts.summary(),
        None if rooms.is_resident(&room_id).await? => return Err(not_found()),
        None => {
            if let Some(server) = room_id.server_name() {
                via.push(server.to_owned());
            }
            let mut seen = HashSet::new();
            via.retain(|server| seen.insert(server.clone()));
            let remote = federation
                .remote_hierarchy(&room_id, &via, false)
                .await
                .ok_or_else(not_found)?;
            if !rooms
                .user_may_preview_remote(&room_id, &remote.room, user_id)
                .await?
            {
                return Err(not_found());
            }
            let mut summary = remote.room;
            summary.remove("children_state");
            summary
        }
    };
    if let Some(user_id) = user_id {
        let membership = rooms
            .membership(&room_id, user_id)
            .await?
            .unwrap_or_else(|| "leave".to_owned());
        summary.insert("membership".to_owned(), json!(membership));
    }
    Ok(Value::Object(summary))
}

#[cfg(test)]
mod tests {
    use ruma::room_id;

    use super::{pagination_token, parse_token, HierarchyRequest};

    fn request(max_depth: Option<u64>, suggested_only: bool) -> HierarchyRequest<'static> {
        HierarchyRequest {
            room_id: room_id!("!space:example.org"),
            from: None,
            limit: None,
            max_depth,
            suggested_only,
        }
    }

    #[test]
    fn a_token_is_good_only_with_the_parameters_it_was_made_with() {
        let first = request(Some(3), true);
        let token = pagination_token(7, &first);
        assert_eq!(parse_token(&token, &first).unwrap(), 7);
        assert!(parse_token(&token, &request(Some(3), false)).is_err());
        assert!(parse_token(&token, &request(None, true)).is_err());
        assert!(parse_token(&token, &request(Some(4), true)).is_err());
        for bad in ["", "7", "x_1_3", "-1_1_3", "7_1_3_", "07_1_3"] {
            assert!(parse_token(bad, &first).is_err(), "{bad}");
        }
        let unbounded = request(None, false);
        assert_eq!(
            parse_token(&pagination_token(0, &unbounded), &unbounded).unwrap(),
            0
        );
    }
}
