//! End-to-end encryption keys and to-device messages.

use std::collections::BTreeMap;

use actix_web::{web::Data, HttpResponse};
use ruma::api::client::{
    keys::{
        claim_keys::v3 as claim_keys, get_key_changes::v3 as key_changes, get_keys::v3 as get_keys,
        upload_keys::v3 as upload_keys, upload_signatures::v3 as upload_signatures,
        upload_signing_keys::v3 as upload_signing_keys,
    },
    to_device::send_event_to_device::v3 as send_to_device,
};
use ruma::OwnedUserId;
use serde::Serialize;
use serde_json::{json, Value};

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::{
        e2ee::{
            keys::{SigningKeys, Upload},
            remote::DEFAULT_REMOTE_TIMEOUT,
        },
        sync::token::SyncToken,
        uia::Purpose,
        Services,
    },
};

/// A request part as plain JSON (ruma keeps key material as raw JSON already).
fn to_json<T: Serialize>(value: &T) -> Result<Value> {
    serde_json::to_value(value).map_err(|e| Error::bad_json(e.to_string()))
}

fn to_json_map<T: Serialize>(value: &T) -> Result<BTreeMap<String, Value>> {
    serde_json::from_value(to_json(value)?).map_err(|e| Error::bad_json(e.to_string()))
}

/// How long to wait for other servers: the request's `timeout`, at most a minute.
fn remote_timeout(requested: Option<std::time::Duration>) -> std::time::Duration {
    requested
        .unwrap_or(DEFAULT_REMOTE_TIMEOUT)
        .min(std::time::Duration::from_secs(60))
}

/// A key query as `user -> devices` (none: all of them).
pub fn device_lists_of(
    wanted: &BTreeMap<OwnedUserId, Vec<ruma::OwnedDeviceId>>,
) -> BTreeMap<OwnedUserId, Vec<String>> {
    wanted
        .iter()
        .map(|(user, devices)| {
            (
                user.clone(),
                devices.iter().map(|d| d.to_string()).collect(),
            )
        })
        .collect()
}

/// A claim request as `user -> device -> algorithm`.
pub fn claims_of(
    claims: &BTreeMap<OwnedUserId, BTreeMap<ruma::OwnedDeviceId, ruma::OneTimeKeyAlgorithm>>,
) -> BTreeMap<OwnedUserId, BTreeMap<String, String>> {
    claims
        .iter()
        .map(|(user, devices)| {
            (
                user.clone(),
                devices
                    .iter()
                    .map(|(device, algorithm)| (device.to_string(), algorithm.to_string()))
                    .collect(),
            )
        })
        .collect()
}

/// `POST /_matrix/client/v3/keys/upload`
pub async fn upload_keys_route(
    services: Data<Services>,
    body: Ruma<upload_keys::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let request = &body.body;
    let upload = Upload {
        device_keys: request.device_keys.as_ref().map(to_json).transpose()?,
        one_time_keys: to_json_map(&request.one_time_keys)?,
        fallback_keys: to_json_map(&request.fallback_keys)?,
    };
    let counts = services
        .e2ee_keys
        .upload(&caller.user_id, caller.device_id.as_str(), upload)
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "one_time_key_counts": counts })))
}

/// `POST /_matrix/client/v3/keys/query`
pub async fn query_keys_route(
    services: Data<Services>,
    body: Ruma<get_keys::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let wanted = device_lists_of(&body.body.device_keys);
    let timeout = remote_timeout(body.body.timeout);
    let answer = services
        .e2ee_keys
        .query_everywhere(
            &caller.user_id,
            &wanted,
            &services.config.server_name,
            timeout,
        )
        .await?;
    Ok(HttpResponse::Ok().json(answer))
}

/// `POST /_matrix/client/v3/keys/claim`
pub async fn claim_keys_route(
    services: Data<Services>,
    body: Ruma<claim_keys::Request>,
) -> Result<HttpResponse> {
    body.caller()?;
    let wanted = claims_of(&body.body.one_time_keys);
    let timeout = remote_timeout(body.body.timeout);
    let answer = services
        .e2ee_keys
        .claim_everywhere(&wanted, &services.config.server_name, timeout)
        .await?;
    Ok(HttpResponse::Ok().json(answer))
}

/// `GET /_matrix/client/v3/keys/changes`
pub async fn key_changes_route(
    services: Data<Services>,
    body: Ruma<key_changes::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let from = SyncToken::parse(&body.body.from)?;
    let to = SyncToken::parse(&body.body.to)?;
    let (changed, left) = services
        .e2ee_keys
        .changes(
            &caller.user_id,
            (from.device_lists, to.device_lists),
            (from.events, to.events),
        )
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "changed": changed, "left": left })))
}

/// `POST /_matrix/client/v3/keys/device_signing/upload`
pub async fn upload_signing_keys_route(
    services: Data<Services>,
    body: Ruma<upload_signing_keys::Request>,
) -> Result<RumaResponse<upload_signing_keys::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    let keys = SigningKeys {
        master: request.master_key.as_ref().map(to_json).transpose()?,
        self_signing: request.self_signing_key.as_ref().map(to_json).transpose()?,
        user_signing: request.user_signing_key.as_ref().map(to_json).transpose()?,
    };
    // Replacing a master key is the one change that needs the password again.
    let completed = if services
        .e2ee_keys
        .replaces_master_key(&caller.user_id, &keys)
        .await?
    {
        Some(
            services
                .uia
                .check(
                    request.auth.as_ref(),
                    Purpose::Account(&caller.user_id, "POST /keys/device_signing/upload"),
                )
                .await?,
        )
    } else {
        None
    };
    services
        .e2ee_keys
        .upload_signing_keys(
            &caller.user_id,
            keys,
            completed.as_ref().map(|c| (&services.uia, c)),
        )
        .await?;
    Ok(upload_signing_keys::Response::new().into())
}

/// `POST /_matrix/client/v3/keys/signatures/upload`
pub async fn upload_signatures_route(
    services: Data<Services>,
    body: Ruma<upload_signatures::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let signed: BTreeMap<String, BTreeMap<String, Value>> =
        serde_json::from_value(to_json(&body.body.signed_keys)?)
            .map_err(|e| Error::bad_json(e.to_string()))?;
    let answer = services
        .e2ee_keys
        .upload_signatures(&caller.user_id, &signed)
        .await?;
    Ok(HttpResponse::Ok().json(answer))
}

/// `PUT /_matrix/client/v3/sendToDevice/{eventType}/{txnId}`
pub async fn send_to_device_route(
    services: Data<Services>,
    body: Ruma<send_to_device::Request>,
) -> Result<RumaResponse<send_to_device::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    if caller.shadow_banned {
        return Ok(send_to_device::Response::new().into());
    }
    let messages = match to_json(&request.messages)? {
        Value::Object(messages) => messages,
        _ => return Err(Error::bad_json("messages must be an object")),
    };
    services
        .to_device
        .send(
            &caller.user_id,
            caller.device_id.as_str(),
            &request.event_type.to_string(),
            request.txn_id.as_str(),
            &messages,
        )
        .await?;
    Ok(send_to_device::Response::new().into())
}
