//! `GET /_matrix/key/v2/server` and `GET /_matrix/federation/v1/version`.

use actix_web::{web::Data, HttpResponse};
use ruma::api::federation::discovery::{get_server_keys, get_server_version};

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::Result,
    service::Services,
};

/// `GET /_matrix/key/v2/server`: our signing key, self-signed.
pub async fn server_keys_route(
    services: Data<Services>,
    _body: Ruma<get_server_keys::v2::Request>,
) -> Result<HttpResponse> {
    let document = services.keys.key_document(&services.config.server_name)?;
    Ok(HttpResponse::Ok().json(document))
}

/// `GET /_matrix/federation/v1/version`.
pub async fn version_route(
    _body: Ruma<get_server_version::v1::Request>,
) -> Result<RumaResponse<get_server_version::v1::Response>> {
    let mut server = get_server_version::v1::Server::new();
    server.name = Some("Myelin".into());
    server.version = Some(env!("CARGO_PKG_VERSION").into());
    let mut response = get_server_version::v1::Response::new();
    response.server = Some(server);
    Ok(response.into())
}
