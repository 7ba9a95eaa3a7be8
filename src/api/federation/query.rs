//! `GET /_matrix/federation/v1/query/profile` and `/query/directory`: what other servers ask
//! about our users and aliases. Other query types fall to the unknown-path answer (404
//! `M_UNRECOGNIZED`).

use actix_web::web::Data;
use ruma::api::federation::query::{get_profile_information, get_room_information};

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::Services,
};

/// `GET /_matrix/federation/v1/query/profile?user_id=&field=`: a local user's profile, or the
/// one field asked for; 404 `M_NOT_FOUND` for a user not of this server or unknown.
pub async fn query_profile_route(
    services: Data<Services>,
    body: Ruma<get_profile_information::v1::Request>,
) -> Result<RumaResponse<get_profile_information::v1::Response>> {
    body.origin()?;
    let request = &body.body;
    let field = request.field.as_ref().map(|f| f.as_str());
    let profile = services.users.get_profile(&request.user_id).await?;
    let mut response = get_profile_information::v1::Response::new();
    for (name, value) in profile {
        if field.is_none_or(|f| f == name) {
            response.set(name, value);
        }
    }
    if field.is_some() && response.iter().next().is_none() {
        return Err(Error::not_found("Profile field not set"));
    }
    Ok(response.into())
}

/// `GET /_matrix/federation/v1/query/directory?room_alias=`: one of our aliases, with the
/// servers to join through; 404 `M_NOT_FOUND` for an alias not of this server or unknown.
pub async fn query_directory_route(
    services: Data<Services>,
    body: Ruma<get_room_information::v1::Request>,
) -> Result<RumaResponse<get_room_information::v1::Response>> {
    body.origin()?;
    let (room_id, servers) = services
        .rooms
        .resolve_local_alias(&body.body.room_alias)
        .await?;
    Ok(get_room_information::v1::Response::new(room_id, servers).into())
}
