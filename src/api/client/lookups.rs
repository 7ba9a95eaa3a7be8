//! Lookups clients make at start that have nothing to find here: third-party identifiers
//! (none are bound to accounts). (Third-party protocols are in `thirdparty`. OAuth 2.0
//! server metadata, `/auth_metadata`, is not routed at all: its 404 `M_UNRECOGNIZED` is what
//! the spec has a server without the OAuth 2.0 API answer.)

use actix_web::{web::Data, HttpResponse};
use ruma::api::client::account::get_3pids::v3 as get_3pids;
use serde_json::json;

use crate::{api::ruma::Ruma, error::Result, service::Services};

/// `GET /_matrix/client/v3/account/3pid`: always `{"threepids": []}` (ruma's type would
/// leave the empty list out).
pub async fn get_3pids_route(
    _services: Data<Services>,
    body: Ruma<get_3pids::Request>,
) -> Result<HttpResponse> {
    body.caller()?;
    Ok(HttpResponse::Ok().json(json!({ "threepids": [] })))
}
