//! Which servers are in a room: the members of one server, found by the server part of their
//! user IDs. The SQL narrows by the suffix `:{server}`; callers confirm each user ID's server
//! with ruma's parser, because a suffix is not a server name (`@a:host:8448` ends in `:8448`,
//! and `8448` is a valid server name too).

use diesel::{
    prelude::*,
    sql_types::{BigInt, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// `LIKE` pattern for user IDs ending in `:{server}`.
pub(super) fn suffix_pattern(server: &str) -> String {
    let escaped = server
        .replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_");
    format!("%:{escaped}")
}

#[derive(QueryableByName)]
struct Member {
    #[diesel(sql_type = Text)]
    user_id: String,
}

/// The users whose current membership of the room is `join` and whose ID ends in
/// `:{server}` (to be confirmed by the caller).
pub async fn get_joined_users_like_server(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    server: &str,
) -> QueryResult<Vec<String>> {
    let rows: Vec<Member> = super::cached_sql(
        "SELECT user_id FROM room_memberships \
         WHERE room_id = $1 AND membership = 'join' AND user_id LIKE $2",
    )
    .bind::<Text, _>(room_id)
    .bind::<Text, _>(suffix_pattern(server))
    .load(&mut conn)
    .await?;
    Ok(rows.into_iter().map(|m| m.user_id).collect())
}

#[derive(QueryableByName)]
struct LastJoin {
    #[diesel(sql_type = Text)]
    user_id: String,
    #[diesel(sql_type = BigInt)]
    stream_ordering: i64,
}

/// For each user whose ID ends in `:{server}` (to be confirmed by the caller) and who ever
/// joined the room: the stream position of their latest join event.
pub async fn get_last_joins_like_server(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    server: &str,
) -> QueryResult<Vec<(String, i64)>> {
    let rows: Vec<LastJoin> = super::cached_sql(
        "SELECT state_key AS user_id, max(stream_ordering) AS stream_ordering FROM events \
         WHERE room_id = $1 AND event_type = 'm.room.member' AND state_key LIKE $2 \
           AND pdu->'content'->>'membership' = 'join' \
         GROUP BY state_key",
    )
    .bind::<Text, _>(room_id)
    .bind::<Text, _>(suffix_pattern(server))
    .load(&mut conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.user_id, r.stream_ordering))
        .collect())
}

/// The users joined to any room `user_id` is joined to (`user_id` included while joined
/// anywhere): whose servers hear of the user's presence and devices.
pub async fn get_users_sharing_a_room(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<Vec<String>> {
    let rows: Vec<Member> = super::cached_sql(
        "SELECT DISTINCT theirs.user_id FROM room_memberships mine \
         JOIN room_memberships theirs ON theirs.room_id = mine.room_id \
         WHERE mine.user_id = $1 AND mine.membership = 'join' AND theirs.membership = 'join'",
    )
    .bind::<Text, _>(user_id)
    .load(&mut conn)
    .await?;
    Ok(rows.into_iter().map(|m| m.user_id).collect())
}
