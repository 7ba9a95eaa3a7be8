//! `GET /_matrix/federation/v1/hierarchy/{roomId}`: our spaces, for other servers' users.

use actix_web::{web::Data, HttpResponse};
use ruma::api::federation::space::get_hierarchy::v1 as get_hierarchy;

use crate::{api::ruma::Ruma, error::Result, service::Services};

/// `GET /_matrix/federation/v1/hierarchy/{roomId}`
pub async fn hierarchy_route(
    services: Data<Services>,
    body: Ruma<get_hierarchy::Request>,
) -> Result<HttpResponse> {
    let origin = body.origin()?;
    let hierarchy = services
        .rooms
        .federation_hierarchy(origin, &body.body.room_id, body.body.suggested_only)
        .await?;
    Ok(HttpResponse::Ok().json(hierarchy))
}
