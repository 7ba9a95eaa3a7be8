//! Lookups clients make at start that have nothing to find here: third-party identifiers
//! (none are bound to accounts), third-party protocols (no appservice provides any) and
//! OAuth 2.0 server metadata (this server has no next-generation auth).

use actix_web::{http::StatusCode, web::Data, HttpResponse};
use ruma::api::client::{
    account::get_3pids::v3 as get_3pids, discovery::get_authorization_server_metadata,
    thirdparty::get_protocols::v3 as get_protocols,
};
use serde_json::json;

use crate::{
    api::ruma::Ruma,
    error::{Error, Result},
    service::Services,
};

/// `GET /_matrix/client/v3/account/3pid`: always `{"threepids": []}` (ruma's type would
/// leave the empty list out).
pub async fn get_3pids_route(
    _services: Data<Services>,
    body: Ruma<get_3pids::Request>,
) -> Result<HttpResponse> {
    body.caller()?;
    Ok(HttpResponse::Ok().json(json!({ "threepids": [] })))
}

/// `GET /_matrix/client/v3/thirdparty/protocols`: `{}`.
pub async fn get_protocols_route(
    _services: Data<Services>,
    body: Ruma<get_protocols::Request>,
) -> Result<HttpResponse> {
    body.caller()?;
    Ok(HttpResponse::Ok().json(json!({})))
}

/// `GET /_matrix/client/v1/auth_metadata`: 404 `M_UNRECOGNIZED`, the spec's answer of a
/// server without OAuth 2.0 API support (Synapse without MAS gives the same), so clients
/// use the legacy login API.
pub async fn auth_metadata_route(
    _body: Ruma<get_authorization_server_metadata::v1::Request>,
) -> Result<HttpResponse> {
    Err(Error::unrecognized(StatusCode::NOT_FOUND))
}
