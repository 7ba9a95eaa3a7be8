//! Dehydrated devices (MSC3814), at Synapse's unstable paths.

use std::collections::BTreeMap;

use actix_web::{
    web::{Data, Path, Query},
    HttpResponse,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{
    api::ruma::{Authenticated, JsonBody},
    error::{Error, Result},
    service::{
        dehydrated_devices::{describe, NewDehydratedDevice},
        e2ee::keys::Upload,
        Services,
    },
};

/// `PUT /dehydrated_device` body.
#[derive(Deserialize)]
pub struct PutBody {
    device_id: String,
    device_data: Value,
    initial_device_display_name: Option<String>,
    device_keys: Option<Value>,
    #[serde(default)]
    one_time_keys: BTreeMap<String, Value>,
    #[serde(default)]
    fallback_keys: BTreeMap<String, Value>,
}

/// `GET /_matrix/client/unstable/org.matrix.msc3814.v1/dehydrated_device`
pub async fn get_route(services: Data<Services>, caller: Authenticated) -> Result<HttpResponse> {
    let (device_id, data) = services.dehydrated_devices.get(&caller.0.user_id).await?;
    Ok(HttpResponse::Ok().json(describe(&device_id, &data)))
}

/// `PUT /_matrix/client/unstable/org.matrix.msc3814.v1/dehydrated_device`
pub async fn put_route(
    services: Data<Services>,
    caller: Authenticated,
    body: JsonBody<PutBody>,
) -> Result<HttpResponse> {
    let body = body.0;
    if body.device_id.is_empty() || body.device_id.len() > 255 {
        return Err(Error::invalid_param(
            "device_id must be 1 to 255 characters",
        ));
    }
    if !body.device_data.is_object() {
        return Err(Error::bad_json("device_data must be an object"));
    }
    let device_id = body.device_id.clone();
    let new = NewDehydratedDevice {
        device_id: body.device_id,
        device_data: body.device_data,
        display_name: body.initial_device_display_name,
        keys: Upload {
            device_keys: body.device_keys,
            one_time_keys: body.one_time_keys,
            fallback_keys: body.fallback_keys,
        },
    };
    services
        .dehydrated_devices
        .put(&services.e2ee_keys, &caller.0.user_id, new)
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "device_id": device_id })))
}

/// `DELETE /_matrix/client/unstable/org.matrix.msc3814.v1/dehydrated_device`
pub async fn delete_route(services: Data<Services>, caller: Authenticated) -> Result<HttpResponse> {
    let device_id = services
        .dehydrated_devices
        .delete(&caller.0.user_id)
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "device_id": device_id })))
}

/// `POST .../dehydrated_device/{deviceId}/events` body (the earlier draft's form).
#[derive(Deserialize)]
pub struct EventsBody {
    next_batch: Option<String>,
}

/// `?from=` of the `GET` form.
#[derive(Deserialize)]
pub struct EventsQuery {
    from: Option<String>,
}

/// `POST /_matrix/client/unstable/org.matrix.msc3814.v1/dehydrated_device/{deviceId}/events`:
/// always answers `next_batch`.
pub async fn post_events_route(
    services: Data<Services>,
    caller: Authenticated,
    device_id: Path<String>,
    body: JsonBody<EventsBody>,
) -> Result<HttpResponse> {
    let batch = services
        .dehydrated_devices
        .events(&caller.0.user_id, &device_id, body.0.next_batch.as_deref())
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "events": batch.events, "next_batch": batch.next_batch })))
}

/// `GET /_matrix/client/unstable/org.matrix.msc3814.v1/dehydrated_device/{deviceId}/events`:
/// answers `next_batch` only while more are waiting.
pub async fn get_events_route(
    services: Data<Services>,
    caller: Authenticated,
    device_id: Path<String>,
    query: Query<EventsQuery>,
) -> Result<HttpResponse> {
    let batch = services
        .dehydrated_devices
        .events(&caller.0.user_id, &device_id, query.from.as_deref())
        .await?;
    let mut answer = json!({ "events": batch.events });
    if batch.limited {
        answer["next_batch"] = batch.next_batch.into();
    }
    Ok(HttpResponse::Ok().json(answer))
}
