//! Pushers: where to send a user's push notifications, and how far each has got.

use std::sync::LazyLock;

use diesel::{
    prelude::*,
    sql_types::{BigInt, Jsonb, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::{event_push_actions, pushers, users};

/// A stored pusher.
#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = pushers)]
pub struct PusherRow {
    /// Owner.
    pub user_id: String,
    /// Application.
    pub app_id: String,
    /// The device's push key.
    pub pushkey: String,
    /// `http`.
    pub kind: String,
    /// Shown to the user.
    pub app_display_name: String,
    /// Shown to the user.
    pub device_display_name: String,
    /// Rule set selector.
    pub profile_tag: Option<String>,
    /// Language of notifications.
    pub lang: String,
    /// `url`, `format` and whatever else the client put there.
    pub data: Value,
    /// The device whose access token created it.
    pub device_id: Option<String>,
    /// When it was created.
    pub created_ts: i64,
    /// Notifications up to this stream position are done.
    pub last_stream_ordering: i64,
}

/// Adds or replaces a pusher (its progress is kept on replacement).
pub async fn upsert_pusher(mut conn: &AsyncPgConnection, pusher: &PusherRow) -> QueryResult<()> {
    diesel::insert_into(pushers::table)
        .values(pusher)
        .on_conflict((pushers::user_id, pushers::app_id, pushers::pushkey))
        .do_update()
        .set((
            pushers::kind.eq(&pusher.kind),
            pushers::app_display_name.eq(&pusher.app_display_name),
            pushers::device_display_name.eq(&pusher.device_display_name),
            pushers::profile_tag.eq(&pusher.profile_tag),
            pushers::lang.eq(&pusher.lang),
            pushers::data.eq(&pusher.data),
            pushers::device_id.eq(&pusher.device_id),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Removes a user's pusher; returns whether it existed.
pub async fn delete_pusher(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    app_id: &str,
    pushkey: &str,
) -> QueryResult<bool> {
    diesel::delete(pushers::table.find((user_id, app_id, pushkey)))
        .execute(&mut conn)
        .await
        .map(|n| n > 0)
}

/// Removes other users' pushers with this app ID and push key (a device changing hands).
pub async fn delete_pushers_of_others(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    app_id: &str,
    pushkey: &str,
) -> QueryResult<()> {
    diesel::delete(
        pushers::table
            .filter(pushers::app_id.eq(app_id))
            .filter(pushers::pushkey.eq(pushkey))
            .filter(pushers::user_id.ne(user_id)),
    )
    .execute(&mut conn)
    .await
    .map(drop)
}

/// Removes the pushers a device created (it logged out or was deleted).
pub async fn delete_pushers_of_device(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
) -> QueryResult<()> {
    diesel::delete(
        pushers::table
            .filter(pushers::user_id.eq(user_id))
            .filter(pushers::device_id.eq(device_id)),
    )
    .execute(&mut conn)
    .await
    .map(drop)
}

/// A user's pushers.
pub async fn get_pushers_of_user(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<Vec<PusherRow>> {
    pushers::table
        .filter(pushers::user_id.eq(user_id))
        .order(pushers::created_ts)
        .select(PusherRow::as_select())
        .load(&mut conn)
        .await
}

/// How many pushers a user has besides the one with this app ID and push key.
pub async fn count_other_pushers(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    app_id: &str,
    pushkey: &str,
) -> QueryResult<i64> {
    pushers::table
        .filter(pushers::user_id.eq(user_id))
        .filter(pushers::app_id.ne(app_id).or(pushers::pushkey.ne(pushkey)))
        .count()
        .get_result(&mut conn)
        .await
}

/// Every pusher on the server.
pub async fn get_all_pushers(mut conn: &AsyncPgConnection) -> QueryResult<Vec<PusherRow>> {
    pushers::table
        .select(PusherRow::as_select())
        .load(&mut conn)
        .await
}

/// Records that a pusher is done up to a stream position.
pub async fn set_pusher_progress(
    mut conn: &AsyncPgConnection,
    pusher: &PusherRow,
    position: i64,
) -> QueryResult<()> {
    diesel::update(pushers::table.find((&pusher.user_id, &pusher.app_id, &pusher.pushkey)))
        .filter(pushers::last_stream_ordering.lt(position))
        .set(pushers::last_stream_ordering.eq(position))
        .execute(&mut conn)
        .await
        .map(drop)
}

#[derive(QueryableByName)]
struct PendingNotification {
    #[diesel(sql_type = Text)]
    room_id: String,
    #[diesel(sql_type = Text)]
    event_id: String,
    #[diesel(sql_type = BigInt)]
    stream_ordering: i64,
    #[diesel(sql_type = Jsonb)]
    actions: Value,
}

/// A user's notifying push actions after a stream position: `(room, event, stream, actions)`.
/// The batch is taken from the index of notifying actions first; each entry then looks up its
/// room and event (one probe each, whatever the statistics say).
pub async fn get_pending_notifications(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    after: i64,
    limit: i64,
) -> QueryResult<Vec<(String, String, i64, Value)>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT n.room_id, e.event_id, n.stream_ordering, n.actions
             FROM (
                 SELECT (SELECT r.room_id FROM rooms r WHERE r.nid = a.room_nid) AS room_id,
                        a.stream_ordering, {actions} AS actions
                 FROM event_push_actions a
                 WHERE a.user_nid = (SELECT u.nid FROM users u WHERE u.user_id = $1)
                   AND a.notify AND a.stream_ordering > $2
                 ORDER BY a.stream_ordering
                 LIMIT $3
             ) n
             CROSS JOIN LATERAL (
                 SELECT e.event_id FROM events e WHERE e.stream_ordering = n.stream_ordering LIMIT 1
             ) e
             ORDER BY n.stream_ordering",
            actions = super::push::STORED_ACTIONS
        )
    });
    let rows: Vec<PendingNotification> = super::cached_sql(SQL.as_str())
        .bind::<Text, _>(user_id)
        .bind::<BigInt, _>(after)
        .bind::<BigInt, _>(limit)
        .load(&mut conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|n| (n.room_id, n.event_id, n.stream_ordering, n.actions))
        .collect())
}

#[derive(QueryableByName)]
struct RoomRow {
    #[diesel(sql_type = Text)]
    room_id: String,
}

/// The badge a push carries: how many rooms have unread notifications (as Synapse counts).
/// The rooms a user has push actions in are found by skipping through the primary key (one
/// lookup per room), then each is counted from its read position on: the cost follows the
/// user's rooms and what is unread, not every notification they ever had.
pub async fn count_rooms_with_notifications(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<i64> {
    let rooms: Vec<RoomRow> = super::cached_sql(
        "WITH RECURSIVE member AS (SELECT nid FROM users WHERE user_id = $1),
         notified (room_nid) AS (
             (SELECT a.room_nid FROM event_push_actions a
              WHERE a.user_nid = (SELECT nid FROM member) ORDER BY a.room_nid LIMIT 1)
             UNION ALL
             SELECT (SELECT a.room_nid FROM event_push_actions a
                     WHERE a.user_nid = (SELECT nid FROM member) AND a.room_nid > n.room_nid
                     ORDER BY a.room_nid LIMIT 1)
             FROM notified n WHERE n.room_nid IS NOT NULL
         )
         SELECT (SELECT r.room_id FROM rooms r WHERE r.nid = n.room_nid) AS room_id
         FROM notified n WHERE n.room_nid IS NOT NULL",
    )
    .bind::<Text, _>(user_id)
    .load(&mut conn)
    .await?;
    let rooms: Vec<String> = rooms.into_iter().map(|row| row.room_id).collect();
    let counts = super::push::get_unread_counts(conn, user_id, &rooms, i64::MAX).await?;
    let notifying: std::collections::HashSet<&str> = counts
        .iter()
        .filter(|count| count.notifications > 0)
        .map(|count| count.room_id.as_str())
        .collect();
    Ok(notifying.len() as i64)
}

/// Pushers with notifications after their progress mark.
pub async fn get_pushers_with_pending(mut conn: &AsyncPgConnection) -> QueryResult<Vec<PusherRow>> {
    let pusher_user = users::table
        .filter(users::user_id.eq(pushers::user_id))
        .select(users::nid);
    let pending = event_push_actions::table
        .filter(event_push_actions::user_nid.eq_any(pusher_user))
        // The column itself, not a comparison with a bound `true`: the partial index on
        // notifying actions then serves a plan made once instead of one per call.
        .filter(event_push_actions::notify)
        .filter(event_push_actions::stream_ordering.gt(pushers::last_stream_ordering));
    pushers::table
        .filter(diesel::dsl::exists(pending))
        .select(PusherRow::as_select())
        .load(&mut conn)
        .await
}

/// A member's display name in a room and the room's name, for a push's text.
pub async fn get_push_names(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    sender: &str,
) -> QueryResult<(Option<String>, Option<String>)> {
    use super::schema::{events, room_current_state, room_memberships};
    let sender_name: Option<Option<String>> = room_memberships::table
        .find((room_id, sender))
        .select(room_memberships::display_name)
        .first(&mut conn)
        .await
        .optional()?;
    let room_name: Option<Value> = room_current_state::table
        .inner_join(events::table.on(events::event_id.eq(room_current_state::event_id)))
        .filter(room_current_state::room_id.eq(room_id))
        .filter(room_current_state::event_type.eq("m.room.name"))
        .filter(room_current_state::state_key.eq(""))
        .select(events::pdu)
        .first(&mut conn)
        .await
        .optional()?;
    Ok((
        sender_name.flatten(),
        room_name
            .and_then(|pdu| {
                pdu.pointer("/content/name")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .filter(|name| !name.is_empty()),
    ))
}
