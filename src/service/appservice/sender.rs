//! Sends application services what interests them in `PUT /_matrix/app/v1/transactions/{txnId}`
//! transactions, in the background, on the same design as the push and federation senders
//! (a durable cursor per consumer, one leading process: [`super::super::sending`]).
//!
//! Rules that keep delivery exactly-once and in order (bridges deduplicate by transaction ID,
//! in memory, and handle a transaction's events in order):
//! - One transaction in flight per appservice: its next events of interest in stream order
//!   (at most [`MAX_EVENTS`]) and, when it asks, ephemeral events, to-device messages
//!   ([`super::to_device`]) and device lists and key counts ([`super::e2ee`]). Its ID (the
//!   last one plus one, so IDs increase forever, across restarts) and body are committed with
//!   the cursor moves before the first attempt, and resent unchanged until the appservice
//!   answers 2xx: a crash between storing and acknowledging resends the same ID with the
//!   same events.
//! - Each cursor (events, to-device, device lists) only moves up to its stream's
//!   persisted-up-to position, so nothing is passed over while an earlier position is still
//!   being written.
//! - A failure backs the appservice off (doubling from 2 s up to 512 s, as Synapse), stored
//!   in PostgreSQL. A successful ping ([`AppserviceSender::appservice_is_up`]) ends it.
//! - Ephemeral events (typing, receipts, presence: [`super::ephemeral`]) are not replayed: those that
//!   happen while an appservice is failing are dropped, as Synapse does. To-device messages
//!   and device-list changes are not: their cursors wait.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use diesel_async::AsyncPgConnection;
use ruma::room_version_rules::RoomVersionRules;
use serde_json::{json, Value};
use tokio::sync::Notify;

use super::{
    e2ee::{self, DeviceLists},
    ephemeral::Ephemeral,
    interest::RoomInterest,
    to_device::{self, ToDeviceBatch},
    Registration, MAX_ANSWER,
};
use crate::{
    error::{Error, Result},
    service::{
        federation::sender::backoff,
        notifier::{Notifier, APPSERVICE_CHANNEL},
        outbound::Outbound,
        presence::Presence,
        rooms::pdu,
        rooms::versions::rules_for,
        sending::Consumers,
    },
    storage::{
        appservice::{self as store, Cursors},
        e2ee::DEVICE_LISTS,
        now_ms, rooms as rooms_store, streams,
        to_device::TO_DEVICE,
        Db,
    },
};

/// Most events in one transaction.
pub const MAX_EVENTS: usize = 100;
/// Events read per pass over the stream (most may be of no interest).
const SCAN: i32 = 500;
/// How long one attempt may take (a bridge handles a transaction before answering).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(35);
/// Advisory-lock key held by the sending process.
const LEADER_LOCK: i64 = 0x6d79_656c_6170_7073; // "myelapps"
/// First retry delay and the cap (Synapse: 2^n s, n = 1..9).
const RETRY_MIN: Duration = Duration::from_secs(2);
const RETRY_MAX: Duration = Duration::from_secs(512);

/// What building the next transaction found.
enum Next {
    /// A transaction to (re)send.
    Txn(i64, Value),
    /// The cursor moved past events of no interest; more may follow.
    Skipped,
    /// Nothing to send.
    Idle,
}

/// The background appservice sender.
pub struct AppserviceSender {
    db: Db,
    http: Arc<Outbound>,
    registrations: Vec<Arc<Registration>>,
    wake: Arc<Notify>,
    consumers: Consumers,
    ephemeral: Ephemeral,
}

impl AppserviceSender {
    /// Creates the sender for the registrations that have a URL.
    pub fn new(
        db: Db,
        http: Arc<Outbound>,
        notifier: Arc<Notifier>,
        presence: Arc<Presence>,
        registrations: &[Arc<Registration>],
    ) -> Arc<Self> {
        let registrations: Vec<Arc<Registration>> = registrations
            .iter()
            .filter(|r| r.url.is_some())
            .cloned()
            .collect();
        Arc::new(AppserviceSender {
            wake: notifier.appservice_wake.clone(),
            db,
            http,
            registrations,
            consumers: Consumers::default(),
            ephemeral: Ephemeral::new(notifier.clone(), presence),
        })
    }

    /// Runs until the process ends, in the leading process only; nothing without appservices.
    pub fn start(self: &Arc<Self>) {
        if self.registrations.is_empty() {
            return;
        }
        let sender = self.clone();
        super::super::sending::lead_forever(
            self.db.clone(),
            LEADER_LOCK,
            self.wake.clone(),
            "sends to application services",
            move || {
                let sender = sender.clone();
                async move { sender.round().await }
            },
        );
    }

    /// The appservice answered a ping: its backoff ends and what is stored goes now.
    pub async fn appservice_is_up(&self, appservice_id: &str) -> Result<()> {
        let conn = self.db.conn().await?;
        store::reset_backoff(&conn, appservice_id).await?;
        rooms_store::notify(&conn, APPSERVICE_CHANNEL, appservice_id).await?;
        Ok(())
    }

    /// Starts a drain for every appservice not already being drained or backed off.
    async fn round(self: &Arc<Self>) -> Result<()> {
        for registration in &self.registrations {
            let state = {
                let conn = self.db.conn().await?;
                store::get_state(&conn, &registration.id).await?
            };
            if state.is_some_and(|s| s.retry_at_ts > now_ms()) {
                continue;
            }
            let sender = self.clone();
            let registration = registration.clone();
            self.consumers.spawn(registration.id.clone(), async move {
                if let Err(err) = sender.drain(&registration).await {
                    tracing::warn!(appservice = %registration.id, "appservice sender: {err}");
                }
            });
        }
        Ok(())
    }

    /// Sends an appservice's transactions one after the other until nothing is left or an
    /// attempt fails.
    async fn drain(&self, registration: &Registration) -> Result<()> {
        loop {
            let (txn_id, body) = match self.next_txn(registration).await? {
                Next::Txn(txn_id, body) => (txn_id, body),
                Next::Skipped => continue,
                Next::Idle => return Ok(()),
            };
            let failure = self.put(registration, txn_id, &body).await.err();
            let conn = self.db.conn().await?;
            let Some(reason) = failure else {
                store::finish_txn(&conn, &registration.id, txn_id).await?;
                continue;
            };
            let failures = store::get_state(&conn, &registration.id)
                .await?
                .map_or(0, |s| s.failures)
                .saturating_add(1);
            let delay = backoff(RETRY_MIN, RETRY_MAX, failures);
            tracing::warn!(appservice = %registration.id, txn_id, %reason, ?delay, "transaction failed; will retry");
            store::set_backoff(
                &conn,
                &registration.id,
                failures,
                now_ms() + delay.as_millis() as i64,
            )
            .await?;
            // Ephemeral events while it is down are not replayed.
            self.ephemeral.drop_pending(&conn, &registration.id).await?;
            return Ok(());
        }
    }

    /// One attempt at `PUT /transactions/{txn_id}` with the stored body.
    async fn put(
        &self,
        registration: &Registration,
        txn_id: i64,
        body: &Value,
    ) -> std::result::Result<(), String> {
        let url = registration.url.as_deref().unwrap_or_default();
        let response = self
            .http
            .send_to_configured(
                reqwest::Method::PUT,
                &format!("{url}/_matrix/app/v1/transactions/{txn_id}"),
                &registration.hs_token,
                Some(body),
                ATTEMPT_TIMEOUT,
                MAX_ANSWER,
            )
            .await
            .map_err(|e| e.to_string())?;
        if response.status.is_success() {
            Ok(())
        } else {
            Err(format!("answered {}", response.status))
        }
    }

    /// The transaction in flight, or a new one built from what is next for the appservice,
    /// committed with the cursors before it is first sent.
    async fn next_txn(&self, registration: &Registration) -> Result<Next> {
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            let positions = streams::positions(conn).await?;
            let now = Cursors {
                events: positions.persisted(streams::EVENTS),
                to_device: positions.persisted(TO_DEVICE),
                device_lists: positions.persisted(DEVICE_LISTS),
            };
            let state = store::lock_state(conn, &registration.id, now).await?;
            let start = state.cursors();
            if let (Some(txn_id), Some(body)) = (state.txn_id, state.txn_body) {
                return Ok(Next::Txn(txn_id, body));
            }
            let mut interest = RoomInterest::new(registration);
            let (chosen, events_reached) =
                next_events(conn, &mut interest, start.events, now.events).await?;
            let events = client_events(conn, &chosen).await?;
            let ephemeral = self
                .ephemeral
                .collect(conn, registration, &mut interest)
                .await?;
            let to_device = if registration.wants_ephemeral() {
                to_device::collect(conn, registration, start.to_device, now.to_device).await?
            } else {
                ToDeviceBatch::none(start.to_device.max(now.to_device))
            };
            let device_lists = if registration.msc3202 {
                let (after, up_to) = (start.device_lists, now.device_lists);
                e2ee::collect(conn, registration, &mut interest, &chosen, after, up_to).await?
            } else {
                DeviceLists::none(start.device_lists.max(now.device_lists))
            };
            let reached = Cursors {
                events: events_reached,
                to_device: to_device.reached,
                device_lists: device_lists.reached,
            };
            if events.is_empty()
                && ephemeral.is_empty()
                && to_device.messages.is_empty()
                && device_lists.is_empty()
            {
                if reached != start {
                    store::set_cursors(conn, &registration.id, reached).await?;
                    return Ok(Next::Skipped);
                }
                return Ok(Next::Idle);
            }
            let rooms: BTreeSet<String> = chosen
                .iter()
                .map(|row| row.room_id.clone())
                .chain(
                    ephemeral
                        .iter()
                        .filter_map(|e| e["room_id"].as_str().map(str::to_owned)),
                )
                .collect();
            let mut body = json!({ "events": events });
            if registration.receive_ephemeral {
                body["ephemeral"] = Value::from(ephemeral.clone());
            }
            if registration.receive_ephemeral_unstable {
                body["de.sorunome.msc2409.ephemeral"] = Value::from(ephemeral);
            }
            if registration.wants_ephemeral() {
                body["de.sorunome.msc2409.to_device"] = Value::from(to_device.messages);
            }
            if registration.msc3202 {
                let recipients = &to_device.recipients;
                e2ee::add_to_body(
                    conn,
                    registration,
                    &mut body,
                    &device_lists,
                    &rooms,
                    recipients,
                )
                .await?;
            }
            let txn_id = state.last_txn_id + 1;
            store::set_txn_in_flight(conn, &registration.id, txn_id, &body, reached).await?;
            Ok(Next::Txn(txn_id, body))
        })
        .await
    }
}

/// The next events of interest in `(after, up_to]`, at most [`MAX_EVENTS`], and the position
/// the event cursor moves to.
async fn next_events(
    conn: &AsyncPgConnection,
    interest: &mut RoomInterest<'_>,
    after: i64,
    up_to: i64,
) -> Result<(Vec<rooms_store::EventRow>, i64)> {
    let rows = if up_to > after {
        store::get_events_between(conn, after, up_to, SCAN).await?
    } else {
        Vec::new()
    };
    let mut reached = match rows.last() {
        Some(last) if rows.len() == SCAN as usize => last.stream_ordering,
        _ => up_to.max(after),
    };
    let mut chosen = Vec::new();
    for row in rows {
        if interest.event(conn, &row).await? {
            let position = row.stream_ordering;
            chosen.push(row);
            if chosen.len() == MAX_EVENTS {
                reached = position;
                break;
            }
        }
    }
    Ok((chosen, reached))
}

/// The client format of stored events (redacted ones pruned), as `/sync` serves them.
async fn client_events(
    conn: &AsyncPgConnection,
    rows: &[rooms_store::EventRow],
) -> Result<Vec<Value>> {
    let mut rules: HashMap<String, RoomVersionRules> = HashMap::new();
    let now = now_ms();
    let mut events = Vec::with_capacity(rows.len());
    for row in rows {
        if !rules.contains_key(&row.room_id) {
            let room = rooms_store::get_room(conn, &row.room_id)
                .await?
                .ok_or_else(|| Error::internal("an event of an unknown room"))?;
            rules.insert(row.room_id.clone(), rules_for(&room.room_version)?);
        }
        let room_rules = &rules[&row.room_id];
        let redaction = match &row.redacted_by {
            Some(id) => rooms_store::get_event(conn, id)
                .await?
                .map(|r| pdu::client_event(&r.event_id, &r.room_id, &r.pdu, room_rules, None, now)),
            None => None,
        };
        let mut event = pdu::client_event(
            &row.event_id,
            &row.room_id,
            &row.pdu,
            room_rules,
            redaction,
            now,
        );
        // A transaction is resent unchanged: nothing in it may depend on when it is sent.
        if let Some(unsigned) = event.get_mut("unsigned").and_then(Value::as_object_mut) {
            unsigned.remove("age");
            unsigned.remove("transaction_id");
        }
        events.push(event);
    }
    Ok(events)
}
