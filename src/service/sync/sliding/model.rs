//! The one internal form of a sliding sync request, whatever wire form it came in (the
//! unstable format clients speak or the merged MSC4186's).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use ruma::{OwnedRoomId, OwnedUserId};
use serde::{Deserialize, Serialize};

/// Most lists, room subscriptions, ranges per list and timeline events a request may ask for.
pub const MAX_LISTS: usize = 100;
pub const MAX_SUBSCRIPTIONS: usize = 100;
pub const MAX_RANGES: usize = 10;
pub const MAX_TIMELINE_LIMIT: u64 = 1000;
/// Longest list name and `conn_id`, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// One sliding sync request.
#[derive(Debug, Clone)]
pub struct SlidingRequest {
    /// The syncing user.
    pub user_id: OwnedUserId,
    /// Their device.
    pub device_id: String,
    /// The connection's name (`""` when absent).
    pub conn_id: String,
    /// The position the client processed last (absent: a new connection).
    pub pos: Option<String>,
    /// How long to wait for something to report.
    pub timeout: Duration,
    /// Requested lists by name.
    pub lists: BTreeMap<String, ListRequest>,
    /// Rooms asked for by ID.
    pub subscriptions: BTreeMap<OwnedRoomId, RoomConfig>,
    /// Extensions.
    pub extensions: Extensions,
    /// Echoed back.
    pub txn_id: Option<String>,
}

/// One list.
#[derive(Debug, Clone)]
pub struct ListRequest {
    /// Inclusive `[start, end]` windows; `None`: the whole list.
    pub ranges: Option<Vec<(u64, u64)>>,
    /// What to send of its rooms.
    pub config: RoomConfig,
    /// Which rooms it holds.
    pub filters: ListFilters,
}

/// What to send of a room.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomConfig {
    /// Newest events to send.
    pub timeline_limit: u64,
    /// Which state to send.
    pub required_state: RequiredState,
}

impl RoomConfig {
    /// The config covering both (a room in several lists and subscriptions).
    pub fn combine(&mut self, other: &RoomConfig) {
        self.timeline_limit = self.timeline_limit.max(other.timeline_limit);
        let (mine, theirs) = (&mut self.required_state, &other.required_state);
        mine.entries.extend(theirs.entries.iter().cloned());
        mine.narrowed.extend(theirs.narrowed.iter().cloned());
        mine.lazy_members |= theirs.lazy_members;
    }
}

/// Which state events to send: `(type, state_key)` with `*` for "any", `$ME` already replaced
/// by the user's ID, and whether members are lazy-loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequiredState {
    /// `(type, state_key)` pairs; either may be `*`.
    pub entries: BTreeSet<(String, String)>,
    /// The merged MSC's `include` with an `exclude`: what one names but the other does not.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub narrowed: BTreeSet<Narrowed>,
    /// `["m.room.member", "$LAZY"]`: the members of the timeline's senders (never narrowed
    /// by an `exclude`).
    pub lazy_members: bool,
}

/// `include` pairs less `exclude` pairs (either part of a pair may be `*`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Narrowed {
    /// What is asked for.
    pub include: BTreeSet<(String, String)>,
    /// What of it is not.
    pub exclude: BTreeSet<(String, String)>,
}

/// The wildcard in `required_state`.
pub const WILDCARD: &str = "*";

/// Whether one of `pairs` names the state event `(kind, key)`.
fn names(pairs: &BTreeSet<(String, String)>, kind: &str, key: &str) -> bool {
    pairs
        .iter()
        .any(|(t, k)| (t == kind || t == WILDCARD) && (k == key || k == WILDCARD))
}

impl RequiredState {
    /// Whether the state event `(kind, key)` is asked for (lazy members aside).
    pub fn matches(&self, kind: &str, key: &str) -> bool {
        names(&self.entries, kind, key)
            || self
                .narrowed
                .iter()
                .any(|n| names(&n.include, kind, key) && !names(&n.exclude, kind, key))
    }

    /// Whether this asks for no more than `other` does. (Narrowed parts count as within
    /// only when `other` has them too or covers all they include: when unsure, the caller
    /// compares event by event.)
    pub fn within(&self, other: &RequiredState) -> bool {
        (!self.lazy_members || other.lazy_members)
            && self.entries.iter().all(|(t, k)| other.matches(t, k))
            && self.narrowed.iter().all(|n| {
                other.narrowed.contains(n) || n.include.iter().all(|(t, k)| other.matches(t, k))
            })
    }
}

/// List filters (all must hold; `None`: no constraint).
#[derive(Debug, Clone, Default)]
pub struct ListFilters {
    /// Rooms in (or not in) the user's `m.direct`.
    pub is_dm: Option<bool>,
    /// Rooms with (or without) `m.room.encryption`.
    pub is_encrypted: Option<bool>,
    /// Invites (or not).
    pub is_invite: Option<bool>,
    /// Rooms of one of these types (`None` in it: untyped rooms).
    pub room_types: Option<Vec<Option<String>>>,
    /// Rooms of none of these types.
    pub not_room_types: Vec<Option<String>>,
    /// Children of these spaces (the user must be joined to the space).
    pub spaces: Option<Vec<String>>,
    /// Rooms whose name contains this (case-insensitive).
    pub room_name_like: Option<String>,
    /// Rooms with one of these tags.
    pub tags: Option<Vec<String>>,
    /// Rooms with none of these tags.
    pub not_tags: Vec<String>,
}

impl ListFilters {
    /// Whether evaluating these filters needs the rooms' current state.
    pub fn needs_state(&self) -> bool {
        self.is_encrypted.is_some()
            || self.room_types.is_some()
            || !self.not_room_types.is_empty()
            || self.room_name_like.is_some()
            || self.spaces.is_some()
    }

    /// Whether they need the user's room tags.
    pub fn needs_tags(&self) -> bool {
        self.tags.is_some() || !self.not_tags.is_empty()
    }
}

/// Which rooms an extension covers: `None` = all lists / all subscriptions.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// Lists whose windows it covers.
    pub lists: Option<Vec<String>>,
    /// Subscribed rooms it covers.
    pub rooms: Option<Vec<String>>,
}

impl Scope {
    /// Whether it covers every list's window and every subscription (absent or `*`).
    pub fn covers_everything(&self) -> bool {
        let all = |names: &Option<Vec<String>>| {
            names
                .as_ref()
                .is_none_or(|names| names.iter().any(|n| n == "*"))
        };
        all(&self.lists) && all(&self.rooms)
    }
}

/// The `to_device` extension.
#[derive(Debug, Clone, Default)]
pub struct ToDeviceExtension {
    /// Its own token: what the client received up to (absent: nothing yet).
    pub since: Option<i64>,
    /// Most messages per response.
    pub limit: i64,
}

/// Requested extensions (`None`/`false`: off).
#[derive(Debug, Clone, Default)]
pub struct Extensions {
    /// To-device messages.
    pub to_device: Option<ToDeviceExtension>,
    /// Device lists and key counts.
    pub e2ee: bool,
    /// Global and room account data.
    pub account_data: Option<Scope>,
    /// Read receipts.
    pub receipts: Option<Scope>,
    /// Typing notices.
    pub typing: Option<Scope>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(entries: &[(&str, &str)], lazy: bool) -> RequiredState {
        RequiredState {
            entries: entries
                .iter()
                .map(|(t, k)| ((*t).to_owned(), (*k).to_owned()))
                .collect(),
            narrowed: BTreeSet::new(),
            lazy_members: lazy,
        }
    }

    #[test]
    fn wildcards_match_and_narrower_configs_are_within_wider_ones() {
        let wide = state(
            &[("m.space.child", "*"), ("*", "@me:x"), ("m.room.name", "")],
            true,
        );
        assert!(wide.matches("m.space.child", "!a:x"));
        assert!(wide.matches("m.room.member", "@me:x"));
        assert!(wide.matches("m.room.name", ""));
        assert!(!wide.matches("m.room.topic", ""));
        assert!(state(&[("*", "*")], false).matches("anything", "at all"));
        let narrow = state(&[("m.space.child", "!a:x"), ("m.room.name", "")], false);
        assert!(narrow.within(&wide));
        assert!(!wide.within(&narrow));
        assert!(!state(&[], true).within(&state(&[], false)), "lazy is more");
        let mut combined = RoomConfig {
            timeline_limit: 1,
            required_state: narrow,
        };
        combined.combine(&RoomConfig {
            timeline_limit: 20,
            required_state: state(&[("m.room.topic", "")], true),
        });
        assert_eq!(combined.timeline_limit, 20);
        assert!(combined.required_state.lazy_members);
        assert!(combined.required_state.matches("m.room.topic", ""));
        assert!(combined.required_state.matches("m.space.child", "!a:x"));
    }

    #[test]
    fn exclude_narrows_include_and_combines_as_a_union() {
        let pairs = |p: &[(&str, &str)]| state(p, false).entries;
        let mut all_but_members = state(&[], true);
        all_but_members.narrowed.insert(Narrowed {
            include: pairs(&[("*", "*")]),
            exclude: pairs(&[("m.room.member", "*")]),
        });
        assert!(all_but_members.matches("m.room.name", ""));
        assert!(!all_but_members.matches("m.room.member", "@a:x"));
        assert!(!all_but_members.within(&state(&[("m.room.name", "")], true)));
        assert!(all_but_members.within(&all_but_members.clone()));
        assert!(all_but_members.within(&state(&[("*", "*")], true)));
        // Another list asking for one member: that member matches in the union.
        let mut combined = RoomConfig {
            timeline_limit: 1,
            required_state: all_but_members,
        };
        combined.combine(&RoomConfig {
            timeline_limit: 1,
            required_state: state(&[("m.room.member", "@b:x")], false),
        });
        assert!(combined.required_state.matches("m.room.member", "@b:x"));
        assert!(!combined.required_state.matches("m.room.member", "@a:x"));
    }
}
