//! Login, logout and token refresh.

use std::time::Duration;

use actix_web::{web::Data, HttpRequest};
use ruma::api::client::{
    session::{
        get_login_types::v3::{
            self as login_types, ApplicationServiceLoginType, LoginType, PasswordLoginType,
        },
        login::v3::{self as login, DiscoveryInfo, HomeserverInfo, LoginInfo},
        logout::v3 as logout,
        logout_all::v3 as logout_all,
        refresh_token::v3 as refresh,
    },
    uiaa::UserIdentifier,
};
use serde_json::Value;

use crate::{
    api::{
        client_ip::client_ip,
        ruma::{Ruma, RumaResponse},
    },
    error::{Error, Result},
    service::{
        rate_limit::{Action, Failure},
        users::DeviceRequest,
        Services,
    },
};

const JWT_LOGIN_TYPE: &str = "org.matrix.login.jwt";

/// `GET /_matrix/client/v3/login`
pub async fn get_login_types_route(
    services: Data<Services>,
    _body: Ruma<login_types::Request>,
) -> Result<RumaResponse<login_types::Response>> {
    let mut flows = vec![LoginType::Password(PasswordLoginType::new())];
    if !services.appservices.all().is_empty() {
        flows.push(LoginType::ApplicationService(
            ApplicationServiceLoginType::new(),
        ));
    }
    if services.config.jwt.is_some() {
        let jwt = LoginType::new(JWT_LOGIN_TYPE, Default::default()).map_err(Error::internal)?;
        flows.push(jwt);
    }
    Ok(login_types::Response::new(flows).into())
}

/// `POST /_matrix/client/v3/login`
pub async fn login_route(
    services: Data<Services>,
    req: HttpRequest,
    body: Ruma<login::Request>,
) -> Result<RumaResponse<login::Response>> {
    let appservice = body.caller.as_ref().and_then(|c| c.appservice.clone());
    if appservice.as_ref().is_none_or(|a| a.rate_limited) {
        let ip = client_ip(&req, &services.config.trusted_proxies);
        services.rate_limit.check(Action::Login, ip)?;
    }
    let request = body.body;
    let user_id = match &request.login_info {
        LoginInfo::ApplicationService(login) => {
            let appservice = appservice.ok_or_else(Error::missing_token)?;
            #[allow(deprecated)]
            let name = match (&login.identifier, &login.user) {
                (Some(UserIdentifier::Matrix(id)), _) => id.user.clone(),
                (None, Some(user)) => user.clone(),
                _ => return Err(Error::missing_param("Missing identifier")),
            };
            let user_id = services.users.resolve_identifier(&name)?;
            services
                .appservices
                .check_login(&appservice, &user_id)
                .await?;
            user_id
        }
        LoginInfo::Password(password) => {
            #[allow(deprecated)]
            let name = match (&password.identifier, &password.user) {
                (Some(UserIdentifier::Matrix(id)), _) => id.user.clone(),
                (None, Some(user)) => user.clone(),
                (Some(_), _) => {
                    return Err(Error::unknown("Only m.id.user identifiers are supported"))
                }
                (None, None) => return Err(Error::missing_param("Missing identifier")),
            };
            let user_id = services.users.resolve_identifier(&name)?;
            // Only a wrong password spends the account's bucket, so strangers guessing
            // cannot lock the owner out at the cost of one request per refill.
            services
                .rate_limit
                .guard_password(
                    Failure::Login,
                    &user_id,
                    services.users.check_password(&user_id, &password.password),
                )
                .await?;
            user_id
        }
        other if other.login_type() == JWT_LOGIN_TYPE => {
            let data = other.data();
            let token = data
                .get("token")
                .and_then(Value::as_str)
                .ok_or_else(|| Error::forbidden("Token field for JWT is missing"))?;
            services.users.check_jwt(token).await?
        }
        other => {
            return Err(Error::unknown(format!(
                "Unknown login type {}",
                other.login_type()
            )))
        }
    };
    let device = DeviceRequest {
        device_id: request.device_id,
        display_name: request.initial_device_display_name,
        refresh_token: request.refresh_token,
    };
    let session = services.users.login(&user_id, device).await?;
    let mut response = login::Response::new(
        session.user_id,
        session.tokens.access_token,
        session.device_id,
    );
    #[allow(deprecated)]
    {
        response.home_server = Some(services.config.server_name.clone());
    }
    response.well_known = Some(DiscoveryInfo::new(HomeserverInfo::new(
        services.config.public_baseurl.clone(),
    )));
    response.refresh_token = session.tokens.refresh_token;
    response.expires_in = session.tokens.expires_in_ms.map(Duration::from_millis);
    Ok(response.into())
}

/// `POST /_matrix/client/v3/logout`
pub async fn logout_route(
    services: Data<Services>,
    body: Ruma<logout::Request>,
) -> Result<RumaResponse<logout::Response>> {
    let caller = body.caller()?;
    services
        .users
        .logout(&caller.user_id, caller.device_id.as_str())
        .await?;
    Ok(logout::Response::new().into())
}

/// `POST /_matrix/client/v3/logout/all`
pub async fn logout_all_route(
    services: Data<Services>,
    body: Ruma<logout_all::Request>,
) -> Result<RumaResponse<logout_all::Response>> {
    let caller = body.caller()?;
    services.users.logout_all(&caller.user_id).await?;
    Ok(logout_all::Response::new().into())
}

/// `POST /_matrix/client/v3/refresh`
pub async fn refresh_route(
    services: Data<Services>,
    body: Ruma<refresh::Request>,
) -> Result<RumaResponse<refresh::Response>> {
    let issued = services.sessions.refresh(&body.body.refresh_token).await?;
    let mut response = refresh::Response::new(issued.access_token);
    response.refresh_token = issued.refresh_token;
    response.expires_in_ms = issued.expires_in_ms.map(Duration::from_millis);
    Ok(response.into())
}
