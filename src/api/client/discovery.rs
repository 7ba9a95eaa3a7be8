//! Server discovery: `.well-known`, `/versions` and `/capabilities`.

use std::collections::BTreeMap;

use actix_web::{web::Data, HttpResponse};
use ruma::api::client::discovery::{
    get_capabilities::v3::{
        self as capabilities, Capabilities, ProfileFieldsCapability, RoomVersionStability,
        RoomVersionsCapability,
    },
    get_supported_versions,
};
use serde_json::json;

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::{rooms, Services},
};

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
pub async fn well_known_server_route(services: Data<Services>) -> Result<HttpResponse> {
    match &services.config.federation.well_known_server {
        Some(server) if services.federation.enabled() => {
            Ok(HttpResponse::Ok().json(serde_json::json!({ "m.server": server })))
        }
        _ => Err(Error::not_found("No server delegation is configured")),
    }
}

/// `GET /_matrix/client/versions`
pub async fn versions_route(
    services: Data<Services>,
    _body: Ruma<get_supported_versions::Request>,
) -> Result<RumaResponse<get_supported_versions::Response>> {
    let versions = rooms::SPEC_VERSIONS.iter().map(|v| v.to_string()).collect();
    let mut response = get_supported_versions::Response::new(versions);
    // Simplified sliding sync (MSC4186), room summaries (MSC3266, also at their unstable
    // paths), delayed events (MSC4140, when configured), dehydrated devices (MSC3814).
    response.unstable_features = BTreeMap::from([
        ("org.matrix.simplified_msc3575".to_owned(), true),
        ("org.matrix.msc3266".to_owned(), true),
        (
            "org.matrix.msc4140".to_owned(),
            services.delayed_events.max_delay_ms().is_some(),
        ),
        ("org.matrix.msc3814".to_owned(), true),
    ]);
    Ok(response.into())
}

/// `GET /_matrix/client/v3/capabilities`
pub async fn capabilities_route(
    services: Data<Services>,
    body: Ruma<capabilities::Request>,
) -> Result<RumaResponse<capabilities::Response>> {
    body.caller()?;
    let available = rooms::SUPPORTED_VERSIONS
        .into_iter()
        .map(|v| (v, RoomVersionStability::Stable))
        .collect();
    let mut caps = Capabilities::new();
    caps.room_versions = RoomVersionsCapability::new(rooms::DEFAULT_VERSION, available);
    caps.profile_fields = Some(ProfileFieldsCapability::new(true));
    caps.set(
        "org.matrix.msc4140.delayed_events",
        json!({
            "max_delay_ms": services.delayed_events.max_delay_ms().unwrap_or(0),
            "max_scheduled": crate::service::delayed_events::MAX_SCHEDULED_PER_USER,
        }),
    )
    .map_err(Error::internal)?;
    Ok(capabilities::Response::new(caps).into())
}
