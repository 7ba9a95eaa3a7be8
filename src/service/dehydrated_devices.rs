//! Dehydrated devices (MSC3814): a device a client stores on the server, encrypted with a key
//! only the user holds, that receives to-device messages (room keys) while none of the user's
//! real devices is running; a new client picks it up and reads what arrived for it.
//!
//! The dehydrated device is an ordinary row in `devices` (so senders find its keys and its
//! to-device inbox fills like any other) marked in `dehydrated_devices`, at most one per user:
//! storing a new one deletes the old one, with its keys and inbox.

use std::sync::Arc;

use ruma::UserId;
use serde_json::{json, Value};

use super::{
    e2ee::{
        keys::{Keys, Upload},
        local_devices_changed,
        to_device::take_for_sync,
    },
    federation::sender::Sender,
};
use crate::{
    error::{Error, Result},
    storage::{dehydrated_devices as store, devices, now_ms, streams, to_device::TO_DEVICE, Db},
};

/// What `PUT /dehydrated_device` stores.
pub struct NewDehydratedDevice {
    /// The device ID the client chose.
    pub device_id: String,
    /// The client's opaque data (`algorithm` and whatever it needs to rehydrate).
    pub device_data: Value,
    /// Display name for the device.
    pub display_name: Option<String>,
    /// Keys uploaded for the device, as `/keys/upload` takes them.
    pub keys: Upload,
}

/// Messages for a dehydrated device, and the token for the next batch.
pub struct DehydratedEvents {
    /// `{sender, type, content}` to-device events.
    pub events: Vec<Value>,
    /// `d<position>`: pass it back as `next_batch`/`from` to acknowledge these.
    pub next_batch: String,
    /// Whether more are waiting beyond this batch.
    pub limited: bool,
}

/// Dehydrated devices.
pub struct DehydratedDevices {
    db: Db,
    federation: Arc<Sender>,
}

impl DehydratedDevices {
    /// Creates the service.
    pub fn new(db: Db, federation: Arc<Sender>) -> Self {
        DehydratedDevices { db, federation }
    }

    /// The user's dehydrated device: `{device_id, device_data}`.
    pub async fn get(&self, user_id: &UserId) -> Result<(String, Value)> {
        let conn = self.db.conn().await?;
        store::get(&conn, user_id.as_str()).await?.ok_or_else(none)
    }

    /// Stores a new dehydrated device with its keys, replacing (deleting) the old one.
    pub async fn put(&self, keys: &Keys, user_id: &UserId, new: NewDehydratedDevice) -> Result<()> {
        if new
            .device_data
            .get("algorithm")
            .and_then(Value::as_str)
            .is_none()
        {
            return Err(Error::bad_json("device_data.algorithm must be a string"));
        }
        if new.keys.device_keys.is_none() {
            return Err(Error::bad_json(
                "Device key(s) not found, these must be provided.",
            ));
        }
        let user = user_id.as_str();
        let device_id = new.device_id.as_str();
        let conn = self.db.conn().await?;
        let old = store::get(&conn, user).await?.map(|(id, _)| id);
        let existing = devices::get_device(&conn, user, device_id).await?;
        if existing.is_some() && old.as_deref() != Some(device_id) {
            return Err(Error::invalid_param(
                "A device with this ID exists and is not the dehydrated device",
            ));
        }
        devices::upsert_device(
            &conn,
            user,
            device_id,
            new.display_name.as_deref(),
            now_ms(),
        )
        .await?;
        drop(conn);
        if let Err(err) = keys.upload(user_id, device_id, new.keys).await {
            if existing.is_none() {
                let conn = self.db.conn().await?;
                devices::delete_devices(&conn, user, &[device_id.to_owned()]).await?;
            }
            return Err(err);
        }
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            store::set(conn, user, device_id, &new.device_data, now_ms()).await?;
            if let Some(old) = old.filter(|old| old != device_id) {
                let old = [old];
                devices::delete_devices(conn, user, &old).await?;
                local_devices_changed(conn, &self.federation, user_id, &old).await?;
            }
            Ok(())
        })
        .await
    }

    /// Deletes the user's dehydrated device; returns its ID.
    pub async fn delete(&self, user_id: &UserId) -> Result<String> {
        let user = user_id.as_str();
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            let device_id = store::delete(conn, user).await?.ok_or_else(none)?;
            let deleted = [device_id.clone()];
            devices::delete_devices(conn, user, &deleted).await?;
            local_devices_changed(conn, &self.federation, user_id, &deleted).await?;
            Ok(device_id)
        })
        .await
    }

    /// The to-device messages of the user's dehydrated device after `from` (a `d<position>`
    /// token from an earlier batch; what it covers is acknowledged and deleted).
    pub async fn events(
        &self,
        user_id: &UserId,
        device_id: &str,
        from: Option<&str>,
    ) -> Result<DehydratedEvents> {
        let since = match from {
            None => 0,
            Some(token) => token
                .strip_prefix('d')
                .and_then(|n| n.parse::<i64>().ok())
                .filter(|n| *n >= 0)
                .ok_or_else(|| {
                    Error::invalid_param(format!("from parameter {token:?} has an invalid format"))
                })?,
        };
        let user = user_id.as_str();
        let conn = self.db.conn().await?;
        match store::get(&conn, user).await? {
            None => return Err(Error::forbidden("No dehydrated device exists")),
            Some((id, _)) if id != device_id => {
                return Err(Error::forbidden(
                    "You may only fetch messages for your dehydrated device",
                ))
            }
            Some(_) => {}
        }
        let up_to = streams::persisted(&conn, TO_DEVICE).await?;
        let (events, reached) = take_for_sync(&conn, user, device_id, since, up_to).await?;
        Ok(DehydratedEvents {
            events,
            next_batch: format!("d{}", reached.max(since)),
            limited: reached < up_to,
        })
    }
}

fn none() -> Error {
    Error::not_found("No dehydrated device available")
}

/// The `GET /dehydrated_device` answer.
pub fn describe(device_id: &str, device_data: &Value) -> Value {
    json!({ "device_id": device_id, "device_data": device_data })
}
