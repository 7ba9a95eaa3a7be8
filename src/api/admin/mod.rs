//! Admin API (Synapse-compatible paths, so existing admin tooling such as synapse-admin and
//! Ketesa works). Every route but `server_version` is for server admins only.

mod media;
mod reports;
mod rooms;
mod users;

use std::collections::HashMap;

use actix_web::{http::Method, web, web::Data, HttpResponse};
use ruma::{OwnedRoomId, OwnedUserId};
use serde::Deserialize;
use serde_json::json;

use super::{
    ruma::{Authenticated, JsonBody},
    RouteTable,
};
use crate::{
    error::{Error, Result},
    service::{sessions::Caller, Services},
};

/// Registers the admin routes.
pub fn routes(t: &mut RouteTable) {
    t.raw(
        Method::GET,
        "/_synapse/admin/v1/registration_tokens",
        list_registration_tokens_route,
    );
    t.raw(
        Method::POST,
        "/_synapse/admin/v1/registration_tokens/new",
        create_registration_token_route,
    );
    t.raw(
        Method::DELETE,
        "/_synapse/admin/v1/registration_tokens/{token}",
        delete_registration_token_route,
    );
    t.raw(
        Method::POST,
        "/_synapse/admin/v1/users/{userId}/shadow_ban",
        shadow_ban_route,
    );
    t.raw(
        Method::DELETE,
        "/_synapse/admin/v1/users/{userId}/shadow_ban",
        shadow_unban_route,
    );
    t.raw(
        Method::GET,
        "/_synapse/admin/v1/event_reports",
        reports::list_event_reports_route,
    );
    t.raw(
        Method::GET,
        "/_synapse/admin/v1/event_reports/{report_id}",
        reports::get_event_report_route,
    );
    t.raw(
        Method::DELETE,
        "/_synapse/admin/v1/event_reports/{report_id}",
        reports::delete_event_report_route,
    );
    t.raw(
        Method::GET,
        "/_synapse/admin/v1/server_version",
        server_version_route,
    );
    users::routes(t);
    rooms::routes(t);
    media::routes(t);
}

/// `GET /_synapse/admin/v1/server_version` (unauthenticated, as in Synapse: the admin UIs
/// probe it before logging in).
pub async fn server_version_route() -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "server_version": concat!("myelin ", env!("CARGO_PKG_VERSION")),
    }))
}

/// The query string of an admin list request.
type Query = web::Query<HashMap<String, String>>;

/// An integer query parameter that must not be negative (Synapse's rule for `from`/`limit`).
fn int_param(query: &HashMap<String, String>, name: &str, default: i64) -> Result<i64> {
    match query.get(name) {
        None => Ok(default),
        Some(value) => value.parse().ok().filter(|n: &i64| *n >= 0).ok_or_else(|| {
            Error::invalid_param(format!(
                "Query parameter {name} must be a string representing a positive integer"
            ))
        }),
    }
}

/// A `true`/`false` query parameter; `None` when absent.
fn bool_param(query: &HashMap<String, String>, name: &str) -> Result<Option<bool>> {
    match query.get(name).map(String::as_str) {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(_) => Err(Error::invalid_param(format!(
            "Query parameter {name} must be 'true' or 'false'"
        ))),
    }
}

/// `dir`: whether the list runs backwards (`b`), `default` when absent.
fn backwards_param(query: &HashMap<String, String>, default: bool) -> Result<bool> {
    match query.get("dir").map(String::as_str) {
        None => Ok(default),
        Some("f") => Ok(false),
        Some("b") => Ok(true),
        Some(_) => Err(Error::invalid_param(
            "Query parameter dir must be 'f' or 'b'",
        )),
    }
}

/// A path argument with what actix leaves encoded (`%2F`, `%25`, `%2B`) decoded.
fn path_arg(raw: &str) -> Result<String> {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| Error::invalid_param("Path parameter is not UTF-8"))
}

/// A room ID from the path, sent encoded or raw (the admin UIs do both).
fn parse_room(raw: &str) -> Result<OwnedRoomId> {
    ruma::RoomId::parse(path_arg(raw)?).map_err(|_| Error::invalid_param("Invalid room ID"))
}

fn ensure_admin(caller: &Caller) -> Result<()> {
    if caller.is_admin {
        Ok(())
    } else {
        Err(Error::forbidden("You are not a server admin"))
    }
}

/// Body of `POST /_synapse/admin/v1/registration_tokens/new`.
#[derive(Deserialize)]
pub struct NewRegistrationToken {
    token: Option<String>,
    uses_allowed: Option<i32>,
    expiry_time: Option<i64>,
}

/// `GET /_synapse/admin/v1/registration_tokens`
pub async fn list_registration_tokens_route(
    services: Data<Services>,
    caller: Authenticated,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let tokens = services.registration_tokens.list().await?;
    Ok(HttpResponse::Ok().json(json!({ "registration_tokens": tokens })))
}

/// `POST /_synapse/admin/v1/registration_tokens/new`
pub async fn create_registration_token_route(
    services: Data<Services>,
    caller: Authenticated,
    body: JsonBody<NewRegistrationToken>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let NewRegistrationToken {
        token,
        uses_allowed,
        expiry_time,
    } = body.0;
    let created = services
        .registration_tokens
        .create(token, uses_allowed, expiry_time)
        .await?;
    Ok(HttpResponse::Ok().json(created))
}

/// `DELETE /_synapse/admin/v1/registration_tokens/{token}`
pub async fn delete_registration_token_route(
    services: Data<Services>,
    caller: Authenticated,
    token: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    services.registration_tokens.delete(&token).await?;
    Ok(HttpResponse::Ok().json(json!({})))
}

/// A user ID from the path.
fn parse_user(user_id: &str) -> Result<OwnedUserId> {
    ruma::UserId::parse(path_arg(user_id)?).map_err(|_| Error::invalid_param("Invalid user ID"))
}

/// `POST /_synapse/admin/v1/users/{userId}/shadow_ban`: the user keeps getting success
/// responses, but nothing they send reaches anyone else.
pub async fn shadow_ban_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    services
        .users
        .set_shadow_banned(&parse_user(&user_id)?, true)
        .await?;
    Ok(HttpResponse::Ok().json(json!({})))
}

/// `DELETE /_synapse/admin/v1/users/{userId}/shadow_ban`
pub async fn shadow_unban_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    services
        .users
        .set_shadow_banned(&parse_user(&user_id)?, false)
        .await?;
    Ok(HttpResponse::Ok().json(json!({})))
}
