//! Asking other servers about spaces and rooms we are not in
//! (`GET /_matrix/federation/v1/hierarchy/{roomId}`), for the client `/hierarchy` and
//! `/room_summary`.

use std::collections::HashSet;

use ruma::{api::federation::space::get_hierarchy, OwnedRoomId, OwnedServerName, RoomId};
use serde_json::{Map, Value};

use super::Federation;

/// Most of a room's via servers asked, in turn (Synapse's limit).
const MAX_SERVERS_ASKED: usize = 3;

/// What a server said of a room it is in.
pub struct RemoteHierarchy {
    /// The room's summary with its `children_state`.
    pub room: Map<String, Value>,
    /// Summaries of its children the server is in and we may see, by room ID.
    pub children: Vec<(OwnedRoomId, Map<String, Value>)>,
    /// Children the server says we may not see.
    pub inaccessible: HashSet<OwnedRoomId>,
}

fn to_map(value: impl serde::Serialize) -> Option<Map<String, Value>> {
    match serde_json::to_value(value).ok()? {
        Value::Object(map) => Some(map),
        _ => None,
    }
}

impl Federation {
    /// The room's hierarchy from the first of its via servers (at most three, never us) that
    /// answers; `None` when federation is off or none does.
    pub async fn remote_hierarchy(
        &self,
        room_id: &RoomId,
        via: &[OwnedServerName],
        suggested_only: bool,
    ) -> Option<RemoteHierarchy> {
        if !self.enabled() {
            return None;
        }
        let servers = via
            .iter()
            .filter(|s| **s != self.config.server_name)
            .take(MAX_SERVERS_ASKED);
        for server in servers {
            let mut request = get_hierarchy::v1::Request::new(room_id.to_owned());
            request.suggested_only = suggested_only;
            let response = match self.client.send(server, request).await {
                Ok(response) => response,
                Err(err) => {
                    tracing::info!("hierarchy of {room_id} from {server} failed: {err}");
                    continue;
                }
            };
            if response.room.summary.room_id != room_id {
                tracing::info!("{server} answered the hierarchy of another room than {room_id}");
                continue;
            }
            let Some(mut room) = to_map(&response.room.summary) else {
                continue;
            };
            let children_state: Vec<Value> = response
                .room
                .children_state
                .iter()
                .filter_map(|raw| serde_json::from_str(raw.json().get()).ok())
                .collect();
            // Only summaries of children the room names are kept: a server speaks for the
            // children of its own space, not for any room it likes.
            let named: HashSet<&str> = children_state
                .iter()
                .filter_map(|event| event.get("state_key")?.as_str())
                .collect();
            let children = response
                .children
                .iter()
                .filter(|child| named.contains(child.room_id.as_str()))
                .filter_map(|child| Some((child.room_id.clone(), to_map(child)?)))
                .collect();
            room.insert("children_state".to_owned(), Value::Array(children_state));
            return Some(RemoteHierarchy {
                room,
                children,
                inaccessible: response.inaccessible_children.into_iter().collect(),
            });
        }
        None
    }
}
