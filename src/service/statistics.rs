//! Keeps PostgreSQL's planner statistics fresh for Myelin's tables, whether or not autovacuum
//! runs. A plan made from statistics of a table a hundredth its size picks the wrong joins:
//! an initial sync over 500 rooms took seconds instead of a fraction of one on a database
//! filled after its last `ANALYZE`. Autovacuum refreshes them at most once a minute, and not at
//! all where an operator turned it off, so one process of a scale-out (it holds an advisory
//! lock) checks every few seconds which tables changed by a tenth since their last `ANALYZE`
//! and analyses those. The check reads PostgreSQL's per-table counters; it costs nothing when
//! nothing changed. The same round merges the search index's pending list, which autovacuum
//! would otherwise merge.

use std::time::Duration;

use crate::{
    error::Result,
    metrics::metrics,
    storage::{leader::Leadership, statistics as store, Db},
};

/// The advisory lock of the process that refreshes statistics.
const LEADER_LOCK: i64 = 0x6d79_656c_616e_616c; // "myelanal"
/// How often the leader looks for tables that changed.
const CHECK_EVERY: Duration = Duration::from_secs(5);
/// How often a process that does not lead tries to.
const RETRY_EVERY: Duration = Duration::from_secs(30);

/// Runs until the process ends.
pub fn start(db: Db) {
    tokio::spawn(async move {
        loop {
            if let Err(err) = lead(&db).await {
                tracing::warn!("planner statistics: {err}");
            }
            tokio::time::sleep(RETRY_EVERY).await;
        }
    });
}

/// Takes the leader lock if free, then refreshes what changed for as long as it holds it.
async fn lead(db: &Db) -> Result<()> {
    let Some(mut leadership) = Leadership::try_acquire(db, LEADER_LOCK).await? else {
        return Ok(());
    };
    let conn = leadership.conn();
    store::bound_lock_waits(conn).await?;
    loop {
        for table in store::stale_tables(conn).await? {
            // A table another session is analysing or vacuuming is left for the next round.
            match store::analyze(conn, &table).await {
                Ok(()) => {
                    metrics().statistics_refreshes.inc();
                }
                Err(err) => tracing::debug!("ANALYZE {table}: {err}"),
            }
        }
        if let Err(err) = store::merge_gin_pending_lists(conn).await {
            tracing::debug!("merging GIN pending lists: {err}");
        }
        tokio::time::sleep(CHECK_EVERY).await;
    }
}
