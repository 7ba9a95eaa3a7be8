//! Device management.

use actix_web::{web::Data, Either, HttpResponse};
use ruma::{
    api::client::device::{
        delete_device::v3 as delete_device, delete_devices::v3 as delete_devices,
        get_device::v3 as get_device, get_devices::v3 as get_devices,
        update_device::v3 as update_device, Device,
    },
    MilliSecondsSinceUnixEpoch, UInt,
};
use serde_json::json;

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::Result,
    service::{uia::Purpose, users, Services},
};

fn to_ruma(row: users::Device) -> Device {
    let mut device = Device::new(row.device_id.into());
    device.display_name = row.display_name;
    device.last_seen_ip = row.last_seen_ip;
    device.last_seen_ts = row
        .last_seen_ts
        .and_then(|ts| UInt::new(ts as u64))
        .map(MilliSecondsSinceUnixEpoch);
    device
}

/// `GET /_matrix/client/v3/devices`
pub async fn get_devices_route(
    services: Data<Services>,
    body: Ruma<get_devices::Request>,
) -> Result<RumaResponse<get_devices::Response>> {
    let caller = body.caller()?;
    let devices = services
        .users
        .get_devices(&caller.user_id)
        .await?
        .into_iter()
        .map(to_ruma)
        .collect();
    Ok(get_devices::Response::new(devices).into())
}

/// `GET /_matrix/client/v3/devices/{deviceId}`
pub async fn get_device_route(
    services: Data<Services>,
    body: Ruma<get_device::Request>,
) -> Result<RumaResponse<get_device::Response>> {
    let caller = body.caller()?;
    let device = services
        .users
        .get_device(&caller.user_id, body.body.device_id.as_str())
        .await?;
    Ok(get_device::Response::new(to_ruma(device)).into())
}

/// `PUT /_matrix/client/v3/devices/{deviceId}`
pub async fn update_device_route(
    services: Data<Services>,
    body: Ruma<update_device::Request>,
) -> Result<Either<RumaResponse<update_device::Response>, HttpResponse>> {
    let caller = body.caller()?;
    let request = &body.body;
    // MSC4190: an appservice creates its users' devices this way (201), then names them.
    if caller.appservice.is_some()
        && services
            .users
            .create_device(
                &caller.user_id,
                request.device_id.as_str(),
                request.display_name.as_deref(),
            )
            .await?
    {
        return Ok(Either::Right(HttpResponse::Created().json(json!({}))));
    }
    services
        .users
        .rename_device(
            &caller.user_id,
            request.device_id.as_str(),
            request.display_name.as_deref(),
        )
        .await?;
    Ok(Either::Left(update_device::Response::new().into()))
}

/// `DELETE /_matrix/client/v3/devices/{deviceId}`
pub async fn delete_device_route(
    services: Data<Services>,
    body: Ruma<delete_device::Request>,
) -> Result<RumaResponse<delete_device::Response>> {
    let caller = body.caller()?;
    let device_id = body.body.device_id.as_str();
    services
        .users
        .get_device(&caller.user_id, device_id)
        .await?;
    let operation = format!("DELETE /devices/{device_id}");
    let completed = services
        .uia
        .check(
            body.body.auth.as_ref(),
            Purpose::Account(&caller.user_id, &operation),
        )
        .await?;
    services
        .users
        .delete_devices(
            &caller.user_id,
            &[device_id.to_owned()],
            Some((&services.uia, &completed)),
        )
        .await?;
    Ok(delete_device::Response::new().into())
}

/// `POST /_matrix/client/v3/delete_devices`
pub async fn delete_devices_route(
    services: Data<Services>,
    body: Ruma<delete_devices::Request>,
) -> Result<RumaResponse<delete_devices::Response>> {
    let caller = body.caller()?;
    let completed = services
        .uia
        .check(
            body.body.auth.as_ref(),
            Purpose::Account(&caller.user_id, "POST /delete_devices"),
        )
        .await?;
    let ids: Vec<String> = body.body.devices.iter().map(|d| d.to_string()).collect();
    services
        .users
        .delete_devices(&caller.user_id, &ids, Some((&services.uia, &completed)))
        .await?;
    Ok(delete_devices::Response::new().into())
}
