//! Each user's current membership of each room (`room_memberships`), kept in step with the
//! room's current state on every path that moves it: a local event (the writer), another
//! server's event (incoming), and the state a join through another server brings.

use diesel::QueryResult;
use diesel_async::AsyncPgConnection;
use ruma::{ServerName, UserId};
use serde_json::Value;

use crate::storage::{memberships as store, now_ms, push as push_store, remote_devices};

/// Records the member event `event_id` (with `content`) as `user`'s membership of `room`: its
/// `membership` (`leave` when unreadable) and display name. A user no longer joined loses
/// their unread counts there; a user of another server who joins has their cached device list
/// marked stale (their server told us of no changes while we shared no room). One pipeline.
pub(super) async fn record_member_event(
    conn: &AsyncPgConnection,
    server_name: &ServerName,
    room: &str,
    user: &str,
    content: &Value,
    event_id: &str,
) -> QueryResult<()> {
    let membership = content
        .get("membership")
        .and_then(Value::as_str)
        .unwrap_or("leave");
    let display_name = content.get("displayname").and_then(Value::as_str);
    let joined = membership == "join";
    tokio::try_join!(
        store::set_membership(conn, room, user, membership, display_name, event_id),
        async {
            match joined {
                false => push_store::delete_for_user_room(conn, user, room).await,
                true => Ok(()),
            }
        },
        async {
            match joined && !is_local(user, server_name) {
                true => remote_devices::mark_stale(conn, user, now_ms()).await,
                false => Ok(()),
            }
        },
    )
    .map(drop)
}

/// Whether a user ID is of this server.
pub(super) fn is_local(user_id: &str, server_name: &ServerName) -> bool {
    UserId::parse(user_id).is_ok_and(|user| user.server_name() == server_name)
}
