//! Third-party lookups: the protocols the appservices bridge to, and their users and
//! locations (answered by the appservices: [`crate::service::appservice::thirdparty`]).

use actix_web::{web::Data, HttpResponse};
use ruma::api::client::thirdparty::{
    get_location_for_protocol::v3 as location_for_protocol,
    get_location_for_room_alias::v3 as location_for_alias, get_protocol::v3 as get_protocol,
    get_protocols::v3 as get_protocols, get_user_for_protocol::v3 as user_for_protocol,
    get_user_for_user_id::v3 as user_for_user_id,
};

use crate::{
    api::ruma::Ruma, error::Result, service::appservice::thirdparty::ThirdPartyKind,
    service::Services,
};

/// `GET /_matrix/client/v3/thirdparty/protocols`
pub async fn get_protocols_route(
    services: Data<Services>,
    body: Ruma<get_protocols::Request>,
) -> Result<HttpResponse> {
    body.caller()?;
    Ok(HttpResponse::Ok().json(services.appservices.get_protocols().await))
}

/// `GET /_matrix/client/v3/thirdparty/protocol/{protocol}`
pub async fn get_protocol_route(
    services: Data<Services>,
    body: Ruma<get_protocol::Request>,
) -> Result<HttpResponse> {
    body.caller()?;
    let protocol = services
        .appservices
        .get_protocol(&body.body.protocol)
        .await?;
    Ok(HttpResponse::Ok().json(protocol))
}

/// `GET /_matrix/client/v3/thirdparty/location/{protocol}`
pub async fn get_location_for_protocol_route(
    services: Data<Services>,
    body: Ruma<location_for_protocol::Request>,
) -> Result<HttpResponse> {
    body.caller()?;
    let request = &body.body;
    let locations = services
        .appservices
        .query_third_party(ThirdPartyKind::Location, &request.protocol, &request.fields)
        .await?;
    Ok(HttpResponse::Ok().json(locations))
}

/// `GET /_matrix/client/v3/thirdparty/user/{protocol}`
pub async fn get_user_for_protocol_route(
    services: Data<Services>,
    body: Ruma<user_for_protocol::Request>,
) -> Result<HttpResponse> {
    body.caller()?;
    let request = &body.body;
    let users = services
        .appservices
        .query_third_party(ThirdPartyKind::User, &request.protocol, &request.fields)
        .await?;
    Ok(HttpResponse::Ok().json(users))
}

/// `GET /_matrix/client/v3/thirdparty/location?alias=`
pub async fn get_location_for_alias_route(
    services: Data<Services>,
    body: Ruma<location_for_alias::Request>,
) -> Result<HttpResponse> {
    body.caller()?;
    let locations = services
        .appservices
        .query_matrix_id(ThirdPartyKind::Location, body.body.alias.as_str())
        .await;
    Ok(HttpResponse::Ok().json(locations))
}

/// `GET /_matrix/client/v3/thirdparty/user?userid=`
pub async fn get_user_for_user_id_route(
    services: Data<Services>,
    body: Ruma<user_for_user_id::Request>,
) -> Result<HttpResponse> {
    body.caller()?;
    let users = services
        .appservices
        .query_matrix_id(ThirdPartyKind::User, body.body.userid.as_str())
        .await;
    Ok(HttpResponse::Ok().json(users))
}
