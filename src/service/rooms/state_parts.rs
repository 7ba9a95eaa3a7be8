//! State events kept in memory by event ID, as a sync serves them.
//!
//! An initial sync with every member reads each room's whole state: for an account in 300
//! rooms of 300 members, 90,000 events looked up by their text key, most of what PostgreSQL
//! spends on that sync. A stored event's client form never changes except by a redaction, and
//! each redaction counts itself in its room's row (`rooms.redactions`) in the transaction that
//! prunes the event. So an event read with its room's count is still right as long as the
//! room's count, read beside the state's event IDs, is the same; a redaction made through any
//! process makes it stale for all of them at its commit.
//!
//! Each event is kept as its client JSON up to its age (`unsigned.age`, the one part that
//! changes with time), so serving it is one copy and a number, not a rendering: writing 90,000
//! member events from their parts was most of the server's own time in that sync. Redacted
//! events and redactions are not kept: their client form comes from the whole PDU.
//!
//! A state group's entries never change once written either, so a group whose every event is
//! kept is also kept whole, its events in the order a section serves them: a sync that finds
//! it reads only the room's redaction count, not the group's chain of entries (most of
//! PostgreSQL's work in a sync with every member) nor 300 event IDs looked up one by one.
//!
//! Both are bounded by an estimate of their bytes, least recently used first out.

use std::{
    fmt::Write,
    hash::Hash,
    sync::{Arc, Mutex},
};

use lru::LruCache;
use serde_json::value::RawValue;

use super::pdu::{client_event_from_parts, RoomIdField};
use crate::{
    error::{Error, Result},
    storage::client_events::ClientEventParts,
};

/// The bytes an entry costs beyond its key and texts (see [`KeptEvent::bytes`]).
const ENTRY_OVERHEAD: usize = 300;
/// The end of a client event rendered with an age of 0, where the age is written.
const AGE_ZERO_END: &str = "0}}";

/// One state event as a sync section serves it (without `room_id`).
pub struct KeptEvent {
    /// The client JSON up to the value of `unsigned.age`, which ends it.
    head: Box<str>,
    /// The sender, then the type (what filters read).
    sender_and_type: Box<str>,
    sender_end: u32,
    /// Its position in the event stream, the order a section's state is served in.
    pub stream_ordering: i64,
    origin_server_ts: i64,
    /// Whether its content has a `url` (for filters' `contains_url`).
    pub has_url: bool,
    /// The room's redaction count when it was read.
    room_redactions: i64,
}

impl KeptEvent {
    /// The event of `parts`, read at the room's redaction count `room_redactions`; `None` for
    /// one whose client form is not made from its parts (redacted, or a redaction).
    fn new(parts: &ClientEventParts, room_redactions: i64) -> Option<Self> {
        // Rendered as of its own timestamp, its age is 0, the text's last digit.
        let at_zero =
            client_event_from_parts(parts.clone(), parts.origin_server_ts, RoomIdField::Omitted)
                .ok()??;
        let head = at_zero.get().strip_suffix(AGE_ZERO_END)?;
        let mut sender_and_type =
            String::with_capacity(parts.sender.len() + parts.event_type.len());
        sender_and_type.push_str(&parts.sender);
        sender_and_type.push_str(&parts.event_type);
        Some(KeptEvent {
            head: head.into(),
            sender_and_type: sender_and_type.into_boxed_str(),
            sender_end: u32::try_from(parts.sender.len()).ok()?,
            stream_ordering: parts.stream_ordering,
            origin_server_ts: parts.origin_server_ts,
            has_url: parts.has_url,
            room_redactions,
        })
    }

    pub fn sender(&self) -> &str {
        &self.sender_and_type[..self.sender_end as usize]
    }

    pub fn event_type(&self) -> &str {
        &self.sender_and_type[self.sender_end as usize..]
    }

    /// Its client JSON as of `now` (ms), as [`client_event_from_parts`] renders it.
    pub fn render(&self, now: i64) -> Result<Box<RawValue>> {
        let age = (now - self.origin_server_ts).max(0);
        let mut text = String::with_capacity(self.head.len() + 24);
        text.push_str(&self.head);
        write!(text, "{age}}}}}").map_err(Error::internal)?;
        RawValue::from_string(text).map_err(Error::internal)
    }

    /// What an entry costs, roughly: its key and texts, and a fixed share for the value, the
    /// list's node, the map's slot and the allocator's headers (measured for the parts kept
    /// before: 90,000 member events of 300-member rooms took 47 MiB of the process's memory,
    /// about 520 bytes each).
    fn bytes(&self, event_id: &str) -> usize {
        event_id.len() + self.bytes_but_id()
    }

    fn bytes_but_id(&self) -> usize {
        ENTRY_OVERHEAD + self.head.len() + self.sender_and_type.len()
    }
}

/// A state group's events, all kept, in stream order, as of one redaction count of its room.
struct KeptGroup {
    events: Arc<[Arc<KeptEvent>]>,
    room_redactions: i64,
    /// Its events' bytes, as the events' cache counts them (without their IDs).
    bytes: usize,
}

/// A map whose least recently used entries go first once the estimate of its bytes (each
/// entry's by `weigh`) is over `budget`.
struct Bounded<K, V> {
    map: LruCache<K, V>,
    bytes: usize,
    budget: usize,
    weigh: fn(&K, &V) -> usize,
}

impl<K: Hash + Eq, V> Bounded<K, V> {
    fn new(budget: usize, weigh: fn(&K, &V) -> usize) -> Self {
        Bounded {
            map: LruCache::unbounded(),
            bytes: 0,
            budget,
            weigh,
        }
    }

    /// Puts `value` at `key` (the most recently used), then lets the least recently used go
    /// while over the budget.
    fn put(&mut self, key: K, value: V) {
        self.bytes += (self.weigh)(&key, &value);
        if let Some((key, old)) = self.map.push(key, value) {
            self.bytes -= (self.weigh)(&key, &old);
        }
        while self.bytes > self.budget {
            match self.map.pop_lru() {
                Some((key, old)) => self.bytes -= (self.weigh)(&key, &old),
                None => break,
            }
        }
    }

    fn pop(&mut self, key: &K) {
        if let Some((key, old)) = self.map.pop_entry(key) {
            self.bytes -= (self.weigh)(&key, &old);
        }
    }
}

/// The cache (one per process).
///
/// A kept group holds its events even after the events' cache lets them go, so the two
/// together hold at most twice the budget; mostly they hold the same events.
pub struct StatePartsCache {
    entries: Mutex<Bounded<Box<str>, Arc<KeptEvent>>>,
    groups: Mutex<Bounded<i64, KeptGroup>>,
}

/// What [`StatePartsCache::find`] found of a state.
pub struct Found {
    /// The events still right, of the IDs asked for.
    pub kept: Vec<Arc<KeptEvent>>,
    /// The IDs whose parts must be read.
    pub missing: Vec<String>,
}

impl StatePartsCache {
    /// A cache of at most about `budget` bytes.
    pub fn new(budget: usize) -> Self {
        StatePartsCache {
            entries: Mutex::new(Bounded::new(budget, |event_id, event| {
                event.bytes(event_id)
            })),
            groups: Mutex::new(Bounded::new(budget, |_, group| group.bytes)),
        }
    }

    /// The events of state group `group` if it is kept whole, in stream order, with the room's
    /// redaction count they were kept at: they are right while the room's count is that one.
    pub fn find_group(&self, group: i64) -> Option<(Arc<[Arc<KeptEvent>]>, i64)> {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        let found = groups
            .map
            .get(&group)
            .map(|kept| (kept.events.clone(), kept.room_redactions));
        drop(groups);
        let hit = u64::from(found.is_some());
        crate::metrics::metrics().cache_lookups("state_groups", hit, 1 - hit);
        found
    }

    /// Lets group `group` go (its room had a redaction since it was kept).
    pub fn forget_group(&self, group: i64) {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups.pop(&group);
    }

    /// Keeps state group `group` whole: its events `events` (every event of its state), each
    /// kept at the room's redaction count `room_redactions`. A group with an event kept at
    /// another count is left out.
    pub fn keep_group(&self, group: i64, events: &[Arc<KeptEvent>], room_redactions: i64) {
        if events.iter().any(|e| e.room_redactions != room_redactions) {
            return;
        }
        let mut ordered = events.to_vec();
        ordered.sort_by_key(|e| e.stream_ordering);
        let bytes = ordered.iter().map(|e| e.bytes_but_id()).sum();
        let kept = KeptGroup {
            events: ordered.into(),
            room_redactions,
            bytes,
        };
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups.put(group, kept);
    }

    /// The room's events `event_ids` that are kept and still right at the room's redaction
    /// count `room_redactions`, and the IDs of the others.
    pub fn find(&self, event_ids: Vec<String>, room_redactions: i64) -> Found {
        let mut found = Found {
            kept: Vec::with_capacity(event_ids.len()),
            missing: Vec::new(),
        };
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        for event_id in event_ids {
            match entries.map.get(event_id.as_str()) {
                Some(kept) if kept.room_redactions == room_redactions => {
                    found.kept.push(kept.clone());
                }
                _ => found.missing.push(event_id),
            }
        }
        drop(entries);
        crate::metrics::metrics().cache_lookups(
            "state_events",
            found.kept.len() as u64,
            found.missing.len() as u64,
        );
        found
    }

    /// Keeps the events of `parts`, read when their room's redaction count was
    /// `room_redactions`, and answers them as kept, so that they are served without being
    /// rendered again; and the parts not kept (redacted events and redactions, whose client
    /// form comes from the whole PDU), to be rendered from what was read.
    pub fn keep(
        &self,
        parts: Vec<ClientEventParts>,
        room_redactions: i64,
    ) -> (Vec<Arc<KeptEvent>>, Vec<ClientEventParts>) {
        let mut kept = Vec::with_capacity(parts.len());
        let mut not_kept = Vec::new();
        for part in parts {
            match KeptEvent::new(&part, room_redactions) {
                Some(event) => kept.push((part.event_id, Arc::new(event))),
                None => not_kept.push(part),
            }
        }
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        for (event_id, event) in &kept {
            entries.put(event_id.as_str().into(), event.clone());
        }
        drop(entries);
        (kept.into_iter().map(|(_, event)| event).collect(), not_kept)
    }

    /// How many events are kept, and their estimated bytes.
    pub fn size(&self) -> (usize, usize) {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        (entries.map.len(), entries.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(event_id: &str, user: &str, content: &str) -> ClientEventParts {
        ClientEventParts {
            event_id: event_id.to_owned(),
            room_id: "!room:example.org".to_owned(),
            stream_ordering: 7,
            sender: user.to_owned(),
            event_type: "m.room.member".to_owned(),
            state_key: Some(user.to_owned()),
            origin_server_ts: 1_700_000_000_000,
            content: content.to_owned(),
            membership: Some("join".to_owned()),
            has_url: false,
            redacted_by: None,
        }
    }

    /// What the event of `parts` is served as at `now`, rendered from its parts.
    fn rendered(parts: &ClientEventParts, now: i64) -> String {
        client_event_from_parts(parts.clone(), now, RoomIdField::Omitted)
            .unwrap()
            .unwrap()
            .get()
            .to_owned()
    }

    #[test]
    fn kept_events_are_served_as_rendered_while_the_room_has_no_new_redaction() {
        let cache = StatePartsCache::new(1 << 20);
        let alice = member(
            "$a",
            "@alice:example.org",
            r#"{"displayname": "Alice \"A\" Smith", "membership": "join"}"#,
        );
        let mut topic = member("$t", "@alice:example.org", "{}");
        topic.event_type = "m.room.topic".to_owned();
        topic.state_key = Some(String::new());
        topic.membership = None;
        topic.has_url = true;
        let mut redacted = topic.clone();
        redacted.event_id = "$x".to_owned();
        redacted.redacted_by = Some("$r".to_owned());
        let (kept, not_kept) = cache.keep(vec![alice.clone(), topic.clone(), redacted.clone()], 3);
        assert_eq!(kept.len(), 2);
        assert_eq!(not_kept, vec![redacted]);

        let ids = vec![
            "$a".to_owned(),
            "$t".to_owned(),
            "$x".to_owned(),
            "$unknown".to_owned(),
        ];
        let found = cache.find(ids.clone(), 3);
        // A redacted event is served from its whole PDU: never kept.
        assert_eq!(found.missing, vec!["$x".to_owned(), "$unknown".to_owned()]);
        let now = alice.origin_server_ts + 12_345;
        for (kept, parts) in found.kept.iter().zip([&alice, &topic]) {
            assert_eq!(kept.render(now).unwrap().get(), rendered(parts, now));
            assert_eq!(kept.sender(), parts.sender);
            assert_eq!(kept.event_type(), parts.event_type);
            assert_eq!(kept.has_url, parts.has_url);
        }
        // Before its own timestamp (another server's clock ahead), its age is 0 as rendered.
        let early = alice.origin_server_ts - 5;
        assert_eq!(
            found.kept[0].render(early).unwrap().get(),
            rendered(&alice, early)
        );

        // A redaction in the room since: nothing kept for it is served.
        let found = cache.find(ids, 4);
        assert!(found.kept.is_empty());
        assert_eq!(found.missing.len(), 4);
    }

    #[test]
    fn a_group_kept_whole_is_found_in_stream_order_with_its_redaction_count() {
        let cache = StatePartsCache::new(1 << 20);
        let mut later = member("$b", "@bob:example.org", "{}");
        later.stream_ordering = 9;
        let (kept, _) = cache.keep(vec![later, member("$a", "@alice:example.org", "{}")], 3);
        cache.keep_group(5, &kept, 3);
        let (events, kept_at) = cache.find_group(5).unwrap();
        assert_eq!(kept_at, 3);
        let orderings: Vec<i64> = events.iter().map(|e| e.stream_ordering).collect();
        assert_eq!(orderings, [7, 9]);
        assert!(cache.find_group(6).is_none());
        cache.forget_group(5);
        assert!(cache.find_group(5).is_none());

        // An event kept at another count than the group's: the group is not kept.
        let (newer, _) = cache.keep(vec![member("$c", "@carol:example.org", "{}")], 4);
        cache.keep_group(6, &[kept[0].clone(), newer[0].clone()], 4);
        assert!(cache.find_group(6).is_none());
    }

    #[test]
    fn the_least_recently_used_group_goes_first_when_over_budget() {
        let one = member("$1", "@a:example.org", "{}");
        let budget = KeptEvent::new(&one, 0).unwrap().bytes_but_id() * 2;
        let cache = StatePartsCache::new(budget);
        let (kept, _) = cache.keep(vec![one], 0);
        cache.keep_group(1, &kept, 0);
        cache.keep_group(2, &kept, 0);
        // Reading group 1 makes group 2 the least recently used.
        assert!(cache.find_group(1).is_some());
        cache.keep_group(3, &kept, 0);
        assert!(cache.find_group(2).is_none());
        assert!(cache.find_group(1).is_some() && cache.find_group(3).is_some());
    }

    #[test]
    fn the_least_recently_used_go_first_when_over_budget() {
        let one = member("$1", "@a:example.org", "{}");
        let budget = KeptEvent::new(&one, 0).unwrap().bytes("$1") * 2;
        let cache = StatePartsCache::new(budget);
        cache.keep(vec![one, member("$2", "@a:example.org", "{}")], 0);
        // Reading $1 makes $2 the least recently used.
        assert!(cache.find(vec!["$1".to_owned()], 0).missing.is_empty());
        cache.keep(vec![member("$3", "@a:example.org", "{}")], 0);
        assert_eq!(cache.size(), (2, budget));
        let found = cache.find(vec!["$1".into(), "$2".into(), "$3".into()], 0);
        assert_eq!(found.missing, vec!["$2".to_owned()]);
    }
}
