//! E2EE over federation: `user/devices`, `user/keys/query` and `user/keys/claim` for our users.

use actix_web::{web::Data, HttpResponse};
use ruma::api::federation::{
    device::get_devices::v1 as get_devices,
    keys::{claim_keys::v1 as claim_keys, get_keys::v1 as get_keys},
};

use crate::{
    api::{
        client::keys::{claims_of, device_lists_of},
        ruma::Ruma,
    },
    error::Result,
    service::Services,
};

/// `GET /_matrix/federation/v1/user/devices/{userId}`
pub async fn user_devices_route(
    services: Data<Services>,
    body: Ruma<get_devices::Request>,
) -> Result<HttpResponse> {
    let answer = services
        .e2ee_keys
        .devices_for_server(&body.body.user_id, &services.config.server_name)
        .await?;
    Ok(HttpResponse::Ok().json(answer))
}

/// `POST /_matrix/federation/v1/user/keys/query`
pub async fn keys_query_route(
    services: Data<Services>,
    body: Ruma<get_keys::Request>,
) -> Result<HttpResponse> {
    let wanted = device_lists_of(&body.body.device_keys);
    let answer = services
        .e2ee_keys
        .query_for_server(&wanted, &services.config.server_name)
        .await?;
    Ok(HttpResponse::Ok().json(answer))
}

/// `POST /_matrix/federation/v1/user/keys/claim`
pub async fn keys_claim_route(
    services: Data<Services>,
    body: Ruma<claim_keys::Request>,
) -> Result<HttpResponse> {
    let answer = services
        .e2ee_keys
        .claim_for_server(
            &claims_of(&body.body.one_time_keys),
            &services.config.server_name,
        )
        .await?;
    Ok(HttpResponse::Ok().json(answer))
}
