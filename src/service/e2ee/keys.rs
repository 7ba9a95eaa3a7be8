//! Device keys, one-time and fallback keys, cross-signing keys and signatures.

use std::collections::{BTreeMap, HashMap};

use ruma::{OwnedUserId, ServerName, UserId};
use serde_json::{json, Map, Value};

use super::{
    cross_signing_public_key, device_list_changed, has_valid_signature, local_devices_changed,
    public_key,
};
use crate::{
    error::{Error, Result},
    storage::{
        e2ee::{self as store, SignatureRow},
        Db,
    },
};

/// The one-time key algorithm clients use; always reported, with 0 when none are left, so
/// clients know to upload more.
const SIGNED_CURVE25519: &str = "signed_curve25519";
/// Cross-signing key types as stored.
const MASTER: &str = "master";
const SELF_SIGNING: &str = "self_signing";
const USER_SIGNING: &str = "user_signing";

/// The keys service.
pub struct Keys {
    pub(super) db: Db,
    /// Asks other servers about their users' keys (`service/e2ee/remote.rs`).
    pub(super) federation: std::sync::Arc<crate::service::federation::FederationClient>,
    /// Tells the servers sharing a room with our users that their devices changed.
    pub(super) sender: std::sync::Arc<crate::service::federation::sender::Sender>,
}

/// What `/keys/upload` carries, as JSON.
pub struct Upload {
    /// The device's identity keys.
    pub device_keys: Option<Value>,
    /// `algorithm:id` -> key.
    pub one_time_keys: BTreeMap<String, Value>,
    /// `algorithm:id` -> key.
    pub fallback_keys: BTreeMap<String, Value>,
}

/// What `/keys/device_signing/upload` carries, as JSON.
pub struct SigningKeys {
    /// Master key.
    pub master: Option<Value>,
    /// Self-signing key.
    pub self_signing: Option<Value>,
    /// User-signing key.
    pub user_signing: Option<Value>,
}

fn invalid_signature(message: impl Into<String>) -> Error {
    Error::matrix(
        actix_web::http::StatusCode::BAD_REQUEST,
        "M_INVALID_SIGNATURE",
        message,
    )
}

/// Splits `algorithm:id`.
fn algorithm_of(key_id: &str) -> Result<&str> {
    match key_id.split_once(':') {
        Some((algorithm, id)) if !algorithm.is_empty() && !id.is_empty() => Ok(algorithm),
        _ => Err(Error::invalid_param(format!(
            "Key ID {key_id} is not of the form algorithm:id"
        ))),
    }
}

/// Checks a key object's `user_id` and `usage`.
fn check_cross_signing_key(key: &Value, user_id: &UserId, usage: &str) -> Result<(String, String)> {
    if key.get("user_id").and_then(Value::as_str) != Some(user_id.as_str()) {
        return Err(Error::invalid_param(format!(
            "The {usage} key's user_id is not yours"
        )));
    }
    let has_usage = key
        .get("usage")
        .and_then(Value::as_array)
        .is_some_and(|u| u.iter().any(|v| v == usage));
    if !has_usage {
        return Err(Error::invalid_param(format!(
            "The {usage} key's usage must include {usage}"
        )));
    }
    cross_signing_public_key(key)
        .ok_or_else(|| Error::invalid_param(format!("The {usage} key has no ed25519 key")))
}

impl Keys {
    /// Creates the service.
    pub fn new(
        db: Db,
        federation: std::sync::Arc<crate::service::federation::FederationClient>,
        sender: std::sync::Arc<crate::service::federation::sender::Sender>,
    ) -> Self {
        Keys {
            db,
            federation,
            sender,
        }
    }

    /// `/keys/upload`: stores what the device sent after checking it is the device's own and
    /// signed by it; returns the remaining one-time key counts.
    pub async fn upload(
        &self,
        user_id: &UserId,
        device_id: &str,
        upload: Upload,
    ) -> Result<BTreeMap<String, i64>> {
        let signing_key_id = format!("ed25519:{device_id}");
        if let Some(keys) = &upload.device_keys {
            if keys.get("user_id").and_then(Value::as_str) != Some(user_id.as_str())
                || keys.get("device_id").and_then(Value::as_str) != Some(device_id)
            {
                return Err(Error::invalid_param(
                    "device_keys must be for your own user and device",
                ));
            }
            let Some(ed25519) = public_key(keys, &signing_key_id) else {
                return Err(Error::invalid_param(format!(
                    "device_keys has no {signing_key_id} key"
                )));
            };
            if !has_valid_signature(keys, user_id.as_str(), &signing_key_id, ed25519) {
                return Err(invalid_signature(
                    "device_keys are not signed by the device",
                ));
            }
        }
        let mut conn = self.db.conn().await?;
        let device_key = match &upload.device_keys {
            Some(keys) => Some(keys.clone()),
            None => store::get_device_key(&conn, user_id.as_str(), device_id).await?,
        };
        let ed25519 = device_key
            .as_ref()
            .and_then(|k| public_key(k, &signing_key_id).map(str::to_owned));
        // Signed one-time and fallback keys must be signed by this device.
        for (key_id, key) in upload.one_time_keys.iter().chain(&upload.fallback_keys) {
            algorithm_of(key_id)?;
            if let (Some(ed25519), true) = (&ed25519, key.get("signatures").is_some()) {
                if !has_valid_signature(key, user_id.as_str(), &signing_key_id, ed25519) {
                    return Err(invalid_signature(format!(
                        "{key_id} is not signed by the device"
                    )));
                }
            }
        }
        let ids: Vec<String> = upload.one_time_keys.keys().cloned().collect();
        let user = user_id.as_str();
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            for (key_id, existing) in store::get_one_time_keys(conn, user, device_id, &ids).await? {
                if upload.one_time_keys.get(&key_id) != Some(&existing) {
                    return Err(Error::invalid_param(format!(
                        "One time key {key_id} already exists"
                    )));
                }
            }
            let new_keys: Vec<(String, String, Value)> = upload
                .one_time_keys
                .iter()
                .map(|(id, key)| Ok((algorithm_of(id)?.to_owned(), id.clone(), key.clone())))
                .collect::<Result<_>>()?;
            store::insert_one_time_keys(conn, user, device_id, &new_keys).await?;
            for (key_id, key) in &upload.fallback_keys {
                let algorithm = algorithm_of(key_id)?;
                store::upsert_fallback_key(conn, user, device_id, algorithm, key_id, key).await?;
            }
            if let Some(keys) = &upload.device_keys {
                if store::upsert_device_keys(conn, user, device_id, keys).await? {
                    let changed = [device_id.to_owned()];
                    local_devices_changed(conn, &self.sender, user_id, &changed).await?;
                }
            }
            Ok(())
        })
        .await?;
        one_time_key_counts(&conn, user_id.as_str(), device_id).await
    }

    /// `/keys/query` for local users: device keys (all devices when the list is empty) and
    /// cross-signing keys, with the signatures added since; user-signing keys only for the
    /// requester's own account.
    pub async fn query(
        &self,
        requester: Option<&UserId>,
        wanted: &BTreeMap<OwnedUserId, Vec<String>>,
        server_name: &ServerName,
    ) -> Result<Value> {
        let wanted: HashMap<&str, &Vec<String>> = wanted
            .iter()
            .filter(|(user, _)| user.server_name() == server_name)
            .map(|(user, devices)| (user.as_str(), devices))
            .collect();
        let users: Vec<String> = wanted.keys().map(|u| (*u).to_owned()).collect();
        let conn = self.db.conn().await?;
        let signatures = store::get_signatures(&conn, &users).await?;
        let mut extra: HashMap<(&str, &str), Vec<&SignatureRow>> = HashMap::new();
        for row in &signatures {
            extra
                .entry((row.target_user_id.as_str(), row.target_key_id.as_str()))
                .or_default()
                .push(row);
        }
        // A signature across users is a user-signing key's signature of another user's master
        // key: only its signer sees it (the spec keeps the user-signing key's work private).
        let with_signatures = |user: &str, key_id: &str, mut key: Value| {
            let visible = |row: &&&SignatureRow| {
                row.signer_user_id == row.target_user_id
                    || requester.is_some_and(|r| row.signer_user_id == r.as_str())
            };
            for row in extra
                .get(&(user, key_id))
                .into_iter()
                .flatten()
                .filter(visible)
            {
                key["signatures"][&row.signer_user_id][&row.signer_key_id] =
                    Value::from(row.signature.as_str());
            }
            key
        };

        let mut device_keys: Map<String, Value> =
            users.iter().map(|u| (u.clone(), json!({}))).collect();
        for (user, device, mut keys, display_name) in store::get_device_keys(&conn, &users).await? {
            let devices = wanted[user.as_str()];
            if !devices.is_empty() && !devices.contains(&device) {
                continue;
            }
            if let Some(name) = display_name {
                keys["unsigned"] = json!({ "device_display_name": name });
            }
            let keys = with_signatures(&user, &device, keys);
            device_keys[&user][&device] = keys;
        }
        let (mut master, mut self_signing, mut user_signing) = (Map::new(), Map::new(), Map::new());
        for (user, kind, key) in store::get_cross_signing_keys(&conn, &users).await? {
            let Some((_, public)) = cross_signing_public_key(&key) else {
                continue;
            };
            let key = with_signatures(&user, &public, key);
            match kind.as_str() {
                MASTER => master.insert(user, key),
                SELF_SIGNING => self_signing.insert(user, key),
                _ if requester.is_some_and(|r| user == r.as_str()) => {
                    user_signing.insert(user, key)
                }
                _ => None,
            };
        }
        Ok(json!({
            "device_keys": device_keys,
            "master_keys": master,
            "self_signing_keys": self_signing,
            "user_signing_keys": user_signing,
            "failures": {},
        }))
    }

    /// `/keys/claim`: one key per requested device, taken atomically (two claims never get the
    /// same one-time key); the fallback key when a device has no one-time key left.
    pub async fn claim(
        &self,
        wanted: &BTreeMap<String, BTreeMap<String, String>>,
    ) -> Result<Value> {
        let conn = self.db.conn().await?;
        let mut claimed = Map::new();
        for (user, devices) in wanted {
            for (device, algorithm) in devices {
                let key = match store::claim_one_time_key(&conn, user, device, algorithm).await? {
                    Some(key) => Some(key),
                    None => store::claim_fallback_key(&conn, user, device, algorithm).await?,
                };
                if let Some((key_id, key)) = key {
                    let entry = claimed.entry(user.clone()).or_insert_with(|| json!({}));
                    entry[device] = json!({ key_id: key });
                }
            }
        }
        Ok(json!({ "one_time_keys": claimed, "failures": {} }))
    }

    /// Whether uploading these cross-signing keys replaces an existing master key (then the
    /// caller must pass user-interactive auth first).
    pub async fn replaces_master_key(&self, user_id: &UserId, keys: &SigningKeys) -> Result<bool> {
        let Some(new_master) = &keys.master else {
            return Ok(false);
        };
        let conn = self.db.conn().await?;
        let existing = store::get_cross_signing_keys(&conn, &[user_id.to_string()]).await?;
        Ok(existing
            .iter()
            .any(|(_, kind, key)| kind == MASTER && key != new_master))
    }

    /// `/keys/device_signing/upload`: the self-signing and user-signing keys must be signed by
    /// the master key (the new one, or the stored one).
    /// `uia`: the completed authentication a master-key replacement needs, consumed in the
    /// same transaction as the keys it authorises.
    pub async fn upload_signing_keys(
        &self,
        user_id: &UserId,
        keys: SigningKeys,
        uia: Option<(&crate::service::uia::Uia, &crate::service::uia::Completed)>,
    ) -> Result<()> {
        let user = user_id.as_str();
        let mut conn = self.db.conn().await?;
        let stored = store::get_cross_signing_keys(&conn, &[user.to_owned()]).await?;
        let master = match &keys.master {
            Some(master) => master.clone(),
            None => stored
                .iter()
                .find(|(_, kind, _)| kind == MASTER)
                .map(|(_, _, key)| key.clone())
                .ok_or_else(|| Error::invalid_param("No master key: upload one first"))?,
        };
        let (master_id, master_public) = check_cross_signing_key(&master, user_id, MASTER)?;
        for (kind, key) in [
            (SELF_SIGNING, &keys.self_signing),
            (USER_SIGNING, &keys.user_signing),
        ] {
            if let Some(key) = key {
                check_cross_signing_key(key, user_id, kind)?;
                if !has_valid_signature(key, user, &master_id, &master_public) {
                    return Err(invalid_signature(format!(
                        "The {kind} key is not signed by the master key"
                    )));
                }
            }
        }
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            if let Some((uia, completed)) = uia {
                uia.finish(conn, completed).await?;
            }
            for (kind, key) in [
                (MASTER, &keys.master),
                (SELF_SIGNING, &keys.self_signing),
                (USER_SIGNING, &keys.user_signing),
            ] {
                if let Some(key) = key {
                    store::set_cross_signing_key(conn, user, kind, key).await?;
                }
            }
            device_list_changed(conn, user).await?;
            self.sender
                .queue_signing_key_update(
                    conn,
                    user_id,
                    keys.master.as_ref(),
                    keys.self_signing.as_ref(),
                )
                .await?;
            Ok(())
        })
        .await
    }

    /// `/keys/signatures/upload`: each signed object must match the stored key it signs and
    /// carry a valid new signature by a key that may sign it (see [`allowed_signers`]).
    /// Returns the per-key failures; only users with an accepted signature have their device
    /// list marked changed.
    pub async fn upload_signatures(
        &self,
        signer: &UserId,
        signed: &BTreeMap<String, BTreeMap<String, Value>>,
    ) -> Result<Value> {
        let mut conn = self.db.conn().await?;
        let mut users: Vec<String> = signed.keys().cloned().collect();
        users.push(signer.to_string());
        let devices = store::get_device_keys(&conn, &users).await?;
        let cross = store::get_cross_signing_keys(&conn, &users).await?;
        // The caller's keys: key ID -> (public key, what it is).
        let mut signing_keys: HashMap<String, (String, KeyKind)> = HashMap::new();
        for (user, device, keys, _) in &devices {
            if user == signer.as_str() {
                let id = format!("ed25519:{device}");
                if let Some(public) = public_key(keys, &id) {
                    signing_keys.insert(id, (public.to_owned(), KeyKind::Device));
                }
            }
        }
        for (user, kind, key) in &cross {
            if user == signer.as_str() {
                if let Some((id, public)) = cross_signing_public_key(key) {
                    signing_keys.insert(id, (public, KeyKind::cross_signing(kind)));
                }
            }
        }
        let strip = |key: &Value| {
            let mut key = key.clone();
            if let Some(object) = key.as_object_mut() {
                object.remove("signatures");
                object.remove("unsigned");
            }
            key
        };
        let mut failures: Map<String, Value> = Map::new();
        let mut accepted = Vec::new();
        for (target_user, objects) in signed {
            let own = target_user == signer.as_str();
            for (key_id, object) in objects {
                let stored = devices
                    .iter()
                    .find(|(u, d, _, _)| u == target_user && d == key_id)
                    .map(|(_, _, keys, _)| (keys, KeyKind::Device))
                    .or_else(|| {
                        cross.iter().find_map(|(u, kind, key)| {
                            (u == target_user
                                && cross_signing_public_key(key).is_some_and(|(_, p)| &p == key_id))
                            .then(|| (key, KeyKind::cross_signing(kind)))
                        })
                    });
                let mut fail = |errcode: &str, error: &str| {
                    failures
                        .entry(target_user.clone())
                        .or_insert_with(|| json!({}))[key_id] =
                        json!({ "errcode": errcode, "error": error });
                };
                let Some((stored, target_kind)) = stored else {
                    fail("M_NOT_FOUND", "No such key");
                    continue;
                };
                let allowed = allowed_signers(own, target_kind);
                if allowed.is_empty() {
                    fail(
                        "M_FORBIDDEN",
                        if own {
                            "Your cross-signing keys are signed by uploading them"
                        } else {
                            "Of another user's keys you may only sign their master key"
                        },
                    );
                    continue;
                }
                if strip(stored) != strip(object) {
                    fail(
                        "M_INVALID_SIGNATURE",
                        "The signed object does not match the stored key",
                    );
                    continue;
                }
                let signatures = object
                    .pointer(&format!(
                        "/signatures/{}",
                        signer.as_str().replace('~', "~0").replace('/', "~1")
                    ))
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                let (mut any, mut refused) = (false, false);
                for (signer_key_id, signature) in &signatures {
                    let Some((public, signer_kind)) = signing_keys.get(signer_key_id) else {
                        continue;
                    };
                    if stored["signatures"][signer.as_str()][signer_key_id] == *signature {
                        continue;
                    }
                    if !allowed.contains(signer_kind) {
                        refused = true;
                        continue;
                    }
                    if !has_valid_signature(object, signer.as_str(), signer_key_id, public) {
                        continue;
                    }
                    any = true;
                    accepted.push(SignatureRow {
                        target_user_id: target_user.clone(),
                        target_key_id: key_id.clone(),
                        signer_user_id: signer.to_string(),
                        signer_key_id: signer_key_id.clone(),
                        signature: signature.as_str().unwrap_or_default().to_owned(),
                    });
                }
                if !any && refused {
                    fail(
                        "M_FORBIDDEN",
                        match (own, target_kind) {
                            (true, KeyKind::Device) => {
                                "Only your self-signing key signs your devices"
                            }
                            (true, _) => "Only your devices or master key sign your master key",
                            (false, _) => {
                                "Only your user-signing key signs other users' master keys"
                            }
                        },
                    );
                } else if !any {
                    fail(
                        "M_INVALID_SIGNATURE",
                        "No valid new signature by one of your keys",
                    );
                }
            }
        }
        let changed: Vec<String> = {
            let mut users: Vec<String> =
                accepted.iter().map(|s| s.target_user_id.clone()).collect();
            users.dedup();
            users
        };
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            store::add_signatures(conn, &accepted).await?;
            for user in &changed {
                device_list_changed(conn, user).await?;
            }
            Ok(())
        })
        .await?;
        Ok(json!({ "failures": failures }))
    }

    /// Users whose keys changed between two sync tokens' device-list positions, and users who
    /// no longer share a room with the caller (between the event positions).
    pub async fn changes(
        &self,
        user_id: &UserId,
        device_lists: (i64, i64),
        events: (i64, i64),
    ) -> Result<(Vec<String>, Vec<String>)> {
        let conn = self.db.conn().await?;
        device_list_delta(&conn, user_id.as_str(), device_lists, events).await
    }
}

/// What a key is, as a signer or as the key signed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyKind {
    Device,
    Master,
    SelfSigning,
    UserSigning,
}

impl KeyKind {
    /// The kind of a stored cross-signing key (`master`, `self_signing`, `user_signing`).
    fn cross_signing(kind: &str) -> Self {
        match kind {
            MASTER => KeyKind::Master,
            SELF_SIGNING => KeyKind::SelfSigning,
            _ => KeyKind::UserSigning,
        }
    }
}

/// Which of the signer's keys may sign a key through `/keys/signatures/upload`, as the spec's
/// cross-signing rules say: the self-signing key signs the user's own devices, devices (and
/// the master key itself) sign the user's own master key, and the user-signing key signs
/// other users' master keys. Nothing signs the other cross-signing keys this way (the master
/// key signs them on upload) or other users' devices.
fn allowed_signers(own: bool, target: KeyKind) -> &'static [KeyKind] {
    match (own, target) {
        (true, KeyKind::Device) => &[KeyKind::SelfSigning],
        (true, KeyKind::Master) => &[KeyKind::Device, KeyKind::Master],
        (false, KeyKind::Master) => &[KeyKind::UserSigning],
        _ => &[],
    }
}

/// A device's remaining one-time keys per algorithm, as `/keys/upload` and `/sync` report them.
pub async fn one_time_key_counts(
    conn: &diesel_async::AsyncPgConnection,
    user_id: &str,
    device_id: &str,
) -> Result<BTreeMap<String, i64>> {
    let mut counts: BTreeMap<String, i64> = store::count_one_time_keys(conn, user_id, device_id)
        .await?
        .into_iter()
        .collect();
    counts.entry(SIGNED_CURVE25519.to_owned()).or_insert(0);
    Ok(counts)
}

/// `device_lists.changed` and `.left` between two positions of the device-list and event
/// streams.
pub async fn device_list_delta(
    conn: &diesel_async::AsyncPgConnection,
    user_id: &str,
    device_lists: (i64, i64),
    events: (i64, i64),
) -> Result<(Vec<String>, Vec<String>)> {
    let mut changed = if device_lists.0 < device_lists.1 {
        store::get_device_list_changes_for(conn, user_id, device_lists.0, device_lists.1).await?
    } else {
        Vec::new()
    };
    let mut left = Vec::new();
    if events.0 < events.1 {
        for (user, shares) in
            store::get_membership_changes_for(conn, user_id, events.0, events.1).await?
        {
            if shares {
                changed.push(user);
            } else {
                left.push(user);
            }
        }
    }
    changed.sort();
    changed.dedup();
    left.sort();
    left.dedup();
    left.retain(|u| !changed.contains(u));
    Ok((changed, left))
}
