//! Server-side key backup (`/room_keys/...`).

use actix_web::{web::Data, HttpResponse};
use ruma::api::client::backup::{
    add_backup_keys::v3 as add_keys, add_backup_keys_for_room::v3 as add_room_keys,
    add_backup_keys_for_session::v3 as add_session_key,
    create_backup_version::v3 as create_version, delete_backup_keys::v3 as delete_keys,
    delete_backup_keys_for_room::v3 as delete_room_keys,
    delete_backup_keys_for_session::v3 as delete_session_key,
    delete_backup_version::v3 as delete_version, get_backup_info::v3 as get_version,
    get_backup_keys::v3 as get_keys, get_backup_keys_for_room::v3 as get_room_keys,
    get_backup_keys_for_session::v3 as get_session_key,
    get_latest_backup_info::v3 as get_latest_version, update_backup_version::v3 as update_version,
};
use serde_json::{json, Map, Value};

use crate::{
    api::ruma::Ruma,
    error::{Error, Result},
    service::{e2ee::backup::Selector, Services},
};

fn ok(value: Value) -> Result<HttpResponse> {
    Ok(HttpResponse::Ok().json(value))
}

/// `{algorithm, auth_data}` of a backup version request.
fn algorithm(raw: &impl serde::Serialize) -> Result<(String, Value)> {
    let value = serde_json::to_value(raw).map_err(|e| Error::bad_json(e.to_string()))?;
    let algorithm = value
        .get("algorithm")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::bad_json("algorithm is required"))?
        .to_owned();
    let auth_data = value
        .get("auth_data")
        .filter(|a| a.is_object())
        .cloned()
        .ok_or_else(|| Error::bad_json("auth_data must be an object"))?;
    Ok((algorithm, auth_data))
}

fn object(value: &impl serde::Serialize) -> Result<Map<String, Value>> {
    match serde_json::to_value(value).map_err(|e| Error::bad_json(e.to_string()))? {
        Value::Object(map) => Ok(map),
        _ => Err(Error::bad_json("expected an object")),
    }
}

/// `POST /_matrix/client/v3/room_keys/version`
pub async fn create_version_route(
    services: Data<Services>,
    body: Ruma<create_version::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let (algorithm, auth_data) = algorithm(&body.body.algorithm)?;
    let version = services
        .backup
        .create_version(&caller.user_id, &algorithm, &auth_data)
        .await?;
    ok(json!({ "version": version }))
}

/// `GET /_matrix/client/v3/room_keys/version`
pub async fn get_latest_version_route(
    services: Data<Services>,
    body: Ruma<get_latest_version::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    ok(services.backup.version_info(&caller.user_id, None).await?)
}

/// `GET /_matrix/client/v3/room_keys/version/{version}`
pub async fn get_version_route(
    services: Data<Services>,
    body: Ruma<get_version::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    ok(services
        .backup
        .version_info(&caller.user_id, Some(&body.body.version))
        .await?)
}

/// `PUT /_matrix/client/v3/room_keys/version/{version}`
pub async fn update_version_route(
    services: Data<Services>,
    body: Ruma<update_version::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let (algorithm, auth_data) = algorithm(&body.body.algorithm)?;
    services
        .backup
        .update_version(&caller.user_id, &body.body.version, &algorithm, &auth_data)
        .await?;
    ok(json!({}))
}

/// `DELETE /_matrix/client/v3/room_keys/version/{version}`
pub async fn delete_version_route(
    services: Data<Services>,
    body: Ruma<delete_version::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    services
        .backup
        .delete_version(&caller.user_id, &body.body.version)
        .await?;
    ok(json!({}))
}

/// `PUT /_matrix/client/v3/room_keys/keys`
pub async fn put_keys_route(
    services: Data<Services>,
    body: Ruma<add_keys::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let rooms: Map<String, Value> = object(&body.body.rooms)?
        .into_iter()
        .map(|(room, backup)| (room, backup.get("sessions").cloned().unwrap_or_default()))
        .collect();
    ok(services
        .backup
        .put_keys(&caller.user_id, &body.body.version, &rooms)
        .await?)
}

/// `PUT /_matrix/client/v3/room_keys/keys/{roomId}`
pub async fn put_room_keys_route(
    services: Data<Services>,
    body: Ruma<add_room_keys::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let request = &body.body;
    let mut rooms = Map::new();
    rooms.insert(
        request.room_id.to_string(),
        Value::Object(object(&request.sessions)?),
    );
    ok(services
        .backup
        .put_keys(&caller.user_id, &request.version, &rooms)
        .await?)
}

/// `PUT /_matrix/client/v3/room_keys/keys/{roomId}/{sessionId}`
pub async fn put_session_key_route(
    services: Data<Services>,
    body: Ruma<add_session_key::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let request = &body.body;
    let key =
        serde_json::to_value(&request.session_data).map_err(|e| Error::bad_json(e.to_string()))?;
    let rooms = Map::from_iter([(
        request.room_id.to_string(),
        json!({ request.session_id.clone(): key }),
    )]);
    ok(services
        .backup
        .put_keys(&caller.user_id, &request.version, &rooms)
        .await?)
}

/// `GET /_matrix/client/v3/room_keys/keys`
pub async fn get_keys_route(
    services: Data<Services>,
    body: Ruma<get_keys::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    ok(services
        .backup
        .get_keys(&caller.user_id, &body.body.version, Selector::default())
        .await?)
}

/// `GET /_matrix/client/v3/room_keys/keys/{roomId}`
pub async fn get_room_keys_route(
    services: Data<Services>,
    body: Ruma<get_room_keys::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let request = &body.body;
    let selector = Selector {
        room_id: Some(request.room_id.as_str()),
        session_id: None,
    };
    ok(services
        .backup
        .get_keys(&caller.user_id, &request.version, selector)
        .await?)
}

/// `GET /_matrix/client/v3/room_keys/keys/{roomId}/{sessionId}`
pub async fn get_session_key_route(
    services: Data<Services>,
    body: Ruma<get_session_key::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let request = &body.body;
    let selector = Selector {
        room_id: Some(request.room_id.as_str()),
        session_id: Some(request.session_id.as_str()),
    };
    ok(services
        .backup
        .get_keys(&caller.user_id, &request.version, selector)
        .await?)
}

/// `DELETE /_matrix/client/v3/room_keys/keys`
pub async fn delete_keys_route(
    services: Data<Services>,
    body: Ruma<delete_keys::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    ok(services
        .backup
        .delete_keys(&caller.user_id, &body.body.version, Selector::default())
        .await?)
}

/// `DELETE /_matrix/client/v3/room_keys/keys/{roomId}`
pub async fn delete_room_keys_route(
    services: Data<Services>,
    body: Ruma<delete_room_keys::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let request = &body.body;
    let selector = Selector {
        room_id: Some(request.room_id.as_str()),
        session_id: None,
    };
    ok(services
        .backup
        .delete_keys(&caller.user_id, &request.version, selector)
        .await?)
}

/// `DELETE /_matrix/client/v3/room_keys/keys/{roomId}/{sessionId}`
pub async fn delete_session_key_route(
    services: Data<Services>,
    body: Ruma<delete_session_key::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let request = &body.body;
    let selector = Selector {
        room_id: Some(request.room_id.as_str()),
        session_id: Some(request.session_id.as_str()),
    };
    ok(services
        .backup
        .delete_keys(&caller.user_id, &request.version, selector)
        .await?)
}
