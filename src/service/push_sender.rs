//! Delivers notifications to push gateways (`POST /_matrix/push/v1/notify`) in the background.
//!
//! Sending never waits for a gateway: events only leave push actions behind, and this task
//! sends what each pusher has not sent yet, in order, tracking progress in the pusher's row.
//! A failing gateway is retried with exponential backoff (its pusher alone waits); an event
//! still failing after [`MAX_ATTEMPTS`] tries is skipped. One server process sends at a time
//! (it holds a PostgreSQL advisory lock), so nothing is pushed twice by two processes.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::{json, Map, Value};
use tokio::sync::Notify;

use crate::{
    error::{Error, Result},
    service::{
        outbound::Outbound,
        sending::{self, Consumers},
    },
    storage::{
        pushers::{self as store, PusherRow},
        rooms as rooms_store, Db,
    },
};

/// Tries per event before it is skipped.
pub const MAX_ATTEMPTS: u32 = 10;
/// First retry delay; doubled after each failure.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Most of a gateway's answer that is read (it is `{"rejected": [push keys]}`).
const MAX_GATEWAY_RESPONSE: usize = 64 * 1024;
/// Advisory-lock key held by the sending process.
const LEADER_LOCK: i64 = 0x6d79_656c_7075_7368; // "myelpush"
/// Notifications fetched per pusher per batch.
const BATCH: i64 = 20;

type PusherKey = (String, String, String);

fn key(pusher: &PusherRow) -> PusherKey {
    (
        pusher.user_id.clone(),
        pusher.app_id.clone(),
        pusher.pushkey.clone(),
    )
}

/// Retry state of a pusher whose gateway failed.
struct Backoff {
    failures: u32,
    retry_at: Instant,
}

/// What a gateway said.
enum Outcome {
    Delivered,
    /// The gateway no longer knows this push key: the pusher is removed.
    Rejected,
    Failed(String),
}

/// The background sender.
pub struct PushSender {
    db: Db,
    http: Arc<Outbound>,
    wake: Arc<Notify>,
    busy: Consumers<PusherKey>,
    backoff: Mutex<HashMap<PusherKey, Backoff>>,
}

impl PushSender {
    /// Creates the sender; `wake` is notified whenever events are written.
    pub fn new(db: Db, http: Arc<Outbound>, wake: Arc<Notify>) -> Arc<Self> {
        Arc::new(PushSender {
            db,
            http,
            wake,
            busy: Consumers::default(),
            backoff: Mutex::default(),
        })
    }

    /// Runs until the process ends: waits to become the sending process, then sends.
    pub fn start(self: &Arc<Self>) {
        let sender = self.clone();
        sending::lead_forever(
            self.db.clone(),
            LEADER_LOCK,
            self.wake.clone(),
            "sends push notifications",
            move || {
                let sender = sender.clone();
                async move { sender.round().await }
            },
        );
    }

    /// Starts a drain for every pusher with pending notifications that is not already being
    /// drained or waiting out a backoff.
    async fn round(self: &Arc<Self>) -> Result<()> {
        let pushers = {
            let conn = self.db.conn().await?;
            store::get_pushers_with_pending(&conn).await?
        };
        let now = Instant::now();
        for pusher in pushers {
            let key = key(&pusher);
            if self
                .backoff
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&key)
                .is_some_and(|b| b.retry_at > now)
            {
                continue;
            }
            let sender = self.clone();
            self.busy.spawn(key, async move {
                if let Err(err) = sender.drain(&pusher).await {
                    tracing::warn!(user = %pusher.user_id, "push: {err}");
                }
            });
        }
        Ok(())
    }

    /// Sends a pusher's pending notifications in order until none are left or one fails.
    async fn drain(&self, pusher: &PusherRow) -> Result<()> {
        let key = key(pusher);
        let mut done = pusher.last_stream_ordering;
        loop {
            let mut conn = self.db.conn().await?;
            let pending =
                store::get_pending_notifications(&conn, &pusher.user_id, done, BATCH).await?;
            if pending.is_empty() {
                return Ok(());
            }
            for (room_id, event_id, position, actions) in pending {
                let notification = self
                    .notification(&conn, pusher, &room_id, &event_id, &actions)
                    .await?;
                drop(conn);
                let outcome = self.post(pusher, &notification).await;
                crate::metrics::Metrics::count(
                    &crate::metrics::metrics().push_notifications,
                    match outcome {
                        Outcome::Delivered => "sent",
                        Outcome::Rejected => "rejected",
                        Outcome::Failed(_) => "failed",
                    },
                );
                match outcome {
                    Outcome::Delivered => {
                        self.backoff
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&key);
                    }
                    Outcome::Rejected => {
                        tracing::info!(user = %pusher.user_id, app = %pusher.app_id, "gateway rejected the push key; removing the pusher");
                        let conn = self.db.conn().await?;
                        store::delete_pusher(
                            &conn,
                            &pusher.user_id,
                            &pusher.app_id,
                            &pusher.pushkey,
                        )
                        .await?;
                        return Ok(());
                    }
                    Outcome::Failed(reason) => {
                        let mut backoffs = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
                        let failures = backoffs.get(&key).map_or(0, |b| b.failures) + 1;
                        if failures < MAX_ATTEMPTS {
                            let delay = FIRST_BACKOFF * 2u32.pow(failures - 1);
                            tracing::warn!(user = %pusher.user_id, %reason, ?delay, "push failed; will retry");
                            backoffs.insert(
                                key,
                                Backoff {
                                    failures,
                                    retry_at: Instant::now() + delay,
                                },
                            );
                            return Ok(());
                        }
                        tracing::warn!(user = %pusher.user_id, %event_id, %reason, "push failed {failures} times; skipping the event");
                        backoffs.remove(&key);
                    }
                }
                conn = self.db.conn().await?;
                store::set_pusher_progress(&conn, pusher, position).await?;
                done = position;
            }
        }
    }

    /// The gateway request body for one event (spec: Push Gateway API, `notify`).
    async fn notification(
        &self,
        conn: &diesel_async::AsyncPgConnection,
        pusher: &PusherRow,
        room_id: &str,
        event_id: &str,
        actions: &Value,
    ) -> Result<Value> {
        let event = rooms_store::get_event(conn, event_id)
            .await?
            .ok_or_else(|| Error::internal("push action for a missing event"))?;
        let badge = store::count_rooms_with_notifications(conn, &pusher.user_id).await?;
        let tweaks = tweaks(actions);
        let mut device_data = pusher.data.clone();
        if let Some(data) = device_data.as_object_mut() {
            data.remove("url");
        }
        let device = json!({
            "app_id": pusher.app_id,
            "pushkey": pusher.pushkey,
            "pushkey_ts": pusher.created_ts / 1000,
            "data": device_data,
            "tweaks": tweaks,
        });
        let counts = json!({ "unread": badge });
        if pusher.data.get("format").and_then(Value::as_str) == Some("event_id_only") {
            return Ok(json!({ "notification": {
                "event_id": event_id,
                "room_id": room_id,
                "counts": counts,
                "devices": [device],
            }}));
        }
        let (sender_name, room_name) = store::get_push_names(conn, room_id, &event.sender).await?;
        let high = event.event_type == "m.room.encrypted"
            || tweaks
                .get("highlight")
                .is_some_and(|h| h == &Value::Bool(true))
            || tweaks.contains_key("sound");
        let mut notification = json!({
            "event_id": event_id,
            "room_id": room_id,
            "type": event.event_type,
            "sender": event.sender,
            "prio": if high { "high" } else { "low" },
            "content": event.pdu.get("content").cloned().unwrap_or_default(),
            "counts": counts,
            "devices": [device],
        });
        if let Some(name) = sender_name {
            notification["sender_display_name"] = Value::from(name);
        }
        if let Some(name) = room_name {
            notification["room_name"] = Value::from(name);
        }
        Ok(json!({ "notification": notification }))
    }

    async fn post(&self, pusher: &PusherRow, body: &Value) -> Outcome {
        let Some(url) = pusher.data.get("url").and_then(Value::as_str) else {
            return Outcome::Rejected;
        };
        let response = match self.http.post_json(url, body, MAX_GATEWAY_RESPONSE).await {
            Ok(response) => response,
            Err(err) => return Outcome::Failed(format!("{url}: {err}")),
        };
        let status = response.status;
        if !status.is_success() {
            // Redirects are not followed: a 3xx lands here too.
            return Outcome::Failed(format!("gateway answered {status}"));
        }
        let answer: Value = serde_json::from_slice(&response.body).unwrap_or_default();
        let rejected = answer["rejected"]
            .as_array()
            .is_some_and(|keys| keys.iter().any(|k| k == pusher.pushkey.as_str()));
        if rejected {
            Outcome::Rejected
        } else {
            Outcome::Delivered
        }
    }
}

/// The tweaks of a push rule's actions (`highlight` without a value means true).
fn tweaks(actions: &Value) -> Map<String, Value> {
    actions
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|action| {
            let name = action.get("set_tweak")?.as_str()?;
            let value = action.get("value").cloned().unwrap_or(Value::Bool(true));
            Some((name.to_owned(), value))
        })
        .collect()
}
