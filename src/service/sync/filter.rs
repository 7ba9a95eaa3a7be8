//! Sync filters: which rooms and events a `/sync` (or `/messages`) response includes, and the
//! `event_fields` projection.

use std::collections::HashSet;

use ruma::api::client::filter::FilterDefinition;
use serde_json::{json, Map, Value};

use crate::{
    service::rooms::state_parts::KeptEvent,
    storage::{client_events::ClientEventParts, rooms::EventRow},
};

/// Timeline length when the filter does not say.
const DEFAULT_TIMELINE_LIMIT: usize = 10;
/// Longest timeline a filter may ask for.
const MAX_TIMELINE_LIMIT: usize = 100;
/// Which events of one kind (timeline, state, account data) a filter lets through.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Event types to include (`None`: all); `*` at the end matches a prefix.
    pub types: Option<Vec<String>>,
    /// Event types to leave out.
    pub not_types: Vec<String>,
    /// Senders to include (`None`: all).
    pub senders: Option<HashSet<String>>,
    /// Senders to leave out.
    pub not_senders: HashSet<String>,
    /// Only events with (`true`) or without (`false`) a `content.url`.
    pub contains_url: Option<bool>,
}

impl EventFilter {
    /// The event filter of a client's `RoomEventFilter`.
    pub fn from_room_filter(filter: &ruma::api::client::filter::RoomEventFilter) -> Self {
        use ruma::api::client::filter::UrlFilter;
        EventFilter {
            types: filter.types.clone(),
            not_types: filter.not_types.clone(),
            senders: filter
                .senders
                .as_ref()
                .map(|s| s.iter().map(|u| u.to_string()).collect()),
            not_senders: filter.not_senders.iter().map(|u| u.to_string()).collect(),
            contains_url: filter
                .url_filter
                .as_ref()
                .map(|f| matches!(f, UrlFilter::EventsWithUrl)),
        }
    }

    /// Whether the filter lets an event of this type, sender and content through.
    pub fn allows(&self, kind: &str, sender: &str, content: Option<&Value>) -> bool {
        self.allows_with_url(
            kind,
            sender,
            content.is_some_and(|c| c.get("url").is_some()),
        )
    }

    /// [`Self::allows`] for an event whose content has a `url` or not.
    fn allows_with_url(&self, kind: &str, sender: &str, has_url: bool) -> bool {
        self.types
            .as_ref()
            .is_none_or(|types| types.iter().any(|t| type_matches(t, kind)))
            && !self.not_types.iter().any(|t| type_matches(t, kind))
            && self.senders.as_ref().is_none_or(|s| s.contains(sender))
            && !self.not_senders.contains(sender)
            && self.contains_url.is_none_or(|want| want == has_url)
    }

    /// Whether the filter lets a stored event through.
    pub fn allows_row(&self, event: &EventRow) -> bool {
        self.allows(&event.event_type, &event.sender, event.pdu.get("content"))
    }

    /// Whether the filter lets an event read as its client parts through.
    pub fn allows_parts(&self, event: &ClientEventParts) -> bool {
        self.allows_with_url(&event.event_type, &event.sender, event.has_url)
    }

    /// [`Self::allows`] for a state event kept in memory.
    pub fn allows_kept(&self, event: &KeptEvent) -> bool {
        self.allows_with_url(event.event_type(), event.sender(), event.has_url)
    }
}

/// The parts of a filter that `/sync` applies.
#[derive(Debug, Clone, Default)]
pub struct SyncFilter {
    /// Timeline events per room.
    pub timeline_limit: usize,
    /// Only these rooms.
    pub rooms: Option<HashSet<String>>,
    /// Never these rooms.
    pub not_rooms: HashSet<String>,
    /// Timeline events.
    pub timeline: EventFilter,
    /// State events.
    pub state: EventFilter,
    /// Global account data.
    pub account_data: EventFilter,
    /// Presence events.
    pub presence: EventFilter,
    /// Per-room account data.
    pub room_account_data: EventFilter,
    /// Send only the member events the timeline needs.
    pub lazy_load_members: bool,
    /// Include rooms the user has left.
    pub include_leave: bool,
    /// Keep only these (dotted) fields of each event.
    pub event_fields: Option<Vec<String>>,
    /// Send events as the federation PDUs they are stored as.
    pub federation_format: bool,
    /// Count thread replies per thread instead of with the room.
    pub unread_thread_notifications: bool,
}

fn type_matches(pattern: &str, kind: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => kind.starts_with(prefix),
        None => pattern == kind,
    }
}

impl SyncFilter {
    /// Takes what `/sync` honours from a filter definition.
    pub fn from_definition(filter: &FilterDefinition) -> Self {
        let room = &filter.room;
        let timeline = &room.timeline;
        let account_data = &filter.account_data;
        SyncFilter {
            timeline_limit: timeline
                .limit
                .map_or(DEFAULT_TIMELINE_LIMIT, |l| u64::from(l) as usize)
                .clamp(1, MAX_TIMELINE_LIMIT),
            rooms: room
                .rooms
                .as_ref()
                .map(|r| r.iter().map(|r| r.to_string()).collect()),
            not_rooms: room.not_rooms.iter().map(|r| r.to_string()).collect(),
            timeline: EventFilter::from_room_filter(timeline),
            state: EventFilter::from_room_filter(&room.state),
            account_data: EventFilter {
                types: account_data.types.clone(),
                not_types: account_data.not_types.clone(),
                ..EventFilter::default()
            },
            presence: EventFilter {
                types: filter.presence.types.clone(),
                not_types: filter.presence.not_types.clone(),
                senders: filter
                    .presence
                    .senders
                    .as_ref()
                    .map(|s| s.iter().map(|u| u.to_string()).collect()),
                not_senders: filter
                    .presence
                    .not_senders
                    .iter()
                    .map(|u| u.to_string())
                    .collect(),
                ..EventFilter::default()
            },
            room_account_data: EventFilter::from_room_filter(&room.account_data),
            lazy_load_members: !room.state.lazy_load_options.is_disabled()
                || !timeline.lazy_load_options.is_disabled(),
            include_leave: room.include_leave,
            event_fields: filter.event_fields.clone(),
            federation_format: filter.event_format
                == ruma::api::client::filter::EventFormat::Federation,
            unread_thread_notifications: timeline.unread_thread_notifications,
        }
    }

    pub(super) fn wants_room(&self, room_id: &str) -> bool {
        self.rooms.as_ref().is_none_or(|r| r.contains(room_id)) && !self.not_rooms.contains(room_id)
    }
}

fn insert_path(target: &mut Map<String, Value>, path: &[String], value: Value) {
    match path {
        [] => {}
        [last] => {
            target.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            // A field already kept whole (`content` before `content.body`) stays whole.
            if let Some(object) = target
                .entry(first.clone())
                .or_insert_with(|| json!({}))
                .as_object_mut()
            {
                insert_path(object, rest, value);
            }
        }
    }
}

/// Keeps only the listed dotted fields of an event (`content.body`; `\.` escapes a dot).
pub fn keep_fields(event: &Value, fields: &[String]) -> Value {
    let mut kept = Map::new();
    for field in fields {
        let path: Vec<String> = field
            .replace("\\.", "\u{0}")
            .split('.')
            .map(|p| p.replace('\u{0}', "."))
            .collect();
        let Some(value) = path.iter().try_fold(event, |source, key| source.get(key)) else {
            continue;
        };
        insert_path(&mut kept, &path, value.clone());
    }
    Value::Object(kept)
}
