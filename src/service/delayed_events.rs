//! Delayed events (MSC4140): a message or state event a client schedules now and the server
//! sends later, unless the client cancels it or keeps restarting its timer (Element Call ends a
//! call membership this way when a client disappears).
//!
//! The timer is durable: scheduled events live in PostgreSQL, and one process of a scale-out
//! (the holder of an advisory lock, like the push and federation senders) sends them when they
//! are due, woken by `NOTIFY` on [`DELAYED_CHANNEL`] whenever one is scheduled or restarted.
//! Exactly once: a process claims an event with a conditional update (`scheduled` ->
//! `sending`) that only one can win, and sends it with a transaction ID of its own, so a
//! process that dies mid-send and has its claim taken over later cannot send it twice (the
//! retry returns the first event). A delayed `m.room.member` event, which has no transaction
//! ID, is recorded as failed instead of being sent again after such a crash.
//!
//! The event goes through the same write path as any send (`Rooms::send_event` or
//! `send_state`), with every check as of the moment it is sent: an owner who lost the right to
//! send it by then gets a `failed` record, not an event.

use std::{sync::Arc, time::Duration};

use ruma::{RoomId, UserId};
use serde_json::Value;
use tokio::sync::Notify;

use crate::{
    config::Config,
    error::{Error, Result},
    service::{
        rooms::{
            send::{Origin, Sender},
            Rooms,
        },
        sessions::generate_token,
        Services,
    },
    storage::{
        delayed_events::{self as store, DelayedEventRow, NewDelayedEvent},
        leader::Leadership,
        now_ms,
        rooms::notify,
        Db,
    },
};

/// Channel announcing scheduled or restarted delayed events (payload empty).
pub const DELAYED_CHANNEL: &str = "myelin_delayed";
/// Scheduled delayed events a user may have at once (Synapse's default).
pub const MAX_SCHEDULED_PER_USER: i64 = 100;
/// Advisory-lock key held by the process that sends due delayed events.
const LEADER_LOCK: i64 = 0x6d79_656c_6465_6c61; // "myeldela"
/// Longest sleep without being woken (a lost notification delays an event at most this long).
const IDLE_TICK: Duration = Duration::from_secs(5);
/// A claim older than this was left by a process that died while sending.
const STALE_CLAIM_MS: i64 = 60_000;
/// Events claimed per round.
const BATCH: i64 = 50;
/// How long finalised events can still be looked up.
const KEEP_FINALISED_MS: i64 = 7 * 24 * 3600 * 1000;
/// Device ID under which delayed sends record their transaction IDs: no real device has it,
/// so no client sees them as its own remote echo.
const TXN_DEVICE: &str = "";

/// Scheduling and managing delayed events.
pub struct DelayedEvents {
    db: Db,
    config: Arc<Config>,
    /// Woken on [`DELAYED_CHANNEL`].
    pub wake: Arc<Notify>,
}

impl DelayedEvents {
    /// Creates the service; `wake` is notified when a delayed event is scheduled or restarted.
    pub fn new(db: Db, config: Arc<Config>, wake: Arc<Notify>) -> Self {
        DelayedEvents { db, config, wake }
    }

    /// The longest delay allowed, `None` when delayed events are off.
    pub fn max_delay_ms(&self) -> Option<u64> {
        self.config.max_event_delay_ms
    }

    /// Schedules an event for `delay_ms` from now; returns its delay ID. The event is checked
    /// in full only when it is sent. A `/send` retried with its transaction ID (however late
    /// or concurrent) gets the first request's delay ID and schedules nothing.
    #[allow(clippy::too_many_arguments)]
    pub async fn schedule(
        &self,
        owner: &UserId,
        device_id: &str,
        txn_id: Option<&str>,
        room_id: &RoomId,
        event_type: &str,
        state_key: Option<&str>,
        content: &Value,
        delay_ms: u64,
    ) -> Result<String> {
        let Some(max) = self.max_delay_ms() else {
            return Err(Error::forbidden(
                "Sending delayed events has been disallowed",
            ));
        };
        if delay_ms > max {
            return Err(Error::matrix(
                actix_web::http::StatusCode::BAD_REQUEST,
                "ORG.MATRIX.MSC4140_DELAY_TOO_LARGE",
                format!("The requested delay ({delay_ms}ms) exceeds the allowed maximum ({max}ms)"),
            ));
        }
        if !content.is_object() {
            return Err(Error::bad_json("Event content must be a JSON object"));
        }
        if state_key.is_some() && event_type == "m.room.member" {
            // The state key of a member event must be a user ID (as a direct send requires).
            UserId::parse(state_key.unwrap_or_default())
                .map_err(|_| Error::bad_json("The state key of a member event is a user ID"))?;
        }
        let delay_id = generate_token("myd");
        let conn = self.db.conn().await?;
        // An unknown room fails now, as Synapse's check of the room version does.
        if crate::storage::rooms::get_room(&conn, room_id.as_str())
            .await?
            .is_none()
        {
            return Err(Error::not_found("Unknown room"));
        }
        if store::count_scheduled(&conn, owner.as_str()).await? >= MAX_SCHEDULED_PER_USER {
            return Err(Error::matrix(
                actix_web::http::StatusCode::TOO_MANY_REQUESTS,
                "M_LIMIT_EXCEEDED",
                "The maximum number of delayed events has been reached",
            ));
        }
        let new = NewDelayedEvent {
            delay_id: &delay_id,
            user_id: owner.as_str(),
            device_id,
            room_id: room_id.as_str(),
            event_type,
            state_key,
            content,
            delay_ms: i64::try_from(delay_ms).map_err(|_| Error::invalid_param("delay"))?,
            txn_id,
        };
        let delay_id = store::insert(&conn, &new, now_ms()).await?;
        notify(&conn, DELAYED_CHANNEL, "").await?;
        self.wake.notify_one();
        Ok(delay_id)
    }

    /// Starts a scheduled event's delay again from now.
    pub async fn restart(&self, delay_id: &str) -> Result<()> {
        let conn = self.db.conn().await?;
        if !store::restart(&conn, delay_id, now_ms()).await? {
            return Err(not_found());
        }
        notify(&conn, DELAYED_CHANNEL, "").await?;
        Ok(())
    }

    /// Cancels a scheduled event: it will never be sent.
    pub async fn cancel(&self, delay_id: &str) -> Result<()> {
        let conn = self.db.conn().await?;
        if !store::cancel(&conn, delay_id, "cancelled by request", now_ms()).await? {
            return Err(not_found());
        }
        Ok(())
    }

    /// Sends a scheduled event now; the send's own error (the owner may no longer send it) is
    /// the caller's answer, and the event is recorded as failed.
    pub async fn send_now(&self, rooms: &Rooms, delay_id: &str) -> Result<()> {
        let claimed = {
            let conn = self.db.conn().await?;
            store::claim_one(&conn, delay_id, now_ms()).await?
        };
        let row = claimed.ok_or_else(not_found)?;
        self.deliver(rooms, &row).await
    }

    /// A user's scheduled events, soonest first.
    pub async fn scheduled(&self, owner: &UserId) -> Result<Vec<DelayedEventRow>> {
        let conn = self.db.conn().await?;
        Ok(store::get_scheduled_for_user(&conn, owner.as_str()).await?)
    }

    /// A user's finalised events (sent, cancelled, failed), latest first.
    pub async fn finalised(&self, owner: &UserId) -> Result<Vec<DelayedEventRow>> {
        let conn = self.db.conn().await?;
        Ok(store::get_finalised_for_user(&conn, owner.as_str(), 100).await?)
    }

    /// One of the user's scheduled events (another user's is not found).
    pub async fn scheduled_one(&self, owner: &UserId, delay_id: &str) -> Result<DelayedEventRow> {
        let conn = self.db.conn().await?;
        store::get(&conn, delay_id)
            .await?
            .filter(|row| row.user_id == owner.as_str() && row.status == store::SCHEDULED)
            .ok_or_else(not_found)
    }

    /// Sends a claimed event through the ordinary write path and records the outcome.
    async fn deliver(&self, rooms: &Rooms, row: &DelayedEventRow) -> Result<()> {
        let outcome = self.send(rooms, row).await;
        let conn = self.db.conn().await?;
        let now = now_ms();
        match &outcome {
            Ok(event_id) => store::finish(&conn, &row.delay_id, Ok(event_id), now).await?,
            Err(err) => {
                tracing::info!(delay_id = %row.delay_id, "delayed event failed: {err}");
                // What the owner may learn: the Matrix error, not an internal one's detail.
                let reason = match err {
                    Error::Matrix { .. } => err.to_string(),
                    _ => "M_UNKNOWN: internal error".to_owned(),
                };
                store::finish(&conn, &row.delay_id, Err(&reason), now).await?;
            }
        }
        outcome.map(drop)
    }

    async fn send(&self, rooms: &Rooms, row: &DelayedEventRow) -> Result<String> {
        let owner = UserId::parse(row.user_id.as_str()).map_err(Error::internal)?;
        let room_id = RoomId::parse(row.room_id.as_str()).map_err(Error::internal)?;
        let txn_id = format!("org.matrix.msc4140.{}", row.delay_id);
        let is_member = row.event_type == "m.room.member";
        if is_member
            && row
                .claimed_ts
                .is_some_and(|t| t < now_ms() - STALE_CLAIM_MS)
        {
            return Err(Error::unknown(
                "The server stopped while sending this membership change",
            ));
        }
        let sender = Sender {
            user_id: &owner,
            txn: Some((TXN_DEVICE, txn_id.as_str())),
            ts: None,
            // Nobody is there to retry a refused send when it comes due: never limited.
            origin: Origin::Server,
        };
        let event_id = match &row.state_key {
            Some(state_key) => {
                rooms
                    .send_state_as(
                        sender,
                        &room_id,
                        &row.event_type,
                        state_key,
                        row.content.clone(),
                    )
                    .await?
            }
            None => {
                rooms
                    .send_event(sender, &room_id, &row.event_type, None, row.content.clone())
                    .await?
            }
        };
        Ok(event_id.to_string())
    }

    /// Runs until the process ends: waits to become the sending process, then sends due events.
    pub fn start(services: Arc<Services>) {
        tokio::spawn(async move {
            let timer = &services.delayed_events;
            loop {
                if let Err(err) = timer.lead(&services.rooms).await {
                    tracing::warn!("delayed events: {err}");
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
    }

    /// Takes the leader lock if free, then sends due events for as long as its connection lives.
    async fn lead(&self, rooms: &Rooms) -> Result<()> {
        let Some(mut leadership) = Leadership::try_acquire(&self.db, LEADER_LOCK).await? else {
            return Ok(());
        };
        tracing::info!("this process sends delayed events");
        let mut last_prune = 0;
        loop {
            let now = now_ms();
            let due = {
                let conn = self.db.conn().await?;
                store::claim_due(&conn, now, now - STALE_CLAIM_MS, BATCH).await?
            };
            for row in &due {
                // The outcome is recorded; one event's failure does not stop the others.
                let _ = self.deliver(rooms, row).await;
            }
            if due.len() as i64 == BATCH {
                continue;
            }
            let conn = self.db.conn().await?;
            if now - last_prune > 3600 * 1000 {
                store::delete_finalised_before(&conn, now - KEEP_FINALISED_MS).await?;
                last_prune = now;
            }
            let next = store::next_due(&conn).await?;
            drop(conn);
            let sleep = next
                .map(|at| Duration::from_millis((at - now_ms()).max(0) as u64))
                .unwrap_or(IDLE_TICK)
                .min(IDLE_TICK);
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(sleep) => {}
            }
            leadership.check().await?;
        }
    }
}

fn not_found() -> Error {
    Error::not_found("Delayed event not found")
}
