//! Room summaries: what a room's current state says about it (name, topic, join rule, ...),
//! who may preview a room without being in it, and a space's children. `/hierarchy`,
//! `/room_summary` and the federation `/hierarchy` all take their rules from here.
//!
//! **Who may preview a room** (the spec's rule for the space hierarchy and room summaries,
//! as Synapse applies it): anyone when its join rule is `public`, `knock` or
//! `knock_restricted`, or its history is `world_readable`; otherwise a user who is joined or
//! invited, or, in a `restricted` room, joined to one of the rooms its join rule allows. A
//! server (federation) may when the room's server ACL admits it and, beyond the open cases,
//! one of its users is joined or invited, or joined to an allowed room. Everybody else learns
//! nothing: the room is left out, or answered as unknown.

use std::collections::HashMap;

use diesel_async::AsyncPgConnection;
use ruma::{OwnedRoomId, OwnedServerName, RoomId, ServerName, UserId};
use serde_json::{json, Map, Value};

use super::Rooms;
use crate::{
    error::{Error, Result},
    service::federation::room_access::acl_allows,
    storage::{
        memberships as membership_store,
        rooms::{self as store, EventRow},
        summaries,
    },
};

/// The state event type of a space's children.
pub const SPACE_CHILD: &str = "m.space.child";

/// The state a summary is made of, besides the space children.
const SUMMARY_STATE: &[&str] = &[
    "m.room.create",
    "m.room.name",
    "m.room.topic",
    "m.room.avatar",
    "m.room.canonical_alias",
    "m.room.join_rules",
    "m.room.history_visibility",
    "m.room.guest_access",
    "m.room.encryption",
    "m.room.server_acl",
];

/// Most children of one space the federation `/hierarchy` summarises (Synapse's limit).
pub const MAX_CHILDREN: usize = 50;

/// Longest `order` of an `m.space.child` that counts (the spec's rule).
const MAX_ORDER_LENGTH: usize = 50;

/// A room's current state, as far as its summary needs it.
pub struct RoomFacts {
    /// The room.
    pub room_id: OwnedRoomId,
    room_version: String,
    joined_members: i64,
    /// Content of each summary state event, by type (all have the empty state key).
    state: HashMap<String, Value>,
    /// The `m.space.child` events with a usable `via`, in the spec's order.
    children: Vec<EventRow>,
}

/// One child of a space: the room and the servers to reach it through.
pub struct SpaceChild {
    /// The child room.
    pub room_id: OwnedRoomId,
    /// Servers that may know it.
    pub via: Vec<OwnedServerName>,
}

/// Whether an `m.space.child` content names servers (one without is a removed child).
fn has_valid_via(content: &Value) -> bool {
    match content.get("via").and_then(Value::as_array) {
        Some(via) => !via.is_empty() && via.iter().all(Value::is_string),
        None => false,
    }
}

/// Whether an `m.space.child` content marks the child as suggested.
fn is_suggested(content: &Value) -> bool {
    content.get("suggested").and_then(Value::as_bool) == Some(true)
}

/// The spec's order of a space's children: by a valid `order` (those without come last),
/// then by the event's `origin_server_ts`, then by room ID.
fn child_order(event: &EventRow) -> (bool, String, i64, String) {
    let order = event
        .pdu
        .pointer("/content/order")
        .and_then(Value::as_str)
        .filter(|o| o.len() <= MAX_ORDER_LENGTH && o.chars().all(|c| (' '..='~').contains(&c)));
    (
        order.is_none(),
        order.unwrap_or_default().to_owned(),
        event
            .pdu
            .get("origin_server_ts")
            .and_then(Value::as_i64)
            .unwrap_or(0),
        event.state_key.clone().unwrap_or_default(),
    )
}

/// The via servers of an `m.space.child` content (entries that are not server names skipped).
pub fn via_of(content: &Value) -> Vec<OwnedServerName> {
    content
        .get("via")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter_map(|s| ServerName::parse(s).ok())
        .collect()
}

impl RoomFacts {
    fn content(&self, kind: &str) -> Option<&Value> {
        self.state.get(kind)
    }

    fn string(&self, kind: &str, field: &str) -> Option<&str> {
        self.content(kind)?.get(field)?.as_str()
    }

    /// The join rule (`invite` when the room has none, as the auth rules read it).
    pub fn join_rule(&self) -> &str {
        self.string("m.room.join_rules", "join_rule")
            .unwrap_or("invite")
    }

    /// Whether the join rule lets anyone see the room: `public`, `knock`, `knock_restricted`.
    pub fn is_open(&self) -> bool {
        matches!(self.join_rule(), "public" | "knock" | "knock_restricted")
    }

    /// Whether the history is `world_readable`.
    pub fn world_readable(&self) -> bool {
        self.string("m.room.history_visibility", "history_visibility") == Some("world_readable")
    }

    /// The rooms a `restricted` (or `knock_restricted`) join rule lets members of join from.
    pub fn allowed_room_ids(&self) -> Vec<String> {
        if !matches!(self.join_rule(), "restricted" | "knock_restricted") {
            return Vec::new();
        }
        self.content("m.room.join_rules")
            .and_then(|c| c.get("allow"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|entry| entry.get("type").and_then(Value::as_str) == Some("m.room_membership"))
            .filter_map(|entry| entry.get("room_id").and_then(Value::as_str))
            .filter(|id| RoomId::parse(id).is_ok())
            .map(str::to_owned)
            .collect()
    }

    /// Whether the room is a space (`type: m.space` in its create event).
    pub fn is_space(&self) -> bool {
        self.string("m.room.create", "type") == Some("m.space")
    }

    /// Whether the room's server ACL admits `server`.
    pub fn acl_allows(&self, server: &ServerName) -> bool {
        self.content("m.room.server_acl")
            .is_none_or(|acl| acl_allows(acl, server))
    }

    /// The summary (the spec's `RoomSummary`): fields the room does not set are left out.
    pub fn summary(&self) -> Map<String, Value> {
        let mut entry = json!({
            "room_id": self.room_id,
            "num_joined_members": self.joined_members,
            "join_rule": self.join_rule(),
            "world_readable": self.world_readable(),
            "guest_can_join": self.string("m.room.guest_access", "guest_access") == Some("can_join"),
            "room_version": self.room_version,
        });
        let optional = [
            ("name", self.string("m.room.name", "name")),
            ("topic", self.string("m.room.topic", "topic")),
            ("avatar_url", self.string("m.room.avatar", "url")),
            (
                "canonical_alias",
                self.string("m.room.canonical_alias", "alias"),
            ),
            ("room_type", self.string("m.room.create", "type")),
            ("encryption", self.string("m.room.encryption", "algorithm")),
        ];
        for (key, value) in optional {
            if let Some(value) = value.filter(|v| !v.is_empty()) {
                entry[key] = json!(value);
            }
        }
        let allowed = self.allowed_room_ids();
        if !allowed.is_empty() {
            entry["allowed_room_ids"] = json!(allowed);
        }
        match entry {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    fn children_events(&self, suggested_only: bool) -> impl Iterator<Item = &EventRow> {
        self.children
            .iter()
            .filter(move |e| !suggested_only || e.pdu.get("content").is_some_and(is_suggested))
    }

    /// The space's children as stripped state events with `origin_server_ts` (the
    /// hierarchy's `children_state`); none for a room that is not a space.
    pub fn children_state(&self, suggested_only: bool) -> Vec<Value> {
        if !self.is_space() {
            return Vec::new();
        }
        self.children_events(suggested_only)
            .map(|e| {
                json!({
                    "type": SPACE_CHILD,
                    "state_key": e.state_key,
                    "content": e.pdu.get("content"),
                    "sender": e.sender,
                    "origin_server_ts": e.pdu.get("origin_server_ts"),
                })
            })
            .collect()
    }

    /// The space's children in order, with their via servers; none for a room that is not a
    /// space.
    pub fn children(&self, suggested_only: bool) -> Vec<SpaceChild> {
        if !self.is_space() {
            return Vec::new();
        }
        self.children_events(suggested_only)
            .filter_map(|e| {
                Some(SpaceChild {
                    room_id: RoomId::parse(e.state_key.as_deref()?).ok()?,
                    via: via_of(e.pdu.get("content")?),
                })
            })
            .collect()
    }
}

impl Rooms {
    /// The user's current membership in a room, if any.
    pub async fn membership(&self, room_id: &RoomId, user_id: &UserId) -> Result<Option<String>> {
        let conn = self.db.conn().await?;
        Ok(
            membership_store::get_membership(&conn, room_id.as_str(), user_id.as_str())
                .await?
                .map(|(membership, _)| membership),
        )
    }

    /// Who invited the user to a room with `is_direct: true`, while that invite is their
    /// current membership (what joining a DM adds to `m.direct`).
    pub async fn direct_inviter(
        &self,
        room_id: &RoomId,
        user_id: &UserId,
    ) -> Result<Option<ruma::OwnedUserId>> {
        let conn = self.db.conn().await?;
        let Some((membership, event_id)) =
            membership_store::get_membership(&conn, room_id.as_str(), user_id.as_str()).await?
        else {
            return Ok(None);
        };
        if membership != "invite" {
            return Ok(None);
        }
        Ok(store::get_state_event(&conn, &event_id)
            .await?
            .filter(|row| row.pdu.pointer("/content/is_direct") == Some(&Value::Bool(true)))
            .and_then(|row| UserId::parse(row.sender).ok()))
    }

    /// The facts of a room this server has the state of; `None` for one it has not.
    pub(crate) async fn room_facts(
        &self,
        conn: &AsyncPgConnection,
        room_id: &RoomId,
    ) -> Result<Option<RoomFacts>> {
        let Some(room) = store::get_room(conn, room_id.as_str()).await? else {
            return Ok(None);
        };
        let ids = store::get_current_state_ids(conn, room_id.as_str()).await?;
        let wanted: Vec<String> = ids
            .into_iter()
            .filter(|(kind, key, _)| {
                (key.is_empty() && SUMMARY_STATE.contains(&kind.as_str())) || kind == SPACE_CHILD
            })
            .map(|(_, _, id)| id)
            .collect();
        let mut state = HashMap::new();
        let mut children = Vec::new();
        for row in store::get_state_events(conn, &wanted).await? {
            let content = row.pdu.get("content").cloned().unwrap_or_default();
            if row.event_type == SPACE_CHILD {
                if has_valid_via(&content) {
                    children.push(row);
                }
            } else {
                state.insert(row.event_type.clone(), content);
            }
        }
        children.sort_by_key(child_order);
        Ok(Some(RoomFacts {
            room_id: room_id.to_owned(),
            room_version: room.room_version,
            joined_members: summaries::count_members(conn, room_id.as_str(), "join").await?,
            state,
            children,
        }))
    }

    /// Whether a user (or an anonymous caller, `None`) may preview a room (module docs).
    pub(crate) async fn user_may_preview(
        &self,
        conn: &AsyncPgConnection,
        facts: &RoomFacts,
        user_id: Option<&UserId>,
    ) -> Result<bool> {
        if facts.is_open() || facts.world_readable() {
            return Ok(true);
        }
        let Some(user_id) = user_id else {
            return Ok(false);
        };
        if let Some((membership, _)) =
            membership_store::get_membership(conn, facts.room_id.as_str(), user_id.as_str()).await?
        {
            if membership == "join" || membership == "invite" {
                return Ok(true);
            }
        }
        self.joined_any(conn, user_id, &facts.allowed_room_ids())
            .await
    }

    /// Whether the user is joined to any of `rooms`.
    pub(crate) async fn joined_any(
        &self,
        conn: &AsyncPgConnection,
        user_id: &UserId,
        rooms: &[String],
    ) -> Result<bool> {
        for room in rooms {
            if membership_store::get_membership(conn, room, user_id.as_str())
                .await?
                .is_some_and(|(m, _)| m == "join")
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether another server may preview a room (module docs).
    async fn server_may_preview(
        &self,
        conn: &AsyncPgConnection,
        facts: &RoomFacts,
        origin: &ServerName,
    ) -> Result<bool> {
        if !facts.acl_allows(origin) {
            return Ok(false);
        }
        if facts.is_open() || facts.world_readable() {
            return Ok(true);
        }
        let room = facts.room_id.as_str();
        if summaries::server_has_member(conn, room, origin.as_str(), &["join", "invite"]).await? {
            return Ok(true);
        }
        for allowed in facts.allowed_room_ids() {
            if summaries::server_has_member(conn, &allowed, origin.as_str(), &["join"]).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The facts of a room this server is in, when the user (or anonymous caller) may
    /// preview it; `None` for a room we are not in or they may not see.
    pub async fn facts_for_user(
        &self,
        room_id: &RoomId,
        user_id: Option<&UserId>,
    ) -> Result<Option<RoomFacts>> {
        if !self.is_resident(room_id).await? {
            return Ok(None);
        }
        let conn = self.db.conn().await?;
        let Some(facts) = self.room_facts(&conn, room_id).await? else {
            return Ok(None);
        };
        Ok(self
            .user_may_preview(&conn, &facts, user_id)
            .await?
            .then_some(facts))
    }

    /// Whether a summary another server gave of a room lets the user see it: open or
    /// world-readable, the user in one of its allowed rooms, or joined or invited here.
    pub async fn user_may_preview_remote(
        &self,
        room_id: &RoomId,
        summary: &Map<String, Value>,
        user_id: Option<&UserId>,
    ) -> Result<bool> {
        let join_rule = summary
            .get("join_rule")
            .and_then(Value::as_str)
            .unwrap_or("public");
        if matches!(join_rule, "public" | "knock" | "knock_restricted")
            || summary.get("world_readable") == Some(&Value::Bool(true))
        {
            return Ok(true);
        }
        let Some(user_id) = user_id else {
            return Ok(false);
        };
        let allowed: Vec<String> = summary
            .get("allowed_room_ids")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect();
        let conn = self.db.conn().await?;
        if self.joined_any(&conn, user_id, &allowed).await? {
            return Ok(true);
        }
        Ok(
            membership_store::get_membership(&conn, room_id.as_str(), user_id.as_str())
                .await?
                .is_some_and(|(m, _)| m == "join" || m == "invite"),
        )
    }

    /// `GET /_matrix/federation/v1/hierarchy/{roomId}`: the room with its children's events,
    /// the children we are in that the origin may preview (without their own children), and
    /// those it may not. A room we are not in, or one the origin may not preview (its ACL
    /// included), is 404 `M_NOT_FOUND`, as Synapse answers.
    pub async fn federation_hierarchy(
        &self,
        origin: &ServerName,
        room_id: &RoomId,
        suggested_only: bool,
    ) -> Result<Value> {
        let unknown = || Error::not_found(format!("Unknown room: {room_id}"));
        if !self.is_resident(room_id).await? {
            return Err(unknown());
        }
        let conn = self.db.conn().await?;
        let facts = self.room_facts(&conn, room_id).await?.ok_or_else(unknown)?;
        if !self.server_may_preview(&conn, &facts, origin).await? {
            return Err(unknown());
        }
        let mut children = Vec::new();
        let mut inaccessible = Vec::new();
        for child in facts
            .children(suggested_only)
            .into_iter()
            .take(MAX_CHILDREN)
        {
            if !self.is_resident(&child.room_id).await? {
                continue;
            }
            let Some(child_facts) = self.room_facts(&conn, &child.room_id).await? else {
                continue;
            };
            if self.server_may_preview(&conn, &child_facts, origin).await? {
                children.push(Value::Object(child_facts.summary()));
            } else {
                inaccessible.push(child.room_id);
            }
        }
        let mut room = facts.summary();
        room.insert(
            "children_state".to_owned(),
            Value::Array(facts.children_state(suggested_only)),
        );
        Ok(json!({
            "room": room,
            "children": children,
            "inaccessible_children": inaccessible,
        }))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{child_order, has_valid_via};
    use crate::storage::rooms::EventRow;

    fn child(state_key: &str, order: Option<&str>, ts: i64) -> EventRow {
        let mut content = json!({ "via": ["example.org"] });
        if let Some(order) = order {
            content["order"] = json!(order);
        }
        EventRow {
            event_id: format!("${state_key}"),
            room_id: "!space:example.org".into(),
            stream_ordering: 1,
            depth: 1,
            sender: "@a:example.org".into(),
            event_type: "m.space.child".into(),
            state_key: Some(state_key.into()),
            pdu: json!({ "content": content, "origin_server_ts": ts }),
            state_group: Some(1),
            redacted_by: None,
        }
    }

    #[test]
    fn children_sort_by_valid_order_then_timestamp_then_room_id() {
        let too_long = "x".repeat(51);
        let mut children = [
            child("!e", None, 1),
            child("!d", Some(&too_long), 2),
            child("!c", Some("b"), 9),
            child("!b", Some("a"), 9),
            child("!a", Some("\u{7f}"), 0),
            child("!f", None, 1),
        ];
        children.sort_by_key(child_order);
        let keys: Vec<_> = children
            .iter()
            .map(|c| c.state_key.clone().unwrap())
            .collect();
        // Orders "a", "b" first; then, without a valid order, by timestamp and room ID.
        assert_eq!(keys, ["!b", "!c", "!a", "!e", "!f", "!d"]);
    }

    #[test]
    fn a_child_needs_a_non_empty_list_of_server_names() {
        assert!(has_valid_via(&json!({ "via": ["example.org"] })));
        assert!(!has_valid_via(&json!({})));
        assert!(!has_valid_via(&json!({ "via": [] })));
        assert!(!has_valid_via(&json!({ "via": "example.org" })));
        assert!(!has_valid_via(&json!({ "via": ["example.org", 5] })));
    }
}
