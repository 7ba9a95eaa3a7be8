//! Account registration.

use std::time::Duration;

use actix_web::{http::StatusCode, web::Data, HttpRequest};
use ruma::{
    api::client::account::{
        check_registration_token_validity::v1 as token_validity,
        get_username_availability::v3 as availability,
        register::{v3 as register, LoginType, RegistrationKind},
    },
    OwnedUserId,
};

use crate::{
    api::{
        client_ip::client_ip,
        ruma::{Ruma, RumaResponse},
    },
    config::RegistrationMode,
    error::{Error, Result},
    service::{
        appservice::Registration,
        rate_limit::Action,
        uia::Purpose,
        users::{DeviceRequest, LoginSession},
        Services,
    },
};

/// Takes a token from the client's per-IP registration bucket.
fn limit_registration(services: &Services, req: &HttpRequest) -> Result<()> {
    let ip = client_ip(req, &services.config.trusted_proxies);
    services.rate_limit.check(Action::Registration, ip)
}

/// `POST /_matrix/client/v3/register`
pub async fn register_route(
    services: Data<Services>,
    req: HttpRequest,
    body: Ruma<register::Request>,
) -> Result<RumaResponse<register::Response>> {
    let appservice = body.caller.as_ref().and_then(|c| c.appservice.clone());
    let request = body.body;
    if request.login_type == Some(LoginType::ApplicationService) {
        let appservice = appservice.ok_or_else(Error::missing_token)?;
        return register_appservice_user(&services, &req, &appservice, request).await;
    }
    if request.kind == RegistrationKind::Guest {
        return Err(Error::forbidden("Guest access is disabled"));
    }
    if services.config.registration == RegistrationMode::Closed {
        return Err(Error::forbidden("Registration has been disabled"));
    }
    limit_registration(&services, &req)?;
    // Refuse a taken or invalid name before any UIA stage is spent on it.
    let user_id = match &request.username {
        Some(name) => {
            let user_id = services.users.check_available(&name.to_lowercase()).await?;
            services
                .appservices
                .check_user_unclaimed(&user_id, appservice.as_deref())?;
            Some(user_id)
        }
        None => None,
    };
    let completed = services
        .uia
        .check(request.auth.as_ref(), Purpose::Register)
        .await?;
    let user_id = match user_id {
        Some(user_id) => user_id,
        None => services
            .users
            .user_id_for(&services.users.generate_localpart().await?)?,
    };
    let device = if request.inhibit_login {
        None
    } else {
        Some(DeviceRequest {
            device_id: request.device_id,
            display_name: request.initial_device_display_name,
            refresh_token: request.refresh_token,
        })
    };
    let session = services
        .users
        .register(
            &user_id,
            request.password,
            false,
            Some((&services.uia, &completed)),
            device,
        )
        .await?;
    Ok(registered(user_id, session).into())
}

/// `/register` with `type: m.login.application_service`: an appservice creates a user in
/// its namespace, with no UIA and no password (spec: Application Service API, "Server
/// admin style permissions").
async fn register_appservice_user(
    services: &Services,
    req: &HttpRequest,
    appservice: &Registration,
    request: register::Request,
) -> Result<RumaResponse<register::Response>> {
    if appservice.rate_limited {
        limit_registration(services, req)?;
    }
    let localpart = request
        .username
        .ok_or_else(|| Error::missing_param("An appservice registers a user by its username"))?;
    let user_id = services.users.user_id_for(&localpart.to_lowercase())?;
    if !appservice.is_interested_in_user(user_id.as_str()) {
        return Err(Error::matrix(
            StatusCode::BAD_REQUEST,
            "M_EXCLUSIVE",
            "Invalid user localpart for this application service",
        ));
    }
    services
        .appservices
        .check_user_unclaimed(&user_id, Some(appservice))?;
    // MSC4190: such an appservice creates its devices itself (`PUT /devices/{id}`).
    if appservice.msc4190 && !request.inhibit_login {
        return Err(Error::matrix(
            StatusCode::BAD_REQUEST,
            "M_APPSERVICE_LOGIN_UNSUPPORTED",
            "This application service manages its devices itself: set inhibit_login",
        ));
    }
    let device = (!request.inhibit_login).then_some(DeviceRequest {
        device_id: request.device_id,
        display_name: request.initial_device_display_name,
        refresh_token: request.refresh_token,
    });
    let session = services
        .users
        .register(&user_id, None, false, None, device)
        .await?;
    Ok(registered(user_id, session).into())
}

/// The answer to a registration.
fn registered(user_id: OwnedUserId, session: Option<LoginSession>) -> register::Response {
    let mut response = register::Response::new(user_id);
    if let Some(session) = session {
        response.access_token = Some(session.tokens.access_token);
        response.device_id = Some(session.device_id);
        response.refresh_token = session.tokens.refresh_token;
        response.expires_in = session.tokens.expires_in_ms.map(Duration::from_millis);
    }
    response
}

/// `GET /_matrix/client/v3/register/available`
pub async fn username_available_route(
    services: Data<Services>,
    req: HttpRequest,
    body: Ruma<availability::Request>,
) -> Result<RumaResponse<availability::Response>> {
    limit_registration(&services, &req)?;
    let user_id = services
        .users
        .check_available(&body.body.username.to_lowercase())
        .await?;
    services.appservices.check_user_unclaimed(&user_id, None)?;
    Ok(availability::Response::new(true).into())
}

/// `GET /_matrix/client/v1/register/m.login.registration_token/validity`
pub async fn token_validity_route(
    services: Data<Services>,
    req: HttpRequest,
    body: Ruma<token_validity::Request>,
) -> Result<RumaResponse<token_validity::Response>> {
    if services.config.registration != RegistrationMode::Token {
        return Err(Error::forbidden(
            "Registration tokens are not enabled on this server",
        ));
    }
    limit_registration(&services, &req)?;
    let valid = services
        .registration_tokens
        .is_valid(&body.body.token)
        .await?;
    Ok(token_validity::Response::new(valid).into())
}
