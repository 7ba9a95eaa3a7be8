//! What the background senders share (push gateways, other servers, application services):
//! one process leads each kind of sending, holding a PostgreSQL advisory lock, and runs
//! rounds when woken or on a tick; each round starts at most one drain per consumer (a
//! pusher, a destination, an appservice), which sends that consumer's queue in order from
//! its durable cursor.

use std::{
    collections::HashSet,
    future::Future,
    hash::Hash,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::Notify;

use crate::{
    error::Result,
    storage::{leader::Leadership, Db},
};

/// How often a leader looks for work without being woken (retries coming due).
pub const IDLE_TICK: Duration = Duration::from_secs(1);
/// How long a process that is not leading waits before trying to lead again.
const FOLLOWER_WAIT: Duration = Duration::from_secs(5);

/// Runs `round` until the process ends, in the process holding advisory lock `key` only:
/// after each round it waits for `wake` or [`IDLE_TICK`], and it stops leading when the
/// lock's connection dies. `what` names the work in the logs.
pub fn lead_forever<F, Fut>(db: Db, key: i64, wake: Arc<Notify>, what: &'static str, round: F)
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<()>> + Send,
{
    tokio::spawn(async move {
        loop {
            let led = async {
                let Some(mut leadership) = Leadership::try_acquire(&db, key).await? else {
                    return Ok(());
                };
                tracing::info!("this process {what}");
                loop {
                    round().await?;
                    tokio::select! {
                        _ = wake.notified() => {}
                        _ = tokio::time::sleep(IDLE_TICK) => {}
                    }
                    leadership.check().await?;
                }
            };
            if let Err(err) = led.await as Result<()> {
                tracing::warn!("the process that {what}: {err}");
            }
            tokio::time::sleep(FOLLOWER_WAIT).await;
        }
    });
}

/// The consumers being drained right now: at most one drain each.
pub struct Consumers<K = String> {
    busy: Arc<Mutex<HashSet<K>>>,
}

impl<K> Default for Consumers<K> {
    fn default() -> Self {
        Consumers {
            busy: Arc::default(),
        }
    }
}

impl<K: Hash + Eq + Clone + Send + 'static> Consumers<K> {
    /// Runs `drain` for `key` in the background unless one is running already.
    pub fn spawn(&self, key: K, drain: impl Future<Output = ()> + Send + 'static) {
        if !self
            .busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone())
        {
            return;
        }
        let busy = self.busy.clone();
        tokio::spawn(async move {
            drain.await;
            busy.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        });
    }
}
