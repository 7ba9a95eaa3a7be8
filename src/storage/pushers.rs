//! Pushers: where to send a user's push notifications, and how far each has got.

use diesel::{prelude::*, sql_types::Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::{event_push_actions, pushers};

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

/// A user's notifying push actions after a stream position: `(room, event, stream, actions)`.
pub async fn get_pending_notifications(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    after: i64,
    limit: i64,
) -> QueryResult<Vec<(String, String, i64, Value)>> {
    event_push_actions::table
        .filter(event_push_actions::user_id.eq(user_id))
        // The column itself, not a comparison with a bound `true`: the partial index on
        // notifying actions then serves a plan made once instead of one per call.
        .filter(event_push_actions::notify)
        .filter(event_push_actions::stream_ordering.gt(after))
        .order(event_push_actions::stream_ordering)
        .limit(limit)
        .select((
            event_push_actions::room_id,
            event_push_actions::event_id,
            event_push_actions::stream_ordering,
            event_push_actions::actions,
        ))
        .load(&mut conn)
        .await
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
        "WITH RECURSIVE rooms (room_id) AS (
             (SELECT room_id FROM event_push_actions WHERE user_id = $1
              ORDER BY room_id LIMIT 1)
             UNION ALL
             SELECT (SELECT a.room_id FROM event_push_actions a
                     WHERE a.user_id = $1 AND a.room_id > r.room_id
                     ORDER BY a.room_id LIMIT 1)
             FROM rooms r WHERE r.room_id IS NOT NULL
         )
         SELECT room_id FROM rooms WHERE room_id IS NOT NULL",
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
    let pending = event_push_actions::table
        .filter(event_push_actions::user_id.eq(pushers::user_id))
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
