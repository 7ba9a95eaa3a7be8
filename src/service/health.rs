//! Readiness: whether this process should be sent traffic (`GET /readyz`).
//!
//! Liveness (`GET /health`) needs nothing from here: it answers as long as the process serves
//! HTTP. Readiness also needs the database to answer and the LISTEN connection to be up (without
//! it, long-polls miss writes made through other processes), and the process not to be draining.
//! While the server starts and migrates, a separate listener answers `starting` (see
//! `server::Starting`), so every state a load balancer can see is covered.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use super::notifier::Notifier;
use crate::storage::{self, Db};

/// How long the database may take to answer `SELECT 1` before the process is not ready.
const DATABASE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a database check is reused, so that frequent probes do not load the database.
const CACHE_FOR: Duration = Duration::from_secs(1);

/// What `/readyz` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Serving.
    Ready,
    /// Starting: the database is being opened or migrated.
    Starting,
    /// Shutting down: finishing what is in flight, taking nothing new.
    Draining,
    /// The database did not answer within a second.
    DatabaseUnavailable,
    /// The LISTEN connection that carries wake-ups from other processes is down.
    ListenerDown,
}

impl Readiness {
    /// The `status` string of the `/readyz` body.
    pub fn as_str(self) -> &'static str {
        match self {
            Readiness::Ready => "ready",
            Readiness::Starting => "starting",
            Readiness::Draining => "draining",
            Readiness::DatabaseUnavailable => "database_unavailable",
            Readiness::ListenerDown => "listener_down",
        }
    }
}

/// Decides readiness from the database, the notifier and the drain flag.
pub struct Health {
    db: Db,
    notifier: Arc<Notifier>,
    draining: AtomicBool,
    /// The last database check: when it ran and whether the database answered.
    database: Mutex<Option<(Instant, bool)>>,
}

impl Health {
    /// Creates the readiness check.
    pub fn new(db: Db, notifier: Arc<Notifier>) -> Self {
        Health {
            db,
            notifier,
            draining: AtomicBool::new(false),
            database: Mutex::new(None),
        }
    }

    /// Marks the process as draining: `/readyz` answers 503 from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// The process's readiness now.
    pub async fn readiness(&self) -> Readiness {
        if self.draining.load(Ordering::Relaxed) {
            return Readiness::Draining;
        }
        if !self.database_answers().await {
            return Readiness::DatabaseUnavailable;
        }
        if !self.notifier.is_listening() {
            return Readiness::ListenerDown;
        }
        Readiness::Ready
    }

    /// Whether a pooled connection answers `SELECT 1` in time (checked at most once a second).
    async fn database_answers(&self) -> bool {
        let cached = *self.database.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, answered)) = cached {
            if at.elapsed() < CACHE_FOR {
                return answered;
            }
        }
        let check = async {
            let conn = self.db.conn().await.ok()?;
            storage::ping(&conn).await.ok()
        };
        let answered = matches!(
            tokio::time::timeout(DATABASE_TIMEOUT, check).await,
            Ok(Some(()))
        );
        *self.database.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), answered));
        answered
    }
}
