//! Presence: online, unavailable or offline, a status message and when the user was last
//! active; shared with the users they share a room with.
//!
//! Kept in PostgreSQL with a stream position per change, like receipts. Syncing keeps a user
//! online (the write is skipped while nothing visible changes, so a sync costs at most a
//! cheap `last_seen_ts` touch every few seconds); a user silent for [`OFFLINE_AFTER_MS`] goes
//! offline. Under load, sync-driven updates are the first thing shed.

use std::{num::NonZeroUsize, sync::Arc, sync::Mutex, time::Duration};

use diesel_async::AsyncPgConnection;
use lru::LruCache;
use ruma::{presence::PresenceState, UserId};
use serde_json::{json, Value};

use crate::{
    error::{Error, Result},
    service::{federation::sender::Sender, notifier::SHARERS_CHANNEL},
    storage::{
        now_ms,
        presence::{self as store, PresenceRow},
        rooms::notify,
        Db,
    },
};

/// A user who has not synced or set presence for this long goes offline (as Synapse).
pub const OFFLINE_AFTER_MS: i64 = 30_000;
/// `currently_active` while the last activity is this recent.
const CURRENTLY_ACTIVE_MS: i64 = 60_000;
/// A syncing user's `last_seen_ts` is written at most this often.
const TOUCH_INTERVAL_MS: i64 = 10_000;
/// How often silent users are looked for.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);
/// Longest status message.
pub const MAX_STATUS_MSG: usize = 1024;

/// The presence service.
pub struct Presence {
    db: Db,
    enabled: bool,
    /// Queues our users' presence for the servers sharing a room with them.
    federation: Arc<Sender>,
    /// When this process last wrote each syncing user's `last_seen_ts`.
    touched: Mutex<LruCache<String, i64>>,
}

fn state_name(state: &PresenceState) -> Result<&'static str> {
    match state {
        PresenceState::Online => Ok("online"),
        PresenceState::Unavailable => Ok("unavailable"),
        PresenceState::Offline => Ok("offline"),
        _ => Err(Error::invalid_param(
            "presence must be online, unavailable or offline",
        )),
    }
}

/// The `m.presence` content of a row as of `now`.
fn content(row: &PresenceRow, now: i64) -> Value {
    let mut content = json!({
        "presence": row.state,
        "last_active_ago": (now - row.last_active_ts).max(0),
    });
    if row.state == "online" {
        content["currently_active"] = Value::Bool(now - row.last_active_ts < CURRENTLY_ACTIVE_MS);
    }
    if let Some(msg) = &row.status_msg {
        content["status_msg"] = Value::from(msg.as_str());
    }
    content
}

/// The `m.presence` event of a row as of `now`, as `/sync` and appservice transactions carry it.
fn event(row: &PresenceRow, now: i64) -> Value {
    json!({ "type": "m.presence", "sender": row.user_id, "content": content(row, now) })
}

impl Presence {
    /// Creates the service (`enabled: false` accepts updates and shares nothing).
    pub fn new(db: Db, enabled: bool, federation: Arc<Sender>) -> Arc<Self> {
        Arc::new(Presence {
            db,
            enabled,
            federation,
            touched: Mutex::new(LruCache::new(NonZeroUsize::new(100_000).expect("non-zero"))),
        })
    }

    /// Whether presence is on.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// A user's presence just changed (inside the change's transaction): wakes those sharing
    /// a room with them and, for our users, tells the servers sharing a room with them.
    async fn announce(&self, conn: &AsyncPgConnection, user_id: &str) -> Result<()> {
        notify(conn, SHARERS_CHANNEL, user_id).await?;
        let (Ok(user), Some(row)) = (
            UserId::parse(user_id),
            store::get_presence(conn, user_id).await?,
        ) else {
            return Ok(());
        };
        self.federation
            .queue_presence(conn, &user, &content(&row, now_ms()))
            .await
    }

    /// `PUT /presence/{userId}/status`.
    pub async fn set(
        &self,
        user_id: &UserId,
        state: &PresenceState,
        status_msg: Option<&str>,
    ) -> Result<()> {
        let state = state_name(state)?;
        if status_msg.is_some_and(|m| m.len() > MAX_STATUS_MSG) {
            return Err(Error::invalid_param(format!(
                "status_msg is longer than {MAX_STATUS_MSG} bytes"
            )));
        }
        if !self.enabled {
            return Ok(());
        }
        let mut conn = self.db.conn().await?;
        let now = now_ms();
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            store::lock_presence(conn, user_id.as_str()).await?;
            store::set_presence(conn, user_id.as_str(), state, status_msg, now, now).await?;
            self.announce(conn, user_id.as_str()).await?;
            Ok(())
        })
        .await
    }

    /// `GET /presence/{userId}/status`: for the user and those who share a room with them.
    pub async fn get(&self, viewer: &UserId, user_id: &UserId) -> Result<Value> {
        let conn = self.db.conn().await?;
        if viewer != user_id
            && !store::share_a_room(&conn, viewer.as_str(), user_id.as_str()).await?
        {
            return Err(Error::forbidden("You do not share a room with this user"));
        }
        let row = match self.enabled {
            true => store::get_presence(&conn, user_id.as_str()).await?,
            false => None,
        };
        Ok(match row {
            Some(row) => content(&row, now_ms()),
            None => json!({ "presence": "offline" }),
        })
    }

    /// A sync arrived with `set_presence`: keeps the user online (or unavailable) without
    /// writing anything while nothing visible changes.
    pub async fn syncing(&self, user_id: &UserId, requested: &PresenceState) -> Result<()> {
        let state = match requested {
            PresenceState::Offline => return Ok(()),
            other => state_name(other)?,
        };
        if !self.enabled {
            return Ok(());
        }
        if self.db.is_saturated() {
            crate::metrics::metrics()
                .shed
                .get_or_create(&crate::metrics::Kind { kind: "presence" })
                .inc();
            return Ok(());
        }
        let now = now_ms();
        let recently_touched = self
            .touched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(user_id.as_str())
            .is_some_and(|at| now - at < TOUCH_INTERVAL_MS);
        if recently_touched {
            return Ok(());
        }
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            match store::lock_presence(conn, user_id.as_str()).await? {
                Some(row) if row.state == state => {
                    store::touch_presence(conn, user_id.as_str(), now).await?;
                }
                row => {
                    let status = row.as_ref().and_then(|r| r.status_msg.as_deref());
                    store::set_presence(conn, user_id.as_str(), state, status, now, now).await?;
                    self.announce(conn, user_id.as_str()).await?;
                }
            }
            Ok(())
        })
        .await?;
        self.touched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .put(user_id.to_string(), now);
        Ok(())
    }

    /// `m.presence` events for a sync: changes in `(after, up_to]` of the user and of those
    /// sharing a room with them.
    pub async fn events_for(
        &self,
        conn: &AsyncPgConnection,
        user_id: &str,
        after: i64,
        up_to: i64,
    ) -> Result<Vec<Value>> {
        if !self.enabled || after >= up_to {
            return Ok(Vec::new());
        }
        let now = now_ms();
        Ok(store::get_presence_changed_for(conn, user_id, after, up_to)
            .await?
            .iter()
            .map(|row| event(row, now))
            .collect())
    }

    /// `m.presence` events of every user whose presence changed in `(after, up_to]`, oldest
    /// first, for the appservices to pick from; none while presence is off.
    pub async fn events_between(
        &self,
        conn: &AsyncPgConnection,
        after: i64,
        up_to: i64,
    ) -> Result<Vec<Value>> {
        if !self.enabled || after >= up_to {
            return Ok(Vec::new());
        }
        let now = now_ms();
        Ok(store::get_presence_changed(conn, after, up_to)
            .await?
            .iter()
            .map(|row| event(row, now))
            .collect())
    }

    /// Marks users offline once they have been silent too long (every process sweeps; the
    /// row lock makes a second sweep of the same user a no-op).
    pub fn start_sweeper(self: &Arc<Self>) {
        if !self.enabled {
            return;
        }
        let presence = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_INTERVAL).await;
                if let Err(err) = presence.sweep().await {
                    tracing::warn!("presence sweep: {err}");
                }
            }
        });
    }

    async fn sweep(&self) -> Result<()> {
        let mut conn = self.db.conn().await?;
        let cutoff = now_ms() - OFFLINE_AFTER_MS;
        for user in store::get_silent_users(&conn, cutoff).await? {
            crate::storage::transaction::transaction(&mut conn, async |conn| {
                let Some(row) = store::lock_presence(conn, &user).await? else {
                    return Ok(());
                };
                if row.state == "offline" || row.last_seen_ts >= cutoff {
                    return Ok(());
                }
                store::set_presence(
                    conn,
                    &user,
                    "offline",
                    row.status_msg.as_deref(),
                    row.last_active_ts,
                    row.last_seen_ts,
                )
                .await?;
                self.announce(conn, &user).await?;
                Ok(())
            })
            .await?;
        }
        Ok(())
    }
}
