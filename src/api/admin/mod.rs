//! Admin API (Synapse-compatible paths, so existing admin tooling works).

mod reports;

use actix_web::{http::Method, web, web::Data, HttpResponse};
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

fn parse_user(user_id: &str) -> Result<ruma::OwnedUserId> {
    ruma::UserId::parse(user_id).map_err(|_| Error::invalid_param("Invalid user ID"))
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
