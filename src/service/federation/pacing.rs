//! Pacing one room's PDUs to a server that answers `/send` before it processes them.
//!
//! Synapse stages the PDUs of a transaction, answers 200, and processes each room's staged
//! events one at a time afterwards; once 100 or more of a room wait, it drops all but the
//! newest and leaves the rest as gaps (`prune_staged_events_in_room`). Its answer therefore
//! says nothing about how far it has got, and a sender that goes on at the 200 outruns it: a
//! burst of 1,000 messages from a fast server kept about 200.
//!
//! So a room's PDUs to such a server go through a token bucket: a transaction's worth
//! ([`BURST`]) at once, then at most `rate` a second, the rate the receiver is expected to keep
//! up with. Other rooms' PDUs and EDUs are not held back by a paced room. A server that
//! processes a transaction's PDUs before answering (Myelin; its `/version` says so) gives its
//! own backpressure through its answer and is not paced.

use std::{
    num::NonZeroUsize,
    sync::Mutex,
    time::{Duration, Instant},
};

use lru::LruCache;
use ruma::{api::federation::discovery::get_server_version, ServerName};

use super::FederationClient;
use crate::storage::federation_sending::PduOutboxRow;

/// PDUs of one room a paced destination may be sent at once (one transaction's worth).
pub const BURST: f64 = 50.0;
/// Server software known to process a transaction's PDUs before answering it.
const PROCESSES_BEFORE_ANSWERING: &[&str] = &["Myelin"];
/// How long what a server's `/version` said is trusted.
const SOFTWARE_KEPT: Duration = Duration::from_secs(3600);
/// How long a failed `/version` is not asked again (the server is paced meanwhile).
const SOFTWARE_RETRY: Duration = Duration::from_secs(300);
/// (destination, room) buckets and destinations remembered.
const REMEMBERED: usize = 10_000;

/// One room's allowance towards one destination.
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The token buckets of every (destination, room), and which destinations are paced.
pub struct Pacer {
    /// PDUs per second per room and destination once the burst is spent; 0: no pacing.
    rate: f64,
    buckets: Mutex<LruCache<(String, String), Bucket>>,
    /// Whether a destination is paced, and until when that answer holds.
    paced: Mutex<LruCache<String, (bool, Instant)>>,
}

impl Pacer {
    /// A pacer letting `rate` PDUs a second of one room through to a paced destination
    /// (0 turns pacing off).
    pub fn new(rate: f64) -> Pacer {
        let size = NonZeroUsize::new(REMEMBERED).expect("non-zero");
        Pacer {
            rate,
            buckets: Mutex::new(LruCache::new(size)),
            paced: Mutex::new(LruCache::new(size)),
        }
    }

    /// Whether `destination` is paced: unless pacing is off or its `/version` names software
    /// that processes PDUs before answering (asked once an hour; an unanswered ask paces it).
    pub async fn is_paced(&self, client: &FederationClient, destination: &ServerName) -> bool {
        if self.rate <= 0.0 {
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

    /// Picks, in queue order, at most `limit` of a paced destination's oldest queued PDUs that
    /// their rooms' buckets allow, and spends the allowance. A room whose PDU is held back has
    /// none of its later ones taken, so each room's PDUs still leave in order.
    pub fn choose(
        &self,
        destination: &str,
        rows: Vec<PduOutboxRow>,
        limit: usize,
    ) -> Vec<PduOutboxRow> {
        let now = Instant::now();
        let mut buckets = lock(&self.buckets);
        let mut chosen = Vec::new();
        let mut held: Vec<String> = Vec::new();
        for row in rows {
            if chosen.len() == limit {
                break;
            }
            // A v12 create event has no room ID: it is the first of its room, never a burst.
            let Some(room) = row.pdu["room_id"].as_str().map(str::to_owned) else {
                chosen.push(row);
                continue;
            };
            if held.contains(&room) {
                continue;
            }
            let key = (destination.to_owned(), room);
            let bucket = buckets.get_or_insert_mut(key.clone(), || Bucket {
                tokens: BURST,
                at: now,
            });
            let elapsed = now.duration_since(bucket.at).as_secs_f64();
            bucket.tokens = (bucket.tokens + elapsed * self.rate).min(BURST);
            bucket.at = now;
            if bucket.tokens >= 1.0 {
                bucket.tokens -= 1.0;
                chosen.push(row);
            } else {
                held.push(key.1);
            }
        }
        chosen
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
    fn a_burst_goes_at_once_then_a_room_waits_for_its_rate_and_others_pass() {
        let pacer = Pacer::new(10.0);
        let mut queue = vec!["!busy:a"; 60];
        queue.push("!quiet:a");
        let chosen = pacer.choose("b", rows(&queue), 100);
        // 50 of the busy room, none after the first held back, and the quiet room's one.
        assert_eq!(chosen.len(), 51);
        assert_eq!(&ids(&chosen)[..50], (0..50).collect::<Vec<_>>());
        assert_eq!(chosen[50].outbox_id, 60);
        // Nothing of the busy room right away; another destination has its own bucket.
        assert!(pacer.choose("b", rows(&["!busy:a"]), 100).is_empty());
        assert_eq!(pacer.choose("c", rows(&["!busy:a"]), 100).len(), 1);
        // After 0.2 s at 10 a second, two more.
        {
            let mut buckets = lock(&pacer.buckets);
            let bucket = buckets
                .get_mut(&("b".to_owned(), "!busy:a".to_owned()))
                .unwrap();
            bucket.at -= Duration::from_millis(200);
        }
        assert_eq!(pacer.choose("b", rows(&["!busy:a"; 5]), 100).len(), 2);
    }

    #[test]
    fn the_limit_and_room_less_pdus_are_respected() {
        let pacer = Pacer::new(10.0);
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
