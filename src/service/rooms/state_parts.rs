//! State events' client parts, kept in memory by event ID.
//!
//! An initial sync with every member reads each room's whole state: for an account in 300
//! rooms of 300 members, 90,000 events looked up by their text key, most of what PostgreSQL
//! spends on that sync. A stored event's client parts never change except by a redaction, and
//! each redaction counts itself in its room's row (`rooms.redactions`) in the transaction that
//! prunes the event. So a part read with its room's count is still right as long as the room's
//! count, read beside the state's event IDs, is the same; a redaction made through any process
//! makes it stale for all of them at its commit.
//!
//! The cache is bounded by an estimate of its bytes, least recently used first out.

use std::sync::Mutex;

use lru::LruCache;

use crate::storage::client_events::ClientEventParts;

/// The bytes an entry costs beyond its key and text (see [`Cached::bytes`]).
const ENTRY_OVERHEAD: usize = 300;

/// One event's parts, without the two fields its key and its reader already hold (event and
/// room ID), its text in one allocation.
struct Cached {
    /// Sender, type, state key, content, membership and redaction, one after the other.
    text: Box<str>,
    /// Where each of those ends in `text`.
    ends: [u32; 6],
    /// Which of the optional ones (state key, membership, redaction) are present.
    present: [bool; 3],
    stream_ordering: i64,
    origin_server_ts: i64,
    has_url: bool,
    /// The room's redaction count when these parts were read.
    room_redactions: i64,
}

impl Cached {
    fn new(parts: &ClientEventParts, room_redactions: i64) -> Option<Self> {
        let fields = [
            parts.sender.as_str(),
            parts.event_type.as_str(),
            parts.state_key.as_deref().unwrap_or_default(),
            parts.content.as_str(),
            parts.membership.as_deref().unwrap_or_default(),
            parts.redacted_by.as_deref().unwrap_or_default(),
        ];
        let mut text = String::with_capacity(fields.iter().map(|f| f.len()).sum());
        let mut ends = [0; 6];
        for (end, field) in ends.iter_mut().zip(fields) {
            text.push_str(field);
            *end = u32::try_from(text.len()).ok()?;
        }
        Some(Cached {
            text: text.into_boxed_str(),
            ends,
            present: [
                parts.state_key.is_some(),
                parts.membership.is_some(),
                parts.redacted_by.is_some(),
            ],
            stream_ordering: parts.stream_ordering,
            origin_server_ts: parts.origin_server_ts,
            has_url: parts.has_url,
            room_redactions,
        })
    }

    fn field(&self, index: usize) -> String {
        let start = match index {
            0 => 0,
            _ => self.ends[index - 1] as usize,
        };
        self.text[start..self.ends[index] as usize].to_owned()
    }

    fn optional(&self, index: usize, presence: usize) -> Option<String> {
        self.present[presence].then(|| self.field(index))
    }

    fn parts(&self, event_id: &str, room_id: &str) -> ClientEventParts {
        ClientEventParts {
            event_id: event_id.to_owned(),
            room_id: room_id.to_owned(),
            stream_ordering: self.stream_ordering,
            sender: self.field(0),
            event_type: self.field(1),
            state_key: self.optional(2, 0),
            origin_server_ts: self.origin_server_ts,
            content: self.field(3),
            membership: self.optional(4, 1),
            has_url: self.has_url,
            redacted_by: self.optional(5, 2),
        }
    }

    /// What an entry costs, roughly: its key and text, and a fixed share for the value, the
    /// list's node, the map's slot and the allocator's headers (measured: 90,000 member events
    /// of 300-member rooms took 47 MiB of the process's memory, about 520 bytes each).
    fn bytes(&self, event_id: &str) -> usize {
        ENTRY_OVERHEAD + event_id.len() + self.text.len()
    }
}

struct Entries {
    map: LruCache<Box<str>, Cached>,
    bytes: usize,
}

/// The cache (one per process).
pub struct StatePartsCache {
    entries: Mutex<Entries>,
    budget: usize,
}

/// What [`StatePartsCache::find`] found of a state.
pub struct Found {
    /// The parts still right, of the IDs asked for.
    pub parts: Vec<ClientEventParts>,
    /// The IDs whose parts must be read.
    pub missing: Vec<String>,
}

impl StatePartsCache {
    /// A cache of at most about `budget` bytes (0: nothing is kept).
    pub fn new(budget: usize) -> Self {
        StatePartsCache {
            entries: Mutex::new(Entries {
                map: LruCache::unbounded(),
                bytes: 0,
            }),
            budget,
        }
    }

    /// The parts of the room's events `event_ids` that are kept and still right at the room's
    /// redaction count `room_redactions`, and the IDs of the others.
    pub fn find(&self, room_id: &str, event_ids: Vec<String>, room_redactions: i64) -> Found {
        let mut found = Found {
            parts: Vec::with_capacity(event_ids.len()),
            missing: Vec::new(),
        };
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        for event_id in event_ids {
            match entries.map.get(event_id.as_str()) {
                Some(cached) if cached.room_redactions == room_redactions => {
                    found.parts.push(cached.parts(&event_id, room_id));
                }
                _ => found.missing.push(event_id),
            }
        }
        drop(entries);
        crate::metrics::metrics().cache_lookups(
            "state_events",
            found.parts.len() as u64,
            found.missing.len() as u64,
        );
        found
    }

    /// Keeps `parts`, read when their room's redaction count was `room_redactions`.
    pub fn keep(&self, parts: &[ClientEventParts], room_redactions: i64) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        for part in parts {
            let Some(cached) = Cached::new(part, room_redactions) else {
                continue;
            };
            let bytes = cached.bytes(&part.event_id);
            if let Some(old) = entries.map.put(part.event_id.as_str().into(), cached) {
                entries.bytes -= old.bytes(&part.event_id);
            }
            entries.bytes += bytes;
        }
        while entries.bytes > self.budget {
            match entries.map.pop_lru() {
                Some((event_id, old)) => entries.bytes -= old.bytes(&event_id),
                None => break,
            }
        }
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

    #[test]
    fn parts_come_back_as_kept_while_the_room_has_no_new_redaction() {
        let cache = StatePartsCache::new(1 << 20);
        let alice = member("$a", "@alice:example.org", r#"{"membership": "join"}"#);
        let mut topic = member("$t", "@alice:example.org", "{}");
        topic.event_type = "m.room.topic".to_owned();
        topic.state_key = Some(String::new());
        topic.membership = None;
        topic.redacted_by = Some("$r".to_owned());
        cache.keep(&[alice.clone(), topic.clone()], 3);

        let ids = vec!["$a".to_owned(), "$t".to_owned(), "$unknown".to_owned()];
        let found = cache.find("!room:example.org", ids.clone(), 3);
        assert_eq!(found.missing, vec!["$unknown".to_owned()]);
        assert_eq!(found.parts[0], alice);
        assert_eq!(found.parts[1], topic);

        // A redaction in the room since: nothing kept for it is served.
        let found = cache.find("!room:example.org", ids, 4);
        assert!(found.parts.is_empty());
        assert_eq!(found.missing.len(), 3);
    }

    #[test]
    fn the_least_recently_used_go_first_when_over_budget() {
        let one = member("$1", "@a:example.org", "{}");
        let budget = Cached::new(&one, 0).unwrap().bytes("$1") * 2;
        let cache = StatePartsCache::new(budget);
        cache.keep(&[one, member("$2", "@a:example.org", "{}")], 0);
        // Reading $1 makes $2 the least recently used.
        assert!(cache
            .find("!r", vec!["$1".to_owned()], 0)
            .missing
            .is_empty());
        cache.keep(&[member("$3", "@a:example.org", "{}")], 0);
        assert_eq!(cache.size(), (2, budget));
        let found = cache.find("!r", vec!["$1".into(), "$2".into(), "$3".into()], 0);
        assert_eq!(found.missing, vec!["$2".to_owned()]);

        let off = StatePartsCache::new(0);
        off.keep(&[member("$1", "@a:example.org", "{}")], 0);
        assert_eq!(off.size(), (0, 0));
    }
}
