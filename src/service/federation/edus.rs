//! EDUs about rooms and users that go to other servers (FEDERATION.md §5 "EDUs"): typing and
//! receipts to the servers in the room, presence and device-list updates to the servers that
//! share a room with the user. Each is queued in the durable outbox inside the caller's
//! transaction ([`Sender::queue_edu`]), so it leaves only if the change commits.
//!
//! Never queued: private receipts (`m.read.private` never leaves the server), EDUs about
//! another server's user (only the user's own server speaks for them), anything when
//! federation is off.

use std::collections::BTreeSet;

use diesel_async::AsyncPgConnection;
use ruma::{OwnedServerName, UserId};
use serde_json::{json, Value};

use super::sender::Sender;
use crate::{
    error::Result,
    storage::{receipts::NewReceipt, room_servers},
};

/// A local user still typing has their typing sent again after this long (receivers forget
/// remote typing after 60 s, Synapse's, or 30 s, the shortest in use).
pub const TYPING_RENEW_AFTER: std::time::Duration = std::time::Duration::from_secs(20);

/// A user is typing (or stopped) in a room.
pub const TYPING: &str = "m.typing";
/// Read receipts of users in rooms.
pub const RECEIPT: &str = "m.receipt";
/// Presence of users.
pub const PRESENCE: &str = "m.presence";
/// A user's device changed.
pub const DEVICE_LIST_UPDATE: &str = "m.device_list_update";
/// A user's cross-signing keys changed.
pub const SIGNING_KEY_UPDATE: &str = "m.signing_key_update";

/// The servers of `users`, other than `ours`.
fn servers_of(users: &[String], ours: &OwnedServerName) -> BTreeSet<OwnedServerName> {
    users
        .iter()
        .filter_map(|user| UserId::parse(user.as_str()).ok())
        .map(|user| user.server_name().to_owned())
        .filter(|server| server != ours)
        .collect()
}

impl Sender {
    /// Whether EDUs go anywhere at all, and whether `user` is ours to speak for.
    fn speaks_for(&self, user: &UserId) -> bool {
        self.enabled() && user.server_name() == self.origin()
    }

    /// The servers a room's EDUs about `user` go to: every other server with a joined member
    /// in the room; none when federation is off or `user` is not ours.
    pub async fn room_destinations(
        &self,
        conn: &AsyncPgConnection,
        room_id: &str,
        user: &UserId,
    ) -> Result<BTreeSet<OwnedServerName>> {
        if !self.speaks_for(user) {
            return Ok(BTreeSet::new());
        }
        let joined = room_servers::get_one_joined_member_per_server(conn, room_id).await?;
        Ok(servers_of(&joined, self.origin()))
    }

    /// Queues an EDU for each of `destinations`.
    async fn queue_for(
        &self,
        conn: &AsyncPgConnection,
        destinations: &BTreeSet<OwnedServerName>,
        edu_type: &str,
        content: &Value,
    ) -> Result<()> {
        for server in destinations {
            self.queue_edu(conn, server, edu_type, content).await?;
        }
        Ok(())
    }

    /// Queues an EDU for every other server with a joined member in a room `user` is joined
    /// to.
    async fn queue_for_sharers(
        &self,
        conn: &AsyncPgConnection,
        user: &UserId,
        edu_type: &str,
        content: &Value,
    ) -> Result<()> {
        let sharing = room_servers::get_one_sharing_user_per_server(conn, user.as_str()).await?;
        for server in servers_of(&sharing, self.origin()) {
            self.queue_edu(conn, &server, edu_type, content).await?;
        }
        Ok(())
    }

    /// `m.typing` for a local user's typing start (`true`) or stop in a room.
    pub async fn queue_typing(
        &self,
        conn: &AsyncPgConnection,
        room_id: &str,
        user: &UserId,
        typing: bool,
    ) -> Result<()> {
        let destinations = self.room_destinations(conn, room_id, user).await?;
        let content = json!({ "room_id": room_id, "user_id": user, "typing": typing });
        self.queue_for(conn, &destinations, TYPING, &content).await
    }

    /// `m.receipt` for a local user's public read receipt (`m.read`) to the room's
    /// [`Self::room_destinations`], read beforehand. A threaded receipt's thread (`main` or
    /// the thread root) is carried in `data.thread_id`.
    pub async fn queue_read_receipt(
        &self,
        conn: &AsyncPgConnection,
        destinations: &BTreeSet<OwnedServerName>,
        receipt: &NewReceipt<'_>,
    ) -> Result<()> {
        if destinations.is_empty() {
            return Ok(());
        }
        let mut data = json!({ "ts": receipt.ts });
        if !receipt.thread_id.is_empty() {
            data["thread_id"] = Value::from(receipt.thread_id);
        }
        let content = json!({
            receipt.room_id: {
                "m.read": { receipt.user_id: { "event_ids": [receipt.event_id], "data": data } }
            }
        });
        self.queue_for(conn, destinations, RECEIPT, &content).await
    }

    /// `m.presence` for a local user: `presence` is the user's presence content as clients
    /// see it (`presence`, `last_active_ago`, `currently_active`, `status_msg`).
    pub async fn queue_presence(
        &self,
        conn: &AsyncPgConnection,
        user: &UserId,
        presence: &Value,
    ) -> Result<()> {
        if !self.speaks_for(user) {
            return Ok(());
        }
        let mut update = presence.clone();
        update["user_id"] = Value::from(user.as_str());
        let content = json!({ "push": [update] });
        self.queue_for_sharers(conn, user, PRESENCE, &content).await
    }

    /// `m.device_list_update` for a change of a local user's device: `stream_id` is the
    /// change's position in the device-list stream and `prev_id` the user's previous change
    /// (none: the receiver resyncs); `keys` are the device's current keys, `None` when it
    /// was deleted.
    #[allow(clippy::too_many_arguments)]
    pub async fn queue_device_list_update(
        &self,
        conn: &AsyncPgConnection,
        user: &UserId,
        device_id: &str,
        stream_id: i64,
        prev_id: Option<i64>,
        deleted: bool,
        keys: Option<&Value>,
        display_name: Option<&str>,
    ) -> Result<()> {
        if !self.speaks_for(user) {
            return Ok(());
        }
        let mut content = json!({
            "user_id": user,
            "device_id": device_id,
            "stream_id": stream_id,
            "prev_id": prev_id.into_iter().collect::<Vec<_>>(),
            "deleted": deleted,
        });
        if let Some(keys) = keys {
            content["keys"] = keys.clone();
        }
        if let Some(name) = display_name {
            content["device_display_name"] = Value::from(name);
        }
        self.queue_for_sharers(conn, user, DEVICE_LIST_UPDATE, &content)
            .await
    }
}

impl Sender {
    /// `m.signing_key_update` for a local user's new master and/or self-signing key (the
    /// user-signing key never leaves the server); nothing when neither changed.
    pub async fn queue_signing_key_update(
        &self,
        conn: &AsyncPgConnection,
        user: &UserId,
        master_key: Option<&Value>,
        self_signing_key: Option<&Value>,
    ) -> Result<()> {
        if !self.speaks_for(user) || (master_key.is_none() && self_signing_key.is_none()) {
            return Ok(());
        }
        let mut content = json!({ "user_id": user });
        if let Some(key) = master_key {
            content["master_key"] = key.clone();
        }
        if let Some(key) = self_signing_key {
            content["self_signing_key"] = key.clone();
        }
        self.queue_for_sharers(conn, user, SIGNING_KEY_UPDATE, &content)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_told_apart_by_their_full_name() {
        let ours = OwnedServerName::try_from("example.org:8448").unwrap();
        let users = [
            "@a:example.org:8448".to_owned(),
            "@b:example.org".to_owned(),
            "@c:other.net".to_owned(),
            "@c2:other.net".to_owned(),
            "garbage".to_owned(),
        ];
        let servers: Vec<String> = servers_of(&users, &ours)
            .into_iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(servers, ["example.org", "other.net"]);
    }
}
