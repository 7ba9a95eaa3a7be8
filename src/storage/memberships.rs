//! Memberships: each user's current membership in each room (`room_memberships`, which the
//! member events keep), the counts and heroes of room summaries, and the queries that start
//! from a user's rooms.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::rooms::{served, SERVED_TO_CLIENTS};
use super::schema::{events, room_memberships, user_membership_versions};

/// Channel on which a trigger announces (at commit) each membership written, whatever wrote it
/// (migrations 000042 and 000046): as JSON with the room, the user, the membership and the
/// writing transaction's ID; a deleted row as its bare room ID.
pub const MEMBERS_CHANNEL: &str = "myelin_members";

/// Records a user's current membership in a room, with the display name and avatar URL its
/// event gives (each only when a string).
pub async fn set_membership(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    user_id: &str,
    membership: &str,
    display_name: Option<&str>,
    event_id: &str,
) -> QueryResult<()> {
    // The position and avatar are the member event's, read from its row (written earlier in
    // the same transaction), so this can go out in the pipeline before the position is known.
    crate::storage::cached_sql(
        "INSERT INTO room_memberships \
             (room_id, user_id, membership, display_name, avatar_url, event_id, stream_ordering) \
         SELECT $1, $2, $3, $4, \
                CASE WHEN jsonb_typeof(e.pdu->'content'->'avatar_url') = 'string' \
                     THEN e.pdu->'content'->>'avatar_url' END, \
                $5, e.stream_ordering \
         FROM (SELECT $5::TEXT AS event_id) wanted LEFT JOIN events e USING (event_id) \
         ON CONFLICT (room_id, user_id) DO UPDATE SET \
             membership = EXCLUDED.membership, display_name = EXCLUDED.display_name, \
             avatar_url = EXCLUDED.avatar_url, event_id = EXCLUDED.event_id, \
             stream_ordering = EXCLUDED.stream_ordering, forgotten = false",
    )
    .bind::<diesel::sql_types::Text, _>(room_id)
    .bind::<diesel::sql_types::Text, _>(user_id)
    .bind::<diesel::sql_types::Text, _>(membership)
    .bind::<diesel::sql_types::Nullable<diesel::sql_types::Text>, _>(display_name)
    .bind::<diesel::sql_types::Text, _>(event_id)
    .execute(&mut conn)
    .await
    .map(drop)
}

/// A user's current membership in a room and the event that set it.
pub async fn get_membership(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    user_id: &str,
) -> QueryResult<Option<(String, String)>> {
    room_memberships::table
        .find((room_id, user_id))
        .select((room_memberships::membership, room_memberships::event_id))
        .first(&mut conn)
        .await
        .optional()
}

/// Rooms where the user's current membership is `membership`.
pub async fn get_rooms_for_user(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    membership: &str,
) -> QueryResult<Vec<String>> {
    room_memberships::table
        .filter(room_memberships::user_id.eq(user_id))
        .filter(room_memberships::membership.eq(membership))
        .order(room_memberships::stream_ordering)
        .select(room_memberships::room_id)
        .load(&mut conn)
        .await
}

/// Users whose current membership in a room is `membership`.
pub async fn get_room_members(
    conn: &AsyncPgConnection,
    room_id: &str,
    membership: &str,
) -> QueryResult<Vec<String>> {
    get_room_members_in(conn, room_id, &[membership]).await
}

/// The users whose membership in a room is one of `memberships`.
pub async fn get_room_members_in(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    memberships: &[&str],
) -> QueryResult<Vec<String>> {
    room_memberships::table
        .filter(room_memberships::room_id.eq(room_id))
        .filter(room_memberships::membership.eq_any(memberships))
        .select(room_memberships::user_id)
        .load(&mut conn)
        .await
}

/// The users whose membership in a room is one of `memberships`, and the snapshot they were
/// read in (`pg_current_snapshot()` as text): which membership changes the read saw.
pub async fn get_room_audience(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    memberships: &[&str],
) -> QueryResult<(Vec<String>, String)> {
    use diesel::sql_types::{Array, Text};
    #[derive(QueryableByName)]
    struct Audience {
        #[diesel(sql_type = Array<Text>)]
        users: Vec<String>,
        #[diesel(sql_type = Text)]
        snapshot: String,
    }
    let found: Audience = crate::storage::cached_sql(
        "SELECT ARRAY(SELECT user_id FROM room_memberships \
                      WHERE room_id = $1 AND membership = ANY($2)) AS users, \
                pg_current_snapshot()::TEXT AS snapshot",
    )
    .bind::<Text, _>(room_id)
    .bind::<Array<Text>, _>(memberships)
    .get_result(&mut conn)
    .await?;
    Ok((found.users, found.snapshot))
}

/// How many users have one membership in a room, and the first few of them by user ID
/// (leaving one user out): what a room summary's counts and heroes come from.
#[derive(Debug, QueryableByName)]
pub struct MembershipSummary {
    /// The room.
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub room_id: String,
    /// The membership.
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub membership: String,
    /// How many users have it.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub count: i64,
    /// The first users with it, in user ID order.
    #[diesel(sql_type = diesel::sql_types::Array<diesel::sql_types::Text>)]
    pub first: Vec<String>,
}

/// Joined and invited counts of each room, with the first `heroes` members of each other than
/// `except`, in one statement for any number of rooms (a sync reads every room's at once). The
/// counts are the rows triggers keep (`room_member_counts`), not a count of the members; the
/// heroes the first entries of a range of the `(room, membership, user)` index, not a sort of
/// every member.
pub async fn get_membership_summaries(
    mut conn: &AsyncPgConnection,
    room_ids: &[String],
    except: &str,
    heroes: i32,
) -> QueryResult<Vec<MembershipSummary>> {
    crate::storage::cached_sql(
        "SELECT q.room_id, m.membership, \
                COALESCE((SELECT members FROM room_member_counts \
                          WHERE room_id = q.room_id AND membership = m.membership), 0) AS count, \
                ARRAY(SELECT user_id FROM room_memberships \
                      WHERE room_id = q.room_id AND membership = m.membership AND user_id <> $2 \
                      ORDER BY user_id LIMIT $3) AS first \
         FROM unnest($1::TEXT[]) AS q (room_id) \
         CROSS JOIN (VALUES ('join'), ('invite')) AS m (membership)",
    )
    .bind::<diesel::sql_types::Array<diesel::sql_types::Text>, _>(room_ids)
    .bind::<diesel::sql_types::Text, _>(except)
    .bind::<diesel::sql_types::Integer, _>(heroes)
    .load(&mut conn)
    .await
}

/// Where in the room's history (topological order) the user's latest join event is, if they
/// ever joined.
pub async fn get_last_join_position(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    user_id: &str,
) -> QueryResult<Option<super::dag::HistoryPosition>> {
    let position: Option<(i64, i64)> = events::table
        .filter(events::room_id.eq(room_id))
        .filter(events::event_type.eq("m.room.member"))
        .filter(events::state_key.eq(user_id))
        .filter(served())
        .filter(diesel::dsl::sql::<diesel::sql_types::Bool>(
            "pdu->'content'->>'membership' = 'join'",
        ))
        .order((events::depth.desc(), events::stream_ordering.desc()))
        .select((events::depth, events::stream_ordering))
        .first(&mut conn)
        .await
        .optional()?;
    Ok(position.map(|(depth, stream)| super::dag::HistoryPosition { depth, stream }))
}

/// Whether the user has forgotten the room.
pub async fn is_forgotten(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    user_id: &str,
) -> QueryResult<bool> {
    room_memberships::table
        .find((room_id, user_id))
        .select(room_memberships::forgotten)
        .first(&mut conn)
        .await
        .optional()
        .map(|forgotten| forgotten.unwrap_or(false))
}

/// Marks a room forgotten for a user; returns false when they are still joined or invited.
pub async fn forget_room(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    user_id: &str,
) -> QueryResult<bool> {
    let updated = diesel::update(
        room_memberships::table
            .find((room_id, user_id))
            .filter(room_memberships::membership.ne_all(vec!["join", "invite", "knock"])),
    )
    .set(room_memberships::forgotten.eq(true))
    .execute(&mut conn)
    .await?;
    Ok(updated > 0)
}

/// The counter that moves with every change to a user's memberships (0: none since the
/// counter was introduced; a trigger on `room_memberships` keeps it).
pub async fn get_user_membership_version(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<i64> {
    user_membership_versions::table
        .find(user_id)
        .select(user_membership_versions::version)
        .first(&mut conn)
        .await
        .optional()
        .map(Option::unwrap_or_default)
}

/// Every room a user has a membership in: `(room_id, membership, event_id, stream_ordering)`.
pub async fn get_user_memberships(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<Vec<(String, String, String, i64)>> {
    room_memberships::table
        .filter(room_memberships::user_id.eq(user_id))
        .filter(room_memberships::forgotten.eq(false))
        .select((
            room_memberships::room_id,
            room_memberships::membership,
            room_memberships::event_id,
            room_memberships::stream_ordering,
        ))
        .load(&mut conn)
        .await
}

/// A user's current membership in a room and the stream position it was set at.
pub async fn get_membership_position(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    user_id: &str,
) -> QueryResult<Option<(String, i64)>> {
    room_memberships::table
        .find((room_id, user_id))
        .select((
            room_memberships::membership,
            room_memberships::stream_ordering,
        ))
        .first(&mut conn)
        .await
        .optional()
}

#[derive(QueryableByName)]
struct StretchStart {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    stream_ordering: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    state_group: i64,
}

/// Where a user's current stretch of being joined began: the stream position and state group
/// of the first join after their last non-join membership (display name changes are joins too).
pub async fn get_membership_stretch_start(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    user_id: &str,
) -> QueryResult<Option<(i64, i64)>> {
    // Served events have a state group (only outliers have none).
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT stream_ordering, state_group FROM events
             WHERE room_id = $1 AND event_type = 'm.room.member' AND state_key = $2
               AND pdu->'content'->>'membership' = 'join' AND {SERVED_TO_CLIENTS}
               AND stream_ordering > COALESCE((
                   SELECT MAX(stream_ordering) FROM events
                   WHERE room_id = $1 AND event_type = 'm.room.member' AND state_key = $2
                     AND pdu->'content'->>'membership' <> 'join' AND {SERVED_TO_CLIENTS}), 0)
             ORDER BY stream_ordering LIMIT 1"
        )
    });
    let start: Option<StretchStart> = crate::storage::cached_sql(SQL.as_str())
        .bind::<diesel::sql_types::Text, _>(room_id)
        .bind::<diesel::sql_types::Text, _>(user_id)
        .get_result(&mut conn)
        .await
        .optional()?;
    Ok(start.map(|s| (s.stream_ordering, s.state_group)))
}

/// SQL: whether the user in `$1` shares a joined room with the user in column `other`, probed
/// row by row: the other user's joined rooms, each with `$1`'s membership looked up by key.
/// Its cost follows the rows probed and their rooms, never the size of `$1`'s rooms. An
/// `EXISTS` join here ran as a hashed subplan (with or without statistics), which first reads
/// every member of every room of `$1`: 20,000 in a big room, for each sync a presence change
/// woke. Scalar subqueries are never hashed, so the shape holds whatever the statistics say.
pub(super) fn shares_joined_room(other: &str) -> String {
    format!(
        "COALESCE((SELECT true FROM room_memberships theirs
                   WHERE theirs.user_id = {other} AND theirs.membership = 'join'
                     AND (SELECT mine.membership FROM room_memberships mine
                          WHERE mine.room_id = theirs.room_id AND mine.user_id = $1) = 'join'
                   LIMIT 1), false)"
    )
}

/// SQL: one row, `peers`, the members of every room the user in `$1` has joined, added up
/// from the rooms' member counts (a member of two of them counted twice): a bound on how many
/// fellow members [`among_joined_room_peers`] would read. Each count is a lookup by key; the
/// sum is a `BIGINT`, so dividing it divides whole numbers (a `numeric` sum's fraction made a
/// `LIMIT` that rounds compare with a bound that does not).
pub(super) fn joined_room_peers_bound() -> &'static str {
    "SELECT COALESCE(sum((SELECT c.members FROM room_member_counts c
                          WHERE c.room_id = mine.room_id AND c.membership = 'join')), 0)::BIGINT
            AS peers
     FROM room_memberships mine WHERE mine.user_id = $1 AND mine.membership = 'join'"
}

/// SQL: whether the user in column `other` is among those sharing a joined room with the user
/// in `$1`, read as one set: for a filter over more rows than `$1`'s rooms have members (an
/// initial sync's presence), where probing each row costs more than reading the set once.
pub(super) fn among_joined_room_peers(other: &str) -> String {
    format!(
        "{other} IN (SELECT theirs.user_id FROM room_memberships mine
                     JOIN room_memberships theirs ON theirs.room_id = mine.room_id
                     WHERE mine.user_id = $1 AND mine.membership = 'join'
                       AND theirs.membership = 'join')"
    )
}
