//! Read receipts (`m.read`, `m.read.private`) and read markers (`m.fully_read`).

use diesel_async::AsyncConnection;
use ruma::{RoomId, UserId};
use serde_json::json;

use super::{visibility::Visibility, Rooms};
use crate::{
    error::{Error, Result},
    service::notifier::{ROOM_CHANNEL, USER_CHANNEL},
    storage::{
        account_data, now_ms,
        receipts::{self as store, NewReceipt},
        rooms,
    },
};

/// Receipt types clients may send.
pub const RECEIPT_TYPES: [&str; 2] = ["m.read", "m.read.private"];

/// `m.receipt` events per room for stored receipts; private receipts are left out unless they
/// are `viewer`'s own.
pub fn receipt_events(
    receipts: Vec<store::ReceiptRow>,
    viewer: Option<&str>,
) -> std::collections::HashMap<String, serde_json::Value> {
    let mut by_room = std::collections::HashMap::new();
    for receipt in receipts {
        if receipt.receipt_type != "m.read" && Some(receipt.user_id.as_str()) != viewer {
            continue;
        }
        let event = by_room
            .entry(receipt.room_id.clone())
            .or_insert_with(|| json!({ "type": "m.receipt", "content": {} }));
        let mut entry = json!({ "ts": receipt.ts });
        if !receipt.thread_id.is_empty() {
            entry["thread_id"] = serde_json::Value::from(receipt.thread_id.clone());
        }
        event["content"][&receipt.event_id][&receipt.receipt_type][&receipt.user_id] = entry;
    }
    by_room
}

impl Rooms {
    /// Records that the user read up to an event. A receipt for an earlier event than the
    /// current one changes nothing; private receipts only ever reach the user's own devices.
    pub async fn set_receipt(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        receipt_type: &str,
        event_id: &str,
        thread_id: Option<&str>,
    ) -> Result<()> {
        if !RECEIPT_TYPES.contains(&receipt_type) {
            return Err(Error::invalid_param(format!(
                "Unknown receipt type {receipt_type}"
            )));
        }
        let mut conn = self.db.conn().await?;
        if !self.is_joined(&conn, room_id, user_id).await? {
            return Err(Error::forbidden("You are not in this room"));
        }
        let event = rooms::get_event(&conn, event_id)
            .await?
            .filter(|e| e.room_id == room_id.as_str())
            .ok_or_else(|| Error::not_found("Event not found"))?;
        if !Visibility::new(user_id).can_see(&conn, &event).await? {
            return Err(Error::not_found("Event not found"));
        }
        let thread = match thread_id {
            None => "",
            Some("main") => "main",
            Some(root) if root.starts_with('$') => root,
            Some(_) => {
                return Err(Error::invalid_param(
                    "thread_id must be \"main\" or an event ID",
                ))
            }
        };
        let receipt = NewReceipt {
            room_id: room_id.as_str(),
            user_id: user_id.as_str(),
            receipt_type,
            thread_id: thread,
            event_id,
            event_stream: event.stream_ordering,
            ts: now_ms(),
        };
        conn.transaction::<_, Error, _>(async |conn| {
            if store::set_receipt(conn, &receipt).await? {
                let (channel, payload) = if receipt_type == "m.read" {
                    // Only public receipts go to the other servers in the room.
                    self.federation
                        .queue_read_receipt(
                            conn,
                            room_id.as_str(),
                            user_id,
                            event_id,
                            thread,
                            receipt.ts,
                        )
                        .await?;
                    (ROOM_CHANNEL, room_id.as_str())
                } else {
                    (USER_CHANNEL, user_id.as_str())
                };
                rooms::notify(conn, channel, payload).await?;
            }
            Ok(())
        })
        .await
    }

    /// Sets the `m.fully_read` marker (room account data).
    pub async fn set_fully_read(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        event_id: &str,
    ) -> Result<()> {
        let mut conn = self.db.conn().await?;
        if !self.is_joined(&conn, room_id, user_id).await? {
            return Err(Error::forbidden("You are not in this room"));
        }
        rooms::get_event(&conn, event_id)
            .await?
            .filter(|e| e.room_id == room_id.as_str())
            .ok_or_else(|| Error::not_found("Event not found"))?;
        let content = json!({ "event_id": event_id });
        conn.transaction::<_, Error, _>(async |conn| {
            account_data::set_account_data(
                conn,
                user_id.as_str(),
                room_id.as_str(),
                "m.fully_read",
                &content,
            )
            .await?;
            rooms::notify(conn, USER_CHANNEL, user_id.as_str()).await?;
            Ok(())
        })
        .await
    }
}
