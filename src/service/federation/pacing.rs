//! Pacing one room's PDUs to a server that answers `/send` before it processes them.
//!
//! Synapse stages the PDUs of a transaction, answers 200, and processes each room's staged
//! events one at a time afterwards; once 100 or more of a room wait, it drops all but the
//! newest and leaves the rest as gaps (`prune_staged_events_in_room`). Its answer therefore
//! says nothing about how far it has got, and a sender that goes on at the 200 outruns it: a
//! burst of 1,000 messages from a fast server kept about 200.
//!
//! So a room's PDUs to such a server go through a window: at most [`WINDOW`] sent and not yet
//! known to be processed. What the server has processed it serves: `GET /event/{eventId}`
//! of one of our own events answers 200 once it is stored, 404 while it is only staged. A full
//! window is probed at its middle (at most every [`PROBE_EVERY`]), and everything up to a
//! processed event leaves it (a room's events are processed in the order they came). An event
//! unconfirmed for [`UNCONFIRMED_KEPT`] leaves it anyway (the server may have dropped it and
//! will fetch it back), so a window never stalls for good. Other rooms' PDUs and EDUs are not
//! held back by a full window. A server that processes a transaction's PDUs before answering
//! (Myelin; its `/version` says so) gives its own backpressure through its answer and is not
//! paced.

use std::{
    collections::{HashMap, VecDeque},
    num::NonZeroUsize,
    sync::Mutex,
    time::{Duration, Instant},
};

use lru::LruCache;
use ruma::{
    api::federation::{discovery::get_server_version, event::get_event},
    OwnedEventId, ServerName,
};

use super::FederationClient;
use crate::storage::federation_sending::PduOutboxRow;

/// Server software known to process a transaction's PDUs before answering it.
const PROCESSES_BEFORE_ANSWERING: &[&str] = &["Myelin"];
/// How long what a server's `/version` said is trusted.
const SOFTWARE_KEPT: Duration = Duration::from_secs(3600);
/// How long a failed `/version` is not asked again (the server is paced meanwhile).
const SOFTWARE_RETRY: Duration = Duration::from_secs(300);
/// How often a room's full window is probed at most.
pub const PROBE_EVERY: Duration = Duration::from_millis(200);
/// How long a sent PDU counts against its room's window at most.
const UNCONFIRMED_KEPT: Duration = Duration::from_secs(30);
/// Destinations whose windows are remembered.
const REMEMBERED: usize = 10_000;

/// One room's PDUs sent to one destination and not known to be processed, oldest first.
#[derive(Default)]
struct Window {
    unconfirmed: VecDeque<(OwnedEventId, Instant)>,
    probed_at: Option<Instant>,
}

impl Window {
    fn expire(&mut self, now: Instant) {
        while self
            .unconfirmed
            .front()
            .is_some_and(|(_, at)| now.duration_since(*at) > UNCONFIRMED_KEPT)
        {
            self.unconfirmed.pop_front();
        }
    }
}

/// A destination's rooms' windows, and whether any of its PDUs were held back last time.
#[derive(Default)]
struct Destination {
    rooms: HashMap<String, Window>,
    held_back: bool,
}

/// The windows of every (destination, room), and which destinations are paced.
pub struct Pacer {
    /// Most PDUs of one room sent to a paced destination and not known to be processed; 0:
    /// no pacing.
    window: usize,
    destinations: Mutex<LruCache<String, Destination>>,
    /// Whether a destination is paced, and until when that answer holds.
    paced: Mutex<LruCache<String, (bool, Instant)>>,
}

impl Pacer {
    /// A pacer allowing `window` unprocessed PDUs of a room at a paced destination (0 turns
    /// pacing off).
    pub fn new(window: usize) -> Pacer {
        let size = NonZeroUsize::new(REMEMBERED).expect("non-zero");
        Pacer {
            window,
            destinations: Mutex::new(LruCache::new(size)),
            paced: Mutex::new(LruCache::new(size)),
        }
    }

    /// Whether `destination` is paced: unless pacing is off or its `/version` names software
    /// that processes PDUs before answering (asked once an hour; an unanswered ask paces it).
    pub async fn is_paced(&self, client: &FederationClient, destination: &ServerName) -> bool {
        if self.window == 0 {
            return false;
        }
        let now = Instant::now();
        let key = destination.as_str().to_owned();
        if let Some((paced, until)) = lock(&self.paced).get(&key) {
            if *until > now {
                return *paced;
            }
        }
        let answer = client
            .send(destination, get_server_version::v1::Request::new())
            .await;
        let (paced, kept) = match answer {
            Ok(response) => {
                let name = response.server.and_then(|server| server.name);
                let processes_first =
                    name.is_some_and(|name| PROCESSES_BEFORE_ANSWERING.contains(&name.as_str()));
                (!processes_first, SOFTWARE_KEPT)
            }
            Err(_) => (true, SOFTWARE_RETRY),
        };
        lock(&self.paced).put(key, (paced, now + kept));
        paced
    }

    /// Picks, in queue order, at most `limit` of a paced destination's oldest queued PDUs
    /// that their rooms' windows have room for, and counts them in. A room whose PDU is held
    /// back has none of its later ones taken, so each room's PDUs still leave in order.
    pub fn choose(
        &self,
        destination: &str,
        rows: Vec<PduOutboxRow>,
        limit: usize,
    ) -> Vec<PduOutboxRow> {
        let now = Instant::now();
        let mut destinations = lock(&self.destinations);
        let state = destinations.get_or_insert_mut(destination.to_owned(), Destination::default);
        let mut chosen = Vec::new();
        let mut held: Vec<String> = Vec::new();
        for row in rows {
            if chosen.len() == limit {
                break;
            }
            // A v12 create event has no room ID: it is the first of its room, never a burst.
            let (Some(room), Ok(event_id)) = (
                row.pdu["room_id"].as_str(),
                OwnedEventId::try_from(row.event_id.as_str()),
            ) else {
                chosen.push(row);
                continue;
            };
            if held.iter().any(|r| r == room) {
                continue;
            }
            let window = state.rooms.entry(room.to_owned()).or_default();
            window.expire(now);
            if window.unconfirmed.len() < self.window {
                window.unconfirmed.push_back((event_id, now));
                chosen.push(row);
            } else {
                held.push(room.to_owned());
            }
        }
        state.held_back = !held.is_empty();
        chosen
    }

    /// Whether the last [`Self::choose`] for `destination` held PDUs back.
    pub fn held_back(&self, destination: &str) -> bool {
        lock(&self.destinations)
            .peek(destination)
            .is_some_and(|state| state.held_back)
    }

    /// Asks `destination` how far it has got in each of its rooms whose window is full (not
    /// probed within [`PROBE_EVERY`]): the window's middle event, and when that one is stored
    /// there, it and everything before it leave the window.
    pub async fn probe(&self, client: &FederationClient, destination: &ServerName) {
        let now = Instant::now();
        let probes: Vec<(String, OwnedEventId)> = {
            let mut destinations = lock(&self.destinations);
            let Some(state) = destinations.get_mut(destination.as_str()) else {
                return;
            };
            state.rooms.retain(|_, window| {
                window.expire(now);
                !window.unconfirmed.is_empty()
            });
            state
                .rooms
                .iter_mut()
                .filter(|(_, window)| window.unconfirmed.len() >= self.window)
                .filter(|(_, window)| {
                    window
                        .probed_at
                        .is_none_or(|at| now.duration_since(at) >= PROBE_EVERY)
                })
                .map(|(room, window)| {
                    window.probed_at = Some(now);
                    let middle = window.unconfirmed.len() / 2;
                    (room.clone(), window.unconfirmed[middle].0.clone())
                })
                .collect()
        };
        for (room, event_id) in probes {
            let stored = client
                .send(destination, get_event::v1::Request::new(event_id.clone()))
                .await
                .is_ok();
            if !stored {
                continue;
            }
            let mut destinations = lock(&self.destinations);
            let Some(window) = destinations
                .get_mut(destination.as_str())
                .and_then(|state| state.rooms.get_mut(&room))
            else {
                continue;
            };
            if let Some(done) = window
                .unconfirmed
                .iter()
                .position(|(id, _)| *id == event_id)
            {
                window.unconfirmed.drain(..=done);
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rows(rooms: &[&str]) -> Vec<PduOutboxRow> {
        rooms
            .iter()
            .enumerate()
            .map(|(n, room)| PduOutboxRow {
                outbox_id: n as i64,
                event_id: format!("$e{n}"),
                pdu: json!({ "room_id": room }),
            })
            .collect()
    }

    fn ids(rows: &[PduOutboxRow]) -> Vec<i64> {
        rows.iter().map(|row| row.outbox_id).collect()
    }

    #[test]
    fn a_room_fills_its_window_and_waits_while_other_rooms_and_destinations_pass() {
        let pacer = Pacer::new(50);
        let mut queue = vec!["!busy:a"; 60];
        queue.push("!quiet:a");
        let chosen = pacer.choose("b", rows(&queue), 100);
        // 50 of the busy room, none after the first held back, and the quiet room's one.
        assert_eq!(chosen.len(), 51);
        assert_eq!(&ids(&chosen)[..50], (0..50).collect::<Vec<_>>());
        assert_eq!(chosen[50].outbox_id, 60);
        assert!(pacer.held_back("b"));
        // Nothing more of the busy room until the window empties; another destination has
        // its own windows.
        assert!(pacer.choose("b", rows(&["!busy:a"]), 100).is_empty());
        assert_eq!(pacer.choose("c", rows(&["!busy:a"]), 100).len(), 1);
        assert!(!pacer.held_back("c"));
        // Confirmed up to the middle: 26 leave the window, so 26 more may go.
        {
            let mut destinations = lock(&pacer.destinations);
            let window = destinations
                .get_mut("b")
                .unwrap()
                .rooms
                .get_mut("!busy:a")
                .unwrap();
            window.unconfirmed.drain(..=25);
        }
        assert_eq!(pacer.choose("b", rows(&["!busy:a"; 40]), 100).len(), 26);
    }

    #[test]
    fn an_unconfirmed_pdu_leaves_the_window_after_a_while() {
        let pacer = Pacer::new(2);
        assert_eq!(pacer.choose("b", rows(&["!r:a"; 3]), 100).len(), 2);
        {
            let mut destinations = lock(&pacer.destinations);
            let window = destinations
                .get_mut("b")
                .unwrap()
                .rooms
                .get_mut("!r:a")
                .unwrap();
            window.unconfirmed[0].1 -= UNCONFIRMED_KEPT + Duration::from_secs(1);
        }
        assert_eq!(pacer.choose("b", rows(&["!r:a"; 3]), 100).len(), 1);
    }

    #[test]
    fn the_limit_and_room_less_pdus_are_respected() {
        let pacer = Pacer::new(10);
        let mut queue = rows(&["!r:a"; 3]);
        queue.insert(
            1,
            PduOutboxRow {
                outbox_id: 99,
                event_id: "$create".into(),
                pdu: json!({ "type": "m.room.create" }),
            },
        );
        assert_eq!(ids(&pacer.choose("b", queue, 2)), [0, 99]);
    }
}
