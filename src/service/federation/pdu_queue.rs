//! Puts the events this server creates into the outbox of every other server in their rooms,
//! for the [`Sender`](super::sender::Sender) to deliver (FEDERATION.md §5 "Sending PDUs",
//! invariants 3, 4 and 7).
//!
//! - **Which events.** A cursor walks the event stream up to the persisted-up-to position
//!   (never past a position still being written, so no event is passed over) and takes the
//!   events clients are served (never an outlier, a rejected or a soft-failed event) whose
//!   sender is on this server. Another server's event is never sent on (invariant 4; Synapse
//!   relayed them, synapse#1753): its origin sends it where it must go.
//! - **Where to.** Every other server with a joined member in the state *after* the event (its
//!   state group), so the leave, kick or ban of a server's last member still reaches that
//!   server; and for a member event the server of its target (`state_key`), so invites,
//!   kicks and bans reach the target's server. The state group is exact at that event however
//!   far the cursor lags, where `room_memberships` holds only the current state (a server
//!   that joined later would get older events, one that left later would miss some). A
//!   group's servers are cached: state groups never change. Never ourselves, never a server
//!   outside the allow list.
//! - **What.** The stored PDU, signed, without `unsigned` (nothing local such as the
//!   client's `transaction_id` leaves the server; the form `/event` serves).
//! - **Durable and ordered.** The cursor moves in the database transaction that queues the
//!   events it passes, and that transaction holds the cursor's advisory lock, so a crash
//!   queues nothing twice and skips nothing, and two processes that both believe they lead
//!   cannot queue the same events. Past events that queue nothing (rooms without other
//!   servers) it moves in memory, stored only every thousand positions or two seconds: a
//!   transaction that writes nothing does not wait for the disk at commit. Each destination's
//!   PDUs are queued, and so leave, in stream order.
//! - **Bounded.** A destination that stays down keeps about `max_queued_pdus` unsent PDUs at
//!   most: beyond that the oldest are dropped (and logged). When it is back it gets the newer ones,
//!   whose `prev_events` lead back into the gap, and fills it from us with
//!   `get_missing_events` and `/state_ids` as it does after any gap (Synapse's catch-up sends
//!   only the newest event per room and relies on the same).

use std::{
    collections::{BTreeMap, HashMap},
    num::NonZeroUsize,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use diesel_async::AsyncPgConnection;
use lru::LruCache;
use ruma::{OwnedServerName, UserId};
use serde_json::Value;

use crate::{
    config::FederationConfig,
    error::Result,
    storage::{
        federation_sending::{self as store, EventToSend},
        now_ms, state as state_store, streams, Db,
    },
};

/// Events read per database transaction.
const BATCH: i32 = 200;
/// State groups whose servers are remembered.
const CACHED_GROUPS: usize = 1024;

/// The servers with a joined member in one state, and how many members each has joined.
type Servers = Arc<BTreeMap<OwnedServerName, usize>>;

/// Queues our new events for the servers in their rooms; run by the sending process only.
pub struct PduQueue {
    db: Db,
    config: FederationConfig,
    origin: OwnedServerName,
    servers: Mutex<LruCache<i64, Servers>>,
    queued_since_trim: Mutex<HashMap<String, u64>>,
    /// Where the cursor has gone past events that queued nothing, ahead of the stored one:
    /// (the stored cursor it started from, how far it went, since when).
    unstored: Mutex<Option<Unstored>>,
}

/// A cursor that moved past events with nothing to queue, not yet stored.
#[derive(Clone, Copy)]
struct Unstored {
    stored: i64,
    reached: i64,
    since: Instant,
}

/// How far ahead of the stored cursor, in positions, or for how long, the cursor may run
/// over events that queue nothing before it is stored: the events a restart reads again.
const STORE_AFTER_POSITIONS: i64 = 1000;
const STORE_AFTER: Duration = Duration::from_secs(2);

impl PduQueue {
    /// Creates the queue for events of `origin` (this server).
    pub fn new(db: Db, config: FederationConfig, origin: OwnedServerName) -> Self {
        PduQueue {
            db,
            config,
            origin,
            servers: Mutex::new(LruCache::new(
                NonZeroUsize::new(CACHED_GROUPS).expect("non-zero"),
            )),
            queued_since_trim: Mutex::default(),
            unstored: Mutex::default(),
        }
    }

    /// Queues every event committed since the cursor and moves the cursor past them; answers
    /// how many PDUs were queued (one per event and destination).
    pub async fn queue_new_events(&self) -> Result<usize> {
        let mut queued = 0;
        loop {
            let (count, more) = self.queue_batch().await?;
            queued += count;
            if !more {
                return Ok(queued);
            }
        }
    }

    /// Queues the next [`BATCH`] events at most, in one database transaction; answers how many
    /// PDUs it queued and whether more events may follow.
    async fn queue_batch(&self) -> Result<(usize, bool)> {
        crate::metrics::metrics().federation_queue_passes.inc();
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            let stored = store::lock_pdu_cursor(conn).await?;
            // Ahead of the stored cursor when this process passed events that queued nothing
            // since (and no other process moved it meanwhile).
            let ahead = self
                .unstored
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .filter(|ahead| ahead.stored == stored);
            let cursor = ahead.map_or(stored, |ahead| ahead.reached);
            let since = ahead.map_or_else(Instant::now, |ahead| ahead.since);
            let up_to = streams::persisted(conn, streams::EVENTS).await?;
            if up_to <= cursor {
                // Nothing new: a cursor left ahead in memory is stored once it is due.
                self.move_cursor(conn, stored, (cursor, since), false).await?;
                return Ok((0, false));
            }
            let events =
                store::get_events_to_send(conn, cursor, up_to, self.origin.as_str(), BATCH)
                    .await?;
            let more = events.len() == BATCH as usize;
            let reached = match events.last() {
                Some(last) if more => last.stream_ordering,
                _ => up_to,
            };
            let mut pdus = Vec::new();
            for event in &events {
                if !self.is_ours(&event.sender) {
                    continue;
                }
                let destinations = self.destinations(conn, event).await?;
                if !destinations.is_empty() {
                    pdus.push((destinations, event.event_id.as_str(), federation_form(&event.pdu)));
                }
            }
            let rows: Vec<store::NewPdu<'_>> = pdus
                .iter()
                .flat_map(|(destinations, event_id, pdu)| {
                    destinations
                        .iter()
                        .map(move |destination| (destination.as_str(), *event_id, pdu))
                })
                .collect();
            store::queue_pdus(conn, &rows, now_ms()).await?;
            for destination in self.due_for_trim(&rows) {
                let keep = self.config.max_queued_pdus as i64;
                let dropped = store::trim_unsent_pdus(conn, &destination, keep).await?;
                if dropped > 0 {
                    tracing::warn!(%destination, dropped, "too many events queued for a server that is down; dropped the oldest (it fetches them with get_missing_events)");
                }
            }
            self.move_cursor(conn, stored, (reached, since), !rows.is_empty())
                .await?;
            Ok((rows.len(), more))
        })
        .await
    }

    /// Moves the cursor from `stored` to `reached` (ahead in memory since `since`): in the
    /// database with what it `queued`, else only once it is due. Storing it is the one write
    /// a transaction that queued nothing would make, and a write waits at commit for the
    /// disk; events passed and not stored are read again after a restart, and again queue
    /// nothing.
    async fn move_cursor(
        &self,
        conn: &AsyncPgConnection,
        stored: i64,
        (reached, since): (i64, Instant),
        queued: bool,
    ) -> Result<()> {
        let due =
            queued || reached - stored >= STORE_AFTER_POSITIONS || since.elapsed() >= STORE_AFTER;
        let store_now = reached != stored && due;
        if store_now {
            store::set_pdu_cursor(conn, reached).await?;
        }
        *self.unstored.lock().unwrap_or_else(|e| e.into_inner()) =
            (reached != stored && !store_now).then_some(Unstored {
                stored,
                reached,
                since,
            });
        Ok(())
    }

    /// The destinations among `rows` whose backlog is due a trim: one per tenth of
    /// `max_queued_pdus` queued since the last (trimming reads up to that many rows; this keeps
    /// it to about ten reads per event however many servers are down). Counts are this
    /// process's, so a backlog may pass the bound by a tenth, and after a restart by a little
    /// more.
    fn due_for_trim(&self, rows: &[store::NewPdu<'_>]) -> Vec<String> {
        let every = (self.config.max_queued_pdus / 10).max(1);
        let mut counts = self
            .queued_since_trim
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut due = Vec::new();
        for (destination, ..) in rows {
            let count = counts.entry((*destination).to_owned()).or_default();
            *count += 1;
            if *count >= every {
                *count = 0;
                if !due.iter().any(|d: &String| d == destination) {
                    due.push((*destination).to_owned());
                }
            }
        }
        due
    }

    /// Whether `sender` is a user of this server (the SQL only matched a suffix).
    fn is_ours(&self, sender: &str) -> bool {
        UserId::parse(sender).is_ok_and(|user| user.server_name() == self.origin)
    }

    /// The servers `event` goes to: those with a joined member in the state after it, plus a
    /// member event's target's server (a kick or ban reaches the server it removes), except for
    /// an invite, which reached it through `/invite` already (sent again, it would arrive after
    /// a quick accept and fail the state); never ours, never one we may not contact.
    async fn destinations(
        &self,
        conn: &AsyncPgConnection,
        event: &EventToSend,
    ) -> Result<Vec<OwnedServerName>> {
        let servers = self.servers_in(conn, event.state_group).await?;
        let membership = event
            .pdu
            .pointer("/content/membership")
            .and_then(Value::as_str);
        let is_invite = membership == Some("invite");
        let target = (event.event_type == "m.room.member" && !is_invite)
            .then(|| {
                event
                    .state_key
                    .as_deref()
                    .and_then(|key| UserId::parse(key).ok())
            })
            .flatten()
            .map(|user| user.server_name().to_owned());
        let mut destinations: Vec<OwnedServerName> = servers.keys().cloned().collect();
        if let Some(target) = target.filter(|t| !servers.contains_key(t)) {
            destinations.push(target);
        }
        destinations.retain(|server| *server != self.origin && self.config.allows(server));
        Ok(destinations)
    }

    /// The servers with a joined member in state group `group`, with how many each has. A
    /// delta group's are its parent's with the delta's membership changes applied (each
    /// group's counts are cached, and the parents of new groups are the recent bases of the
    /// room's skip deltas), so a join into a big room reads the join alone; only a snapshot's
    /// are read member by member. Reading every member for every new group (48 ms at 20,000
    /// members) left the sender behind a burst of joins for minutes.
    async fn servers_in(&self, conn: &AsyncPgConnection, group: i64) -> Result<Servers> {
        // The groups above the nearest one known, nearest first, with their changes.
        let mut deltas = Vec::new();
        let mut at = group;
        let mut servers = loop {
            if let Some(servers) = self.cached_servers(at) {
                break servers;
            }
            let changes = state_store::get_member_changes(conn, at).await?;
            match changes.parent {
                Some(parent) => {
                    deltas.push((at, changes.members));
                    at = parent;
                }
                None => {
                    let users = state_store::get_joined_users(conn, at).await?;
                    let mut counts = BTreeMap::new();
                    for user in users.iter().filter_map(|u| UserId::parse(u.as_str()).ok()) {
                        *counts.entry(user.server_name().to_owned()).or_insert(0) += 1;
                    }
                    let servers = Arc::new(counts);
                    self.cache_servers(at, &servers);
                    break servers;
                }
            }
        };
        for (at, members) in deltas.into_iter().rev() {
            let mut counts = (*servers).clone();
            for (user, joined, was_joined) in members {
                let Ok(user) = UserId::parse(user.as_str()) else {
                    continue;
                };
                let server = user.server_name();
                match (joined, was_joined) {
                    (true, false) => *counts.entry(server.to_owned()).or_insert(0) += 1,
                    (false, true) => {
                        if let Some(count) = counts.get_mut(server) {
                            *count -= 1;
                            if *count == 0 {
                                counts.remove(server);
                            }
                        }
                    }
                    _ => {}
                }
            }
            servers = Arc::new(counts);
            self.cache_servers(at, &servers);
        }
        Ok(servers)
    }

    fn cached_servers(&self, group: i64) -> Option<Servers> {
        let mut cache = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        cache.get(&group).cloned()
    }

    fn cache_servers(&self, group: i64, servers: &Servers) {
        let mut cache = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        cache.put(group, servers.clone());
    }
}

/// A stored PDU as it goes to other servers: without `unsigned`, like every PDU we serve
/// (`room_access::federation_pdu`).
fn federation_form(pdu: &Value) -> Value {
    let mut pdu = pdu.clone();
    if let Some(object) = pdu.as_object_mut() {
        object.remove("unsigned");
    }
    pdu
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn nothing_local_leaves_in_a_pdu() {
        let pdu = json!({
            "type": "m.room.message",
            "content": { "body": "hi" },
            "unsigned": { "transaction_id": "t1", "age": 3 },
        });
        assert_eq!(
            federation_form(&pdu),
            json!({ "type": "m.room.message", "content": { "body": "hi" } })
        );
    }
}
