//! `/_synapse/admin/.../users/...`: the user list, one user's details and changes, devices,
//! rooms, rate-limit overrides, deactivation and password resets.

use std::collections::HashMap;

use actix_web::{http::Method, web, web::Data, HttpResponse};
use serde_json::{json, Map, Value};

use super::{
    backwards_param, bool_param, ensure_admin, int_param, parse_user, path_arg, Query, RouteTable,
};
use crate::{
    api::ruma::{Authenticated, JsonBody},
    error::{Error, Result},
    service::{
        admin::{UserUpdate, MAX_PAGE},
        Services,
    },
    storage::admin_users::{UserOrder, UserQuery},
};

/// Users per page unless `limit` says otherwise (Synapse's default).
const DEFAULT_LIMIT: i64 = 100;

/// Registers the user routes.
pub fn routes(t: &mut RouteTable) {
    t.raw(Method::GET, "/_synapse/admin/v2/users", list_users_v2_route);
    t.raw(Method::GET, "/_synapse/admin/v3/users", list_users_v3_route);
    let user = "/_synapse/admin/v2/users/{user_id}";
    t.raw(Method::GET, user, get_user_route);
    t.raw(Method::PUT, user, put_user_route);
    let v1 = "/_synapse/admin/v1";
    t.raw(
        Method::POST,
        &format!("{v1}/deactivate/{{user_id}}"),
        deactivate_route,
    );
    t.raw(
        Method::POST,
        &format!("{v1}/reset_password/{{user_id}}"),
        reset_password_route,
    );
    t.raw(Method::GET, &format!("{v1}/whois/{{user_id}}"), whois_route);
    let user_v1 = format!("{v1}/users/{{user_id}}");
    t.raw(Method::GET, &format!("{user_v1}/admin"), get_admin_route);
    t.raw(Method::PUT, &format!("{user_v1}/admin"), put_admin_route);
    let ratelimit = format!("{user_v1}/override_ratelimit");
    t.raw(Method::GET, &ratelimit, get_ratelimit_route);
    t.raw(Method::POST, &ratelimit, set_ratelimit_route);
    t.raw(Method::DELETE, &ratelimit, delete_ratelimit_route);
    t.raw(
        Method::GET,
        &format!("{user_v1}/joined_rooms"),
        joined_rooms_route,
    );
    t.raw(
        Method::GET,
        &format!("{user_v1}/memberships"),
        memberships_route,
    );
    t.raw(Method::GET, &format!("{user_v1}/media"), user_media_route);
    t.raw(Method::POST, &format!("{user_v1}/login"), login_as_route);
    let devices = format!("{user}/devices");
    t.raw(Method::GET, &devices, list_devices_route);
    t.raw(Method::POST, &devices, create_device_route);
    t.raw(
        Method::GET,
        "/_synapse/admin/v1/username_available",
        username_available_route,
    );
    t.raw(
        Method::POST,
        &format!("{user}/delete_devices"),
        delete_devices_route,
    );
    let device = format!("{devices}/{{device_id}}");
    t.raw(Method::GET, &device, get_device_route);
    t.raw(Method::PUT, &device, put_device_route);
    t.raw(Method::DELETE, &device, delete_device_route);
}

fn order_param(query: &HashMap<String, String>) -> Result<UserOrder> {
    Ok(match query.get("order_by").map(String::as_str) {
        // Every account here is a full one with no type, so those orders are by name.
        None | Some("name" | "is_guest" | "user_type" | "locked" | "approved") => UserOrder::Name,
        Some("admin") => UserOrder::Admin,
        Some("deactivated") => UserOrder::Deactivated,
        Some("shadow_banned") => UserOrder::ShadowBanned,
        Some("displayname") => UserOrder::Displayname,
        Some("avatar_url") => UserOrder::AvatarUrl,
        Some("creation_ts") => UserOrder::CreationTs,
        Some("last_seen_ts") => UserOrder::LastSeenTs,
        Some(_) => return Err(Error::invalid_param("Unknown value for order_by")),
    })
}

/// The user list; `deactivated` differs between the versions: v2 reads `true` as "include
/// them" (excluded by default), v3 as "only them" (`false`: none, absent: all).
async fn list_users(
    services: &Services,
    query: &HashMap<String, String>,
    v3: bool,
) -> Result<HttpResponse> {
    let deactivated = bool_param(query, "deactivated")?;
    let deactivated = match (v3, deactivated) {
        (true, filter) => filter,
        (false, Some(true)) => None,
        (false, _) => Some(false),
    };
    bool_param(query, "guests")?;
    let user_query = UserQuery {
        user_id: query.get("user_id").cloned(),
        name: query.get("name").cloned(),
        deactivated,
        admins: bool_param(query, "admins")?,
        order: Some((order_param(query)?, backwards_param(query, false)?)),
    };
    let page = services
        .admin
        .list_users(
            &user_query,
            int_param(query, "from", 0)?,
            int_param(query, "limit", DEFAULT_LIMIT)?,
        )
        .await?;
    let mut body = json!({ "users": page.users, "total": page.total });
    if let Some(next) = page.next_token {
        // A string here, unlike the other lists' integers (as Synapse sends it).
        body["next_token"] = json!(next.to_string());
    }
    Ok(HttpResponse::Ok().json(body))
}

/// `GET /_synapse/admin/v2/users`
pub async fn list_users_v2_route(
    services: Data<Services>,
    caller: Authenticated,
    query: Query,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    list_users(&services, &query, false).await
}

/// `GET /_synapse/admin/v3/users`
pub async fn list_users_v3_route(
    services: Data<Services>,
    caller: Authenticated,
    query: Query,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    list_users(&services, &query, true).await
}

/// `GET /_synapse/admin/v2/users/{userId}`
pub async fn get_user_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    services.admin.ensure_local(&user_id)?;
    Ok(HttpResponse::Ok().json(services.admin.get_user(&user_id).await?))
}

/// A field of a JSON body: absent and `null` both mean "not given".
fn field<T: serde::de::DeserializeOwned>(
    body: &Map<String, Value>,
    name: &str,
    what: &str,
) -> Result<Option<T>> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => serde_json::from_value(value.clone())
            .map(Some)
            .map_err(|_| Error::invalid_param(format!("'{name}' must be {what}"))),
    }
}

/// `PUT /_synapse/admin/v2/users/{userId}`: creates the user (201) or changes the fields given
/// (200); fields it does not know (the UIs send their whole record) are ignored.
pub async fn put_user_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
    body: JsonBody<Map<String, Value>>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    let body = body.0;
    let update = UserUpdate {
        password: field(&body, "password", "a string")?,
        logout_devices: field(&body, "logout_devices", "a boolean")?.unwrap_or(true),
        displayname: field(&body, "displayname", "a string")?,
        avatar_url: field(&body, "avatar_url", "a string")?,
        admin: field(&body, "admin", "a boolean")?,
        deactivated: field(&body, "deactivated", "a boolean")?,
    };
    if update.admin == Some(false) && user_id == caller.0.user_id {
        return Err(Error::invalid_param("You may not demote yourself."));
    }
    let (created, user) = services
        .admin
        .create_or_modify_user(&services.users, &services.rooms, &user_id, update)
        .await?;
    Ok(if created {
        HttpResponse::Created().json(user)
    } else {
        HttpResponse::Ok().json(user)
    })
}

/// `POST /_synapse/admin/v1/deactivate/{userId}`, body `{"erase": bool}` (optional).
pub async fn deactivate_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
    body: JsonBody<Map<String, Value>>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    let erase = field(&body.0, "erase", "a boolean")?.unwrap_or(false);
    services
        .admin
        .deactivate_user(&services.users, &services.rooms, &user_id, erase)
        .await?;
    // No identity server is ever bound, so there is nothing to unbind.
    Ok(HttpResponse::Ok().json(json!({ "id_server_unbind_result": "no-support" })))
}

/// `POST /_synapse/admin/v1/reset_password/{userId}`
pub async fn reset_password_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
    body: JsonBody<Map<String, Value>>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    let new_password: String = field(&body.0, "new_password", "a string")?
        .ok_or_else(|| Error::missing_param("Missing param new_password"))?;
    let logout_devices = field(&body.0, "logout_devices", "a boolean")?.unwrap_or(true);
    services
        .admin
        .reset_password(&services.users, &user_id, new_password, logout_devices)
        .await?;
    Ok(HttpResponse::Ok().json(json!({})))
}

/// `GET /_synapse/admin/v1/whois/{userId}`
pub async fn whois_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    Ok(HttpResponse::Ok().json(services.admin.whois(&services.users, &user_id).await?))
}

/// `POST /_synapse/admin/v1/users/{userId}/login`, body `{"valid_until_ms"}` (optional):
/// an access token for the user that their device list does not show.
pub async fn login_as_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
    body: JsonBody<Map<String, Value>>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    let valid_until_ms = field(&body.0, "valid_until_ms", "an integer")?;
    let access_token = services
        .admin
        .login_as(&services.users, &caller.0.user_id, &user_id, valid_until_ms)
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "access_token": access_token })))
}

/// `GET /_synapse/admin/v1/users/{userId}/admin`
pub async fn get_admin_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let admin = services.admin.is_admin(&parse_user(&user_id)?).await?;
    Ok(HttpResponse::Ok().json(json!({ "admin": admin })))
}

/// `PUT /_synapse/admin/v1/users/{userId}/admin`, body `{"admin": bool}`.
pub async fn put_admin_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
    body: JsonBody<Map<String, Value>>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    let admin: bool = field(&body.0, "admin", "a boolean")?
        .ok_or_else(|| Error::missing_param("Missing param admin"))?;
    if !admin && user_id == caller.0.user_id {
        return Err(Error::invalid_param("You may not demote yourself."));
    }
    services
        .admin
        .set_admin(&services.users, &user_id, admin)
        .await?;
    Ok(HttpResponse::Ok().json(json!({})))
}

/// `GET /_synapse/admin/v1/users/{userId}/override_ratelimit`
pub async fn get_ratelimit_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    Ok(HttpResponse::Ok().json(services.admin.get_ratelimit_override(&user_id).await?))
}

/// `POST /_synapse/admin/v1/users/{userId}/override_ratelimit`: stored and reported; the
/// server has no per-user message limit yet for it to lift.
pub async fn set_ratelimit_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
    body: JsonBody<Map<String, Value>>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    let what = "a positive integer";
    let per_second = field(&body.0, "messages_per_second", what)?.unwrap_or(0);
    let burst = field(&body.0, "burst_count", what)?.unwrap_or(0);
    let set = services
        .admin
        .set_ratelimit_override(&user_id, per_second, burst)
        .await?;
    Ok(HttpResponse::Ok().json(set))
}

/// `DELETE /_synapse/admin/v1/users/{userId}/override_ratelimit`
pub async fn delete_ratelimit_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    services.admin.delete_ratelimit_override(&user_id).await?;
    Ok(HttpResponse::Ok().json(json!({})))
}

/// `GET /_synapse/admin/v1/users/{userId}/joined_rooms`
pub async fn joined_rooms_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    services.admin.ensure_local(&user_id)?;
    let rooms = services.rooms.joined_rooms(&user_id).await?;
    Ok(HttpResponse::Ok().json(json!({ "total": rooms.len(), "joined_rooms": rooms })))
}

/// `GET /_synapse/admin/v1/users/{userId}/memberships`
pub async fn memberships_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    Ok(HttpResponse::Ok().json(services.admin.user_memberships(&user_id).await?))
}

/// `GET /_synapse/admin/v1/users/{userId}/media`
pub async fn user_media_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
    query: Query,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    services.admin.ensure_exists(&user_id).await?;
    let from = int_param(&query, "from", 0)?;
    let limit = int_param(&query, "limit", DEFAULT_LIMIT)?.min(MAX_PAGE);
    let order = (
        super::media::order_param(&query)?,
        backwards_param(&query, false)?,
    );
    let page = services
        .media
        .list_user_media(&user_id, order, from, limit)
        .await?;
    let media: Vec<Value> = page.media.iter().map(super::media::media_entry).collect();
    let mut body = json!({ "media": media, "total": page.total });
    let next = from + page.media.len() as i64;
    if next < page.total && !page.media.is_empty() {
        body["next_token"] = json!(next);
    }
    Ok(HttpResponse::Ok().json(body))
}

/// `GET /_synapse/admin/v2/users/{userId}/devices`
pub async fn list_devices_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    Ok(HttpResponse::Ok().json(
        services
            .admin
            .list_devices(&services.users, &user_id)
            .await?,
    ))
}

/// `GET /_synapse/admin/v2/users/{userId}/devices/{deviceId}`
pub async fn get_device_route(
    services: Data<Services>,
    caller: Authenticated,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&path.0)?;
    let device = services
        .admin
        .get_device(&services.users, &user_id, &path_arg(&path.1)?)
        .await?;
    Ok(HttpResponse::Ok().json(device))
}

/// `PUT /_synapse/admin/v2/users/{userId}/devices/{deviceId}`, body `{"display_name"}`.
pub async fn put_device_route(
    services: Data<Services>,
    caller: Authenticated,
    path: web::Path<(String, String)>,
    body: JsonBody<Map<String, Value>>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&path.0)?;
    services.admin.ensure_exists(&user_id).await?;
    let name: Option<String> = field(&body.0, "display_name", "a string")?;
    services
        .users
        .rename_device(&user_id, &path_arg(&path.1)?, name.as_deref())
        .await?;
    Ok(HttpResponse::Ok().json(json!({})))
}

/// `DELETE /_synapse/admin/v2/users/{userId}/devices/{deviceId}`: the device and its tokens go
/// at once; deleting a device that does not exist succeeds (as in Synapse).
pub async fn delete_device_route(
    services: Data<Services>,
    caller: Authenticated,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&path.0)?;
    services.admin.ensure_exists(&user_id).await?;
    services
        .users
        .delete_devices(&user_id, &[path_arg(&path.1)?], None)
        .await?;
    Ok(HttpResponse::Ok().json(json!({})))
}

/// `POST /_synapse/admin/v2/users/{userId}/devices`, body `{"device_id"}`: creates the device
/// (no session comes with it); an existing one is left as it is.
pub async fn create_device_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
    body: JsonBody<Map<String, Value>>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    services.admin.ensure_exists(&user_id).await?;
    let device_id: String = field(&body.0, "device_id", "a string")?
        .filter(|id: &String| !id.is_empty())
        .ok_or_else(|| Error::missing_param("Missing param device_id"))?;
    services
        .users
        .create_device(&user_id, &device_id, None)
        .await?;
    Ok(HttpResponse::Ok().json(json!({})))
}

/// `GET /_synapse/admin/v1/username_available?username=`: `{"available": true}`, or 400
/// `M_USER_IN_USE` / `M_INVALID_USERNAME` (the create-user form checks as the admin types).
pub async fn username_available_route(
    services: Data<Services>,
    caller: Authenticated,
    query: Query,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let username = query
        .get("username")
        .ok_or_else(|| Error::missing_param("Missing param username"))?;
    services
        .users
        .check_available(&username.to_lowercase())
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "available": true })))
}

/// `POST /_synapse/admin/v2/users/{userId}/delete_devices`, body `{"devices": [...]}`.
pub async fn delete_devices_route(
    services: Data<Services>,
    caller: Authenticated,
    user_id: web::Path<String>,
    body: JsonBody<Map<String, Value>>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let user_id = parse_user(&user_id)?;
    services.admin.ensure_exists(&user_id).await?;
    let devices: Vec<String> = field(&body.0, "devices", "a list of device IDs")?
        .ok_or_else(|| Error::missing_param("Missing param devices"))?;
    services
        .users
        .delete_devices(&user_id, &devices, None)
        .await?;
    Ok(HttpResponse::Ok().json(json!({})))
}
