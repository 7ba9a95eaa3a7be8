//! Where rooms last changed, for the room-change index (`service::sync::room_index`): the
//! rooms with events in a range of positions, and given rooms' newest events up to a position.

use diesel::{
    prelude::*,
    sql_types::{Array, BigInt, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::rooms::SERVED_TO_CLIENTS;

/// Where a room last changed (in a range of positions, or up to one).
#[derive(QueryableByName)]
pub struct RoomChange {
    /// The room.
    #[diesel(sql_type = Text)]
    pub room_id: String,
    /// Its latest event's position.
    #[diesel(sql_type = BigInt)]
    pub last_event: i64,
    /// Its latest membership event's position, if it had one (in the range).
    #[diesel(sql_type = diesel::sql_types::Nullable<BigInt>)]
    pub last_membership: Option<i64>,
    /// Its latest "bump" event's position (a message-like event, see [`BUMP_TYPES`]), if
    /// it had one (in the range).
    #[diesel(sql_type = diesel::sql_types::Nullable<BigInt>)]
    pub last_bump: Option<i64>,
}

/// Event types that move a room up a client's list (sliding sync's `bump_stamp`).
pub const BUMP_TYPES: &str = "'m.room.create', 'm.room.message', 'm.room.encrypted', \
    'm.sticker', 'm.call.invite', 'm.poll.start', 'm.beacon_info', \
    'org.matrix.msc3381.poll.start', 'org.matrix.msc3672.beacon_info'";

/// Rooms with served events at positions in `(after, up_to]`. The bounds are sub-selects so
/// that the planner estimates every range alike and settles on one generic plan (an index
/// range scan) instead of planning each call afresh, which cost more than running it. The
/// range is read in position order with the served filter outside it, so the positions' own
/// index is the only one to serve it: with the filter inside, a generic plan made while
/// `events` was small (never replaced where no `ANALYZE` runs) read the whole topological
/// index, whose predicate is that filter, on every call (0.5 ms at 23,000 events, growing
/// with the table).
pub async fn get_rooms_changed_between(
    mut conn: &AsyncPgConnection,
    after: i64,
    up_to: i64,
) -> QueryResult<Vec<RoomChange>> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT room_id, MAX(stream_ordering) AS last_event,
                    MAX(stream_ordering) FILTER (WHERE event_type = 'm.room.member')
                        AS last_membership,
                    MAX(stream_ordering) FILTER (WHERE event_type IN ({BUMP_TYPES}))
                        AS last_bump
             FROM (
                 SELECT room_id, stream_ordering, event_type,
                        outlier, rejected_reason, soft_failed
                 FROM events
                 WHERE stream_ordering > (SELECT $1::BIGINT)
                   AND stream_ordering <= (SELECT $2::BIGINT)
                 ORDER BY stream_ordering OFFSET 0
             ) events
             WHERE {SERVED_TO_CLIENTS}
             GROUP BY room_id"
        )
    });
    super::cached_sql(SQL.as_str())
        .bind::<BigInt, _>(after)
        .bind::<BigInt, _>(up_to)
        .load(&mut conn)
        .await
}

/// Where each of `rooms` last changed at or before `up_to`: its newest event, membership
/// event and "bump" event, each found from the newest end of the room's events (the
/// membership through its own index), so the cost does not grow with the room's history.
/// A room without events there has a zero `last_event`.
pub async fn get_room_last_changes(
    mut conn: &AsyncPgConnection,
    rooms: &[String],
    up_to: i64,
) -> QueryResult<Vec<RoomChange>> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let newest = |kind: &str| {
            format!(
                "LEFT JOIN LATERAL (
                     SELECT stream_ordering AS position FROM events
                     WHERE events.room_id = r.room_id {kind} AND stream_ordering <= $2
                       AND {SERVED_TO_CLIENTS}
                     ORDER BY stream_ordering DESC LIMIT 1
                 )"
            )
        };
        format!(
            "SELECT r.room_id, COALESCE(e.position, 0) AS last_event,
                    m.position AS last_membership, b.position AS last_bump
             FROM unnest($1::TEXT[]) AS r(room_id)
             {} e ON TRUE
             {} m ON TRUE
             {} b ON TRUE",
            newest(""),
            newest("AND event_type = 'm.room.member'"),
            newest(&format!("AND event_type IN ({BUMP_TYPES})")),
        )
    });
    super::cached_sql(SQL.as_str())
        .bind::<Array<Text>, _>(rooms)
        .bind::<BigInt, _>(up_to)
        .load(&mut conn)
        .await
}
