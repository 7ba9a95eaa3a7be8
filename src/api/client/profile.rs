//! Profiles: the whole profile and single fields (`displayname`, `avatar_url`, custom keys).

use actix_web::web::Data;
use ruma::{
    api::client::profile::{
        delete_profile_field::v3 as delete_field, get_profile::v3 as get_profile,
        get_profile_field::v3 as get_field, set_profile_field::v3 as set_field,
    },
    profile::ProfileFieldValue,
};

use super::ensure_self;
use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::Services,
};

/// Longest allowed profile field name, in bytes (spec).
const MAX_FIELD_NAME_BYTES: usize = 255;

/// `GET /_matrix/client/v3/profile/{userId}`
pub async fn get_profile_route(
    services: Data<Services>,
    body: Ruma<get_profile::Request>,
) -> Result<RumaResponse<get_profile::Response>> {
    let user_id = &body.body.user_id;
    let profile = if user_id.server_name() == services.config.server_name {
        match services.users.get_profile(user_id).await {
            // An appservice may register it on demand.
            Err(err)
                if err.errcode() == "M_NOT_FOUND"
                    && services.appservices.query_user(user_id).await =>
            {
                services.users.get_profile(user_id).await?
            }
            profile => profile?,
        }
    } else {
        services.federation.remote_profile(user_id, None).await?
    };
    let mut response = get_profile::Response::new();
    for (field, value) in profile {
        response.data.set(field, value);
    }
    Ok(response.into())
}

/// `GET /_matrix/client/v3/profile/{userId}/{keyName}`
pub async fn get_profile_field_route(
    services: Data<Services>,
    body: Ruma<get_field::Request>,
) -> Result<RumaResponse<get_field::Response>> {
    let field = body.body.field.as_str();
    let user_id = &body.body.user_id;
    let value = if user_id.server_name() == services.config.server_name {
        services.users.get_profile_field(user_id, field).await?
    } else {
        services
            .federation
            .remote_profile(user_id, Some(field))
            .await?
            .into_iter()
            .find_map(|(name, value)| (name == field).then_some(value))
            .ok_or_else(|| Error::not_found("Profile field not set"))?
    };
    let value = ProfileFieldValue::new(field, value).map_err(Error::internal)?;
    Ok(get_field::Response::new(value).into())
}

/// `PUT /_matrix/client/v3/profile/{userId}/{keyName}`
pub async fn set_profile_field_route(
    services: Data<Services>,
    body: Ruma<set_field::Request>,
) -> Result<RumaResponse<set_field::Response>> {
    let caller = body.caller()?;
    ensure_self(&caller.user_id, &body.body.user_id, "set the profile")?;
    let field = body.body.value.field_name();
    let value = body.body.value.value().into_owned();
    if field.as_str().len() > MAX_FIELD_NAME_BYTES {
        return Err(Error::matrix(
            actix_web::http::StatusCode::BAD_REQUEST,
            "M_KEY_TOO_LARGE",
            "Field name too long",
        ));
    }
    // The whole profile's 64 KiB limit is checked where it is written.
    services
        .users
        .set_profile_field(&caller.user_id, field.as_str(), Some(&value))
        .await?;
    if matches!(field.as_str(), "displayname" | "avatar_url") {
        services.rooms.propagate_profile(&caller.user_id).await?;
    }
    Ok(set_field::Response::new().into())
}

/// `DELETE /_matrix/client/v3/profile/{userId}/{keyName}`
pub async fn delete_profile_field_route(
    services: Data<Services>,
    body: Ruma<delete_field::Request>,
) -> Result<RumaResponse<delete_field::Response>> {
    let caller = body.caller()?;
    ensure_self(&caller.user_id, &body.body.user_id, "change the profile")?;
    let field = body.body.field.as_str();
    services
        .users
        .set_profile_field(&caller.user_id, field, None)
        .await?;
    if matches!(field, "displayname" | "avatar_url") {
        services.rooms.propagate_profile(&caller.user_id).await?;
    }
    Ok(delete_field::Response::new().into())
}
