//! One process of a scale-out leads a kind of background work (push delivery, federation
//! sending): it holds a PostgreSQL session-level advisory lock on a connection of its own,
//! outside the pools, for as long as it leads, and stops leading when that connection dies.

use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Bool};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::{cached_sql, Db};
use crate::error::Result;

/// How often a leader asks whether its lock's connection still lives. Its rounds can come as
/// often as events are written, and a round trip each would be a statement per event; the
/// drains a round starts run on without asking anyway, so asking more often than this would
/// not make two leaders impossible, only a little less likely.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The lock held by the leading process.
pub struct Leadership {
    conn: AsyncPgConnection,
    /// When the connection last answered.
    checked_at: Instant,
}

#[derive(diesel::QueryableByName)]
struct Locked {
    #[diesel(sql_type = Bool)]
    locked: bool,
}

impl Leadership {
    /// Takes advisory lock `key` when no other session holds it.
    pub async fn try_acquire(db: &Db, key: i64) -> Result<Option<Leadership>> {
        let mut conn = db.dedicated_conn().await?;
        let locked: Locked = cached_sql("SELECT pg_try_advisory_lock($1) AS locked")
            .bind::<BigInt, _>(key)
            .get_result(&mut conn)
            .await?;
        Ok(locked.locked.then(|| Leadership {
            conn,
            checked_at: Instant::now(),
        }))
    }

    /// The lock's own connection, for work only the leader does.
    pub fn conn(&mut self) -> &mut AsyncPgConnection {
        &mut self.conn
    }

    /// Fails when the lock's connection has died (and the lock with it). Asks the database at
    /// most once per [`CHECK_INTERVAL`]; in between the last answer stands.
    pub async fn check(&mut self) -> Result<()> {
        if self.checked_at.elapsed() < CHECK_INTERVAL {
            return Ok(());
        }
        cached_sql("SELECT 1").execute(&mut self.conn).await?;
        self.checked_at = Instant::now();
        Ok(())
    }
}
