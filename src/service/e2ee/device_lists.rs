//! The cache of other servers' users' device lists and cross-signing keys, and the EDUs that
//! keep it current.
//!
//! A cached list is only trusted while the user's server keeps it current for us, which it
//! does (with `m.device_list_update` EDUs) only while the user shares a room with one of ours.
//! So a client's `/keys/query` answers a remote user from the cache when the cached list is
//! not stale and the user shares a room with a local user, resyncs the list with
//! `GET /user/devices` when the user shares a room but the list is missing or stale, and
//! otherwise leaves the user to `user/keys/query` (`remote.rs`), as Synapse does for users it
//! shares no room with. An EDU applies when its `prev_id` chains from the cached `stream_id`;
//! otherwise the list is marked stale and resynced before its next use (synapse 5095: lists
//! drift when missed updates are not noticed).
//!
//! Federation 2 (rooms across servers) must mark a user's list stale when they start sharing
//! a room with us, since updates sent before then never reached us.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    time::Duration,
};

use futures_util::future::join_all;
use ruma::{
    api::federation::device::get_devices::v1 as get_devices, OwnedUserId, ServerName, UserId,
};
use serde_json::{Map, Value};

use super::{device_list_changed, keys::Keys};
use crate::{
    error::{Error, Result},
    service::federation::{client::MAX_JSON_RESPONSE, FederationError},
    storage::{
        now_ms,
        remote_devices::{self as remote_store, RemoteDevice, RemoteDeviceList},
    },
};

/// Whether device keys say they are `device` of `user`.
fn device_keys_are_for(keys: &Value, user: &UserId, device: &str) -> bool {
    keys.get("user_id").and_then(Value::as_str) == Some(user.as_str())
        && keys.get("device_id").and_then(Value::as_str) == Some(device)
}

/// Whether a cross-signing key says it is `user`'s key for `usage`.
fn cross_signing_key_is_for(key: &Value, user: &UserId, usage: &str) -> bool {
    key.get("user_id").and_then(Value::as_str) == Some(user.as_str())
        && key
            .get("usage")
            .and_then(Value::as_array)
            .is_some_and(|u| u.iter().any(|v| v == usage))
}

/// A `GET /user/devices` answer for `user`, checked: the list and its devices, or `None` when
/// it is not an answer about `user`. Devices whose keys say they are another device's, and
/// cross-signing keys that are not the user's, are left out.
fn parse_user_devices(
    user: &UserId,
    body: &Value,
) -> Option<(RemoteDeviceList, Vec<RemoteDevice>)> {
    if body.get("user_id").and_then(Value::as_str) != Some(user.as_str()) {
        return None;
    }
    let stream_id = body.get("stream_id")?.as_i64()?;
    let devices = body
        .get("devices")?
        .as_array()?
        .iter()
        .filter_map(|device| {
            let device_id = device.get("device_id")?.as_str()?;
            let keys = device.get("keys").filter(|k| !k.is_null()).cloned();
            if keys
                .as_ref()
                .is_some_and(|k| !device_keys_are_for(k, user, device_id))
            {
                return None;
            }
            Some(RemoteDevice {
                user_id: user.to_string(),
                device_id: device_id.to_owned(),
                keys,
                display_name: device
                    .get("device_display_name")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            })
        })
        .collect();
    let key = |field: &str, usage: &str| {
        body.get(field)
            .filter(|key| cross_signing_key_is_for(key, user, usage))
            .cloned()
    };
    let list = RemoteDeviceList {
        user_id: user.to_string(),
        stream_id,
        stale: false,
        master_key: key("master_key", "master"),
        self_signing_key: key("self_signing_key", "self_signing"),
    };
    Some((list, devices))
}

/// An `m.device_list_update` EDU's content, checked.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct DeviceListUpdate {
    user_id: OwnedUserId,
    device_id: String,
    stream_id: i64,
    prev_id: Vec<i64>,
    deleted: bool,
    keys: Option<Value>,
    display_name: Option<String>,
}

impl DeviceListUpdate {
    /// Parses an EDU's content from `origin`; why not when it is malformed, about a user of
    /// another server, or carries keys of another device.
    fn parse(origin: &ServerName, content: &Value) -> std::result::Result<Self, String> {
        let user_id = content
            .get("user_id")
            .and_then(Value::as_str)
            .and_then(|u| UserId::parse(u).ok())
            .ok_or("no valid user_id")?;
        if user_id.server_name() != origin {
            return Err(format!("{user_id} is not a user of {origin}"));
        }
        let device_id = content
            .get("device_id")
            .and_then(Value::as_str)
            .filter(|d| !d.is_empty())
            .ok_or("no device_id")?
            .to_owned();
        let stream_id = content
            .get("stream_id")
            .and_then(Value::as_i64)
            .ok_or("no stream_id")?;
        let prev_id = match content.get("prev_id") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|id| id.as_i64().ok_or("prev_id holds a non-integer"))
                .collect::<std::result::Result<_, _>>()?,
            Some(_) => return Err("prev_id is not a list".into()),
        };
        let keys = content.get("keys").filter(|k| !k.is_null()).cloned();
        if keys
            .as_ref()
            .is_some_and(|k| !device_keys_are_for(k, &user_id, &device_id))
        {
            return Err(format!("keys are not those of {user_id}'s {device_id}"));
        }
        Ok(DeviceListUpdate {
            user_id,
            device_id,
            stream_id,
            prev_id,
            deleted: content.get("deleted").and_then(Value::as_bool) == Some(true),
            keys,
            display_name: content
                .get("device_display_name")
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
    }
}

/// What a device-list update does to a cached list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Already reflected (its `stream_id` is not past the cache's).
    Ignore,
    /// It follows on from the cached list: apply it.
    Apply,
    /// Something between the cache and it is missing: resync before the list is used again.
    Resync,
}

/// Whether an update applies to a list cached at `stream_id`: it must be newer, and every
/// `prev_id` must be the cached position (an empty `prev_id`, or one we never saw, means
/// updates were missed). A stale list stays stale until a resync.
pub(super) fn plan_update(
    cached_stream_id: i64,
    stale: bool,
    update_stream_id: i64,
    prev_id: &[i64],
) -> Step {
    if stale {
        Step::Resync
    } else if update_stream_id <= cached_stream_id {
        Step::Ignore
    } else if !prev_id.is_empty() && prev_id.iter().all(|p| *p == cached_stream_id) {
        Step::Apply
    } else {
        Step::Resync
    }
}

/// Adds a cached or resynced list to a `/keys/query` answer, with only the devices asked for
/// (all when `wanted` is empty).
fn merge_list(
    answer: &mut Value,
    list: &RemoteDeviceList,
    devices: &[RemoteDevice],
    wanted: &[String],
) {
    let mut keys = Map::new();
    for device in devices.iter().filter(|d| d.user_id == list.user_id) {
        if !wanted.is_empty() && !wanted.contains(&device.device_id) {
            continue;
        }
        let Some(mut device_keys) = device.keys.clone() else {
            continue;
        };
        if let Some(name) = &device.display_name {
            device_keys["unsigned"]["device_display_name"] = Value::from(name.as_str());
        }
        keys.insert(device.device_id.clone(), device_keys);
    }
    let user = list.user_id.as_str();
    answer["device_keys"][user] = Value::Object(keys);
    if let Some(key) = &list.master_key {
        answer["master_keys"][user] = key.clone();
    }
    if let Some(key) = &list.self_signing_key {
        answer["self_signing_keys"][user] = key.clone();
    }
}

impl Keys {
    /// Answers the remote users of a client's `/keys/query` whose device lists we track (they
    /// share a room with a local user): from the cache when it is current, after a resync
    /// with `GET /user/devices` (within `timeout`) when it is missing or stale. Answers the
    /// users it answered; the others are left to their servers' `user/keys/query`.
    pub(super) async fn answer_from_device_lists(
        &self,
        answer: &mut Value,
        wanted: &BTreeMap<OwnedUserId, Vec<String>>,
        ours: &ServerName,
        timeout: Duration,
    ) -> Result<BTreeSet<OwnedUserId>> {
        let users: Vec<String> = wanted
            .keys()
            .filter(|u| u.server_name() != ours)
            .map(|u| u.to_string())
            .collect();
        if users.is_empty() {
            return Ok(BTreeSet::new());
        }
        let conn = self.db.conn().await?;
        let tracked: HashSet<String> = remote_store::get_users_sharing_rooms(&conn, &users)
            .await?
            .into_iter()
            .collect();
        if tracked.is_empty() {
            return Ok(BTreeSet::new());
        }
        let tracked_users: Vec<String> = tracked.iter().cloned().collect();
        let lists: HashMap<String, RemoteDeviceList> =
            remote_store::get_lists(&conn, &tracked_users)
                .await?
                .into_iter()
                .filter(|l| !l.stale)
                .map(|l| (l.user_id.clone(), l))
                .collect();
        let fresh: Vec<String> = lists.keys().cloned().collect();
        let devices = remote_store::get_devices(&conn, &fresh).await?;
        drop(conn);

        let mut answered = BTreeSet::new();
        let mut resync = Vec::new();
        for (user, wanted_devices) in wanted {
            if !tracked.contains(user.as_str()) {
                continue;
            }
            match lists.get(user.as_str()) {
                Some(list) => {
                    merge_list(answer, list, &devices, wanted_devices);
                    answered.insert(user.clone());
                }
                None => resync.push(user.clone()),
            }
        }
        let fetches = resync.iter().map(|user| async move {
            let fetched =
                tokio::time::timeout(timeout, self.fetch_device_list(user.server_name(), user))
                    .await
                    .unwrap_or_else(|_| Err(FederationError::Unreachable("timed out".into())));
            (user, fetched)
        });
        for (user, fetched) in join_all(fetches).await {
            match fetched {
                Ok((list, devices)) => {
                    merge_list(answer, &list, &devices, &wanted[user]);
                    answered.insert(user.clone());
                    if let Err(e) = self.store_resync(&list, &devices).await {
                        tracing::warn!(%user, "caching a device list: {e}");
                    }
                }
                // Left to user/keys/query, which names the server in failures if it fails too.
                Err(e) => tracing::info!(%user, "device list resync: {e}"),
            }
        }
        Ok(answered)
    }

    /// `GET /user/devices/{userId}` on the user's server, checked.
    async fn fetch_device_list(
        &self,
        server: &ServerName,
        user: &UserId,
    ) -> std::result::Result<(RemoteDeviceList, Vec<RemoteDevice>), FederationError> {
        let request = get_devices::Request::new(user.to_owned());
        let raw = self
            .federation
            .send_raw(server, request, MAX_JSON_RESPONSE)
            .await?;
        let body: Value = serde_json::from_slice(&raw.body)
            .map_err(|e| FederationError::BadResponse(format!("{server}: user/devices: {e}")))?;
        parse_user_devices(user, &body).ok_or_else(|| {
            FederationError::BadResponse(format!("{server}: user/devices: not a list of {user}"))
        })
    }

    /// Stores a list just fetched with `GET /user/devices` as the user's fresh cached list.
    async fn store_resync(&self, list: &RemoteDeviceList, devices: &[RemoteDevice]) -> Result<()> {
        let mut conn = self.db.conn().await?;
        let now = now_ms();
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            // An update applied meanwhile may have moved a fresh list past this answer.
            if let Some(current) = remote_store::lock_list(conn, &list.user_id).await? {
                if !current.stale && current.stream_id > list.stream_id {
                    return Ok(());
                }
            }
            remote_store::replace_list(conn, list, devices, now).await?;
            Ok(())
        })
        .await
    }

    /// Fetches and caches `user`'s device list now (`GET /user/devices`), whatever the cache
    /// holds; answers the list's `stream_id`.
    pub async fn resync_device_list(&self, user: &UserId) -> Result<i64> {
        let (list, devices) = self
            .fetch_device_list(user.server_name(), user)
            .await
            .map_err(|e| Error::unknown(e.to_string()))?;
        self.store_resync(&list, &devices).await?;
        Ok(list.stream_id)
    }

    /// Applies an `m.device_list_update` EDU from `origin` (authenticated by the caller) to
    /// the cache: when it follows on from the cached list it is applied, otherwise the list is
    /// marked stale and resynced on its next use. An EDU about a user of another server, or
    /// malformed, is logged and dropped (`Ok`); errors are the database's only.
    pub async fn on_device_list_update(
        &self,
        origin: &ServerName,
        content: &serde_json::Value,
    ) -> crate::error::Result<()> {
        let update = match DeviceListUpdate::parse(origin, content) {
            Ok(update) => update,
            Err(why) => {
                tracing::info!(%origin, "dropped m.device_list_update: {why}");
                return Ok(());
            }
        };
        let user = update.user_id.as_str();
        let mut conn = self.db.conn().await?;
        let now = now_ms();
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            let sharing = !remote_store::get_users_sharing_rooms(conn, &[user.to_owned()])
                .await?
                .is_empty();
            let Some(list) = remote_store::lock_list(conn, user).await? else {
                // Nothing cached: the next query asks the server anyway.
                if sharing {
                    device_list_changed(conn, user).await?;
                }
                return Ok(());
            };
            match plan_update(
                list.stream_id,
                list.stale,
                update.stream_id,
                &update.prev_id,
            ) {
                Step::Ignore => return Ok(()),
                Step::Resync => remote_store::mark_stale(conn, user, now).await?,
                Step::Apply => {
                    if update.deleted {
                        remote_store::delete_device(conn, user, &update.device_id).await?;
                    } else {
                        let existing = remote_store::get_devices(conn, &[user.to_owned()])
                            .await?
                            .into_iter()
                            .find(|d| d.device_id == update.device_id);
                        let device = RemoteDevice {
                            user_id: user.to_owned(),
                            device_id: update.device_id.clone(),
                            keys: update
                                .keys
                                .clone()
                                .or_else(|| existing.as_ref().and_then(|d| d.keys.clone())),
                            display_name: update.display_name.clone(),
                        };
                        remote_store::upsert_device(conn, &device).await?;
                    }
                    remote_store::set_stream_id(conn, user, update.stream_id, now).await?;
                }
            }
            device_list_changed(conn, user).await?;
            Ok(())
        })
        .await
    }

    /// Applies an `m.signing_key_update` EDU from `origin` (authenticated by the caller):
    /// replaces the cached master and/or self-signing key of the user. An EDU about a user of
    /// another server, or with keys that are not the user's, is logged and dropped (`Ok`).
    pub async fn on_signing_key_update(
        &self,
        origin: &ServerName,
        content: &serde_json::Value,
    ) -> crate::error::Result<()> {
        let Some(user_id) = content
            .get("user_id")
            .and_then(Value::as_str)
            .and_then(|u| UserId::parse(u).ok())
            .filter(|u| u.server_name() == origin)
        else {
            tracing::info!(%origin, "dropped m.signing_key_update: no user_id of the origin");
            return Ok(());
        };
        let key = |field: &str, usage: &str| {
            content
                .get(field)
                .filter(|k| !k.is_null())
                .filter(|k| {
                    let ok = cross_signing_key_is_for(k, &user_id, usage);
                    if !ok {
                        tracing::info!(%origin, "dropped an m.signing_key_update {field}");
                    }
                    ok
                })
                .cloned()
        };
        let (master, self_signing) = (
            key("master_key", "master"),
            key("self_signing_key", "self_signing"),
        );
        if master.is_none() && self_signing.is_none() {
            return Ok(());
        }
        let user = user_id.as_str();
        let mut conn = self.db.conn().await?;
        let now = now_ms();
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            let cached = remote_store::lock_list(conn, user).await?.is_some();
            if cached {
                remote_store::set_signing_keys(
                    conn,
                    user,
                    master.as_ref(),
                    self_signing.as_ref(),
                    now,
                )
                .await?;
            }
            let sharing = !remote_store::get_users_sharing_rooms(conn, &[user.to_owned()])
                .await?
                .is_empty();
            if cached || sharing {
                device_list_changed(conn, user).await?;
            }
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use ruma::OwnedServerName;
    use serde_json::json;

    use super::*;

    #[test]
    fn an_update_chaining_from_the_cached_position_applies() {
        assert_eq!(plan_update(5, false, 6, &[5]), Step::Apply);
        assert_eq!(plan_update(5, false, 9, &[5, 5]), Step::Apply);
    }

    #[test]
    fn an_update_with_an_unknown_prev_id_needs_a_resync() {
        assert_eq!(plan_update(5, false, 8, &[7]), Step::Resync);
        assert_eq!(plan_update(5, false, 8, &[5, 7]), Step::Resync);
        assert_eq!(plan_update(5, false, 8, &[]), Step::Resync);
    }

    #[test]
    fn an_old_or_repeated_update_is_ignored() {
        assert_eq!(plan_update(5, false, 5, &[4]), Step::Ignore);
        assert_eq!(plan_update(5, false, 3, &[2]), Step::Ignore);
    }

    #[test]
    fn a_stale_list_stays_stale_until_resynced() {
        assert_eq!(plan_update(5, true, 6, &[5]), Step::Resync);
    }

    fn origin() -> OwnedServerName {
        "remote.example".try_into().unwrap()
    }

    #[test]
    fn an_update_about_another_servers_user_is_refused() {
        let content = json!({
            "user_id": "@bob:other.example", "device_id": "D", "stream_id": 2, "prev_id": [1],
        });
        assert!(DeviceListUpdate::parse(&origin(), &content).is_err());
    }

    #[test]
    fn an_update_carrying_another_devices_keys_is_refused() {
        let content = json!({
            "user_id": "@bob:remote.example", "device_id": "D", "stream_id": 2, "prev_id": [1],
            "keys": { "user_id": "@bob:remote.example", "device_id": "E" },
        });
        assert!(DeviceListUpdate::parse(&origin(), &content).is_err());
    }

    #[test]
    fn a_well_formed_update_parses() {
        let content = json!({
            "user_id": "@bob:remote.example", "device_id": "D", "stream_id": 2, "prev_id": [1],
            "deleted": true, "device_display_name": "phone",
            "keys": { "user_id": "@bob:remote.example", "device_id": "D" },
        });
        let update = DeviceListUpdate::parse(&origin(), &content).unwrap();
        assert_eq!(update.stream_id, 2);
        assert_eq!(update.prev_id, vec![1]);
        assert!(update.deleted);
        assert_eq!(update.display_name.as_deref(), Some("phone"));
    }

    #[test]
    fn a_user_devices_answer_drops_keys_that_are_not_the_users() {
        let user = UserId::parse("@bob:remote.example").unwrap();
        let body = json!({
            "user_id": "@bob:remote.example", "stream_id": 7,
            "devices": [
                { "device_id": "A", "keys": { "user_id": "@bob:remote.example", "device_id": "A" } },
                { "device_id": "B", "keys": { "user_id": "@eve:remote.example", "device_id": "B" } },
                { "device_id": "C" },
            ],
            "master_key": { "user_id": "@eve:remote.example", "usage": ["master"], "keys": {} },
        });
        let (list, devices) = parse_user_devices(&user, &body).unwrap();
        assert_eq!(list.stream_id, 7);
        assert!(list.master_key.is_none());
        let ids: Vec<&str> = devices.iter().map(|d| d.device_id.as_str()).collect();
        assert_eq!(ids, vec!["A", "C"]);
        assert!(parse_user_devices(
            &user,
            &json!({ "user_id": "@eve:remote.example", "stream_id": 1, "devices": [] })
        )
        .is_none());
    }
}
