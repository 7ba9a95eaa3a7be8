//! The room DAG: forward and backward extremities, history in topological order and positions
//! for backfilled events. An event's edges (`prev_events`, `auth_events`) are read from its PDU.
//!
//! History (`/messages`, `/context`) is read in topological order, `(depth, stream_ordering)`:
//! depth places an event among its ancestors and descendants, the stream position breaks ties
//! between events at the same depth. `/sync` keeps stream order for "what is new".

use diesel::{
    prelude::*,
    sql_types::{Array, BigInt, Bool, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::rooms::{EventRow, Placement, EVENT_COLUMNS, SERVED_TO_CLIENTS};

/// A point in a room's history in topological order: just after the event at
/// `(depth, stream)` (the fields compare in that order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HistoryPosition {
    /// Depth in the room DAG.
    pub depth: i64,
    /// Stream position (negative for a backfilled event).
    pub stream: i64,
}

impl HistoryPosition {
    /// Before every event (depths are never negative).
    pub const START: Self = HistoryPosition {
        depth: -1,
        stream: 0,
    };
    /// After every event.
    pub const END: Self = HistoryPosition {
        depth: i64::MAX,
        stream: i64::MAX,
    };

    /// Just after an event: it and everything before it lie at or before this point.
    pub fn at(row: &EventRow) -> Self {
        Self::after(row.placement())
    }

    /// [`Self::at`] for an event known by its place alone.
    pub fn after(event: Placement<'_>) -> Self {
        HistoryPosition {
            depth: event.depth,
            stream: event.stream_ordering,
        }
    }

    /// Just before an event: the next event at or after this point is that one.
    pub fn before(row: &EventRow) -> Self {
        HistoryPosition {
            depth: row.depth,
            stream: row.stream_ordering - 1,
        }
    }
}

#[derive(QueryableByName)]
struct Extremity {
    #[diesel(sql_type = Text)]
    event_id: String,
    #[diesel(sql_type = BigInt)]
    depth: i64,
}

/// A room's forward extremities (the events nothing references yet) with their depths.
///
/// Each depth is one primary-key lookup (the `LIMIT` keeps the planner from turning the
/// lookups into a join): joined, the plan depends on the statistics of `events`, and on a
/// table grown since its last `ANALYZE` it was a scan of every event, for every send.
pub async fn get_forward_extremities(
    mut conn: &AsyncPgConnection,
    room_id: &str,
) -> QueryResult<Vec<(String, i64)>> {
    let rows: Vec<Extremity> = super::cached_sql(
        "SELECT x.event_id, e.depth \
         FROM rooms r CROSS JOIN LATERAL unnest(r.forward_extremities) AS x (event_id) \
         CROSS JOIN LATERAL ( \
             SELECT depth FROM events WHERE event_id = x.event_id LIMIT 1 \
         ) e \
         WHERE r.room_id = $1",
    )
    .bind::<Text, _>(room_id)
    .load(&mut conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.event_id, r.depth)).collect())
}

/// Adds a new event (at `depth`) to the room's forward extremities and removes the events it
/// references (`prev_events`), in one statement; the room's tip depth becomes the greatest
/// depth written to it.
pub async fn update_forward_extremities(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    event_id: &str,
    prev_events: &[&str],
    depth: i64,
) -> QueryResult<()> {
    super::cached_sql(
        "UPDATE rooms SET \
             forward_extremities = array_append(ARRAY( \
                 SELECT x FROM unnest(forward_extremities) AS x WHERE x <> ALL($3::TEXT[]) \
             ), $2), \
             tip_depth = GREATEST(tip_depth, $4) \
         WHERE room_id = $1",
    )
    .bind::<Text, _>(room_id)
    .bind::<Text, _>(event_id)
    .bind::<Array<Text>, _>(prev_events)
    .bind::<BigInt, _>(depth)
    .execute(&mut conn)
    .await
    .map(drop)
}

/// Up to `limit` served events of a room after `after` and at or before `up_to` in
/// topological order: newest first (`backwards`) or oldest first.
///
/// Read through `myelin_room_history` (migration 000043), whose only plan is the ordered walk
/// of the topological index: as a plain statement, a room grown since the last `ANALYZE` was
/// planned as small, and every page then read and sorted all of the room's events.
pub async fn get_room_history(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    after: HistoryPosition,
    up_to: HistoryPosition,
    backwards: bool,
    limit: i64,
) -> QueryResult<Vec<EventRow>> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!("SELECT {EVENT_COLUMNS} FROM myelin_room_history($1, $2, $3, $4, $5, $6, $7)")
    });
    super::cached_sql(SQL.as_str())
        .bind::<Text, _>(room_id)
        .bind::<BigInt, _>(after.depth)
        .bind::<BigInt, _>(after.stream)
        .bind::<BigInt, _>(up_to.depth)
        .bind::<BigInt, _>(up_to.stream)
        .bind::<Bool, _>(backwards)
        .bind::<BigInt, _>(limit)
        .load(&mut conn)
        .await
}

#[derive(QueryableByName)]
struct Position {
    #[diesel(sql_type = BigInt)]
    depth: i64,
    #[diesel(sql_type = BigInt)]
    stream_ordering: i64,
}

/// Where a stream position falls in a room's history: just after the room's newest served
/// event at or before it in stream order, or [`HistoryPosition::START`] before the first.
/// Exact wherever history is linear (every event a room of ours writes follows the one
/// before it, so stream and topological order agree); at a fork it is the point after the
/// event that arrived last.
pub async fn get_position_at_stream(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    stream: i64,
) -> QueryResult<HistoryPosition> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT depth, stream_ordering FROM events \
             WHERE room_id = $1 AND stream_ordering <= $2 AND {SERVED_TO_CLIENTS} \
             ORDER BY stream_ordering DESC LIMIT 1"
        )
    });
    let position: Option<Position> = super::cached_sql(SQL.as_str())
        .bind::<Text, _>(room_id)
        .bind::<BigInt, _>(stream)
        .get_result(&mut conn)
        .await
        .optional()?;
    Ok(
        position.map_or(HistoryPosition::START, |p| HistoryPosition {
            depth: p.depth,
            stream: p.stream_ordering,
        }),
    )
}

/// The end of a room's history: just after its last served event in topological order, or
/// [`HistoryPosition::START`] when it has none.
pub async fn get_history_end(
    mut conn: &AsyncPgConnection,
    room_id: &str,
) -> QueryResult<HistoryPosition> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT depth, stream_ordering FROM events \
             WHERE room_id = $1 AND {SERVED_TO_CLIENTS} \
             ORDER BY depth DESC, stream_ordering DESC LIMIT 1"
        )
    });
    let position: Option<Position> = super::cached_sql(SQL.as_str())
        .bind::<Text, _>(room_id)
        .get_result(&mut conn)
        .await
        .optional()?;
    Ok(
        position.map_or(HistoryPosition::START, |p| HistoryPosition {
            depth: p.depth,
            stream: p.stream_ordering,
        }),
    )
}

/// The stream position of the event at a point in a room's history: the newest served event
/// at or before it in topological order (`None` before the first).
pub async fn get_stream_at_position(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    at: HistoryPosition,
) -> QueryResult<Option<i64>> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT depth, stream_ordering FROM events \
             WHERE room_id = $1 AND (depth, stream_ordering) <= ($2, $3) AND {SERVED_TO_CLIENTS} \
             ORDER BY depth DESC, stream_ordering DESC LIMIT 1"
        )
    });
    let position: Option<Position> = super::cached_sql(SQL.as_str())
        .bind::<Text, _>(room_id)
        .bind::<BigInt, _>(at.depth)
        .bind::<BigInt, _>(at.stream)
        .get_result(&mut conn)
        .await
        .optional()?;
    Ok(position.map(|p| p.stream_ordering))
}

#[derive(QueryableByName)]
struct Taken {
    #[diesel(sql_type = BigInt)]
    position: i64,
}

/// Takes the stream position of a backfilled event: negative and descending (the oldest
/// history lowest), never one `/sync` reports as new, which reads only after its token.
pub async fn next_backfill_position(mut conn: &AsyncPgConnection) -> QueryResult<i64> {
    let taken: Taken = super::cached_sql("SELECT nextval('backfill_position_seq') AS position")
        .get_result(&mut conn)
        .await?;
    Ok(taken.position)
}

/// Whether an event is stored, whatever its status.
pub async fn event_exists(mut conn: &AsyncPgConnection, event_id: &str) -> QueryResult<bool> {
    diesel::select(diesel::dsl::exists(
        super::schema::events::table.find(event_id),
    ))
    .get_result(&mut conn)
    .await
}

/// Marks a just-stored event soft-failed (a no-op for `false`).
pub async fn set_soft_failed(
    mut conn: &AsyncPgConnection,
    event_id: &str,
    soft_failed: bool,
) -> QueryResult<()> {
    super::cached_sql("UPDATE events SET soft_failed = true WHERE event_id = $1 AND $2")
        .bind::<Text, _>(event_id)
        .bind::<diesel::sql_types::Bool, _>(soft_failed)
        .execute(&mut conn)
        .await
        .map(drop)
}

/// A rejected event to store.
pub struct RejectedEvent<'a> {
    /// Event ID.
    pub event_id: &'a str,
    /// Room ID.
    pub room_id: &'a str,
    /// Depth.
    pub depth: i64,
    /// Sender.
    pub sender: &'a str,
    /// Event type.
    pub event_type: &'a str,
    /// State key.
    pub state_key: Option<&'a str>,
    /// Origin timestamp.
    pub origin_server_ts: i64,
    /// The signed PDU.
    pub pdu: &'a serde_json::Value,
    /// The state before it, when known (otherwise it is stored as an outlier).
    pub state_group: Option<i64>,
    /// Why it was rejected.
    pub reason: &'a str,
}

/// Stores a rejected event. It takes a backfill position (below zero): it is never new to
/// anyone, and holds no reader back.
pub async fn insert_rejected_event(
    mut conn: &AsyncPgConnection,
    event: &RejectedEvent<'_>,
) -> QueryResult<()> {
    use diesel::sql_types::{Jsonb, Nullable};
    super::cached_sql(
        "INSERT INTO events (event_id, room_id, stream_ordering, depth, sender, event_type, \
             state_key, origin_server_ts, pdu, state_group, outlier, rejected_reason) \
         VALUES ($1, $2, nextval('backfill_position_seq'), $3, $4, $5, $6, $7, $8, $9, \
             $9 IS NULL, $10)",
    )
    .bind::<Text, _>(event.event_id)
    .bind::<Text, _>(event.room_id)
    .bind::<BigInt, _>(event.depth)
    .bind::<Text, _>(event.sender)
    .bind::<Text, _>(event.event_type)
    .bind::<Nullable<Text>, _>(event.state_key)
    .bind::<BigInt, _>(event.origin_server_ts)
    .bind::<Jsonb, _>(event.pdu)
    .bind::<Nullable<BigInt>, _>(event.state_group)
    .bind::<Text, _>(event.reason)
    .execute(&mut conn)
    .await
    .map(drop)
}

/// An event stored as an outlier: no place in the timeline and no state of its own (an auth
/// event, or the room state a join brought). It takes a backfill position, never new to
/// anyone. Known events are left as they are.
pub async fn insert_outlier(
    mut conn: &AsyncPgConnection,
    event_id: &str,
    room_id: &str,
    pdu: &serde_json::Value,
) -> QueryResult<()> {
    use diesel::sql_types::Jsonb;
    super::cached_sql(
        "INSERT INTO events (event_id, room_id, stream_ordering, depth, sender, event_type, \
             state_key, origin_server_ts, pdu, state_group, outlier) \
         VALUES ($1, $2, nextval('backfill_position_seq'), ($3->>'depth')::BIGINT, \
             $3->>'sender', $3->>'type', $3->>'state_key', \
             ($3->>'origin_server_ts')::BIGINT, $3, NULL, true) \
         ON CONFLICT (event_id) DO NOTHING",
    )
    .bind::<Text, _>(event_id)
    .bind::<Text, _>(room_id)
    .bind::<Jsonb, _>(pdu)
    .execute(&mut conn)
    .await
    .map(drop)
}

/// The room's backward extremities near its oldest served events: `prev_events` of the
/// `OLDEST_SCANNED` earliest events (in topological order) that have no place here yet (unknown,
/// or known only as outliers). Where history here begins, older history may be asked for.
/// Each prev event is looked up by primary key (a scalar subquery with `LIMIT` is never made a
/// join): as `NOT EXISTS`, PostgreSQL guessed a hundred IDs per event and hashed every event of
/// the server against them (13 ms at 34,000 events).
pub async fn get_backward_extremities(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    limit: i64,
) -> QueryResult<Vec<String>> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let prev_events = super::event_graph::pdu_id_list("pdu", "prev_events");
        format!(
            "SELECT DISTINCT prev_id.event_id \
             FROM (SELECT {prev_events} AS prevs \
                   FROM events WHERE room_id = $1 AND {SERVED_TO_CLIENTS} \
                   ORDER BY depth, stream_ordering LIMIT {OLDEST_SCANNED}) oldest \
             CROSS JOIN LATERAL jsonb_array_elements_text(oldest.prevs) prev_id (event_id) \
             WHERE NOT COALESCE(( \
                 SELECT TRUE FROM events prev WHERE prev.event_id = prev_id.event_id \
                 AND (prev.state_group IS NOT NULL OR prev.rejected_reason IS NOT NULL) \
                 LIMIT 1), FALSE) \
             LIMIT $2"
        )
    });
    let rows: Vec<EventIdRow> = super::cached_sql(SQL.as_str())
        .bind::<Text, _>(room_id)
        .bind::<BigInt, _>(limit)
        .load(&mut conn)
        .await?;
    Ok(rows.into_iter().map(|row| row.event_id).collect())
}

/// How many of a room's earliest events [`get_backward_extremities`] looks behind.
const OLDEST_SCANNED: i64 = 10;

#[derive(QueryableByName)]
struct EventIdRow {
    #[diesel(sql_type = Text)]
    event_id: String,
}

/// Whether the event is stored as an outlier that was not rejected: history fetched later may
/// give it its place (see [`place_outlier`]).
pub async fn is_placeable_outlier(
    mut conn: &AsyncPgConnection,
    event_id: &str,
) -> QueryResult<bool> {
    diesel::select(diesel::dsl::exists(
        super::schema::events::table
            .find(event_id)
            .filter(super::schema::events::outlier)
            .filter(super::schema::events::rejected_reason.is_null()),
    ))
    .get_result(&mut conn)
    .await
}

/// Gives an outlier its place in the room's history: the state after it. It keeps its
/// backfill position (never new to anyone).
pub async fn place_outlier(
    mut conn: &AsyncPgConnection,
    event_id: &str,
    state_group: i64,
) -> QueryResult<()> {
    super::cached_sql(
        "UPDATE events SET outlier = false, state_group = $2 WHERE event_id = $1 AND outlier",
    )
    .bind::<Text, _>(event_id)
    .bind::<BigInt, _>(state_group)
    .execute(&mut conn)
    .await
    .map(drop)
}

/// Makes `event_id` the room's only forward extremity, at `depth` (a room joined through
/// another server starts its history here).
pub async fn reset_forward_extremities(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    event_id: &str,
    depth: i64,
) -> QueryResult<()> {
    super::cached_sql(
        "UPDATE rooms SET forward_extremities = ARRAY[$2], tip_depth = GREATEST(tip_depth, $3) \
         WHERE room_id = $1",
    )
    .bind::<Text, _>(room_id)
    .bind::<Text, _>(event_id)
    .bind::<BigInt, _>(depth)
    .execute(&mut conn)
    .await
    .map(drop)
}

/// Turns a user's out-of-band invites and knocks of a room (stored for display while we were
/// not in it) into outliers, once the room's real state arrives with their join.
pub async fn demote_invites_and_knocks(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    user_id: &str,
) -> QueryResult<()> {
    super::cached_sql(
        "UPDATE events SET outlier = true, state_group = NULL \
         WHERE room_id = $1 AND event_type = 'm.room.member' AND state_key = $2 \
           AND NOT outlier AND pdu->'content'->>'membership' IN ('invite', 'knock')",
    )
    .bind::<Text, _>(room_id)
    .bind::<Text, _>(user_id)
    .execute(&mut conn)
    .await
    .map(drop)
}

#[cfg(test)]
mod tests {
    use diesel::{debug_query, pg::Pg};

    use super::*;
    use crate::storage::{rooms::served, schema::events};

    #[test]
    fn served_reads_as_the_sql_the_partial_index_is_built_on() {
        let query = events::table.filter(served()).select(events::event_id);
        let rendered = debug_query::<Pg, _>(&query).to_string();
        let condition = rendered
            .split(" WHERE ")
            .nth(1)
            .and_then(|rest| rest.split(" -- binds").next())
            .expect("a WHERE clause");
        let plain = condition
            .replace("\"events\".", "")
            .replace(['"', '(', ')'], "");
        let words: Vec<&str> = plain.split_whitespace().collect();
        assert_eq!(words.join(" "), SERVED_TO_CLIENTS);
    }

    #[test]
    fn positions_order_by_depth_then_stream() {
        let at = |depth, stream| HistoryPosition { depth, stream };
        assert!(at(3, -7) < at(3, 40));
        assert!(at(3, 40) < at(4, -100));
        assert!(HistoryPosition::START < at(0, i64::MIN + 1));
        assert!(at(i64::MAX - 1, 0) < HistoryPosition::END);
    }
}
