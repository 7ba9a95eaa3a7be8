//! Room tags (`m.tag` room account data).

use actix_web::{web::Data, HttpResponse};
use ruma::api::client::tag::{
    create_tag::v3 as create_tag, delete_tag::v3 as delete_tag, get_tags::v3 as get_tags,
};
use serde_json::json;

use super::ensure_self;
use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::Result,
    service::Services,
};

/// `GET /_matrix/client/v3/user/{userId}/rooms/{roomId}/tags`
pub async fn get_tags_route(
    services: Data<Services>,
    body: Ruma<get_tags::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    ensure_self(&caller.user_id, &body.body.user_id, "get tags")?;
    let tags = services
        .account_data
        .get_tags(&caller.user_id, &body.body.room_id)
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "tags": tags })))
}

/// `PUT /_matrix/client/v3/user/{userId}/rooms/{roomId}/tags/{tag}`
pub async fn create_tag_route(
    services: Data<Services>,
    body: Ruma<create_tag::Request>,
) -> Result<RumaResponse<create_tag::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    ensure_self(&caller.user_id, &request.user_id, "set tags")?;
    services
        .account_data
        .set_tag(
            &caller.user_id,
            &request.room_id,
            &request.tag,
            request.tag_info.order,
        )
        .await?;
    Ok(create_tag::Response::new().into())
}

/// `DELETE /_matrix/client/v3/user/{userId}/rooms/{roomId}/tags/{tag}`
pub async fn delete_tag_route(
    services: Data<Services>,
    body: Ruma<delete_tag::Request>,
) -> Result<RumaResponse<delete_tag::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    ensure_self(&caller.user_id, &request.user_id, "delete tags")?;
    services
        .account_data
        .delete_tag(&caller.user_id, &request.room_id, &request.tag)
        .await?;
    Ok(delete_tag::Response::new().into())
}
