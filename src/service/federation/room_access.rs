//! Who may read what of a room over federation. Every room-scoped federation read (`/event`,
//! `/state`, `/state_ids`, `/event_auth`, `/backfill`, `/get_missing_events`) takes its rules
//! from here, and so should the ones to come (`/hierarchy`, `/timestamp_to_event`, joins).
//! FEDERATION.md §1.5 and §1.7, invariants 4 to 6 and 9:
//!
//! - **The room.** The origin must pass the room's server ACL (`m.room.server_acl` in the
//!   current state) and have a joined member now, or the room must be `world_readable` now;
//!   otherwise 403 `M_FORBIDDEN`. A room this server does not know gets the same 403, so the
//!   answer does not tell which rooms exist. Synapse asks for a joined member only; a
//!   world-readable room is readable by anyone, which is what tuwunel settled on (a04ff7d4a).
//! - **The event.** It must be stored in full ([`event_graph::SERVABLE`]) and belong to the room of the
//!   path, otherwise 404 `M_NOT_FOUND`: the answer for an unknown event, so nobody learns
//!   which room an event ID belongs to (tuwunel's 39c0d3621 served other rooms' events).
//! - **History visibility.** The Client-Server API's rules ("Server behaviour" of the history
//!   visibility module), with "the user" read as "some user of the origin server", judged on
//!   the state at the event ([`RoomAccess::may_see`]). An event the origin may not see is
//!   served **redacted**, not withheld: pruned by the room version's redaction rules, so its
//!   ID, graph edges, hashes and signatures stay and its content goes. Synapse does the same
//!   (`filter_events_for_server` with `redact=True` for `/event`, `/backfill` and
//!   `/get_missing_events`): the asker keeps a DAG without holes whose signatures it can
//!   check, and learns nothing the rules hide.
//! - **State and auth chains** are served whole, as Synapse serves them: a server in the room
//!   needs them to authorise events, and the current state is what it gets on joining anyway.
//! - **Format.** The stored PDU, signed, as it is (a redacted event is stored pruned already),
//!   without `unsigned`: nothing local (transaction IDs, relations, ages) leaves the server.

use std::collections::{HashMap, HashSet};

use diesel_async::AsyncPgConnection;
use ruma::{
    events::room::server_acl::RoomServerAclEventContent, room_version_rules::RoomVersionRules,
    EventId, OwnedRoomId, OwnedServerName, RoomId, ServerName, UserId,
};
use serde_json::{value::RawValue as RawJsonValue, Value};

use crate::{
    error::{Error, Result},
    service::rooms::{pdu::prune, versions::rules_for},
    storage::{
        event_graph, room_servers,
        rooms::{self as rooms_store, EventRow},
        state::{self as state_store, StateIds},
    },
};

const HISTORY_VISIBILITY: &str = "m.room.history_visibility";
const MEMBER: &str = "m.room.member";
const SERVER_ACL: &str = "m.room.server_acl";

/// A history visibility setting, most open first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum HistoryVisibility {
    WorldReadable,
    Shared,
    Invited,
    Joined,
}

impl HistoryVisibility {
    /// The setting an `m.room.history_visibility` content makes; a missing or unknown value
    /// is `shared`, as the spec says.
    fn of(content: Option<&Value>) -> Self {
        match content
            .and_then(|c| c.get("history_visibility"))
            .and_then(Value::as_str)
        {
            Some("world_readable") => Self::WorldReadable,
            Some("invited") => Self::Invited,
            Some("joined") => Self::Joined,
            _ => Self::Shared,
        }
    }
}

/// The strongest membership any user of the origin holds in a state, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum OriginMembership {
    Absent,
    Invite,
    Join,
}

impl OriginMembership {
    fn of(content: Option<&Value>) -> Self {
        match content
            .and_then(|c| c.get("membership"))
            .and_then(Value::as_str)
        {
            Some("join") => Self::Join,
            Some("invite") => Self::Invite,
            _ => Self::Absent,
        }
    }
}

/// Where the state before an event comes from.
enum Before {
    /// Nothing: the event has no `prev_events` (the create event).
    Empty,
    /// A stored state group.
    Group(i64),
    /// Its prev events' states differ, or some are not stored: only state resolution can
    /// tell.
    Unknown,
}

/// Whether a room's server ACL (the content of its `m.room.server_acl`) admits `server`.
/// Read leniently, as Synapse reads it: a non-boolean `allow_ip_literals` counts as true, a
/// missing or malformed list as empty, entries that are not strings are skipped. Matching is
/// ruma's: case-insensitive globs (`*`, `?`) against the host, the port ignored.
pub fn acl_allows(content: &Value, server: &ServerName) -> bool {
    let list = |key: &str| -> Vec<String> {
        content
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    };
    let allow_ip_literals = content
        .get("allow_ip_literals")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    RoomServerAclEventContent::new(allow_ip_literals, list("allow"), list("deny"))
        .is_allowed(server)
}

/// A PDU in federation form: as stored, without `unsigned`.
pub fn federation_pdu(pdu: &Value) -> Result<Box<RawJsonValue>> {
    let mut pdu = pdu.clone();
    if let Some(object) = pdu.as_object_mut() {
        object.remove("unsigned");
    }
    serde_json::value::to_raw_value(&pdu).map_err(Error::internal)
}

/// What one origin server may read of one room, for one request. Built by [`RoomAccess::open`]
/// (the room checks) and asked about events (the event and visibility checks); it caches the
/// state it reads.
pub struct RoomAccess {
    origin: OwnedServerName,
    room_id: OwnedRoomId,
    rules: RoomVersionRules,
    /// Whether a user of the origin is joined now.
    origin_joined: bool,
    states: HashMap<i64, StateIds>,
    /// Contents of state events read, by event ID.
    contents: HashMap<String, Option<Value>>,
    memberships: HashMap<i64, OriginMembership>,
    /// The position of the latest join of a user of the origin, once looked up.
    last_join: Option<Option<i64>>,
}

impl RoomAccess {
    /// Checks that `origin` may read `room_id`: the server ACL admits it (else 403) and it
    /// has a joined member, or the room is world-readable (else 403, unknown rooms too).
    pub async fn open(
        conn: &AsyncPgConnection,
        origin: &ServerName,
        room_id: &RoomId,
    ) -> Result<Self> {
        let not_in_room = || Error::forbidden(format!("{origin} is not in room {room_id}"));
        let Some(row) = rooms_store::get_room(conn, room_id.as_str()).await? else {
            return Err(not_in_room());
        };
        let rules = rules_for(&row.room_version)?;
        let room = room_id.as_str();
        let (acl, visibility, joined) = tokio::try_join!(
            rooms_store::get_current_state_event(conn, room, SERVER_ACL, ""),
            rooms_store::get_current_state_event(conn, room, HISTORY_VISIBILITY, ""),
            room_servers::get_joined_users_like_server(conn, room, origin.as_str()),
        )?;
        if let Some(acl) = acl {
            let content = acl.pdu.get("content").cloned().unwrap_or_default();
            if !acl_allows(&content, origin) {
                return Err(Error::forbidden(format!(
                    "{origin} is denied by the server ACL of room {room_id}"
                )));
            }
        }
        let origin_joined = joined.iter().any(|user| is_user_of(user, origin));
        let visibility =
            HistoryVisibility::of(visibility.as_ref().and_then(|e| e.pdu.get("content")));
        if !origin_joined && visibility != HistoryVisibility::WorldReadable {
            return Err(not_in_room());
        }
        Ok(RoomAccess {
            origin: origin.to_owned(),
            room_id: room_id.to_owned(),
            rules,
            origin_joined,
            states: HashMap::new(),
            contents: HashMap::new(),
            memberships: HashMap::new(),
            last_join: None,
        })
    }

    /// For `/event`, which names no room: the event (404 when unknown or not servable) and
    /// the access to its room (the checks of [`RoomAccess::open`]).
    pub async fn open_for_event(
        conn: &AsyncPgConnection,
        origin: &ServerName,
        event_id: &EventId,
    ) -> Result<(Self, EventRow)> {
        let event = event_graph::get_servable_event(conn, event_id.as_str())
            .await?
            .ok_or_else(event_not_found)?;
        let room_id = RoomId::parse(&event.room_id).map_err(Error::internal)?;
        Ok((Self::open(conn, origin, &room_id).await?, event))
    }

    /// The room.
    pub fn room_id(&self) -> &RoomId {
        &self.room_id
    }

    /// An event of the room that may be served; 404 `M_NOT_FOUND` for an unknown event and an
    /// event of another room alike.
    pub async fn event(&self, conn: &AsyncPgConnection, event_id: &EventId) -> Result<EventRow> {
        event_graph::get_servable_room_event(conn, self.room_id.as_str(), event_id.as_str())
            .await?
            .ok_or_else(event_not_found)
    }

    /// The event in federation form for the origin: whole when it may see it, redacted
    /// otherwise (see the module doc).
    pub async fn serve(
        &mut self,
        conn: &AsyncPgConnection,
        event: &EventRow,
    ) -> Result<Box<RawJsonValue>> {
        if self.may_see(conn, event).await? {
            federation_pdu(&event.pdu)
        } else {
            federation_pdu(&prune(&event.pdu, &self.rules))
        }
    }

    /// The state before `event`, `(type, state_key) -> event ID`. 404 `M_NOT_FOUND` when the
    /// stored state cannot tell it (its prev events' states differ: resolving them is state
    /// resolution's job), as Synapse answers for an event whose state it does not know.
    pub async fn state_before(
        &mut self,
        conn: &AsyncPgConnection,
        event: &EventRow,
    ) -> Result<StateIds> {
        match self.before(conn, event).await? {
            Before::Empty => Ok(StateIds::new()),
            Before::Group(group) => Ok(self.state(conn, group).await?.clone()),
            Before::Unknown => Err(Error::not_found(format!(
                "The state before {} is not known",
                event.event_id
            ))),
        }
    }

    /// Whether the origin may see `event`, by the spec's rules judged on the state at the event
    /// (the state after it, as for local readers), "the user" being any user of the origin:
    /// 1. `world_readable`: allow;
    /// 2. a user of the origin was joined: allow;
    /// 3. `shared`, and a user of the origin joined at any point after the event: allow (a
    ///    user joined now is joined after it, or was joined at it);
    /// 4. a user of the origin was invited and the setting is `invited`: allow;
    /// 5. otherwise deny.
    ///
    /// For an `m.room.history_visibility` event the more open of the settings before and after
    /// it counts, and for a member event of a user of the origin the stronger of the
    /// memberships before and after it, as the spec says for those events.
    pub async fn may_see(&mut self, conn: &AsyncPgConnection, event: &EventRow) -> Result<bool> {
        // An outlier (an auth event fetched on its own) has no state to judge it by; Synapse
        // serves them, and they are what other servers need to check the room's events.
        let Some(after) = event.state_group else {
            return Ok(true);
        };
        let own_member = event.event_type == MEMBER
            && event
                .state_key
                .as_deref()
                .is_some_and(|user| is_user_of(user, &self.origin));
        let before = match event.event_type == HISTORY_VISIBILITY || own_member {
            true => Some(self.before(conn, event).await?),
            false => None,
        };
        let mut visibility = self.history_visibility(conn, after).await?;
        if event.event_type == HISTORY_VISIBILITY {
            let earlier = match before {
                Some(Before::Group(group)) => self.history_visibility(conn, group).await?,
                Some(Before::Empty) => HistoryVisibility::Shared,
                _ => visibility,
            };
            visibility = visibility.min(earlier);
        }
        if visibility == HistoryVisibility::WorldReadable {
            return Ok(true);
        }
        if visibility == HistoryVisibility::Shared && self.origin_joined {
            return Ok(true);
        }
        let mut membership = self.origin_membership(conn, after).await?;
        if own_member {
            if let Some(Before::Group(group)) = before {
                membership = membership.max(self.origin_membership(conn, group).await?);
            }
        }
        match (membership, visibility) {
            (OriginMembership::Join, _) => Ok(true),
            (_, HistoryVisibility::Shared) => self.joined_after(conn, event.stream_ordering).await,
            (OriginMembership::Invite, HistoryVisibility::Invited) => Ok(true),
            _ => Ok(false),
        }
    }

    /// Where the state before `event` comes from: for an event that is not a state event,
    /// the state after it (it changes nothing); for a state event, the state after its prev
    /// events when they agree.
    async fn before(&mut self, conn: &AsyncPgConnection, event: &EventRow) -> Result<Before> {
        if event.state_key.is_none() {
            return Ok(event.state_group.map_or(Before::Unknown, Before::Group));
        }
        let prevs: Vec<String> = event_graph::prev_event_ids(&event.pdu)
            .into_iter()
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        if prevs.is_empty() {
            return Ok(Before::Empty);
        }
        let groups = event_graph::get_state_groups(conn, self.room_id.as_str(), &prevs).await?;
        let distinct: HashSet<i64> = groups.iter().map(|(_, group)| *group).collect();
        Ok(match (groups.len() == prevs.len(), distinct.len()) {
            (true, 1) => Before::Group(groups[0].1),
            _ => Before::Unknown,
        })
    }

    /// A state group's state (read once per request).
    async fn state(&mut self, conn: &AsyncPgConnection, group: i64) -> Result<&StateIds> {
        if let std::collections::hash_map::Entry::Vacant(entry) = self.states.entry(group) {
            entry.insert(state_store::get_state_ids(conn, group).await?);
        }
        Ok(&self.states[&group])
    }

    /// The history visibility in a state group.
    async fn history_visibility(
        &mut self,
        conn: &AsyncPgConnection,
        group: i64,
    ) -> Result<HistoryVisibility> {
        let key = (HISTORY_VISIBILITY.to_owned(), String::new());
        let Some(event_id) = self.state(conn, group).await?.get(&key).cloned() else {
            return Ok(HistoryVisibility::Shared);
        };
        let contents = self.contents(conn, std::slice::from_ref(&event_id)).await?;
        Ok(HistoryVisibility::of(contents[&event_id].as_ref()))
    }

    /// The strongest membership a user of the origin holds in a state group.
    async fn origin_membership(
        &mut self,
        conn: &AsyncPgConnection,
        group: i64,
    ) -> Result<OriginMembership> {
        if let Some(membership) = self.memberships.get(&group) {
            return Ok(*membership);
        }
        let origin = self.origin.clone();
        let member_events: Vec<String> = self
            .state(conn, group)
            .await?
            .iter()
            .filter(|((kind, user), _)| kind == MEMBER && is_user_of(user, &origin))
            .map(|(_, event_id)| event_id.clone())
            .collect();
        let contents = self.contents(conn, &member_events).await?;
        let membership = member_events
            .iter()
            .map(|id| OriginMembership::of(contents[id].as_ref()))
            .max()
            .unwrap_or(OriginMembership::Absent);
        self.memberships.insert(group, membership);
        Ok(membership)
    }

    /// The contents of state events, read once per request (a missing event has none).
    async fn contents(
        &mut self,
        conn: &AsyncPgConnection,
        event_ids: &[String],
    ) -> Result<&HashMap<String, Option<Value>>> {
        let missing: Vec<String> = event_ids
            .iter()
            .filter(|id| !self.contents.contains_key(*id))
            .cloned()
            .collect();
        if !missing.is_empty() {
            for row in rooms_store::get_events(conn, &missing).await? {
                self.contents
                    .insert(row.event_id.clone(), row.pdu.get("content").cloned());
            }
            for id in missing {
                self.contents.entry(id).or_insert(None);
            }
        }
        Ok(&self.contents)
    }

    /// Whether a user of the origin joined the room after stream position `position`.
    async fn joined_after(&mut self, conn: &AsyncPgConnection, position: i64) -> Result<bool> {
        if self.last_join.is_none() {
            let joins = room_servers::get_last_joins_like_server(
                conn,
                self.room_id.as_str(),
                self.origin.as_str(),
            )
            .await?;
            let last = joins
                .into_iter()
                .filter(|(user, _)| is_user_of(user, &self.origin))
                .map(|(_, position)| position)
                .max();
            self.last_join = Some(last);
        }
        Ok(self.last_join.flatten().is_some_and(|join| join > position))
    }
}

/// Whether `user` is a user ID of `server`.
fn is_user_of(user: &str, server: &ServerName) -> bool {
    UserId::parse(user).is_ok_and(|user| user.server_name() == server)
}

/// 404 `M_NOT_FOUND` for an event that is unknown, not servable ([`event_graph::SERVABLE`]) or of another
/// room.
fn event_not_found() -> Error {
    Error::not_found("Event not found")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn server(name: &str) -> OwnedServerName {
        ServerName::parse(name).unwrap()
    }

    #[test]
    fn an_acl_matches_globs_on_the_host_without_the_port() {
        let acl =
            json!({ "allow": ["*.example.org", "good.example"], "deny": ["bad?.example.org"] });
        assert!(acl_allows(&acl, &server("a.example.org:8448")));
        assert!(acl_allows(&acl, &server("GOOD.example")));
        assert!(!acl_allows(&acl, &server("bad1.example.org")));
        assert!(acl_allows(&acl, &server("bad12.example.org")));
        assert!(!acl_allows(&acl, &server("other.example")));
    }

    #[test]
    fn an_acl_denies_ip_literals_only_when_told_to() {
        let open = json!({ "allow": ["*"] });
        assert!(acl_allows(&open, &server("127.0.0.1:8448")));
        assert!(acl_allows(&open, &server("[::1]:8448")));
        let closed = json!({ "allow": ["*"], "allow_ip_literals": false });
        assert!(!acl_allows(&closed, &server("127.0.0.1:8448")));
        assert!(!acl_allows(&closed, &server("[::1]")));
        assert!(acl_allows(&closed, &server("example.org")));
    }

    #[test]
    fn a_malformed_acl_is_read_leniently() {
        // No allow list allows nobody; a malformed flag counts as true; bad entries are skipped.
        assert!(!acl_allows(&json!({}), &server("example.org")));
        let acl = json!({ "allow": [1, "*"], "deny": "example.org", "allow_ip_literals": "no" });
        assert!(acl_allows(&acl, &server("example.org")));
        assert!(acl_allows(&acl, &server("127.0.0.1")));
    }

    #[test]
    fn unknown_history_visibility_is_shared() {
        let of =
            |value: Value| HistoryVisibility::of(Some(&json!({ "history_visibility": value })));
        assert_eq!(
            of(json!("world_readable")),
            HistoryVisibility::WorldReadable
        );
        assert_eq!(of(json!("joined")), HistoryVisibility::Joined);
        assert_eq!(of(json!("something")), HistoryVisibility::Shared);
        assert_eq!(of(json!(3)), HistoryVisibility::Shared);
        assert_eq!(HistoryVisibility::of(None), HistoryVisibility::Shared);
    }

    #[test]
    fn the_federation_form_drops_unsigned() {
        let pdu = json!({ "type": "m.room.message", "unsigned": { "transaction_id": "t" } });
        let served: Value = serde_json::from_str(federation_pdu(&pdu).unwrap().get()).unwrap();
        assert_eq!(served, json!({ "type": "m.room.message" }));
    }
}
