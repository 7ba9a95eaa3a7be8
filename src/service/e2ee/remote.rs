//! E2EE keys across servers: answering other servers' key queries, claims and device-list
//! requests for our users, and asking other servers about theirs for our clients'
//! `/keys/query` and `/keys/claim`.
//!
//! Remote users whose device lists we track (they share a room with one of ours) are answered
//! from the cache in `device_lists.rs`; the others are asked of their servers every time, as
//! Synapse does for users it shares no room with.

use std::{collections::BTreeMap, time::Duration};

use futures_util::future::join_all;
use ruma::{
    api::{
        federation::keys::{claim_keys::v1 as claim_keys, get_keys::v1 as get_keys},
        path_builder::SinglePath,
        OutgoingRequest,
    },
    OneTimeKeyAlgorithm, OwnedDeviceId, OwnedServerName, OwnedUserId, ServerName, UserId,
};
use serde_json::{json, Map, Value};

use super::{cross_signing_public_key, keys::Keys};
use crate::{
    error::{Error, Result},
    service::federation::{client::FederationAuth, FederationError},
    storage::e2ee as store,
};

/// How long a client's `/keys/query` or `/keys/claim` waits for other servers (the spec's
/// default `timeout`).
pub const DEFAULT_REMOTE_TIMEOUT: Duration = Duration::from_secs(10);

/// Requested users grouped by their server.
fn by_server<V: Clone>(
    wanted: &BTreeMap<OwnedUserId, V>,
    ours: &ServerName,
) -> BTreeMap<OwnedServerName, BTreeMap<OwnedUserId, V>> {
    let mut grouped: BTreeMap<OwnedServerName, BTreeMap<OwnedUserId, V>> = BTreeMap::new();
    for (user, value) in wanted {
        if user.server_name() != ours {
            grouped
                .entry(user.server_name().to_owned())
                .or_default()
                .insert(user.clone(), value.clone());
        }
    }
    grouped
}

/// The `failures` entry for a server that did not answer in time or usably.
fn failure(error: impl std::fmt::Display) -> Value {
    json!({ "status": 503, "message": error.to_string() })
}

fn remote_failure(error: FederationError) -> Value {
    match error {
        FederationError::Remote { status, error, .. } => {
            json!({ "status": status, "message": error })
        }
        other => failure(other),
    }
}

/// A JSON object's string field.
fn field<'a>(value: &'a Value, name: &str) -> Option<&'a str> {
    value.get(name).and_then(Value::as_str)
}

impl Keys {
    /// `/keys/query` from one of our clients: local users from the database, other users from
    /// their servers (concurrently, within `timeout`); a server that fails is named in
    /// `failures`.
    pub async fn query_everywhere(
        &self,
        requester: &UserId,
        wanted: &BTreeMap<OwnedUserId, Vec<String>>,
        ours: &ServerName,
        timeout: Duration,
    ) -> Result<Value> {
        let mut answer = self.query(Some(requester), wanted, ours).await?;
        let answered = self
            .answer_from_device_lists(&mut answer, wanted, ours, timeout)
            .await?;
        let wanted: BTreeMap<OwnedUserId, Vec<String>> = wanted
            .iter()
            .filter(|(user, _)| !answered.contains(*user))
            .map(|(user, devices)| (user.clone(), devices.clone()))
            .collect();
        let to_request = |users: &BTreeMap<OwnedUserId, Vec<String>>| {
            get_keys::Request::new(
                users
                    .iter()
                    .map(|(user, devices)| {
                        let devices = devices.iter().map(|d| OwnedDeviceId::from(d.as_str()));
                        (user.clone(), devices.collect())
                    })
                    .collect(),
            )
        };
        let answers = self
            .ask_each_server(
                by_server(&wanted, ours),
                timeout,
                to_request,
                &mut answer["failures"],
            )
            .await;
        for (users, response) in answers {
            let remote = json!({
                "device_keys": response.device_keys,
                "master_keys": response.master_keys,
                "self_signing_keys": response.self_signing_keys,
            });
            merge_remote_query(&mut answer, &remote, &users);
        }
        Ok(answer)
    }

    /// `/keys/claim` from one of our clients: local devices from the database, others from
    /// their servers (concurrently, within `timeout`).
    pub async fn claim_everywhere(
        &self,
        wanted: &BTreeMap<OwnedUserId, BTreeMap<String, String>>,
        ours: &ServerName,
        timeout: Duration,
    ) -> Result<Value> {
        let local: BTreeMap<String, BTreeMap<String, String>> = wanted
            .iter()
            .filter(|(user, _)| user.server_name() == ours)
            .map(|(user, devices)| (user.to_string(), devices.clone()))
            .collect();
        let mut answer = self.claim(&local).await?;
        let to_request = |users: &BTreeMap<OwnedUserId, BTreeMap<String, String>>| {
            claim_keys::Request::new(
                users
                    .iter()
                    .map(|(user, devices)| {
                        let devices = devices.iter().map(|(device, algorithm)| {
                            (
                                OwnedDeviceId::from(device.as_str()),
                                OneTimeKeyAlgorithm::from(algorithm.as_str()),
                            )
                        });
                        (user.clone(), devices.collect())
                    })
                    .collect(),
            )
        };
        let answers = self
            .ask_each_server(
                by_server(wanted, ours),
                timeout,
                to_request,
                &mut answer["failures"],
            )
            .await;
        for (users, response) in answers {
            let remote = serde_json::to_value(&response.one_time_keys).unwrap_or_default();
            // Only what was asked for: the users and devices of the request.
            for (user, devices) in &users {
                for device in devices.keys() {
                    if let Some(keys) = remote.get(user.as_str()).and_then(|d| d.get(device)) {
                        if keys.is_object() {
                            answer["one_time_keys"][user.as_str()][device] = keys.clone();
                        }
                    }
                }
            }
        }
        Ok(answer)
    }

    /// Sends each server the request `to_request` makes for its users, all at once, and waits
    /// at most `timeout`; a server that fails or does not answer in time is named in
    /// `failures`, the others' answers come back with the users they were asked about.
    async fn ask_each_server<V, R>(
        &self,
        grouped: BTreeMap<OwnedServerName, BTreeMap<OwnedUserId, V>>,
        timeout: Duration,
        to_request: impl Fn(&BTreeMap<OwnedUserId, V>) -> R,
        failures: &mut Value,
    ) -> Vec<(BTreeMap<OwnedUserId, V>, R::IncomingResponse)>
    where
        R: OutgoingRequest<PathBuilder = SinglePath>,
        R::Authentication: FederationAuth,
    {
        let asks = grouped.into_iter().map(|(server, users)| {
            let request = to_request(&users);
            async move {
                let result =
                    tokio::time::timeout(timeout, self.federation.send(&server, request)).await;
                (server, users, result)
            }
        });
        let mut answers = Vec::new();
        for (server, users, result) in join_all(asks).await {
            match result {
                Err(_) => failures[server.as_str()] = failure("timed out"),
                Ok(Err(error)) => failures[server.as_str()] = remote_failure(error),
                Ok(Ok(response)) => answers.push((users, response)),
            }
        }
        answers
    }

    /// `POST /_matrix/federation/v1/user/keys/query` from `origin`: our users' device and
    /// cross-signing keys (never user-signing keys, and only self-made signatures).
    pub async fn query_for_server(
        &self,
        wanted: &BTreeMap<OwnedUserId, Vec<String>>,
        ours: &ServerName,
    ) -> Result<Value> {
        let answer = self.query(None, wanted, ours).await?;
        Ok(json!({
            "device_keys": answer["device_keys"],
            "master_keys": answer["master_keys"],
            "self_signing_keys": answer["self_signing_keys"],
        }))
    }

    /// `POST /_matrix/federation/v1/user/keys/claim` from another server: one key per device
    /// of our users (other users are left out).
    pub async fn claim_for_server(
        &self,
        wanted: &BTreeMap<OwnedUserId, BTreeMap<String, String>>,
        ours: &ServerName,
    ) -> Result<Value> {
        let local: BTreeMap<String, BTreeMap<String, String>> = wanted
            .iter()
            .filter(|(user, _)| user.server_name() == ours)
            .map(|(user, devices)| (user.to_string(), devices.clone()))
            .collect();
        let answer = self.claim(&local).await?;
        Ok(json!({ "one_time_keys": answer["one_time_keys"] }))
    }

    /// `GET /_matrix/federation/v1/user/devices/{userId}`: a local user's devices with keys,
    /// the position of their latest device-list change, and their cross-signing keys.
    pub async fn devices_for_server(&self, user_id: &UserId, ours: &ServerName) -> Result<Value> {
        if user_id.server_name() != ours {
            return Err(Error::not_found("Not a user of this server"));
        }
        let conn = self.db.conn().await?;
        let users = [user_id.to_string()];
        if crate::storage::users::get_user(&conn, user_id.as_str())
            .await?
            .is_none()
        {
            return Err(Error::not_found("Unknown user"));
        }
        let devices: Vec<Value> = store::get_device_keys(&conn, &users)
            .await?
            .into_iter()
            .map(|(_, device_id, keys, display_name)| {
                let mut device = json!({ "device_id": device_id, "keys": keys });
                if let Some(name) = display_name {
                    device["device_display_name"] = Value::from(name);
                }
                device
            })
            .collect();
        let stream_id = store::latest_device_list_change(&conn, user_id.as_str())
            .await?
            .unwrap_or(0);
        let mut answer = json!({
            "user_id": user_id,
            "stream_id": stream_id,
            "devices": devices,
        });
        for (_, kind, key) in store::get_cross_signing_keys(&conn, &users).await? {
            match kind.as_str() {
                "master" => answer["master_key"] = key,
                "self_signing" => answer["self_signing_key"] = key,
                _ => {}
            }
        }
        Ok(answer)
    }
}

/// Adds a remote server's `/user/keys/query` answer to a client's answer, keeping only keys
/// of the users asked about that say they are theirs (a server cannot speak for others).
fn merge_remote_query(
    answer: &mut Value,
    remote: &Value,
    users: &BTreeMap<OwnedUserId, Vec<String>>,
) {
    for (user, devices) in users {
        let user = user.as_str();
        let mut kept = Map::new();
        if let Some(remote_devices) = remote["device_keys"].get(user).and_then(Value::as_object) {
            for (device_id, keys) in remote_devices {
                let wanted = devices.is_empty() || devices.contains(device_id);
                if wanted
                    && field(keys, "user_id") == Some(user)
                    && field(keys, "device_id") == Some(device_id)
                {
                    kept.insert(device_id.clone(), keys.clone());
                }
            }
        }
        answer["device_keys"][user] = Value::Object(kept);
        for kind in ["master_keys", "self_signing_keys"] {
            if let Some(key) = remote[kind].get(user) {
                if field(key, "user_id") == Some(user) && cross_signing_public_key(key).is_some() {
                    answer[kind][user] = key.clone();
                }
            }
        }
    }
}
