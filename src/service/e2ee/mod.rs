//! End-to-end encryption support: keys, to-device messages and key backup. The server checks
//! who may store what and routes it exactly; it never sees plaintext.

pub mod backup;
pub mod device_lists;
pub mod keys;
pub mod remote;
pub mod to_device;

use base64::{engine::general_purpose::STANDARD_NO_PAD, Engine};
use diesel_async::AsyncPgConnection;
use ruma::{
    signatures::{to_canonical_json_string_for_signing, verify_canonical_json_bytes},
    CanonicalJsonObject, SigningKeyAlgorithm, UserId,
};
use serde_json::Value;

use super::{federation::sender::Sender, notifier::SHARERS_CHANNEL};
use crate::{
    error::Result,
    storage::{devices, e2ee as store, rooms::notify},
};

/// Records that a user's devices or keys changed and wakes everyone who shares a room with
/// them (their clients must refresh the user's keys). Call inside the change's transaction.
pub async fn device_list_changed(conn: &AsyncPgConnection, user_id: &str) -> Result<()> {
    store::record_device_list_change(conn, user_id).await?;
    notify(conn, SHARERS_CHANNEL, user_id).await?;
    Ok(())
}

/// Records that devices of one of our users changed (keys uploaded, devices deleted), one
/// device-list change per device, and wakes everyone who shares a room with them. Each change
/// goes to the servers sharing a room with the user as an `m.device_list_update` whose
/// `prev_id` is the user's previous change, so a receiver that missed one resyncs. Call inside
/// the change's transaction, after the change.
pub async fn local_devices_changed(
    conn: &AsyncPgConnection,
    federation: &Sender,
    user: &UserId,
    device_ids: &[String],
) -> Result<()> {
    let user_id = user.as_str();
    let mut prev = store::latest_device_list_change(conn, user_id).await?;
    for device_id in device_ids {
        let position = store::record_device_list_change(conn, user_id).await?;
        let device = devices::get_device(conn, user_id, device_id).await?;
        let keys = match device {
            Some(_) => store::get_device_key(conn, user_id, device_id).await?,
            None => None,
        };
        let name = device.as_ref().and_then(|d| d.display_name.as_deref());
        federation
            .queue_device_list_update(
                conn,
                user,
                device_id,
                position,
                prev,
                device.is_none(),
                keys.as_ref(),
                name,
            )
            .await?;
        prev = Some(position);
    }
    notify(conn, SHARERS_CHANNEL, user_id).await?;
    Ok(())
}

/// Whether `object` carries a valid ed25519 signature by `signer` with `key_id`
/// (`ed25519:...`) for the unpadded-base64 public key `public_key`.
pub fn has_valid_signature(object: &Value, signer: &str, key_id: &str, public_key: &str) -> bool {
    let Some(signature) = object
        .pointer(&format!(
            "/signatures/{}/{}",
            escape(signer),
            escape(key_id)
        ))
        .and_then(Value::as_str)
    else {
        return false;
    };
    let (Ok(signature), Ok(public_key)) = (
        STANDARD_NO_PAD.decode(signature.trim_end_matches('=')),
        STANDARD_NO_PAD.decode(public_key.trim_end_matches('=')),
    ) else {
        return false;
    };
    let Ok(canonical) = serde_json::from_value::<CanonicalJsonObject>(object.clone()) else {
        return false;
    };
    let Ok(signed) = to_canonical_json_string_for_signing(&canonical) else {
        return false;
    };
    verify_canonical_json_bytes(
        &SigningKeyAlgorithm::Ed25519,
        &public_key,
        &signature,
        signed.as_bytes(),
    )
    .is_ok()
}

/// Escapes a JSON pointer segment.
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// The ed25519 public key a key object (device or cross-signing key) holds under `key_id`.
pub fn public_key<'a>(keys: &'a Value, key_id: &str) -> Option<&'a str> {
    keys.get("keys")?.get(key_id)?.as_str()
}

/// The single ed25519 key of a cross-signing key object: `(key_id, public key)`.
pub fn cross_signing_public_key(key: &Value) -> Option<(String, String)> {
    let keys = key.get("keys")?.as_object()?;
    let (id, value) = keys.iter().find(|(id, _)| id.starts_with("ed25519:"))?;
    Some((id.clone(), value.as_str()?.to_owned()))
}
