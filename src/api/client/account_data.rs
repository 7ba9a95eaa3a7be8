//! Global and per-room account data.

use actix_web::web::Data;
use ruma::{
    api::client::config::{
        get_global_account_data::v3 as get_global, get_room_account_data::v3 as get_room,
        set_global_account_data::v3 as set_global, set_room_account_data::v3 as set_room,
    },
    serde::Raw,
};
use serde_json::{value::to_raw_value, Value};

use super::ensure_self;
use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::Services,
};

fn to_raw<T>(value: &Value) -> Result<Raw<T>> {
    Ok(Raw::from_json(
        to_raw_value(value).map_err(Error::internal)?,
    ))
}

fn from_raw<T>(raw: &Raw<T>) -> Result<Value> {
    serde_json::from_str(raw.json().get()).map_err(|e| Error::bad_json(e.to_string()))
}

/// `GET /_matrix/client/v3/user/{userId}/account_data/{type}`
pub async fn get_global_route(
    services: Data<Services>,
    body: Ruma<get_global::Request>,
) -> Result<RumaResponse<get_global::Response>> {
    let caller = body.caller()?;
    ensure_self(&caller.user_id, &body.body.user_id, "get account data")?;
    let content = services
        .account_data
        .get(&caller.user_id, None, &body.body.event_type.to_string())
        .await?;
    Ok(get_global::Response::new(to_raw(&content)?).into())
}

/// `PUT /_matrix/client/v3/user/{userId}/account_data/{type}`
pub async fn set_global_route(
    services: Data<Services>,
    body: Ruma<set_global::Request>,
) -> Result<RumaResponse<set_global::Response>> {
    let caller = body.caller()?;
    ensure_self(&caller.user_id, &body.body.user_id, "add account data")?;
    let content = from_raw(&body.body.data)?;
    services
        .account_data
        .set(
            &caller.user_id,
            None,
            &body.body.event_type.to_string(),
            &content,
        )
        .await?;
    Ok(set_global::Response::new().into())
}

/// `GET /_matrix/client/v3/user/{userId}/rooms/{roomId}/account_data/{type}`
pub async fn get_room_route(
    services: Data<Services>,
    body: Ruma<get_room::Request>,
) -> Result<RumaResponse<get_room::Response>> {
    let caller = body.caller()?;
    ensure_self(&caller.user_id, &body.body.user_id, "get account data")?;
    let request = &body.body;
    let content = services
        .account_data
        .get(
            &caller.user_id,
            Some(&request.room_id),
            &request.event_type.to_string(),
        )
        .await?;
    Ok(get_room::Response::new(to_raw(&content)?).into())
}

/// `PUT /_matrix/client/v3/user/{userId}/rooms/{roomId}/account_data/{type}`
pub async fn set_room_route(
    services: Data<Services>,
    body: Ruma<set_room::Request>,
) -> Result<RumaResponse<set_room::Response>> {
    let caller = body.caller()?;
    ensure_self(&caller.user_id, &body.body.user_id, "add account data")?;
    let request = &body.body;
    let content = from_raw(&request.data)?;
    services
        .account_data
        .set(
            &caller.user_id,
            Some(&request.room_id),
            &request.event_type.to_string(),
            &content,
        )
        .await?;
    Ok(set_room::Response::new().into())
}
