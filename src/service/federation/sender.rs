//! Sends what is queued for other servers in `PUT /_matrix/federation/v1/send/{txnId}`
//! transactions, in the background: our events (PDUs, queued from the event stream by
//! [`PduQueue`]) and EDUs.
//!
//! Rules that keep delivery exactly-once on the receiver (FEDERATION.md §5, invariant 3):
//! - One transaction in flight per destination: its oldest queued PDUs (at most
//!   [`MAX_PDUS`], in stream order; one room's paced to a server that answers before it
//!   processes, [`super::pacing`]) and EDUs (at most [`MAX_EDUS`]). Its ID and body are
//!   committed before the first attempt and resent unchanged until the destination answers
//!   200, so a crash mid-send resends the same transaction and the receiver deduplicates it by
//!   `(origin, txnId)`.
//! - What is queued leaves the outbox only after that 200 (invariant 8: durable). A PDU the
//!   destination refuses (an `error` for it in the 200) is not retried: the spec makes a bad
//!   PDU an answer, not a failed transaction.
//! - A failure backs the destination off: jittered, doubling from `retry_min` up to
//!   `retry_max`, stored in PostgreSQL so a restart keeps it. Any authenticated request from
//!   the destination ends the backoff ([`Sender::destination_is_up`]).
//! - One server process sends at a time (it holds a PostgreSQL advisory lock, distinct from
//!   the push sender's), woken by `NOTIFY` on [`FEDERATION_CHANNEL`] from whichever process
//!   queued EDUs or wrote an event that may go to other servers (one in a room with another
//!   server's member), and by a tick for retries coming due, events whose commit an earlier
//!   position held back, and the events of rooms no other server is in, which the queue's
//!   cursor passes over.
//! - With federation off nothing is queued or sent.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use diesel_async::AsyncPgConnection;
use rand::Rng;
use ruma::{
    api::federation::transactions::send_transaction_message, serde::Raw,
    MilliSecondsSinceUnixEpoch, OwnedServerName, OwnedTransactionId, ServerName, UInt,
};
use serde_json::{json, Value};
use tokio::sync::Notify;

use super::{
    edus,
    pacing::{Pacer, PROBE_EVERY},
    pdu_queue::PduQueue,
    FederationClient, FederationError,
};
use crate::{
    config::FederationConfig,
    error::{Error, Result},
    service::{
        notifier::FEDERATION_CHANNEL,
        sending::{self, Consumers},
    },
    storage::{federation_received, federation_sending as store, now_ms, rooms::notify, Db},
};

/// Most PDUs in one transaction (the spec's limit).
pub const MAX_PDUS: i64 = 50;
/// Most EDUs in one transaction (the spec's limit).
pub const MAX_EDUS: i64 = 100;
/// Queued PDUs looked at for a paced destination's transaction.
const PACED_CANDIDATES: i64 = 4 * MAX_PDUS;
/// Advisory-lock key held by the sending process.
const LEADER_LOCK: i64 = 0x6d79_656c_6665_6473; // "myelfeds"
/// Most of a destination's answer to `/send` that is read.
const MAX_SEND_RESPONSE: usize = 1024 * 1024;
/// How long received transaction IDs and to-device message IDs are remembered.
const RECEIVED_KEPT: Duration = Duration::from_secs(24 * 3600);
/// How often the leader forgets old received IDs.
const CLEANUP_EVERY: Duration = Duration::from_secs(3600);
/// Typing older than this is not sent (receivers time typing out after 60 s at most).
const TYPING_KEPT: Duration = Duration::from_secs(30);
/// How often one process resets a destination's backoff at most (each reset is a write).
const RESET_THROTTLE: Duration = Duration::from_secs(5);

/// The background federation sender.
pub struct Sender {
    db: Db,
    client: Arc<FederationClient>,
    config: FederationConfig,
    origin: OwnedServerName,
    wake: Arc<Notify>,
    pdus: PduQueue,
    pacer: Pacer,
    busy: Consumers,
    /// When the leader last forgot old received IDs.
    cleaned: Mutex<Option<Instant>>,
    recently_up: Mutex<HashMap<OwnedServerName, Instant>>,
}

/// What became of one attempt to send a transaction.
enum Outcome {
    /// 200: the PDUs and EDUs were delivered.
    Delivered,
    /// The destination refused the transaction itself (400) or may not be contacted: it will
    /// never be accepted, so it is dropped rather than blocking the queue forever.
    Undeliverable(String),
    /// Try again after a backoff.
    Failed(String),
}

impl Sender {
    /// Creates the sender; `wake` is notified whenever something is queued or an event that
    /// may go to other servers is written.
    pub fn new(
        db: Db,
        client: Arc<FederationClient>,
        config: FederationConfig,
        origin: OwnedServerName,
        wake: Arc<Notify>,
    ) -> Arc<Self> {
        Arc::new(Sender {
            pdus: PduQueue::new(db.clone(), config.clone(), origin.clone()),
            pacer: Pacer::new(config.room_window as usize),
            db,
            client,
            config,
            origin,
            wake,
            busy: Consumers::default(),
            cleaned: Mutex::default(),
            recently_up: Mutex::default(),
        })
    }

    /// Runs until the process ends: waits to become the sending process, then sends. Does
    /// nothing when federation is off.
    pub fn start(self: &Arc<Self>) {
        if !self.config.enabled {
            return;
        }
        let sender = self.clone();
        sending::lead_forever(
            self.db.clone(),
            LEADER_LOCK,
            self.wake.clone(),
            "sends to other servers",
            move || {
                let sender = sender.clone();
                async move { sender.round().await }
            },
        );
    }

    /// Whether federation is on (nothing is queued or sent otherwise).
    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// This server's name.
    pub fn origin(&self) -> &OwnedServerName {
        &self.origin
    }

    /// Queues an EDU for `destination` inside the caller's transaction and wakes the sender
    /// at commit. Destinations we may not contact (federation off, not allowed, ourselves) get
    /// nothing: false.
    pub async fn queue_edu(
        &self,
        conn: &AsyncPgConnection,
        destination: &ServerName,
        edu_type: &str,
        content: &Value,
    ) -> Result<bool> {
        if !self.config.enabled || !self.config.allows(destination) || destination == self.origin {
            return Ok(false);
        }
        store::queue_edu(conn, destination.as_str(), edu_type, content, now_ms()).await?;
        notify(conn, FEDERATION_CHANNEL, destination.as_str()).await?;
        Ok(true)
    }

    /// `origin` just made an authenticated request to us, so it is up: its backoff ends and
    /// what is queued for it goes now. Runs in the background (the request does not wait).
    pub fn destination_is_up(self: &Arc<Self>, origin: &ServerName) {
        if !self.config.enabled {
            return;
        }
        {
            let mut recent = self.recently_up.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            if recent
                .get(origin)
                .is_some_and(|at| now.duration_since(*at) < RESET_THROTTLE)
            {
                return;
            }
            if recent.len() > 10_000 {
                recent.retain(|_, at| now.duration_since(*at) < RESET_THROTTLE);
            }
            recent.insert(origin.to_owned(), now);
        }
        let sender = self.clone();
        let origin = origin.to_owned();
        tokio::spawn(async move {
            let result = async {
                let conn = sender.db.conn().await?;
                if store::reset_backoff(&conn, origin.as_str()).await? {
                    tracing::info!(%origin, "backed-off server contacted us; sending now");
                    notify(&conn, FEDERATION_CHANNEL, origin.as_str()).await?;
                }
                Ok::<_, Error>(())
            }
            .await;
            if let Err(err) = result {
                tracing::warn!(%origin, "could not reset the backoff: {err}");
            }
        });
    }

    /// Forgets old received IDs now and then, queues our new events, then starts a drain for
    /// every destination with something queued that is not already being drained or backed
    /// off.
    async fn round(self: &Arc<Self>) -> Result<()> {
        let cleanup_due = self
            .cleaned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none_or(|at| at.elapsed() >= CLEANUP_EVERY);
        if cleanup_due {
            let conn = self.db.conn().await?;
            let before = now_ms() - RECEIVED_KEPT.as_millis() as i64;
            federation_received::delete_received_before(&conn, before).await?;
            *self.cleaned.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        }
        // EDUs still go when our events cannot be queued.
        if let Err(err) = self.pdus.queue_new_events().await {
            tracing::warn!("could not queue our events for other servers: {err}");
        }
        let destinations = {
            let conn = self.db.conn().await?;
            store::get_ready_destinations(&conn, now_ms()).await?
        };
        for destination in destinations {
            let sender = self.clone();
            self.busy.spawn(destination.clone(), async move {
                if let Err(err) = sender.drain(&destination).await {
                    tracing::warn!(%destination, "federation sender: {err}");
                }
            });
        }
        Ok(())
    }

    /// Sends a destination's transactions one after the other until its queue is empty or an
    /// attempt fails.
    async fn drain(&self, destination: &str) -> Result<()> {
        let Ok(server) = ServerName::parse(destination) else {
            tracing::warn!(%destination, "queued for an invalid server name; dropping it all");
            let conn = self.db.conn().await?;
            return Ok(store::delete_queue(&conn, destination).await?);
        };
        let paced = self.pacer.is_paced(&self.client, &server).await;
        loop {
            if paced {
                self.pacer.probe(&self.client, &server).await;
            }
            let Some((txn_id, body)) = self.next_txn(destination, paced).await? else {
                // A room's window is full: wait for the destination to get through it.
                if paced && self.pacer.held_back(destination) {
                    tokio::time::sleep(PROBE_EVERY).await;
                    continue;
                }
                return Ok(());
            };
            let outcome = self.send(&server, &txn_id, &body).await;
            crate::metrics::Metrics::count(
                &crate::metrics::metrics().federation_transactions,
                match outcome {
                    Outcome::Delivered => "sent",
                    Outcome::Undeliverable(_) => "dropped",
                    Outcome::Failed(_) => "failed",
                },
            );
            match outcome {
                Outcome::Delivered => {
                    let conn = self.db.conn().await?;
                    store::finish_txn(&conn, destination, &txn_id).await?;
                }
                Outcome::Undeliverable(reason) => {
                    let pdus = body["pdus"].as_array().map_or(0, Vec::len);
                    let edus = body["edus"].as_array().map_or(0, Vec::len);
                    tracing::error!(%destination, %txn_id, %reason, "transaction refused; dropping its {pdus} PDU(s) and {edus} EDU(s)");
                    let conn = self.db.conn().await?;
                    store::finish_txn(&conn, destination, &txn_id).await?;
                }
                Outcome::Failed(reason) => {
                    let conn = self.db.conn().await?;
                    let failures = store::get_destination(&conn, destination)
                        .await?
                        .map_or(0, |d| d.failures)
                        .saturating_add(1);
                    let delay = backoff(self.config.retry_min, self.config.retry_max, failures);
                    tracing::warn!(%destination, %txn_id, %reason, ?delay, "sending failed; will retry");
                    let retry_at = now_ms() + delay.as_millis() as i64;
                    store::set_backoff(&conn, destination, failures, retry_at).await?;
                    return Ok(());
                }
            }
        }
    }

    /// The transaction in flight to `destination`, or a new one built from its oldest queued
    /// PDUs (those their rooms' pacing lets through, when `paced`) and EDUs, committed before
    /// it is first sent; `None` when nothing is queued or may go yet.
    async fn next_txn(&self, destination: &str, paced: bool) -> Result<Option<(String, Value)>> {
        let mut conn = self.db.conn().await?;
        let origin = self.origin.clone();
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            if let Some(row) = store::get_destination(conn, destination).await? {
                if let (Some(txn_id), Some(body)) = (row.txn_id, row.txn_body) {
                    return Ok(Some((txn_id, body)));
                }
            }
            // Typing queued while the destination was unreachable is over by now.
            let stale_typing = now_ms() - TYPING_KEPT.as_millis() as i64;
            store::delete_unsent_edus_before(conn, destination, edus::TYPING, stale_typing).await?;
            // Paced, a busy room's held-back PDUs may fill the oldest rows: look further.
            let candidates = if paced { PACED_CANDIDATES } else { MAX_PDUS };
            let (pdu_rows, edu_rows) = tokio::try_join!(
                store::get_unsent_pdus(conn, destination, candidates),
                store::get_unsent_edus(conn, destination, MAX_EDUS),
            )?;
            let pdu_rows = match paced {
                true => self.pacer.choose(destination, pdu_rows, MAX_PDUS as usize),
                false => pdu_rows,
            };
            if pdu_rows.is_empty() && edu_rows.is_empty() {
                return Ok(None);
            }
            let txn_id = new_txn_id();
            let pdus: Vec<&Value> = pdu_rows.iter().map(|row| &row.pdu).collect();
            let edus: Vec<Value> = edu_rows
                .iter()
                .map(|row| json!({ "edu_type": row.edu_type, "content": row.content }))
                .collect();
            let body = json!({
                "origin": origin,
                "origin_server_ts": now_ms(),
                "pdus": pdus,
                "edus": edus,
            });
            let ids: Vec<i64> = pdu_rows
                .iter()
                .map(|row| row.outbox_id)
                .chain(edu_rows.iter().map(|row| row.outbox_id))
                .collect();
            store::set_txn_in_flight(conn, destination, &txn_id, &body, &ids).await?;
            Ok(Some((txn_id, body)))
        })
        .await
    }

    /// One attempt at `PUT /send/{txn_id}` with the stored body.
    async fn send(&self, destination: &ServerName, txn_id: &str, body: &Value) -> Outcome {
        let request = match txn_request(txn_id, body) {
            Ok(request) => request,
            Err(reason) => return Outcome::Undeliverable(reason),
        };
        match self
            .client
            .send_raw(destination, request, MAX_SEND_RESPONSE)
            .await
        {
            Ok(raw) if raw.status == 200 => {
                log_refused_pdus(destination, txn_id, &raw.body);
                Outcome::Delivered
            }
            Ok(raw) => Outcome::Failed(format!("answered {}", raw.status)),
            Err(FederationError::NotAllowed(reason)) => Outcome::Undeliverable(reason),
            Err(err @ FederationError::Remote { status: 400, .. }) => {
                Outcome::Undeliverable(err.to_string())
            }
            Err(err) => Outcome::Failed(err.to_string()),
        }
    }
}

/// Logs (debug) the PDUs a destination answered an error for: it will not accept them, so
/// they are not sent again, and the rest of the transaction stands.
fn log_refused_pdus(destination: &ServerName, txn_id: &str, answer: &[u8]) {
    let Ok(answer) = serde_json::from_slice::<Value>(answer) else {
        return;
    };
    for (event_id, result) in answer["pdus"].as_object().into_iter().flatten() {
        if let Some(error) = result.get("error") {
            tracing::debug!(%destination, %txn_id, %event_id, %error, "the destination refused our event");
        }
    }
}

/// The ruma request for a stored transaction body.
fn txn_request(
    txn_id: &str,
    body: &Value,
) -> std::result::Result<send_transaction_message::v1::Request, String> {
    let origin = body["origin"]
        .as_str()
        .and_then(|o| OwnedServerName::try_from(o).ok())
        .ok_or("stored transaction without an origin")?;
    let ts = body["origin_server_ts"]
        .as_u64()
        .and_then(|ts| UInt::try_from(ts).ok())
        .ok_or("stored transaction without a timestamp")?;
    let mut request = send_transaction_message::v1::Request::new(
        OwnedTransactionId::from(txn_id),
        origin,
        MilliSecondsSinceUnixEpoch(ts),
    );
    for edu in body["edus"].as_array().into_iter().flatten() {
        let raw = serde_json::value::to_raw_value(edu).map_err(|e| e.to_string())?;
        request.edus.push(Raw::from_json(raw));
    }
    for pdu in body["pdus"].as_array().into_iter().flatten() {
        request
            .pdus
            .push(serde_json::value::to_raw_value(pdu).map_err(|e| e.to_string())?);
    }
    Ok(request)
}

/// A new transaction ID: the time and 64 random bits, unique per destination.
fn new_txn_id() -> String {
    format!("{}.{:016x}", now_ms(), rand::rng().random::<u64>())
}

/// The delay before the next attempt after `failures` failures in a row: `min` doubled per
/// earlier failure, times a random factor in [0.5, 2) so servers that failed together do not
/// retry in lockstep, at most `max`.
pub fn backoff(min: Duration, max: Duration, failures: i32) -> Duration {
    let doublings = failures.saturating_sub(1).clamp(0, 30) as u32;
    let nominal = min.saturating_mul(1u32 << doublings).min(max);
    let factor = rand::rng().random_range(0.5..2.0);
    nominal.mul_f64(factor).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        let min = Duration::from_secs(2);
        let max = Duration::from_secs(3600);
        for _ in 0..100 {
            let first = backoff(min, max, 1);
            assert!(first >= Duration::from_secs(1) && first < Duration::from_secs(4));
            let fourth = backoff(min, max, 4);
            assert!(fourth >= Duration::from_secs(8) && fourth < Duration::from_secs(32));
            assert!(backoff(min, max, 40) <= max);
            assert!(backoff(min, max, i32::MAX) <= max);
        }
    }

    #[test]
    fn a_stored_body_becomes_its_request() {
        let body = json!({
            "origin": "example.org",
            "origin_server_ts": 1234,
            "pdus": [],
            "edus": [{ "edu_type": "m.direct_to_device", "content": { "message_id": "m1" } }],
        });
        let request = txn_request("t1", &body).unwrap();
        assert_eq!(request.transaction_id.as_str(), "t1");
        assert_eq!(request.origin.as_str(), "example.org");
        assert_eq!(request.edus.len(), 1);
        assert_eq!(
            request.edus[0].json().get(),
            serde_json::to_string(&body["edus"][0]).unwrap()
        );
    }
}
