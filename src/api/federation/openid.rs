//! `GET /_matrix/federation/v1/openid/userinfo`: who an OpenID token belongs to. The token is
//! the authentication (no X-Matrix): integration managers and widgets call it.

use actix_web::web::Data;
use ruma::api::federation::openid::get_openid_userinfo;

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::Result,
    service::Services,
};

/// `GET /_matrix/federation/v1/openid/userinfo?access_token=`: `{sub}`, or 401
/// `M_UNKNOWN_TOKEN` for a token unknown or expired.
pub async fn openid_userinfo_route(
    services: Data<Services>,
    body: Ruma<get_openid_userinfo::v1::Request>,
) -> Result<RumaResponse<get_openid_userinfo::v1::Response>> {
    let user_id = services
        .sessions
        .openid_user(&body.body.access_token)
        .await?;
    Ok(get_openid_userinfo::v1::Response::new(user_id).into())
}
