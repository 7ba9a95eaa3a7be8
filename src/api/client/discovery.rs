//! Server discovery: `.well-known`, `/versions` and `/capabilities`.

use std::collections::BTreeMap;

use actix_web::{web::Data, HttpResponse};
use ruma::{
    api::client::discovery::{
        get_capabilities::v3::{
            self as capabilities, Capabilities, ProfileFieldsCapability, RoomVersionStability,
            RoomVersionsCapability,
        },
        get_supported_versions,
    },
    RoomVersionId,
};
use serde_json::json;

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::Services,
};

/// Matrix versions whose Client-Server wire formats we follow for every endpoint we serve.
const SUPPORTED_VERSIONS: &[&str] = &[
    "r0.5.0", "r0.6.0", "r0.6.1", "v1.1", "v1.2", "v1.3", "v1.4", "v1.5", "v1.6", "v1.7", "v1.8",
    "v1.9", "v1.10",
];

/// `GET /.well-known/matrix/client`
pub async fn well_known_client_route(services: Data<Services>) -> HttpResponse {
    HttpResponse::Ok()
        .json(json!({ "m.homeserver": { "base_url": services.config.public_baseurl } }))
}

/// `GET /.well-known/matrix/server`
///
/// 404 `M_NOT_FOUND` while federation is not implemented: a delegation would send remote
/// servers to a server-server API this server does not serve. (Remote servers then try the
/// server name itself on port 8448, and fail there too, which is the truth.)
pub async fn well_known_server_route() -> Result<HttpResponse> {
    Err(Error::not_found("This server does not federate"))
}

/// `GET /_matrix/client/versions`
pub async fn versions_route(
    _body: Ruma<get_supported_versions::Request>,
) -> Result<RumaResponse<get_supported_versions::Response>> {
    let versions = SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect();
    let mut response = get_supported_versions::Response::new(versions);
    response.unstable_features = BTreeMap::new();
    Ok(response.into())
}

/// `GET /_matrix/client/v3/capabilities`
pub async fn capabilities_route(
    _services: Data<Services>,
    body: Ruma<capabilities::Request>,
) -> Result<RumaResponse<capabilities::Response>> {
    body.caller()?;
    let available = [RoomVersionId::V10, RoomVersionId::V11, RoomVersionId::V12]
        .into_iter()
        .map(|v| (v, RoomVersionStability::Stable))
        .collect();
    let mut caps = Capabilities::new();
    caps.room_versions = RoomVersionsCapability::new(RoomVersionId::V12, available);
    caps.profile_fields = Some(ProfileFieldsCapability::new(true));
    Ok(capabilities::Response::new(caps).into())
}
