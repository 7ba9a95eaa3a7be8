//! Per-device to-device inboxes.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::{
    schema::{to_device_inbox, to_device_txns},
    streams,
};

/// The to-device stream.
pub const TO_DEVICE: &str = "to_device";

/// A message waiting for a device.
#[derive(Debug, Clone, Queryable)]
pub struct InboxRow {
    /// Position (the device's sync token moves past it once delivered).
    pub stream_ordering: i64,
    /// Sender.
    pub sender: String,
    /// Event type.
    pub event_type: String,
    /// Content.
    pub content: Value,
}

/// Records a sender's transaction; false when it was recorded before (a retry).
pub async fn record_txn(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    txn_id: &str,
    now: i64,
) -> QueryResult<bool> {
    diesel::insert_into(to_device_txns::table)
        .values((
            to_device_txns::user_id.eq(user_id),
            to_device_txns::device_id.eq(device_id),
            to_device_txns::txn_id.eq(txn_id),
            to_device_txns::created_ts.eq(now),
        ))
        .on_conflict_do_nothing()
        .execute(&mut conn)
        .await
        .map(|n| n == 1)
}

/// Puts one message into the inboxes of the given `(user, device)`s at a new stream position.
pub async fn deliver(
    mut conn: &AsyncPgConnection,
    sender: &str,
    event_type: &str,
    messages: &[(String, String, Value)],
) -> QueryResult<()> {
    if messages.is_empty() {
        return Ok(());
    }
    let position = streams::next_position(conn, TO_DEVICE).await?;
    let rows: Vec<_> = messages
        .iter()
        .map(|(user_id, device_id, content)| {
            (
                to_device_inbox::user_id.eq(user_id),
                to_device_inbox::device_id.eq(device_id),
                to_device_inbox::stream_ordering.eq(position),
                to_device_inbox::sender.eq(sender),
                to_device_inbox::event_type.eq(event_type),
                to_device_inbox::content.eq(content),
            )
        })
        .collect();
    diesel::insert_into(to_device_inbox::table)
        .values(rows)
        .execute(&mut conn)
        .await
        .map(drop)
}

/// A device's messages in `(after, up_to]`, oldest first.
pub async fn get_inbox(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    after: i64,
    up_to: i64,
    limit: i64,
) -> QueryResult<Vec<InboxRow>> {
    to_device_inbox::table
        .filter(to_device_inbox::user_id.eq(user_id))
        .filter(to_device_inbox::device_id.eq(device_id))
        .filter(to_device_inbox::stream_ordering.gt(after))
        .filter(to_device_inbox::stream_ordering.le(up_to))
        .order(to_device_inbox::stream_ordering)
        .limit(limit)
        .select((
            to_device_inbox::stream_ordering,
            to_device_inbox::sender,
            to_device_inbox::event_type,
            to_device_inbox::content,
        ))
        .load(&mut conn)
        .await
}

/// Drops what a device has acknowledged (its sync token is past it).
pub async fn delete_inbox_up_to(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    up_to: i64,
) -> QueryResult<()> {
    diesel::delete(
        to_device_inbox::table
            .filter(to_device_inbox::user_id.eq(user_id))
            .filter(to_device_inbox::device_id.eq(device_id))
            .filter(to_device_inbox::stream_ordering.le(up_to)),
    )
    .execute(&mut conn)
    .await
    .map(drop)
}

/// Drops the inboxes of deleted devices.
pub async fn delete_inboxes(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_ids: &[String],
) -> QueryResult<()> {
    diesel::delete(
        to_device_inbox::table
            .filter(to_device_inbox::user_id.eq(user_id))
            .filter(to_device_inbox::device_id.eq_any(device_ids)),
    )
    .execute(&mut conn)
    .await
    .map(drop)
}
