//! Read receipts (`m.read`, `m.read.private`) and read markers (`m.fully_read`).

use diesel_async::AsyncPgConnection;
use futures_util::TryFutureExt;
use ruma::{RoomId, UserId};
use serde_json::json;

use super::{visibility::Visibility, Rooms};
use crate::{
    error::{Error, Result},
    service::notifier::{ROOM_CHANNEL, USER_CHANNEL},
    storage::{
        account_data, memberships, now_ms,
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

/// A receipt a client sets: its type, the event read up to, and its thread (`None`
/// unthreaded, `main`, or a thread root's event ID).
#[derive(Debug, Clone, Copy)]
pub struct Receipt<'a> {
    /// `m.read` or `m.read.private`.
    pub receipt_type: &'a str,
    /// The event read up to.
    pub event_id: &'a str,
    /// The thread, as the client named it.
    pub thread_id: Option<&'a str>,
}

impl Rooms {
    /// Records that the user read up to an event. A receipt for an earlier event than the
    /// current one changes nothing; private receipts only ever reach the user's own devices.
    pub async fn set_receipt(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        receipt: Receipt<'_>,
    ) -> Result<()> {
        self.set_read_markers(user_id, room_id, None, &[receipt])
            .await
    }

    /// Sets the `m.fully_read` marker (room account data).
    pub async fn set_fully_read(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        event_id: &str,
    ) -> Result<()> {
        self.set_read_markers(user_id, room_id, Some(event_id), &[])
            .await
    }

    /// Moves the fully-read marker (when given) and receipts at once, as `/read_markers` asks:
    /// every event is checked first, then everything is written in one transaction, so a
    /// request that fails changes nothing. Element sends the marker and a receipt at the same
    /// event each time its user reads on; the event is looked up once.
    pub async fn set_read_markers(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        fully_read: Option<&str>,
        receipts: &[Receipt<'_>],
    ) -> Result<()> {
        let mut stored = Vec::with_capacity(receipts.len());
        for receipt in receipts {
            stored.push((receipt, thread_key(receipt)?));
        }
        let mut event_ids: Vec<&str> = receipts.iter().map(|r| r.event_id).collect();
        event_ids.extend(fully_read);
        event_ids.sort_unstable();
        event_ids.dedup();
        let mut conn = self.db.conn().await?;
        let (membership, events) = tokio::try_join!(
            memberships::get_membership_position(&conn, room_id.as_str(), user_id.as_str()),
            futures_util::future::try_join_all(
                event_ids.iter().map(|id| rooms::get_event(&conn, id))
            ),
        )?;
        let Some((membership, since)) = membership.filter(|(m, _)| m == "join") else {
            return Err(Error::forbidden("You are not in this room"));
        };
        let mut positions = std::collections::HashMap::new();
        let mut visibility = Visibility::new(user_id);
        visibility.know_membership(room_id.as_str(), &membership, since);
        for (id, event) in event_ids.iter().zip(events) {
            let event = event
                .filter(|e| e.room_id == room_id.as_str())
                .ok_or_else(|| Error::not_found("Event not found"))?;
            // A receipt says the user saw the event; the fully-read marker is their own.
            let receipted = receipts.iter().any(|r| r.event_id == *id);
            if receipted && !visibility.can_see(&conn, &event).await? {
                return Err(Error::not_found("Event not found"));
            }
            positions.insert(*id, event.stream_ordering);
        }
        let ts = now_ms();
        // The marker and the receipts go out together, in one pipeline on the connection.
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            let marker = async {
                let Some(event_id) = fully_read else {
                    return Ok(());
                };
                let content = json!({ "event_id": event_id });
                account_data::set_account_data(
                    conn,
                    user_id.as_str(),
                    room_id.as_str(),
                    "m.fully_read",
                    &content,
                )
                .await?;
                rooms::notify(conn, USER_CHANNEL, user_id.as_str()).await?;
                Ok::<_, Error>(())
            };
            let receipts = async {
                for (receipt, thread) in &stored {
                    let new = NewReceipt {
                        room_id: room_id.as_str(),
                        user_id: user_id.as_str(),
                        receipt_type: receipt.receipt_type,
                        thread_id: thread,
                        event_id: receipt.event_id,
                        event_stream: positions[receipt.event_id],
                        ts,
                    };
                    self.store_receipt(conn, user_id, &new).await?;
                }
                Ok(())
            };
            tokio::try_join!(marker, receipts).map(drop)
        })
        .await
    }

    /// Stores a receipt inside the caller's transaction and announces it when it moved: a
    /// public one to the room's syncs and the other servers in the room, a private one to the
    /// user's own syncs.
    async fn store_receipt(
        &self,
        conn: &AsyncPgConnection,
        user_id: &UserId,
        receipt: &NewReceipt<'_>,
    ) -> Result<()> {
        let public = receipt.receipt_type == "m.read";
        // Where a public receipt goes is read beside the write, in its round trip.
        let (moved, destinations) = tokio::try_join!(
            store::set_receipt(conn, receipt).map_err(Error::from),
            async {
                match public {
                    true => {
                        self.federation
                            .room_destinations(conn, receipt.room_id, user_id)
                            .await
                    }
                    false => Ok(Default::default()),
                }
            }
        )?;
        if !moved {
            return Ok(());
        }
        if public {
            self.federation
                .queue_read_receipt(conn, &destinations, receipt)
                .await?;
            rooms::notify(conn, ROOM_CHANNEL, receipt.room_id).await?;
        } else {
            rooms::notify(conn, USER_CHANNEL, receipt.user_id).await?;
        }
        Ok(())
    }
}

/// The receipt's type checked, and its thread as stored (`""` when unthreaded).
fn thread_key<'a>(receipt: &Receipt<'a>) -> Result<&'a str> {
    if !RECEIPT_TYPES.contains(&receipt.receipt_type) {
        return Err(Error::invalid_param(format!(
            "Unknown receipt type {}",
            receipt.receipt_type
        )));
    }
    match receipt.thread_id {
        None => Ok(""),
        Some("main") => Ok("main"),
        Some(root) if root.starts_with('$') => Ok(root),
        Some(_) => Err(Error::invalid_param(
            "thread_id must be \"main\" or an event ID",
        )),
    }
}
