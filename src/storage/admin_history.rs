//! Purging a room's history through the admin API: which point a purge runs up to, the
//! purge itself, and the record of background purges for `purge_history_status`.

use diesel::{
    prelude::*,
    sql_types::{BigInt, Nullable, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::schema::admin_history_purges;

/// The room and depth of an event this server has stored.
pub async fn get_event_depth(
    mut conn: &AsyncPgConnection,
    event_id: &str,
) -> QueryResult<Option<(String, i64)>> {
    use super::schema::events;
    events::table
        .find(event_id)
        .select((events::room_id, events::depth))
        .first(&mut conn)
        .await
        .optional()
}

/// The depth of the room's last event (in stream order) sent before `ts`, if any.
pub async fn get_depth_before_ts(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    ts: i64,
) -> QueryResult<Option<i64>> {
    use super::schema::events;
    events::table
        .filter(events::room_id.eq(room_id))
        .filter(events::origin_server_ts.lt(ts))
        .filter(super::rooms::served())
        .order(events::stream_ordering.desc())
        .select(events::depth)
        .first(&mut conn)
        .await
        .optional()
}

/// Deletes the room's events below `depth` that are not state and not a forward extremity,
/// with their transaction IDs, pending federation sends, push actions and relations. With
/// `keep_sender_suffix` (`:server.name`), events whose sender ends in it are kept but become
/// outliers (without a state group, as outliers are), so no client is served them any more (as
/// Synapse does). State events stay whole: current state, memberships and every state group
/// name them. Run inside the caller's transaction, under the room's lock. Returns how many
/// events were deleted.
pub async fn purge_history(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    depth: i64,
    keep_sender_suffix: Option<&str>,
) -> QueryResult<usize> {
    // Not a cached (prepared) statement: the temporary table is new in each transaction.
    diesel::sql_query(
        "CREATE TEMPORARY TABLE events_to_purge \
         (event_id TEXT PRIMARY KEY, should_delete BOOLEAN NOT NULL) ON COMMIT DROP",
    )
    .execute(&mut conn)
    .await?;
    diesel::sql_query(
        "INSERT INTO events_to_purge \
         SELECT e.event_id, \
                $3::text IS NULL OR right(e.sender, length($3::text)) <> $3::text \
         FROM events e \
         WHERE e.room_id = $1 AND e.depth < $2 AND e.state_key IS NULL \
           AND e.event_id <> ALL (COALESCE( \
               (SELECT r.forward_extremities FROM rooms r WHERE r.room_id = $1), '{}'))",
    )
    .bind::<Text, _>(room_id)
    .bind::<BigInt, _>(depth)
    .bind::<Nullable<Text>, _>(keep_sender_suffix)
    .execute(&mut conn)
    .await?;
    const DELETED: &str = "(SELECT event_id FROM events_to_purge WHERE should_delete)";
    for table in ["event_txns", "federation_outbox"] {
        diesel::sql_query(format!("DELETE FROM {table} WHERE event_id IN {DELETED}"))
            .execute(&mut conn)
            .await?;
    }
    // Push actions name their event by its position (and it is deleted below, so first). The
    // room's redaction count moves as for a redaction: unread counts kept from before no
    // longer hold.
    diesel::sql_query(format!(
        "WITH deleted AS ( \
             DELETE FROM event_push_actions WHERE stream_ordering IN \
             (SELECT stream_ordering FROM events WHERE room_id = $1 AND event_id IN {DELETED}) \
         ) \
         UPDATE rooms SET redactions = redactions + 1 WHERE room_id = $1"
    ))
    .bind::<Text, _>(room_id)
    .execute(&mut conn)
    .await?;
    for table in ["event_relations", "events"] {
        diesel::sql_query(format!(
            "DELETE FROM {table} WHERE room_id = $1 AND event_id IN {DELETED}"
        ))
        .bind::<Text, _>(room_id)
        .execute(&mut conn)
        .await?;
    }
    diesel::sql_query(
        "UPDATE events SET outlier = TRUE, state_group = NULL \
         WHERE event_id IN (SELECT event_id FROM events_to_purge WHERE NOT should_delete)",
    )
    .execute(&mut conn)
    .await?;
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        count: i64,
    }
    let deleted = diesel::sql_query(format!("SELECT count(*) AS count FROM {DELETED} AS d"))
        .get_result::<Count>(&mut conn)
        .await?;
    Ok(deleted.count as usize)
}

/// A background history purge.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = admin_history_purges)]
pub struct HistoryPurgeRow {
    /// Its ID.
    pub purge_id: String,
    /// The room.
    pub room_id: String,
    /// `active`, `complete` or `failed`.
    pub status: String,
    /// Why it failed.
    pub error: Option<String>,
}

/// Records a new purge as active.
pub async fn insert_history_purge(
    mut conn: &AsyncPgConnection,
    purge_id: &str,
    room_id: &str,
    now: i64,
) -> QueryResult<()> {
    diesel::insert_into(admin_history_purges::table)
        .values((
            admin_history_purges::purge_id.eq(purge_id),
            admin_history_purges::room_id.eq(room_id),
            admin_history_purges::status.eq("active"),
            admin_history_purges::created_ts.eq(now),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Records how a purge ended.
pub async fn update_history_purge(
    mut conn: &AsyncPgConnection,
    purge_id: &str,
    status: &str,
    error: Option<&str>,
) -> QueryResult<()> {
    diesel::update(admin_history_purges::table.find(purge_id))
        .set((
            admin_history_purges::status.eq(status),
            admin_history_purges::error.eq(error),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// One purge.
pub async fn get_history_purge(
    mut conn: &AsyncPgConnection,
    purge_id: &str,
) -> QueryResult<Option<HistoryPurgeRow>> {
    admin_history_purges::table
        .find(purge_id)
        .select(HistoryPurgeRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}
