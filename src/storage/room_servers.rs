//! Which servers are in a room: the members of one server, found by the server part of their
//! user IDs. The SQL narrows by the text after an ID's first `:`, or by the suffix `:{server}`
//! where no index holds the former (an event's state key); callers confirm each user ID's
//! server with ruma's parser, because a suffix is not a server name (`@a:host:8448` ends in
//! `:8448`, and `8448` is a valid server name too).

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

/// SQL for the text after the first `:` of a user ID: the server name, as a localpart never
/// holds a colon. Only a grouping key: callers read each server from a parsed user ID.
macro_rules! server_part {
    ($column:literal) => {
        concat!("substr(", $column, ", strpos(", $column, ", ':') + 1)")
    };
}

/// SQL: the rows of the joined members of room `$1` whose IDs' server part is `$2`, a range of
/// `room_memberships_joined_server_idx`.
macro_rules! joined_of_server {
    () => {
        concat!(
            "FROM room_memberships WHERE room_id = $1 AND membership = 'join' AND ",
            server_part!("user_id"),
            " = $2"
        )
    };
}

#[derive(QueryableByName)]
struct Member {
    #[diesel(sql_type = Text)]
    user_id: String,
}

/// The users whose current membership of the room is `join` and whose ID's text after the
/// first `:` is `server` (to be confirmed by the caller): a range of
/// `room_memberships_joined_server_idx`, not every member's ID matched against a suffix.
pub async fn get_joined_users_like_server(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    server: &str,
) -> QueryResult<Vec<String>> {
    let rows: Vec<Member> = super::cached_sql(concat!("SELECT user_id ", joined_of_server!()))
        .bind::<Text, _>(room_id)
        .bind::<Text, _>(server)
        .load(&mut conn)
        .await?;
    Ok(rows.into_iter().map(|m| m.user_id).collect())
}

/// Whether any user whose ID's text after the first `:` is `server` is joined to the room
/// (for our own server: whether it is in the room). One probe of
/// `room_memberships_joined_server_idx`; counting the members instead read all 20,000 of a big
/// room on every join.
pub async fn has_joined_member_of_server(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    server: &str,
) -> QueryResult<bool> {
    #[derive(QueryableByName)]
    struct Found {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        found: bool,
    }
    let found: Found = super::cached_sql(concat!(
        "SELECT EXISTS (SELECT 1 ",
        joined_of_server!(),
        ") AS found"
    ))
    .bind::<Text, _>(room_id)
    .bind::<Text, _>(server)
    .get_result(&mut conn)
    .await?;
    Ok(found.found)
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

/// SQL: one joined member per server of the rooms the seed query (`room_id`) names, by
/// skipping through `room_memberships_joined_server_idx` from each server of a room to the
/// next (a few index probes per server, whatever the room's size), then one per server over
/// all the rooms. Each room starts from the empty server part, below every real one.
macro_rules! one_joined_member_per_server {
    ($seed:literal) => {
        concat!(
            "WITH RECURSIVE seed AS (",
            $seed,
            "), servers(room_id, server, user_id) AS ( \
                 SELECT room_id, '', NULL::text FROM seed \
                 UNION ALL \
                 SELECT next.* FROM servers s, LATERAL ( \
                     SELECT room_id, ",
            server_part!("user_id"),
            ", user_id FROM room_memberships \
                     WHERE room_id = s.room_id AND membership = 'join' AND ",
            server_part!("user_id"),
            " > s.server ORDER BY ",
            server_part!("user_id"),
            " LIMIT 1) next \
             ) \
             SELECT DISTINCT ON (server) user_id FROM servers WHERE user_id IS NOT NULL"
        )
    };
}

/// One joined member of the room per server: whose servers hear of what happens in it. A
/// room of 20,000 members from a few servers answers a few rows, and reads a few index
/// entries per server.
pub async fn get_one_joined_member_per_server(
    mut conn: &AsyncPgConnection,
    room_id: &str,
) -> QueryResult<Vec<String>> {
    let rows: Vec<Member> =
        super::cached_sql(one_joined_member_per_server!("SELECT $1::text AS room_id"))
            .bind::<Text, _>(room_id)
            .load(&mut conn)
            .await?;
    Ok(rows.into_iter().map(|m| m.user_id).collect())
}

/// One user per server among those joined to any room `user_id` is joined to (`user_id`'s
/// own server included while they are joined anywhere): whose servers hear of the user's
/// presence and devices.
pub async fn get_one_sharing_user_per_server(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<Vec<String>> {
    let rows: Vec<Member> = super::cached_sql(one_joined_member_per_server!(
        "SELECT room_id FROM room_memberships WHERE user_id = $1 AND membership = 'join'"
    ))
    .bind::<Text, _>(user_id)
    .load(&mut conn)
    .await?;
    Ok(rows.into_iter().map(|m| m.user_id).collect())
}
