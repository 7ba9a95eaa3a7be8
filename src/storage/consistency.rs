//! Queries for the consistency sampler: a random sample to check, and the room-change facts
//! recomputed from the events table.

use diesel::{
    sql_types::{Array, BigInt, Text},
    QueryResult, QueryableByName,
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::{
    room_index::{RoomChange, BUMP_TYPES},
    rooms::SERVED_TO_CLIENTS,
};

#[derive(QueryableByName)]
struct UserRow {
    #[diesel(sql_type = Text)]
    user_id: String,
}

/// Up to `limit` random active users joined to at least one room.
pub async fn get_random_joined_users(
    mut conn: &AsyncPgConnection,
    limit: i64,
) -> QueryResult<Vec<String>> {
    // ORDER BY random() reads every user: cheap enough for a run every few minutes, and
    // unlike TABLESAMPLE it never comes back empty from a small table.
    let rows: Vec<UserRow> = diesel::sql_query(
        "SELECT u.user_id FROM users u
         WHERE NOT u.deactivated
           AND EXISTS (SELECT 1 FROM room_memberships m
                       WHERE m.user_id = u.user_id AND m.membership = 'join')
         ORDER BY random() LIMIT $1",
    )
    .bind::<BigInt, _>(limit)
    .load(&mut conn)
    .await?;
    Ok(rows.into_iter().map(|r| r.user_id).collect())
}

/// Where each of `rooms` last changed at or below `up_to`, from the events themselves (the
/// facts the in-memory room-change index is built from).
pub async fn get_room_changes(
    mut conn: &AsyncPgConnection,
    rooms: &[String],
    up_to: i64,
) -> QueryResult<Vec<RoomChange>> {
    diesel::sql_query(format!(
        "SELECT room_id, MAX(stream_ordering) AS last_event,
                MAX(stream_ordering) FILTER (WHERE event_type = 'm.room.member')
                    AS last_membership,
                MAX(stream_ordering) FILTER (WHERE event_type IN ({BUMP_TYPES}))
                    AS last_bump
         FROM events WHERE room_id = ANY($1) AND stream_ordering <= $2
           AND {SERVED_TO_CLIENTS}
         GROUP BY room_id"
    ))
    .bind::<Array<Text>, _>(rooms)
    .bind::<BigInt, _>(up_to)
    .load(&mut conn)
    .await
}
