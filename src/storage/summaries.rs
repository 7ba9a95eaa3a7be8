//! Queries for room summaries and the space hierarchy.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::schema::room_member_counts;

/// How many users hold `membership` in a room (kept by triggers on `room_memberships`).
pub async fn count_members(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    membership: &str,
) -> QueryResult<i64> {
    let members: Option<i64> = room_member_counts::table
        .filter(room_member_counts::room_id.eq(room_id))
        .filter(room_member_counts::membership.eq(membership))
        .select(room_member_counts::members)
        .first(&mut conn)
        .await
        .optional()?;
    Ok(members.unwrap_or(0))
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

/// A joined member's profile in a room, as their membership event gives it.
#[derive(QueryableByName)]
pub struct JoinedProfile {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub user_id: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub display_name: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub avatar_url: Option<String>,
}

/// The joined members of a room with the `displayname` and `avatar_url` of their membership
/// events where those are strings (any other value a member event may hold is left out, as
/// absent): read from the current memberships alone, which keep both, so a room of 20,000 is
/// neither read through its state chain nor every member event taken apart.
pub async fn get_joined_profiles(
    mut conn: &AsyncPgConnection,
    room_id: &str,
) -> QueryResult<Vec<JoinedProfile>> {
    super::cached_sql(
        "SELECT user_id, display_name, avatar_url FROM room_memberships \
         WHERE room_id = $1 AND membership = 'join'",
    )
    .bind::<diesel::sql_types::Text, _>(room_id)
    .load(&mut conn)
    .await
}
