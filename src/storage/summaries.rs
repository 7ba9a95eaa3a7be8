//! Queries for room summaries and the space hierarchy.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::schema::room_memberships;

/// How many users hold `membership` in a room.
pub async fn count_members(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    membership: &str,
) -> QueryResult<i64> {
    room_memberships::table
        .filter(room_memberships::room_id.eq(room_id))
        .filter(room_memberships::membership.eq(membership))
        .count()
        .get_result(&mut conn)
        .await
}

/// Whether any user of `server_name` holds one of `memberships` in a room.
pub async fn server_has_member(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    server_name: &str,
    memberships: &[&str],
) -> QueryResult<bool> {
    #[derive(QueryableByName)]
    struct Found {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        found: bool,
    }
    // A user ID ends with ':' and the server name (which may itself hold a ':port').
    let found: Found = crate::storage::cached_sql(
        "SELECT EXISTS (SELECT 1 FROM room_memberships \
         WHERE room_id = $1 AND membership = ANY($3) \
           AND right(user_id, length($2) + 1) = ':' || $2) AS found",
    )
    .bind::<diesel::sql_types::Text, _>(room_id)
    .bind::<diesel::sql_types::Text, _>(server_name)
    .bind::<diesel::sql_types::Array<diesel::sql_types::Text>, _>(memberships)
    .get_result(&mut conn)
    .await?;
    Ok(found.found)
}
