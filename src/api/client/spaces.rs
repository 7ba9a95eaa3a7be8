//! Spaces and room previews: `/hierarchy` and `/room_summary` (MSC3266).

use actix_web::{web::Data, HttpResponse};
use ruma::api::client::{
    room::get_summary::v1 as get_summary, space::get_hierarchy::v1 as get_hierarchy,
};

use crate::{
    api::ruma::Ruma,
    error::Result,
    service::{spaces, Services},
};

/// `GET /_matrix/client/v1/rooms/{roomId}/hierarchy`
pub async fn hierarchy_route(
    services: Data<Services>,
    body: Ruma<get_hierarchy::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let request = &body.body;
    let hierarchy = spaces::hierarchy(
        &services.rooms,
        &services.federation,
        &caller.user_id,
        &spaces::HierarchyRequest {
            room_id: &request.room_id,
            from: request.from.as_deref(),
            limit: request.limit.map(u64::from),
            max_depth: request.max_depth.map(u64::from),
            suggested_only: request.suggested_only,
        },
    )
    .await?;
    Ok(HttpResponse::Ok().json(hierarchy))
}

/// `GET /_matrix/client/v1/room_summary/{roomIdOrAlias}`, also served at MSC3266's unstable
/// paths. A token is optional: without one, only rooms anyone may preview are summarised.
pub async fn room_summary_route(
    services: Data<Services>,
    body: Ruma<get_summary::Request>,
) -> Result<HttpResponse> {
    let user_id = body.caller.as_ref().map(|c| c.user_id.as_ref());
    let summary = spaces::room_summary(
        &services.rooms,
        &services.federation,
        user_id,
        &body.body.room_id_or_alias,
        &body.body.via,
    )
    .await?;
    Ok(HttpResponse::Ok().json(summary))
}
