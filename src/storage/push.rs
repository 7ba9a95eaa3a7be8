//! Push actions (what each event means for each local member), unread counts and
//! notifications, plus two room reads push evaluation needs (joined members with display
//! names, current state events). Pushers are in `pushers.rs`.

use std::sync::LazyLock;

use diesel::{
    prelude::*,
    sql_types::{Array, BigInt, Bool, Integer, Jsonb, Nullable, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::{events, room_current_state};

/// Channel announcing (once committed, empty payload) that push actions which notify were stored:
/// what the push sender waits for. Only such actions give a pusher something to send, so
/// events that notify nobody (most in a room of one, or with every member's rules silent) do
/// not wake it.
pub const PUSH_CHANNEL: &str = "myelin_push";

/// One event's meaning for one member. Stored by the member's and the room's number and the
/// event's position (migration 000040); the event's ID and timestamp are read from the event,
/// and actions equal to what the flags imply by default are stored as NULL.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct PushActionRow {
    /// The member.
    #[diesel(sql_type = Text)]
    pub user_id: String,
    /// Room.
    #[diesel(sql_type = Text)]
    pub room_id: String,
    /// Event.
    #[diesel(sql_type = Text)]
    pub event_id: String,
    /// The event's stream position.
    #[diesel(sql_type = BigInt)]
    pub stream_ordering: i64,
    /// `""` for the main timeline, else the thread root.
    #[diesel(sql_type = Text)]
    pub thread_id: String,
    /// The push rules say notify.
    #[diesel(sql_type = Bool)]
    pub notify: bool,
    /// The push rules say highlight.
    #[diesel(sql_type = Bool)]
    pub highlight: bool,
    /// It counts as an unread message (MSC2654).
    #[diesel(sql_type = Bool)]
    pub unread: bool,
    /// The push rule actions.
    #[diesel(sql_type = Jsonb)]
    pub actions: Value,
    /// The event's `origin_server_ts`.
    #[diesel(sql_type = BigInt)]
    pub ts: i64,
}

/// A push action's actions as stored: NULL when they are what its flags imply.
pub(super) const STORED_ACTIONS: &str =
    "COALESCE(a.actions, myelin_implied_push_actions(a.notify, a.highlight, a.default_sound))";

/// A new event's push actions: rows evaluated member by member, and the members whose row
/// is one of those but for the user (the default rules, evaluated once for all of them).
#[derive(Debug, Default)]
pub struct NewPushActions<'a> {
    /// Rows evaluated one by one.
    pub rows: Vec<PushActionRow>,
    /// Members sharing another member's outcome.
    pub shared: Option<SharedPushAction<'a>>,
}

/// Members whose push action is `like` but for the user.
#[derive(Debug)]
pub struct SharedPushAction<'a> {
    /// The outcome, as evaluated for one member (whose own row is among the event's rows).
    pub like: PushActionRow,
    /// The other members whose action it is too.
    pub members: Vec<&'a str>,
}

impl NewPushActions<'_> {
    /// Puts every row at `position` (createRoom's provisional positions).
    pub fn set_position(&mut self, position: i64) {
        for row in &mut self.rows {
            row.stream_ordering = position;
        }
        if let Some(shared) = &mut self.shared {
            shared.like.stream_ordering = position;
        }
    }
}

/// Stores push actions: at the positions in their rows when `at_row_positions` (createRoom's
/// provisional positions, a recomputation's rows), else at the position the event's
/// transaction just took (their rows' `stream_ordering` is not used: see
/// [`super::streams::TAKEN_EVENT_POSITION`]). The rows evaluated one by one and the shared
/// ones are two statements of one pipeline, with the announcement when one notifies.
pub async fn insert_new_push_actions(
    conn: &AsyncPgConnection,
    actions: &NewPushActions<'_>,
    at_row_positions: bool,
) -> QueryResult<()> {
    // The array of positions is still bound (and ignored), so both forms bind alike.
    static AT_TAKEN: LazyLock<String> =
        LazyLock::new(|| insert_push_actions_sql(super::streams::TAKEN_EVENT_POSITION));
    static AT_ROWS: LazyLock<String> =
        LazyLock::new(|| insert_push_actions_sql("x.stream_ordering"));
    let rows_sql: &'static str = if at_row_positions {
        &AT_ROWS
    } else {
        &AT_TAKEN
    };
    let shared = actions.shared.as_ref().filter(|s| !s.members.is_empty());
    let notifies =
        actions.rows.iter().any(|row| row.notify) || shared.is_some_and(|s| s.like.notify);
    tokio::try_join!(
        async {
            match actions.rows.is_empty() {
                true => Ok(()),
                false => insert_rows(conn, rows_sql, &actions.rows).await,
            }
        },
        async {
            match shared {
                Some(shared) => insert_shared(conn, shared, at_row_positions).await,
                None => Ok(()),
            }
        },
        async {
            match notifies {
                true => super::rooms::notify(conn, PUSH_CHANNEL, "").await,
                false => Ok(()),
            }
        },
    )
    .map(drop)
}

/// Stores one outcome for many members: the outcome's fields bound once, the members as one
/// array, each member's number looked up by primary key (a member with no account gets no
/// row, as in [`insert_push_actions_sql`]). A position bound as NULL is the one the
/// transaction just took (`COALESCE` evaluates `currval` only then).
async fn insert_shared(
    mut conn: &AsyncPgConnection,
    shared: &SharedPushAction<'_>,
    at_row_position: bool,
) -> QueryResult<()> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "INSERT INTO event_push_actions \
             (user_nid, room_nid, stream_ordering, notify, highlight, unread, default_sound, \
              thread_id, actions) \
             SELECT u.nid, r.nid, COALESCE($8::int8, {taken}), $3, $4, $5, s.default_sound, $6, \
                    NULLIF($7::jsonb, myelin_implied_push_actions($3, $4, s.default_sound)) \
             FROM (SELECT nid FROM rooms WHERE room_id = $2 LIMIT 1) r \
             CROSS JOIN (SELECT $7::jsonb @> '[{{\"set_tweak\": \"sound\", \"value\": \"default\"}}]' \
                 AS default_sound) s \
             CROSS JOIN unnest($1::text[]) AS x (user_id) \
             CROSS JOIN LATERAL (SELECT nid FROM users WHERE user_id = x.user_id LIMIT 1) u",
            taken = super::streams::TAKEN_EVENT_POSITION,
        )
    });
    let like = &shared.like;
    super::cached_sql(SQL.as_str())
        .bind::<Array<Text>, _>(&shared.members)
        .bind::<Text, _>(like.room_id.as_str())
        .bind::<Bool, _>(like.notify)
        .bind::<Bool, _>(like.highlight)
        .bind::<Bool, _>(like.unread)
        .bind::<Text, _>(like.thread_id.as_str())
        .bind::<Jsonb, _>(&like.actions)
        .bind::<Nullable<BigInt>, _>(at_row_position.then_some(like.stream_ordering))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// One array per column, so the statement text is the same for any number of rows and stays
/// prepared (diesel's multi-row VALUES is parsed again for every event). Each row's member and
/// room numbers are looked up by primary key (the `LIMIT` keeps each a lookup whatever the
/// statistics say; a member with no account, which push rules never evaluate, gets no row);
/// actions that are what the row's flags imply are stored as NULL (migration 000040).
fn insert_push_actions_sql(position: &str) -> String {
    format!(
        "INSERT INTO event_push_actions \
         (user_nid, room_nid, stream_ordering, notify, highlight, unread, default_sound, \
          thread_id, actions) \
         SELECT u.nid, r.nid, {position}, x.notify, x.highlight, x.unread, s.default_sound, \
                x.thread_id, \
                NULLIF(x.actions, \
                       myelin_implied_push_actions(x.notify, x.highlight, s.default_sound)) \
         FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::bool[], $6::bool[], \
                     $7::bool[], $8::jsonb[]) \
              AS x (user_id, room_id, stream_ordering, thread_id, notify, highlight, unread, \
                    actions) \
         CROSS JOIN LATERAL (SELECT nid FROM users WHERE user_id = x.user_id LIMIT 1) u \
         CROSS JOIN LATERAL (SELECT nid FROM rooms WHERE room_id = x.room_id LIMIT 1) r \
         CROSS JOIN LATERAL ( \
             SELECT x.actions @> '[{{\"set_tweak\": \"sound\", \"value\": \"default\"}}]' \
                 AS default_sound \
         ) s"
    )
}

/// Inserts the rows with `sql` (from [`insert_push_actions_sql`]).
async fn insert_rows(
    mut conn: &AsyncPgConnection,
    sql: &'static str,
    rows: &[PushActionRow],
) -> QueryResult<()> {
    fn column<'r, T>(rows: &'r [PushActionRow], field: impl Fn(&'r PushActionRow) -> T) -> Vec<T> {
        rows.iter().map(field).collect()
    }
    super::cached_sql(sql)
        .bind::<Array<Text>, _>(column(rows, |r| r.user_id.as_str()))
        .bind::<Array<Text>, _>(column(rows, |r| r.room_id.as_str()))
        .bind::<Array<BigInt>, _>(column(rows, |r| r.stream_ordering))
        .bind::<Array<Text>, _>(column(rows, |r| r.thread_id.as_str()))
        .bind::<Array<Bool>, _>(column(rows, |r| r.notify))
        .bind::<Array<Bool>, _>(column(rows, |r| r.highlight))
        .bind::<Array<Bool>, _>(column(rows, |r| r.unread))
        .bind::<Array<Jsonb>, _>(column(rows, |r| &r.actions))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// A redacted event stops counting for everyone.
pub async fn delete_for_event(mut conn: &AsyncPgConnection, event_id: &str) -> QueryResult<()> {
    super::cached_sql(
        "DELETE FROM event_push_actions \
         WHERE stream_ordering = (SELECT stream_ordering FROM events WHERE event_id = $1)",
    )
    .bind::<Text, _>(event_id)
    .execute(&mut conn)
    .await
    .map(drop)
}

/// A member who leaves has nothing unread in the room any more: their push actions and their
/// summary of them go. (A summary a sync kept meanwhile from before the leave no longer holds
/// either: it was counted before the member's next membership.)
pub async fn delete_for_user_room(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    room_id: &str,
) -> QueryResult<()> {
    super::cached_sql(
        "WITH member AS MATERIALIZED ( \
             SELECT (SELECT nid FROM users WHERE user_id = $1) AS user_nid, \
                    (SELECT nid FROM rooms WHERE room_id = $2) AS room_nid \
         ), summary AS ( \
             DELETE FROM unread_count_summaries s USING member m \
             WHERE s.user_nid = m.user_nid AND s.room_nid = m.room_nid \
         ) \
         DELETE FROM event_push_actions a USING member m \
         WHERE a.user_nid = m.user_nid AND a.room_nid = m.room_nid",
    )
    .bind::<Text, _>(user_id)
    .bind::<Text, _>(room_id)
    .execute(&mut conn)
    .await
    .map(drop)
}

/// A member's push actions in a room, in stream order.
pub async fn get_for_user_room(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    room_id: &str,
) -> QueryResult<Vec<PushActionRow>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT $1 AS user_id, $2 AS room_id, e.event_id, a.stream_ordering, a.thread_id, \
                    a.notify, a.highlight, a.unread, {STORED_ACTIONS} AS actions, \
                    e.origin_server_ts AS ts \
             FROM event_push_actions a JOIN events e ON e.stream_ordering = a.stream_ordering \
             WHERE a.user_nid = (SELECT nid FROM users WHERE user_id = $1) \
               AND a.room_nid = (SELECT nid FROM rooms WHERE room_id = $2) \
             ORDER BY a.stream_ordering"
        )
    });
    super::cached_sql(SQL.as_str())
        .bind::<Text, _>(user_id)
        .bind::<Text, _>(room_id)
        .load(&mut conn)
        .await
}

#[derive(QueryableByName)]
struct JoinedMember {
    #[diesel(sql_type = Text)]
    user_id: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    display_name: Option<String>,
    #[diesel(sql_type = Bool)]
    has_own_rules: bool,
}

/// Joined members of a room with their display names, and whether each has global account
/// data of `data_type` (push rules of their own). One index probe per member, so a small room
/// stays cheap on a server where many users changed their rules.
pub async fn get_joined_members_with_names(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    data_type: &str,
) -> QueryResult<Vec<(String, Option<String>, bool)>> {
    let rows: Vec<JoinedMember> = super::cached_sql(
        "SELECT m.user_id, m.display_name, EXISTS ( \
             SELECT 1 FROM account_data a \
             WHERE a.user_id = m.user_id AND a.room_id = $3 AND a.data_type = $2 \
         ) AS has_own_rules \
         FROM room_memberships m WHERE m.room_id = $1 AND m.membership = 'join'",
    )
    .bind::<Text, _>(room_id)
    .bind::<Text, _>(data_type)
    .bind::<Text, _>(super::account_data::GLOBAL)
    .load(&mut conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|m| (m.user_id, m.display_name, m.has_own_rules))
        .collect())
}

#[derive(QueryableByName)]
struct MemberName {
    #[diesel(sql_type = Text)]
    user_id: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    display_name: Option<String>,
}

/// The joined members of a room with global account data of `data_type` (their own push
/// rules), with display names: the few a membership change can notify, found without
/// reading every member of a big room. The read starts from the users with such data (an
/// index of global account data by type, migration 000041) and looks each one's membership
/// up by key, so no plan reads the room's members, whatever the statistics say.
pub async fn get_joined_members_with_account_data(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    data_type: &str,
) -> QueryResult<Vec<(String, Option<String>)>> {
    // The global room ID is written into the text: only a literal lets PostgreSQL use the
    // partial index in a plan made once.
    let rows: Vec<MemberName> = super::cached_sql(
        "SELECT m.user_id, m.display_name FROM account_data a CROSS JOIN LATERAL ( \
             SELECT user_id, display_name FROM room_memberships \
             WHERE room_id = $1 AND user_id = a.user_id AND membership = 'join' LIMIT 1 \
         ) m \
         WHERE a.room_id = '' AND a.data_type = $2",
    )
    .bind::<Text, _>(room_id)
    .bind::<Text, _>(data_type)
    .load(&mut conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|m| (m.user_id, m.display_name))
        .collect())
}

/// The PDUs of some current state entries of a room: `(type, pdu)`, state key `""`.
pub async fn get_current_state_pdus(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    event_types: &[&str],
) -> QueryResult<Vec<(String, Value)>> {
    room_current_state::table
        .inner_join(events::table.on(events::event_id.eq(room_current_state::event_id)))
        .filter(room_current_state::room_id.eq(room_id))
        .filter(room_current_state::state_key.eq(""))
        .filter(room_current_state::event_type.eq_any(event_types))
        .select((room_current_state::event_type, events::pdu))
        .load(&mut conn)
        .await
}

/// Unread counts of one room and thread (`thread_id` `""`: the main timeline).
#[derive(Debug, Clone, QueryableByName)]
pub struct UnreadCounts {
    /// Room.
    #[diesel(sql_type = Text)]
    pub room_id: String,
    /// Thread.
    #[diesel(sql_type = Text)]
    pub thread_id: String,
    /// Notifying events.
    #[diesel(sql_type = BigInt)]
    pub notifications: i64,
    /// Highlighting events.
    #[diesel(sql_type = BigInt)]
    pub highlights: i64,
    /// Unread messages.
    #[diesel(sql_type = BigInt)]
    pub unread: i64,
}

/// The part of a query that says whether the notification `n` of user `$1` is after their
/// read position: their latest receipt, public or private, unthreaded or for the action's
/// thread (`main` for the main timeline).
const AFTER_READ_POSITION: &str = "n.stream_ordering > COALESCE((
        SELECT MAX(r.event_stream) FROM receipts r
        WHERE r.room_id = n.room_id AND r.user_id = $1
          AND r.thread_id IN ('', CASE WHEN n.thread_id = '' THEN 'main' ELSE n.thread_id END)
    ), 0)";

/// A user's unread counts in the given rooms, per thread, over events up to `up_to`. Counted
/// at read time from the push actions after the read position, so they are exact whatever
/// order receipts and events commit in.
///
/// The main timeline's counts start from the member's summary of the room when it still holds
/// (`unread_count_summaries`, migration 000047): its counts, plus what arrived since and less
/// what was read since, are the counts after the latest receipt, unthreaded or `main`. A
/// summary no longer holds once a redaction or a purge took push actions away (the room's
/// redaction count moved), once it was counted before the member's current membership (a
/// leave deleted the member's actions), or for counts as of an earlier position than its own.
/// Without one they are counted from the receipt; a count that read more than
/// [`SUMMARY_AFTER`] actions is then kept as the member's summary. So a sync's cost follows
/// what changed since the previous one, not how far behind the member is.
///
/// Threads' counts (a partial index holds only their actions) are read from the latest
/// unthreaded receipt, each then checked against its own thread's receipt. The plan is the
/// same for any number of rooms (one indexed lookup each), so the statement is prepared once.
pub async fn get_unread_counts(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    room_ids: &[String],
    up_to: i64,
) -> QueryResult<Vec<UnreadCounts>> {
    static UNREAD_COUNTS: LazyLock<String> = LazyLock::new(|| {
        UNREAD_COUNTS_WITH
            .replace("{added}", &main_timeline_count("m.added_after", "$3"))
            .replace("{read}", &main_timeline_count("m.read_after", "m.read_to"))
    });
    let rows: Vec<CountedUnread> = super::cached_sql(UNREAD_COUNTS.as_str())
        .bind::<Text, _>(user_id)
        .bind::<Array<Text>, _>(room_ids)
        .bind::<BigInt, _>(up_to)
        .load(&mut conn)
        .await?;
    let to_keep: Vec<&CountedUnread> = rows.iter().filter(|row| row.worth_keeping(up_to)).collect();
    if !to_keep.is_empty() {
        // Only a later count gains from it: a sync whose write failed still has its counts.
        if let Err(err) = keep_summaries(conn, user_id, &to_keep, up_to).await {
            tracing::warn!(user_id, error = %err, "could not keep unread count summaries");
        }
    }
    Ok(rows
        .into_iter()
        .filter(|row| {
            let counts = &row.counts;
            counts.notifications != 0 || counts.highlights != 0 || counts.unread != 0
        })
        .map(|row| row.counts)
        .collect())
}

/// How many push actions a count must read before it is kept as the member's summary: fewer
/// cost less to read again than to write.
pub const SUMMARY_AFTER: i64 = 32;

/// A row of [`UNREAD_COUNTS_WITH`]: a room's (or thread's) counts and, for the main timeline,
/// what a summary of them would hold.
#[derive(QueryableByName)]
struct CountedUnread {
    #[diesel(embed)]
    counts: UnreadCounts,
    #[diesel(sql_type = Nullable<Integer>)]
    room_nid: Option<i32>,
    /// The main timeline's read position.
    #[diesel(sql_type = Nullable<BigInt>)]
    read_to: Option<i64>,
    /// `rooms.redactions` in the snapshot the counts were read in.
    #[diesel(sql_type = Nullable<BigInt>)]
    redactions: Option<i64>,
    /// How many push actions the count read.
    #[diesel(sql_type = Nullable<BigInt>)]
    actions_read: Option<i64>,
}

impl CountedUnread {
    fn worth_keeping(&self, up_to: i64) -> bool {
        self.room_nid.is_some()
            && self.actions_read.is_some_and(|read| read > SUMMARY_AFTER)
            && self.read_to.is_some_and(|read_to| read_to < up_to)
    }
}

/// Keeps main-timeline counts as the member's summaries, counted up to `up_to`. In room order,
/// so two syncs of one user never wait on each other's rows in a cycle; a summary is never
/// replaced by one counted to an earlier position.
async fn keep_summaries(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    rows: &[&CountedUnread],
    up_to: i64,
) -> QueryResult<()> {
    fn column<T>(rows: &[&CountedUnread], field: impl Fn(&CountedUnread) -> T) -> Vec<T> {
        rows.iter().map(|row| field(row)).collect()
    }
    super::cached_sql(
        "INSERT INTO unread_count_summaries AS s \
             (user_nid, room_nid, read_from, counted_to, redactions, notifications, highlights, \
              unread) \
         SELECT u.nid, x.room_nid, x.read_from, $2, x.redactions, x.notifications, \
                x.highlights, x.unread \
         FROM (SELECT nid FROM users WHERE user_id = $1 LIMIT 1) u \
         CROSS JOIN unnest($3::int4[], $4::int8[], $5::int8[], $6::int8[], $7::int8[], \
                           $8::int8[]) \
             AS x (room_nid, read_from, redactions, notifications, highlights, unread) \
         ORDER BY x.room_nid \
         ON CONFLICT (user_nid, room_nid) DO UPDATE \
         SET read_from = EXCLUDED.read_from, counted_to = EXCLUDED.counted_to, \
             redactions = EXCLUDED.redactions, notifications = EXCLUDED.notifications, \
             highlights = EXCLUDED.highlights, unread = EXCLUDED.unread \
         WHERE s.counted_to <= EXCLUDED.counted_to",
    )
    .bind::<Text, _>(user_id)
    .bind::<BigInt, _>(up_to)
    .bind::<Array<Integer>, _>(column(rows, |r| r.room_nid.unwrap_or_default()))
    .bind::<Array<BigInt>, _>(column(rows, |r| r.read_to.unwrap_or_default()))
    .bind::<Array<BigInt>, _>(column(rows, |r| r.redactions.unwrap_or_default()))
    .bind::<Array<BigInt>, _>(column(rows, |r| r.counts.notifications))
    .bind::<Array<BigInt>, _>(column(rows, |r| r.counts.highlights))
    .bind::<Array<BigInt>, _>(column(rows, |r| r.counts.unread))
    .execute(&mut conn)
    .await
    .map(drop)
}

/// Counts of the member's main-timeline push actions in room `m` after `after` up to `to`.
fn main_timeline_count(after: &str, to: &str) -> String {
    format!(
        "SELECT COUNT(*) AS actions, \
                COUNT(*) FILTER (WHERE a.notify) AS notifications, \
                COUNT(*) FILTER (WHERE a.highlight) AS highlights, \
                COUNT(*) FILTER (WHERE a.unread) AS unread \
         FROM event_push_actions a \
         WHERE a.user_nid = (SELECT nid FROM me) AND a.room_nid = m.room_nid \
           AND a.thread_id = '' AND a.stream_ordering > {after} AND a.stream_ordering <= {to}"
    )
}

// The summary's check is computed once per room behind `OFFSET 0`, and the rooms' starting
// points are materialised: otherwise PostgreSQL copies the check (and its membership lookup)
// into every expression that uses it, which doubled the statement's planning time.
const UNREAD_COUNTS_WITH: &str = r#"
    WITH me AS MATERIALIZED (SELECT u.nid FROM users u WHERE u.user_id = $1 LIMIT 1),
    read_up_to AS (
        SELECT q.room_id, r.nid AS room_nid, r.redactions,
               COALESCE((SELECT MAX(t.event_stream) FROM receipts t
                         WHERE t.room_id = q.room_id AND t.user_id = $1
                           AND t.thread_id = ''), 0) AS everything,
               COALESCE((SELECT MAX(t.event_stream) FROM receipts t
                         WHERE t.room_id = q.room_id AND t.user_id = $1
                           AND t.thread_id IN ('', 'main')), 0) AS main_timeline
        FROM unnest($2::TEXT[]) AS q (room_id)
        CROSS JOIN LATERAL (
            SELECT r.nid, r.redactions FROM rooms r WHERE r.room_id = q.room_id LIMIT 1
        ) r
    ),
    main_from AS MATERIALIZED (
        SELECT p.room_id, p.room_nid, p.redactions, p.main_timeline AS read_to,
               CASE WHEN k.holds THEN s.counted_to ELSE p.main_timeline END AS added_after,
               CASE WHEN k.holds THEN s.read_from END AS read_after,
               CASE WHEN k.holds THEN s.notifications ELSE 0 END AS notifications,
               CASE WHEN k.holds THEN s.highlights ELSE 0 END AS highlights,
               CASE WHEN k.holds THEN s.unread ELSE 0 END AS unread
        FROM read_up_to p
        LEFT JOIN LATERAL (
            SELECT s.* FROM unread_count_summaries s
            WHERE s.user_nid = (SELECT nid FROM me) AND s.room_nid = p.room_nid LIMIT 1
        ) s ON TRUE
        CROSS JOIN LATERAL (
            SELECT COALESCE(s.redactions = p.redactions AND s.read_from <= p.main_timeline
                            AND p.main_timeline < s.counted_to AND s.counted_to <= $3
                            AND s.counted_to >= (SELECT m.stream_ordering FROM room_memberships m
                                                 WHERE m.room_id = p.room_id AND m.user_id = $1),
                            FALSE) AS holds
            OFFSET 0
        ) k
    )
    SELECT m.room_id, '' AS thread_id,
           m.notifications + a.notifications - r.notifications AS notifications,
           m.highlights + a.highlights - r.highlights AS highlights,
           m.unread + a.unread - r.unread AS unread,
           m.room_nid, m.read_to, m.redactions, a.actions + r.actions AS actions_read
    FROM main_from m
    -- Added: what arrived after the summary (or the receipt). Taken off: what was read since
    -- the summary.
    CROSS JOIN LATERAL ({added}) a
    CROSS JOIN LATERAL ({read}) r
    UNION ALL
    SELECT p.room_id, a.thread_id,
           COUNT(*) FILTER (WHERE a.notify) AS notifications,
           COUNT(*) FILTER (WHERE a.highlight) AS highlights,
           COUNT(*) FILTER (WHERE a.unread) AS unread,
           NULL, NULL, NULL, NULL
    FROM read_up_to p
    CROSS JOIN LATERAL (
        SELECT a.thread_id, a.notify, a.highlight, a.unread
        FROM event_push_actions a
        WHERE a.user_nid = (SELECT nid FROM me)
          AND a.room_nid = p.room_nid AND a.thread_id <> ''
          AND a.stream_ordering > p.everything AND a.stream_ordering <= $3
          AND a.stream_ordering > COALESCE((SELECT MAX(t.event_stream) FROM receipts t
                                            WHERE t.room_id = p.room_id AND t.user_id = $1
                                              AND t.thread_id = a.thread_id), 0)
    ) a
    GROUP BY p.room_id, a.thread_id"#;

/// One entry of a user's notification history.
#[derive(Debug, Clone, QueryableByName)]
pub struct NotificationRow {
    /// Room.
    #[diesel(sql_type = Text)]
    pub room_id: String,
    /// Event.
    #[diesel(sql_type = Text)]
    pub event_id: String,
    /// Stream position (the pagination token).
    #[diesel(sql_type = BigInt)]
    pub stream_ordering: i64,
    /// Push rule actions.
    #[diesel(sql_type = Jsonb)]
    pub actions: Value,
    /// When the event was sent.
    #[diesel(sql_type = BigInt)]
    pub ts: i64,
    /// Whether the user has read it.
    #[diesel(sql_type = Bool)]
    pub read: bool,
}

/// A user's notifications, newest first, before stream position `before`. The page is taken
/// from the index first; each of its entries then looks up its room, event and read position
/// (one probe each, whatever the statistics say).
pub async fn get_notifications(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    before: i64,
    limit: i64,
    only_highlight: bool,
) -> QueryResult<Vec<NotificationRow>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT n.room_id, e.event_id, n.stream_ordering, n.actions, e.ts,
                    NOT ({AFTER_READ_POSITION}) AS read
             FROM (
                 SELECT (SELECT r.room_id FROM rooms r WHERE r.nid = a.room_nid) AS room_id,
                        a.stream_ordering, a.thread_id, {STORED_ACTIONS} AS actions
                 FROM event_push_actions a
                 WHERE a.user_nid = (SELECT u.nid FROM users u WHERE u.user_id = $1) AND a.notify
                   AND a.stream_ordering < $2 AND (a.highlight OR NOT $3)
                 ORDER BY a.stream_ordering DESC
                 LIMIT $4
             ) n
             CROSS JOIN LATERAL (
                 SELECT e.event_id, e.origin_server_ts AS ts FROM events e
                 WHERE e.stream_ordering = n.stream_ordering LIMIT 1
             ) e
             ORDER BY n.stream_ordering DESC"
        )
    });
    super::cached_sql(SQL.as_str())
        .bind::<Text, _>(user_id)
        .bind::<BigInt, _>(before)
        .bind::<Bool, _>(only_highlight)
        .bind::<BigInt, _>(limit)
        .load(&mut conn)
        .await
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_global_room_id_written_into_the_members_read_is_the_global_one() {
        // `get_joined_members_with_account_data` writes it as `''` for its partial index.
        assert_eq!(super::super::account_data::GLOBAL, "");
    }
}
