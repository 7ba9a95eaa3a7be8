//! `sendToDevice` and the per-device inboxes `/sync` delivers from.

use std::collections::BTreeMap;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use ruma::{OwnedServerName, UserId};
use serde_json::{json, Value};

use crate::{
    error::{Error, Result},
    service::notifier::USER_CHANNEL,
    storage::{devices, now_ms, rooms::notify, to_device as store, Db},
};

/// Messages a sync delivers at most; the rest come with the next sync.
pub const SYNC_LIMIT: i64 = 100;

/// The to-device service.
pub struct ToDevice {
    db: Db,
    server_name: OwnedServerName,
}

impl ToDevice {
    /// Creates the service.
    pub fn new(db: Db, server_name: OwnedServerName) -> Self {
        ToDevice { db, server_name }
    }

    /// `PUT /sendToDevice/{eventType}/{txnId}`: `messages` is user -> device (or `*`) ->
    /// content; a device named as well as covered by `*` gets only its own message.
    /// Idempotent per sending device and `txnId`. Messages for remote users are
    /// dropped (no federation yet); unknown local devices are skipped.
    pub async fn send(
        &self,
        sender: &UserId,
        sender_device: &str,
        event_type: &str,
        txn_id: &str,
        messages: &serde_json::Map<String, Value>,
    ) -> Result<()> {
        let mut conn = self.db.conn().await?;
        conn.transaction::<_, Error, _>(async |conn| {
            if !store::record_txn(conn, sender.as_str(), sender_device, txn_id, now_ms()).await? {
                return Ok(());
            }
            let mut deliveries = Vec::new();
            for (user, per_device) in messages {
                let is_local = UserId::parse(user.as_str())
                    .is_ok_and(|user| user.server_name() == self.server_name);
                if !is_local {
                    continue;
                }
                let Some(per_device) = per_device.as_object() else {
                    return Err(Error::bad_json("messages must map users to devices"));
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
            store::deliver(conn, sender.as_str(), event_type, &deliveries).await?;
            let mut users: Vec<&String> = deliveries.iter().map(|(u, _, _)| u).collect();
            users.dedup();
            for user in users {
                notify(conn, USER_CHANNEL, user).await?;
            }
            Ok(())
        })
        .await
    }
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
    if since > 0 {
        store::delete_inbox_up_to(conn, user_id, device_id, since).await?;
    }
    let rows = store::get_inbox(conn, user_id, device_id, since, up_to, SYNC_LIMIT).await?;
    let reached = match rows.last() {
        Some(last) if rows.len() as i64 == SYNC_LIMIT => last.stream_ordering,
        _ => up_to,
    };
    let events = rows
        .into_iter()
        .map(|row| json!({ "sender": row.sender, "type": row.event_type, "content": row.content }))
        .collect();
    Ok((events, reached))
}
