//! To-device messages for the devices of an appservice's users, in its transactions under
//! `de.sorunome.msc2409.to_device` (MSC2409, since split off as MSC4203; Synapse keeps the
//! old key), each with `to_user_id` and `to_device_id` added. Sent when the registration asks
//! for ephemeral events (`receive_ephemeral` or `de.sorunome.msc2409.push_ephemeral`), as
//! Synapse does.
//!
//! As in Synapse, the appservice gets a copy: the messages stay in the devices' inboxes for
//! `/sync`. Unlike typing and receipts they follow a durable cursor committed with the
//! transaction, so each is sent once, and those that arrive while the appservice is failing
//! go when it is back (bridges need every room key). One that a device has already fetched
//! with `/sync`, and so deleted, before the cursor reaches it is not sent.

use std::collections::BTreeSet;

use diesel_async::AsyncPgConnection;
use serde_json::{json, Value};

use super::Registration;
use crate::{error::Result, storage::appservice as store};

/// Most to-device messages in one transaction (Synapse's limit). One request's messages are
/// never split, so a transaction may hold more when a single request brings more.
pub const MAX_TO_DEVICE: usize = 100;
/// Inbox rows read per pass (most may be for other users).
const SCAN: i64 = 500;

/// The to-device messages of one transaction.
pub struct ToDeviceBatch {
    /// The messages, in stream order.
    pub messages: Vec<Value>,
    /// Their recipients.
    pub recipients: BTreeSet<String>,
    /// The stream position the cursor moves to.
    pub reached: i64,
}

impl ToDeviceBatch {
    /// Nothing to send; the cursor moves to `reached`.
    pub fn none(reached: i64) -> Self {
        ToDeviceBatch {
            messages: Vec::new(),
            recipients: BTreeSet::new(),
            reached,
        }
    }
}

/// The next to-device messages in `(after, up_to]` for the devices of `registration`'s users,
/// whole stream positions only (all the messages of one request, or none of them).
pub async fn collect(
    conn: &AsyncPgConnection,
    registration: &Registration,
    after: i64,
    up_to: i64,
) -> Result<ToDeviceBatch> {
    if up_to <= after {
        return Ok(ToDeviceBatch::none(after));
    }
    let mut rows = store::get_to_device_between(conn, after, up_to, SCAN).await?;
    let mut reached = up_to;
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        let (first, last) = (first.stream_ordering, last.stream_ordering);
        if rows.len() == SCAN as usize {
            if first == last {
                // One request to more devices than a scan: read it whole.
                rows = store::get_to_device_between(conn, last - 1, last, i64::MAX).await?;
                reached = last;
            } else {
                // The last position may be cut short: it comes with the next pass.
                rows.retain(|row| row.stream_ordering < last);
                reached = last - 1;
            }
        }
    }
    let mut batch = ToDeviceBatch::none(reached);
    let mut current = None;
    for row in rows
        .into_iter()
        .filter(|row| registration.is_interested_in_user(&row.user_id))
    {
        if batch.messages.len() >= MAX_TO_DEVICE && current != Some(row.stream_ordering) {
            // Everything up to the last position taken is in, or of no interest.
            batch.reached = current.unwrap_or(after);
            break;
        }
        current = Some(row.stream_ordering);
        batch.messages.push(json!({
            "to_user_id": row.user_id,
            "to_device_id": row.device_id,
            "type": row.event_type,
            "sender": row.sender,
            "content": row.content,
        }));
        batch.recipients.insert(row.user_id);
    }
    Ok(batch)
}
