//! Planner statistics of Myelin's own tables: which have changed enough since their last
//! `ANALYZE` (by anyone: this process, autovacuum or an operator) to need another.

use diesel::sql_types::Text;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::cached_sql;

#[derive(diesel::QueryableByName)]
struct Table {
    #[diesel(sql_type = Text)]
    name: String,
}

/// Tables of the current schema whose rows changed by more than 50 plus a tenth of their
/// row count at the last `ANALYZE` (autovacuum's default threshold), or that hold data but
/// were never analysed (a restore, a crash that reset the change counters). A table analysed
/// in the last minute waits for the next (autovacuum's own pace) unless it changed by more
/// than its whole size: tables whose rows come and go (sliding sync's per-connection rows)
/// would otherwise be analysed every few seconds, and each `ANALYZE` makes every session plan
/// its statements on that table afresh.
pub async fn stale_tables(conn: &mut AsyncPgConnection) -> diesel::QueryResult<Vec<String>> {
    let tables: Vec<Table> = cached_sql(
        "SELECT s.relname AS name \
         FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid \
         WHERE s.schemaname = current_schema() \
           AND (s.n_mod_since_analyze > 50 + 0.1 * GREATEST(c.reltuples, 0) \
                OR (c.reltuples < 0 AND pg_relation_size(s.relid) > 0)) \
           AND (s.n_mod_since_analyze > GREATEST(c.reltuples, 0) \
                OR COALESCE(GREATEST(s.last_analyze, s.last_autoanalyze), '-infinity') \
                   < now() - interval '1 minute') \
         ORDER BY s.n_mod_since_analyze DESC",
    )
    .load(conn)
    .await?;
    Ok(tables.into_iter().map(|t| t.name).collect())
}

/// Refreshes one table's statistics. The name comes from [`stale_tables`] and is quoted as an
/// identifier, so it cannot be anything but a table name.
pub async fn analyze(conn: &mut AsyncPgConnection, table: &str) -> diesel::QueryResult<()> {
    let quoted = format!("\"{}\"", table.replace('"', "\"\""));
    diesel::sql_query(format!("ANALYZE {quoted}"))
        .execute(conn)
        .await?;
    Ok(())
}

/// Merges the pending lists of the current schema's GIN indexes (the search vectors') into
/// the indexes. Rows inserted go to a GIN index's unsorted pending list first, and every
/// search reads that list whole: up to 4 MB of it by default. `VACUUM` and autoanalyze merge
/// it, but a plain `ANALYZE` ([`analyze`]) does not, so where autovacuum is off the list would
/// stay full. Merging an empty list reads one page.
pub async fn merge_gin_pending_lists(conn: &mut AsyncPgConnection) -> diesel::QueryResult<()> {
    cached_sql(
        "SELECT gin_clean_pending_list(i.indexrelid) \
         FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
           JOIN pg_am a ON a.oid = c.relam \
         WHERE a.amname = 'gin' AND c.relnamespace = current_schema()::regnamespace",
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Makes this session give up on a lock after a second instead of queueing behind it (an
/// `ANALYZE` waits for a running autovacuum of the same table otherwise).
pub async fn bound_lock_waits(conn: &mut AsyncPgConnection) -> diesel::QueryResult<()> {
    diesel::sql_query("SET lock_timeout = '1s'")
        .execute(conn)
        .await?;
    Ok(())
}
