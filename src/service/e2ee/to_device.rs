//! `sendToDevice` and the per-device inboxes `/sync` delivers from.

use std::{collections::BTreeMap, sync::Arc};

use diesel_async::AsyncPgConnection;
use rand::{distr::Alphanumeric, Rng};
use ruma::{OwnedServerName, ServerName, UserId};
use serde_json::{json, Map, Value};

use crate::{
    error::Result,
    service::{federation::sender::Sender, notifier::USER_CHANNEL},
    storage::{devices, now_ms, rooms::notify, to_device as store, Db},
};

/// Messages a sync delivers at most; the rest come with the next sync.
pub const SYNC_LIMIT: i64 = 100;

/// The federation EDU that carries to-device messages.
pub const DIRECT_TO_DEVICE: &str = "m.direct_to_device";

/// The to-device service.
pub struct ToDevice {
    db: Db,
    server_name: OwnedServerName,
    federation: Arc<Sender>,
}

impl ToDevice {
    /// Creates the service; messages for other servers' users are queued on `federation`.
    pub fn new(db: Db, server_name: OwnedServerName, federation: Arc<Sender>) -> Self {
        ToDevice {
            db,
            server_name,
            federation,
        }
    }

    /// `PUT /sendToDevice/{eventType}/{txnId}`: `messages` is user -> device (or `*`) ->
    /// content; a device named as well as covered by `*` gets only its own message.
    /// Idempotent per sending device and `txnId`. Unknown local devices are skipped.
    ///
    /// Messages for other servers' users are queued as one `m.direct_to_device` EDU per
    /// server, in the same transaction as the local deliveries and the `txnId` record, so a
    /// retried request queues nothing twice and a queued message survives restarts. They are
    /// dropped when that server may not be contacted (federation off, not allowed).
    pub async fn send(
        &self,
        sender: &UserId,
        sender_device: &str,
        event_type: &str,
        txn_id: &str,
        messages: &Map<String, Value>,
    ) -> Result<()> {
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            if !store::record_txn(conn, sender.as_str(), sender_device, txn_id, now_ms()).await? {
                return Ok(());
            }
            deliver_local(
                conn,
                &self.server_name,
                sender.as_str(),
                event_type,
                messages,
            )
            .await?;
            let mut remote: BTreeMap<OwnedServerName, Map<String, Value>> = BTreeMap::new();
            for (user, per_device) in messages {
                let Ok(user_id) = UserId::parse(user.as_str()) else {
                    continue;
                };
                if user_id.server_name() != self.server_name {
                    remote
                        .entry(user_id.server_name().to_owned())
                        .or_default()
                        .insert(user.clone(), per_device.clone());
                }
            }
            for (destination, messages) in remote {
                let content = json!({
                    "sender": sender,
                    "type": event_type,
                    "message_id": new_message_id(),
                    "messages": messages,
                });
                self.federation
                    .queue_edu(conn, &destination, DIRECT_TO_DEVICE, &content)
                    .await?;
            }
            Ok(())
        })
        .await
    }
}

/// Delivers `messages` (user -> device or `*` -> content) from `sender` to this server's
/// users' devices, inside the caller's transaction; other servers' users, unknown devices and
/// malformed entries are skipped. A device named as well as covered by `*` gets only its own
/// message. Wakes the recipients' syncs at commit.
pub async fn deliver_local(
    conn: &AsyncPgConnection,
    server_name: &ServerName,
    sender: &str,
    event_type: &str,
    messages: &Map<String, Value>,
) -> Result<usize> {
    let mut deliveries = Vec::new();
    for (user, per_device) in messages {
        let is_local =
            UserId::parse(user.as_str()).is_ok_and(|user| user.server_name() == server_name);
        let (true, Some(per_device)) = (is_local, per_device.as_object()) else {
            continue;
        };
        let known = devices::get_device_ids(conn, user).await?;
        // One message per device: one addressed to the device itself wins over `*`.
        let mut for_user: BTreeMap<&String, &Value> = BTreeMap::new();
        for (device, content) in per_device {
            if device == "*" {
                for target in &known {
                    for_user.entry(target).or_insert(content);
                }
            } else if let Some(target) = known.iter().find(|d| *d == device) {
                for_user.insert(target, content);
            }
        }
        for (target, content) in for_user {
            deliveries.push((user.clone(), target.clone(), content.clone()));
        }
    }
    store::deliver(conn, sender, event_type, &deliveries).await?;
    let mut users: Vec<&String> = deliveries.iter().map(|(u, _, _)| u).collect();
    users.dedup();
    for user in users {
        notify(conn, USER_CHANNEL, user).await?;
    }
    Ok(deliveries.len())
}

/// A unique `message_id` for an outgoing `m.direct_to_device` EDU.
fn new_message_id() -> String {
    rand::rng()
        .sample_iter(Alphanumeric)
        .take(24)
        .map(char::from)
        .collect()
}

/// A device's to-device events for a sync from `since` (its previous token's position) up to
/// `up_to`. Whatever the device had up to `since` was received, so it is deleted now; the rest
/// stays until a later token shows it arrived. Returns the events and the position the next
/// token may claim (short of `up_to` when more are waiting).
pub async fn take_for_sync(
    conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    since: i64,
    up_to: i64,
) -> Result<(Vec<Value>, i64)> {
    take_up_to(conn, (user_id, device_id), (since, up_to), SYNC_LIMIT).await
}

/// [`take_for_sync`] with at most `limit` events (sliding sync's `to_device.limit`).
pub async fn take_up_to(
    conn: &AsyncPgConnection,
    (user_id, device_id): (&str, &str),
    (since, up_to): (i64, i64),
    limit: i64,
) -> Result<(Vec<Value>, i64)> {
    let limit = limit.clamp(1, SYNC_LIMIT);
    if since > 0 {
        store::delete_inbox_up_to(conn, user_id, device_id, since).await?;
    }
    let rows = store::get_inbox(conn, user_id, device_id, since, up_to, limit).await?;
    let reached = match rows.last() {
        Some(last) if rows.len() as i64 == limit => last.stream_ordering,
        _ => up_to,
    };
    let events = rows
        .into_iter()
        .map(|row| json!({ "sender": row.sender, "type": row.event_type, "content": row.content }))
        .collect();
    Ok((events, reached))
}
