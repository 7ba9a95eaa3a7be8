//! Reporting events, rooms and users to the server's admins.

use actix_web::{web::Data, HttpRequest};
use ruma::{
    api::client::{
        reporting::report_user::v3 as report_user,
        room::{report_content::v3 as report_content, report_room::v3 as report_room},
    },
    EventId, RoomId,
};
use serde_json::Value;

use crate::{
    api::ruma::{Authenticated, JsonBody, Ruma, RumaResponse},
    error::{Error, Result},
    service::Services,
};

/// A path parameter, percent-decoded (actix leaves `%2F`, `%25` and `%2B` encoded).
fn path_param(req: &HttpRequest, name: &str) -> Result<String> {
    let raw = req.match_info().get(name).unwrap_or_default();
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| Error::invalid_param(format!("Path parameter {name} is not UTF-8")))
}

/// `POST /_matrix/client/v3/rooms/{roomId}/report/{eventId}`: the body is read as JSON (not
/// ruma's type) so the legacy `score` can be checked too.
pub async fn report_event_route(
    services: Data<Services>,
    caller: Authenticated,
    req: HttpRequest,
    body: JsonBody<Value>,
) -> Result<RumaResponse<report_content::Response>> {
    let room_id = RoomId::parse(path_param(&req, "room_id")?)
        .map_err(|_| Error::invalid_param("Invalid room ID"))?;
    let event_id = EventId::parse(path_param(&req, "event_id")?)
        .map_err(|_| Error::invalid_param("Invalid event ID"))?;
    if !body.0.is_object() {
        return Err(Error::bad_json("The body must be a JSON object"));
    }
    services
        .reports
        .report_event(
            &services.rooms,
            &caller.0.user_id,
            &room_id,
            event_id.as_str(),
            &body.0,
        )
        .await?;
    Ok(report_content::Response::new().into())
}

/// `POST /_matrix/client/v3/rooms/{roomId}/report`
pub async fn report_room_route(
    services: Data<Services>,
    body: Ruma<report_room::Request>,
) -> Result<RumaResponse<report_room::Response>> {
    let caller = body.caller()?;
    services
        .reports
        .report_room(&caller.user_id, &body.body.room_id, &body.body.reason)
        .await?;
    Ok(report_room::Response::new().into())
}

/// `POST /_matrix/client/v3/users/{userId}/report`
pub async fn report_user_route(
    services: Data<Services>,
    body: Ruma<report_user::Request>,
) -> Result<RumaResponse<report_user::Response>> {
    let caller = body.caller()?;
    services
        .reports
        .report_user(&caller.user_id, &body.body.user_id, &body.body.reason)
        .await?;
    Ok(report_user::Response::new().into())
}
