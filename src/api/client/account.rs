//! `whoami`, password change, deactivation and OpenID tokens.

use actix_web::web::Data;
use ruma::{
    api::client::account::{
        change_password::v3 as change_password, deactivate::v3 as deactivate, request_openid_token,
        whoami::v3 as whoami, ThirdPartyIdRemovalStatus,
    },
    authentication::TokenType,
};

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::Result,
    service::{uia::Purpose, Services},
};

/// `GET /_matrix/client/v3/account/whoami`
pub async fn whoami_route(body: Ruma<whoami::Request>) -> Result<RumaResponse<whoami::Response>> {
    let caller = body.caller()?;
    let mut response = whoami::Response::new(caller.user_id.clone(), false);
    response.device_id = caller.has_device.then(|| caller.device_id.clone());
    Ok(response.into())
}

/// `POST /_matrix/client/v3/account/password`
pub async fn change_password_route(
    services: Data<Services>,
    body: Ruma<change_password::Request>,
) -> Result<RumaResponse<change_password::Response>> {
    let caller = body.caller()?;
    let completed = services
        .uia
        .check(
            body.body.auth.as_ref(),
            Purpose::Account(&caller.user_id, "POST /account/password"),
        )
        .await?;
    services
        .users
        .change_password(
            &caller.user_id,
            body.body.new_password.clone(),
            body.body.logout_devices,
            Some(caller.device_id.as_str()),
            Some((&services.uia, &completed)),
        )
        .await?;
    Ok(change_password::Response::new().into())
}

/// `POST /_matrix/client/v3/account/deactivate`: with `"erase": true` the profile goes too
/// and the account is marked erased, as in Synapse; without it the profile stays.
pub async fn deactivate_route(
    services: Data<Services>,
    body: Ruma<deactivate::Request>,
) -> Result<RumaResponse<deactivate::Response>> {
    let caller = body.caller()?;
    let completed = services
        .uia
        .check(
            body.body.auth.as_ref(),
            Purpose::Account(&caller.user_id, "POST /account/deactivate"),
        )
        .await?;
    services
        .users
        .deactivate(
            &caller.user_id,
            Some((&services.uia, &completed)),
            body.body.erase,
        )
        .await?;
    services.rooms.leave_all_rooms(&caller.user_id).await?;
    Ok(deactivate::Response::new(ThirdPartyIdRemovalStatus::NoSupport).into())
}

/// `POST /_matrix/client/v3/user/{userId}/openid/request_token`: an OpenID token for the
/// caller (403 for anyone else's user ID), for a third party to check at
/// `/_matrix/federation/v1/openid/userinfo`.
pub async fn request_openid_token_route(
    services: Data<Services>,
    body: Ruma<request_openid_token::v3::Request>,
) -> Result<RumaResponse<request_openid_token::v3::Response>> {
    let caller = body.caller()?;
    super::ensure_self(&caller.user_id, &body.body.user_id, "request OpenID tokens")?;
    let token = services
        .sessions
        .create_openid_token(&caller.user_id)
        .await?;
    Ok(request_openid_token::v3::Response::new(
        token,
        TokenType::Bearer,
        services.config.server_name.clone(),
        crate::service::sessions::OPENID_TOKEN_LIFETIME,
    )
    .into())
}
