//! Timelines: rooms' served events by stream position (the newest events of many rooms at once
//! for a sync, `/messages`' stream pages, `timestamp_to_event`) and the state group at a
//! position.

use std::collections::HashMap;

use diesel::{
    prelude::*,
    sql_types::{Array, BigInt, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::rooms::{served, EventRow, EVENT_COLUMNS, SERVED_TO_CLIENTS};
use super::schema::events;

/// One room's part of [`get_newest_events_of_rooms`]: up to `limit` of its served events in
/// `(after, up_to]`.
pub struct Window<'a> {
    /// The room.
    pub room_id: &'a str,
    /// Exclusive start.
    pub after: i64,
    /// Inclusive end.
    pub up_to: i64,
    /// How many.
    pub limit: i64,
}

/// The newest served events of each room in its window, newest first, by room, for many rooms
/// in one statement (a sync reads this for every room it sends).
///
/// Read through `myelin_newest_events` (migration 000045), whose only plan is a walk of
/// `(room_id, stream_ordering)` back from each window's end: as a plain statement on tables
/// never analysed, a room could be read through the topological index and all its events
/// sorted, for every sync.
pub async fn get_newest_events_of_rooms(
    mut conn: &AsyncPgConnection,
    windows: &[Window<'_>],
) -> QueryResult<HashMap<String, Vec<EventRow>>> {
    if windows.is_empty() {
        return Ok(HashMap::new());
    }
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!("SELECT {EVENT_COLUMNS} FROM myelin_newest_events($1, $2, $3, $4)")
    });
    let rooms: Vec<&str> = windows.iter().map(|w| w.room_id).collect();
    let after: Vec<i64> = windows.iter().map(|w| w.after).collect();
    let up_to: Vec<i64> = windows.iter().map(|w| w.up_to).collect();
    let limits: Vec<i64> = windows.iter().map(|w| w.limit).collect();
    let rows: Vec<EventRow> = super::cached_sql(SQL.as_str())
        .bind::<Array<Text>, _>(rooms)
        .bind::<Array<BigInt>, _>(after)
        .bind::<Array<BigInt>, _>(up_to)
        .bind::<Array<BigInt>, _>(limits)
        .load(&mut conn)
        .await?;
    let mut by_room: HashMap<String, Vec<EventRow>> = HashMap::with_capacity(windows.len());
    for row in rows {
        by_room.entry(row.room_id.clone()).or_default().push(row);
    }
    Ok(by_room)
}

/// The state group after the last served event of a room at or before position `at`. Before
/// the room's first served event (a room joined through another server starts with our join,
/// the state it joined stored as the group the join's group came from), the state before
/// that event: the group its group came from for a state event, its group otherwise.
pub async fn get_state_group_at(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    at: i64,
) -> QueryResult<Option<i64>> {
    let found = events::table
        .filter(events::room_id.eq(room_id))
        .filter(served())
        .filter(events::stream_ordering.le(at))
        .order(events::stream_ordering.desc())
        .select(events::state_group)
        .first::<Option<i64>>(&mut conn)
        .await
        .optional()?
        .flatten();
    if found.is_some() {
        return Ok(found);
    }
    #[derive(QueryableByName)]
    struct Before {
        #[diesel(sql_type = diesel::sql_types::Nullable<BigInt>)]
        state_group: Option<i64>,
    }
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT CASE WHEN e.state_key IS NULL THEN e.state_group \
                         ELSE COALESCE(g.prev_group, g.parent_group) END \
                 AS state_group \
             FROM events e JOIN state_groups g ON g.state_group = e.state_group \
             WHERE e.room_id = $1 AND e.stream_ordering > $2 AND {SERVED_TO_CLIENTS} \
             ORDER BY e.stream_ordering LIMIT 1"
        )
    });
    let first: Option<Before> = super::cached_sql(SQL.as_str())
        .bind::<Text, _>(room_id)
        .bind::<BigInt, _>(at)
        .get_result(&mut conn)
        .await
        .optional()?;
    Ok(first.and_then(|row| row.state_group))
}

/// Served events of a room with stream positions in `(after, up_to]`, in stream order.
pub async fn get_room_events_between(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    after: i64,
    up_to: i64,
    limit: i64,
) -> QueryResult<Vec<EventRow>> {
    events::table
        .filter(events::room_id.eq(room_id))
        .filter(served())
        .filter(events::stream_ordering.gt(after))
        .filter(events::stream_ordering.le(up_to))
        .order(events::stream_ordering.asc())
        .limit(limit)
        .select(EventRow::as_select())
        .load(&mut conn)
        .await
}

/// Served events of a room ordered by distance from a timestamp in one direction: with
/// `origin_server_ts >= ts` oldest first (`forward`), else `<= ts` newest first. Ties go by
/// stream position; `after` is the `(origin_server_ts, stream_ordering)` of the last event of
/// the previous page, to continue from.
pub async fn get_events_near_ts(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    ts: i64,
    forward: bool,
    after: Option<(i64, i64)>,
    limit: i64,
) -> QueryResult<Vec<EventRow>> {
    let query = events::table
        .filter(events::room_id.eq(room_id))
        .filter(served())
        .select(EventRow::as_select())
        .limit(limit)
        .into_boxed();
    if forward {
        let (from_ts, from_pos) = after.unwrap_or((ts, i64::MIN));
        query
            .filter(events::origin_server_ts.ge(ts))
            .filter(
                events::origin_server_ts
                    .gt(from_ts)
                    .or(events::origin_server_ts
                        .eq(from_ts)
                        .and(events::stream_ordering.gt(from_pos))),
            )
            .order((
                events::origin_server_ts.asc(),
                events::stream_ordering.asc(),
            ))
            .load(&mut conn)
            .await
    } else {
        let (from_ts, from_pos) = after.unwrap_or((ts, i64::MAX));
        query
            .filter(events::origin_server_ts.le(ts))
            .filter(
                events::origin_server_ts
                    .lt(from_ts)
                    .or(events::origin_server_ts
                        .eq(from_ts)
                        .and(events::stream_ordering.lt(from_pos))),
            )
            .order((
                events::origin_server_ts.desc(),
                events::stream_ordering.desc(),
            ))
            .load(&mut conn)
            .await
    }
}
