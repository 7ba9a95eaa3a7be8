//! Presence rows and the presence stream.

use diesel::{
    prelude::*,
    sql_types::{BigInt, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::{
    schema::{presence, users},
    streams,
};

/// A user's presence.
#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = presence)]
pub struct PresenceRow {
    /// User.
    pub user_id: String,
    /// `online`, `unavailable` or `offline`.
    pub state: String,
    /// Free-text status.
    pub status_msg: Option<String>,
    /// Last activity.
    pub last_active_ts: i64,
    /// Last sync or presence update.
    pub last_seen_ts: i64,
    /// Position of the last change.
    pub stream_ordering: i64,
}

/// A user's presence row.
pub async fn get_presence(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<Option<PresenceRow>> {
    presence::table
        .find(user_id)
        .select(PresenceRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// Locks a user's presence row for a read-modify-write (nothing when there is none).
pub async fn lock_presence(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<Option<PresenceRow>> {
    presence::table
        .find(user_id)
        .select(PresenceRow::as_select())
        .for_update()
        .first(&mut conn)
        .await
        .optional()
}

/// Writes a presence change at a new stream position (inside a transaction).
pub async fn set_presence(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    state: &str,
    status_msg: Option<&str>,
    last_active_ts: i64,
    last_seen_ts: i64,
) -> QueryResult<i64> {
    let position = streams::next_position(conn, streams::PRESENCE).await?;
    diesel::insert_into(presence::table)
        .values((
            presence::user_id.eq(user_id),
            presence::state.eq(state),
            presence::status_msg.eq(status_msg),
            presence::last_active_ts.eq(last_active_ts),
            presence::last_seen_ts.eq(last_seen_ts),
            presence::stream_ordering.eq(position),
        ))
        .on_conflict(presence::user_id)
        .do_update()
        .set((
            presence::state.eq(state),
            presence::status_msg.eq(status_msg),
            presence::last_active_ts.eq(last_active_ts),
            presence::last_seen_ts.eq(last_seen_ts),
            presence::stream_ordering.eq(position),
        ))
        .execute(&mut conn)
        .await?;
    Ok(position)
}

/// Notes that a user was seen, without it being news for anyone.
pub async fn touch_presence(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    now: i64,
) -> QueryResult<()> {
    diesel::update(presence::table.find(user_id))
        .set(presence::last_seen_ts.eq(now))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Our users (not other servers', whose servers tell us when they go offline) not offline
/// whose last sign of life is older than `before`.
pub async fn get_silent_users(
    mut conn: &AsyncPgConnection,
    before: i64,
) -> QueryResult<Vec<String>> {
    presence::table
        .filter(presence::state.ne("offline"))
        .filter(presence::last_seen_ts.lt(before))
        .filter(presence::user_id.eq_any(users::table.select(users::user_id)))
        .select(presence::user_id)
        .load(&mut conn)
        .await
}

/// Every presence change in `(after, up_to]`, oldest first.
pub async fn get_presence_changed(
    mut conn: &AsyncPgConnection,
    after: i64,
    up_to: i64,
) -> QueryResult<Vec<PresenceRow>> {
    presence::table
        .filter(presence::stream_ordering.gt(after))
        .filter(presence::stream_ordering.le(up_to))
        .order(presence::stream_ordering)
        .select(PresenceRow::as_select())
        .load(&mut conn)
        .await
}

/// Up to this many presence changes are each probed for a room shared with the syncing user
/// (about 5 µs each); past it the statement chooses for itself (see [`PEERS_PER_PROBE`]).
const PROBED_CHANGES: i64 = 1_000;

/// Reading the user's fellow members as one set costs about as much as probing one presence
/// row for a shared room per this many members (in a room of 20,000 members, about 0.75 µs a
/// member against 7.5 µs a row): probing wins while the range holds fewer rows than the
/// members of the user's rooms add up to, divided by this.
const PEERS_PER_PROBE: i64 = 10;

/// Presence changes in `(after, up_to]` of the user and of everyone sharing a joined room
/// with them.
pub async fn get_presence_changed_for(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    after: i64,
    up_to: i64,
) -> QueryResult<Vec<PresenceRow>> {
    // Each change has its own position, so the range holds at most `up_to - after` rows. An
    // incremental sync's few are each probed for a shared room. For more (an initial sync's:
    // every user's presence) the statement decides once, before any row: it probes each row
    // while there are fewer of them than the members of the user's rooms (their counts,
    // summed) over PEERS_PER_PROBE, and otherwise matches them against the set of fellow
    // members, read once (built only when that branch runs). A member of a room of 20,000
    // on a server where a few hundred users have presence no longer reads the 20,000.
    let probe = super::memberships::shares_joined_room("p.user_id");
    let (bound, shares) = if after > 0 && up_to - after <= PROBED_CHANGES {
        (String::new(), probe)
    } else {
        (
            format!(
                "WITH bound AS MATERIALIZED \
                 (SELECT peers / {PEERS_PER_PROBE} AS probes FROM ({peers}) s)",
                peers = super::memberships::joined_room_peers_bound(),
            ),
            format!(
                "CASE WHEN (SELECT count(*) FROM ( \
                                SELECT 1 FROM presence \
                                WHERE stream_ordering > $2 AND stream_ordering <= $3 \
                                LIMIT (SELECT probes FROM bound)) x) < (SELECT probes FROM bound) \
                      THEN {probe} ELSE {set} END",
                set = super::memberships::among_joined_room_peers("p.user_id"),
            ),
        )
    };
    diesel::sql_query(format!(
        "{bound} SELECT p.* FROM presence p \
         WHERE p.stream_ordering > $2 AND p.stream_ordering <= $3 \
           AND (p.user_id = $1 OR {shares})"
    ))
    .bind::<Text, _>(user_id)
    .bind::<BigInt, _>(after)
    .bind::<BigInt, _>(up_to)
    .load(&mut conn)
    .await
}

/// Whether two users share a joined room.
pub async fn share_a_room(mut conn: &AsyncPgConnection, a: &str, b: &str) -> QueryResult<bool> {
    use super::schema::room_memberships as m;
    let (mine, theirs) = diesel::alias!(m as mine, m as theirs);
    let shared = mine
        .inner_join(theirs.on(theirs.field(m::room_id).eq(mine.field(m::room_id))))
        .filter(mine.field(m::user_id).eq(a))
        .filter(mine.field(m::membership).eq("join"))
        .filter(theirs.field(m::user_id).eq(b))
        .filter(theirs.field(m::membership).eq("join"));
    diesel::select(diesel::dsl::exists(shared))
        .get_result(&mut conn)
        .await
}
