//! Sliding sync connections: per (user, device, `conn_id`), what each room was last sent with.
//!
//! A connection's state is its rows with `version <= base_version` (the newest row of a room
//! wins), overlaid by the rows of one of `pending_versions` for a request that shows it.
//! Acknowledging a pending version deletes the other pending ones and the rows it superseded,
//! so a connection holds at most one row per room plus the pending ones: its size is bounded
//! by the user's rooms, never by its age.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::{sliding_sync_connections as connections, sliding_sync_rooms as rooms};

/// A connection's row.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = connections)]
pub struct ConnectionRow {
    /// Its key.
    pub conn_key: i64,
    /// Newest version a request proved the client holds.
    pub base_version: i64,
    /// Versions handed out since, computed from the base.
    pub pending_versions: Vec<i64>,
    /// When a request last used it (ms).
    pub last_used_ts: i64,
}

/// A room's status as of a version.
#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = rooms)]
pub struct RoomRow {
    /// The connection.
    pub conn_key: i64,
    /// The room.
    pub room_id: String,
    /// The version that wrote the row.
    pub version: i64,
    /// The user's membership when it was sent.
    pub membership: String,
    /// `None`: sent up to the `pos`; else updates after this position are unsent.
    pub events_from: Option<i64>,
    /// Timeline limit it was sent with.
    pub timeline_limit: i32,
    /// Required state it was sent with (normalised).
    pub required_state: Value,
}

/// The connection of (user, device, `conn_id`), locked until the transaction ends.
pub async fn lock_connection(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    conn_id: &str,
) -> QueryResult<Option<ConnectionRow>> {
    connections::table
        .filter(connections::user_id.eq(user_id))
        .filter(connections::device_id.eq(device_id))
        .filter(connections::conn_id.eq(conn_id))
        .select(ConnectionRow::as_select())
        .for_update()
        .first(&mut conn)
        .await
        .optional()
}

/// The connection of (user, device, `conn_id`), without locking it.
pub async fn get_connection(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    conn_id: &str,
) -> QueryResult<Option<ConnectionRow>> {
    connections::table
        .filter(connections::user_id.eq(user_id))
        .filter(connections::device_id.eq(device_id))
        .filter(connections::conn_id.eq(conn_id))
        .select(ConnectionRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// Deletes a connection and all it remembers.
pub async fn delete_connection(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    conn_id: &str,
) -> QueryResult<()> {
    diesel::delete(
        connections::table
            .filter(connections::user_id.eq(user_id))
            .filter(connections::device_id.eq(device_id))
            .filter(connections::conn_id.eq(conn_id)),
    )
    .execute(&mut conn)
    .await
    .map(drop)
}

/// A fresh version number (global, so no two connections share one).
pub async fn next_version(mut conn: &AsyncPgConnection) -> QueryResult<i64> {
    diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
        "nextval('sliding_sync_versions')",
    ))
    .get_result(&mut conn)
    .await
}

/// Creates a connection whose base is `version` with nothing sent; returns its key.
pub async fn create_connection(
    mut conn: &AsyncPgConnection,
    (user_id, device_id, conn_id): (&str, &str, &str),
    version: i64,
    now: i64,
) -> QueryResult<i64> {
    diesel::insert_into(connections::table)
        .values((
            connections::user_id.eq(user_id),
            connections::device_id.eq(device_id),
            connections::conn_id.eq(conn_id),
            connections::base_version.eq(version),
            connections::last_used_ts.eq(now),
        ))
        .returning(connections::conn_key)
        .get_result(&mut conn)
        .await
}

/// The client holds the pending version: it becomes the base; the other pending versions and
/// the rows it superseded go.
pub async fn acknowledge(
    mut conn: &AsyncPgConnection,
    conn_key: i64,
    (base, version): (i64, i64),
    now: i64,
) -> QueryResult<()> {
    diesel::delete(
        rooms::table
            .filter(rooms::conn_key.eq(conn_key))
            .filter(rooms::version.gt(base))
            .filter(rooms::version.ne(version)),
    )
    .execute(&mut conn)
    .await?;
    crate::storage::cached_sql(
        "DELETE FROM sliding_sync_rooms old USING sliding_sync_rooms new \
         WHERE new.conn_key = $1 AND new.version = $2 \
           AND old.conn_key = $1 AND old.room_id = new.room_id AND old.version < $2",
    )
    .bind::<diesel::sql_types::BigInt, _>(conn_key)
    .bind::<diesel::sql_types::BigInt, _>(version)
    .execute(&mut conn)
    .await?;
    diesel::update(connections::table.find(conn_key))
        .set((
            connections::base_version.eq(version),
            connections::pending_versions.eq(Vec::<i64>::new()),
            connections::last_used_ts.eq(now),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// [`acknowledge`] in one statement and without a lock, for the common case: the connection
/// is still at `base`, holds `version` as pending and was used since `used_since`. False
/// when it is not (the caller then takes the locking path, which tells the cases apart).
pub async fn try_acknowledge(
    mut conn: &AsyncPgConnection,
    conn_key: i64,
    (base, version): (i64, i64),
    (now, used_since): (i64, i64),
) -> QueryResult<bool> {
    // The data-modifying parts see one snapshot and run only when the update matched.
    crate::storage::cached_sql(
        "WITH moved AS ( \
             UPDATE sliding_sync_connections \
             SET base_version = $3, pending_versions = '{}', last_used_ts = $4 \
             WHERE conn_key = $1 AND base_version = $2 AND $3 = ANY(pending_versions) \
               AND last_used_ts >= $5 \
             RETURNING conn_key), \
         dropped AS ( \
             DELETE FROM sliding_sync_rooms \
             WHERE conn_key IN (SELECT conn_key FROM moved) AND version > $2 AND version <> $3), \
         superseded AS ( \
             DELETE FROM sliding_sync_rooms old USING sliding_sync_rooms new \
             WHERE old.conn_key IN (SELECT conn_key FROM moved) AND new.conn_key = $1 \
               AND new.version = $3 AND old.room_id = new.room_id AND old.version <= $2) \
         SELECT count(*) AS moved FROM moved",
    )
    .bind::<diesel::sql_types::BigInt, _>(conn_key)
    .bind::<diesel::sql_types::BigInt, _>(base)
    .bind::<diesel::sql_types::BigInt, _>(version)
    .bind::<diesel::sql_types::BigInt, _>(now)
    .bind::<diesel::sql_types::BigInt, _>(used_since)
    .get_result::<Count>(&mut conn)
    .await
    .map(|c| c.moved > 0)
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    moved: i64,
}

/// The client went back to the base (a retry): the pending versions are dropped.
pub async fn drop_pending(
    mut conn: &AsyncPgConnection,
    conn_key: i64,
    base: i64,
    now: i64,
) -> QueryResult<()> {
    diesel::delete(
        rooms::table
            .filter(rooms::conn_key.eq(conn_key))
            .filter(rooms::version.gt(base)),
    )
    .execute(&mut conn)
    .await?;
    diesel::update(connections::table.find(conn_key))
        .set((
            connections::pending_versions.eq(Vec::<i64>::new()),
            connections::last_used_ts.eq(now),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// The rows of a connection's base (newest per room).
pub async fn get_base_rooms(
    mut conn: &AsyncPgConnection,
    conn_key: i64,
    base_version: i64,
) -> QueryResult<Vec<RoomRow>> {
    rooms::table
        .filter(rooms::conn_key.eq(conn_key))
        .filter(rooms::version.le(base_version))
        .order((rooms::room_id, rooms::version.desc()))
        .distinct_on(rooms::room_id)
        .select(RoomRow::as_select())
        .load(&mut conn)
        .await
}

/// Records a new pending version computed from `base` with its rows, in one statement;
/// returns the version, or `None` when the connection's base moved meanwhile (another request
/// acknowledged something else). `rows`' own `version` is ignored.
pub async fn write_pending(
    mut conn: &AsyncPgConnection,
    conn_key: i64,
    base: i64,
    rows: &[RoomRow],
) -> QueryResult<Option<i64>> {
    use diesel::sql_types::{Array, BigInt, Integer, Jsonb, Nullable, Text};
    #[derive(QueryableByName)]
    struct Version {
        #[diesel(sql_type = BigInt)]
        version: i64,
    }
    // The insert runs only when the update matched, and returns the version it used.
    let version = crate::storage::cached_sql(
        "WITH pending AS ( \
             UPDATE sliding_sync_connections \
             SET pending_versions = array_append(pending_versions, \
                                                 nextval('sliding_sync_versions')) \
             WHERE conn_key = $1 AND base_version = $2 \
             RETURNING pending_versions[cardinality(pending_versions)] AS version), \
         inserted AS ( \
             INSERT INTO sliding_sync_rooms \
                 (conn_key, room_id, version, membership, events_from, timeline_limit, \
                  required_state) \
             SELECT $1, r.room_id, pending.version, r.membership, r.events_from, \
                    r.timeline_limit, r.required_state \
             FROM pending, unnest($3::text[], $4::text[], $5::int8[], $6::int4[], \
                                  $7::jsonb[]) \
                 AS r(room_id, membership, events_from, timeline_limit, required_state)) \
         SELECT version FROM pending",
    )
    .bind::<BigInt, _>(conn_key)
    .bind::<BigInt, _>(base)
    .bind::<Array<Text>, _>(rows.iter().map(|r| &r.room_id).collect::<Vec<_>>())
    .bind::<Array<Text>, _>(rows.iter().map(|r| &r.membership).collect::<Vec<_>>())
    .bind::<Array<Nullable<BigInt>>, _>(rows.iter().map(|r| r.events_from).collect::<Vec<_>>())
    .bind::<Array<Integer>, _>(rows.iter().map(|r| r.timeline_limit).collect::<Vec<_>>())
    .bind::<Array<Jsonb>, _>(rows.iter().map(|r| &r.required_state).collect::<Vec<_>>())
    .get_result::<Version>(&mut conn)
    .await
    .optional()?;
    Ok(version.map(|v| v.version))
}

/// Deletes connections unused since `before` (ms).
pub async fn delete_unused_since(mut conn: &AsyncPgConnection, before: i64) -> QueryResult<usize> {
    diesel::delete(connections::table.filter(connections::last_used_ts.lt(before)))
        .execute(&mut conn)
        .await
}

/// Keeps a device's `keep` most recently used connections, deleting the others.
pub async fn trim_device_connections(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    keep: i64,
) -> QueryResult<()> {
    crate::storage::cached_sql(
        "DELETE FROM sliding_sync_connections WHERE conn_key IN ( \
             SELECT conn_key FROM sliding_sync_connections \
             WHERE user_id = $1 AND device_id = $2 \
             ORDER BY last_used_ts DESC OFFSET $3)",
    )
    .bind::<diesel::sql_types::Text, _>(user_id)
    .bind::<diesel::sql_types::Text, _>(device_id)
    .bind::<diesel::sql_types::BigInt, _>(keep)
    .execute(&mut conn)
    .await
    .map(drop)
}

/// What list filters read of rooms' current state: `(room_id, type, state_key, content)` of
/// the create, encryption and name events of `room_ids`, and the `m.space.child` events of
/// `spaces`.
pub async fn get_filter_state(
    mut conn: &AsyncPgConnection,
    room_ids: &[String],
    spaces: &[String],
) -> QueryResult<Vec<(String, String, String, Value)>> {
    use super::schema::{events, room_current_state as state};
    let content = diesel::dsl::sql::<diesel::sql_types::Jsonb>("events.pdu -> 'content'");
    let mut rows: Vec<(String, String, String, Value)> = state::table
        .inner_join(events::table.on(events::event_id.eq(state::event_id)))
        .filter(state::room_id.eq_any(room_ids))
        .filter(state::event_type.eq_any(["m.room.create", "m.room.encryption", "m.room.name"]))
        .filter(state::state_key.eq(""))
        .select((state::room_id, state::event_type, state::state_key, content))
        .load(&mut conn)
        .await?;
    if !spaces.is_empty() {
        let content = diesel::dsl::sql::<diesel::sql_types::Jsonb>("events.pdu -> 'content'");
        rows.extend(
            state::table
                .inner_join(events::table.on(events::event_id.eq(state::event_id)))
                .filter(state::room_id.eq_any(spaces))
                .filter(state::event_type.eq("m.space.child"))
                .select((state::room_id, state::event_type, state::state_key, content))
                .load::<(String, String, String, Value)>(&mut conn)
                .await?,
        );
    }
    Ok(rows)
}

/// The senders of the given events: `(event_id, sender)`.
pub async fn get_event_senders(
    mut conn: &AsyncPgConnection,
    event_ids: &[String],
) -> QueryResult<Vec<(String, String)>> {
    use super::schema::events;
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    events::table
        .filter(events::event_id.eq_any(event_ids))
        .select((events::event_id, events::sender))
        .load(&mut conn)
        .await
}
