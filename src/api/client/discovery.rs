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
    error::Result,
    service::{rooms, Services},
};

/// `GET /.well-known/matrix/client`
pub async fn well_known_client_route(services: Data<Services>) -> HttpResponse {
    HttpResponse::Ok()
        .json(json!({ "m.homeserver": { "base_url": services.config.public_baseurl } }))
}

/// `GET /.well-known/matrix/server`
pub async fn well_known_server_route(services: Data<Services>) -> HttpResponse {
    let delegated = delegated_server(&services.config.public_baseurl);
    HttpResponse::Ok().json(json!({ "m.server": delegated }))
}

/// The `host:port` federation is delegated to: the public base URL's host and port, 443 when
/// it names none (an IPv6 literal keeps its brackets; a path is not part of it).
fn delegated_server(public_baseurl: &str) -> String {
    let authority = public_baseurl
        .parse::<http::Uri>()
        .ok()
        .and_then(|uri| uri.authority().cloned());
    match authority {
        Some(authority) => {
            let port = authority.port_u16().unwrap_or(443);
            format!("{}:{port}", authority.host())
        }
        None => String::new(),
    }
}

/// `GET /_matrix/client/versions`
pub async fn versions_route(
    _body: Ruma<get_supported_versions::Request>,
) -> Result<RumaResponse<get_supported_versions::Response>> {
    let versions = rooms::SPEC_VERSIONS.iter().map(|v| v.to_string()).collect();
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
    let available = rooms::SUPPORTED_VERSIONS
        .into_iter()
        .map(|v| (v, RoomVersionStability::Stable))
        .collect();
    let mut caps = Capabilities::new();
    caps.room_versions = RoomVersionsCapability::new(rooms::DEFAULT_VERSION, available);
    caps.profile_fields = Some(ProfileFieldsCapability::new(true));
    Ok(capabilities::Response::new(caps).into())
}

#[cfg(test)]
mod tests {
    use super::delegated_server;

    #[test]
    fn delegation_keeps_ports_and_ipv6_brackets() {
        assert_eq!(delegated_server("https://example.org"), "example.org:443");
        assert_eq!(
            delegated_server("https://example.org/matrix/"),
            "example.org:443"
        );
        assert_eq!(
            delegated_server("http://example.org:8448/"),
            "example.org:8448"
        );
        assert_eq!(delegated_server("https://[::1]/"), "[::1]:443");
        assert_eq!(delegated_server("http://[::1]:8008"), "[::1]:8008");
    }
}
