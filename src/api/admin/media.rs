//! `/_synapse/admin/v1/media/...`: deleting and quarantining media.

use std::collections::HashMap;

use actix_web::{http::Method, web, web::Data, HttpResponse};
use serde_json::{json, Value};

use super::{ensure_admin, parse_room, path_arg, RouteTable};
use crate::{
    api::ruma::Authenticated,
    error::{Error, Result},
    service::Services,
    storage::media::{MediaOrder, MediaRow},
};

/// Registers the media routes.
pub fn routes(t: &mut RouteTable) {
    t.raw(
        Method::GET,
        "/_synapse/admin/v1/room/{room_id}/media",
        room_media_route,
    );
    let v1 = "/_synapse/admin/v1/media";
    t.raw(
        Method::DELETE,
        &format!("{v1}/{{server_name}}/{{media_id}}"),
        delete_media_route,
    );
    t.raw(
        Method::POST,
        &format!("{v1}/quarantine/{{server_name}}/{{media_id}}"),
        quarantine_route,
    );
    t.raw(
        Method::POST,
        &format!("{v1}/unquarantine/{{server_name}}/{{media_id}}"),
        unquarantine_route,
    );
}

/// `order_by` of a media list (`last_access_ts` and `safe_from_quarantine` are not kept here,
/// so they order by upload time).
pub fn order_param(query: &HashMap<String, String>) -> Result<MediaOrder> {
    Ok(match query.get("order_by").map(String::as_str) {
        None | Some("created_ts" | "last_access_ts" | "safe_from_quarantine") => {
            MediaOrder::CreatedTs
        }
        Some("media_id") => MediaOrder::MediaId,
        Some("upload_name") => MediaOrder::UploadName,
        Some("media_length") => MediaOrder::MediaLength,
        Some("media_type") => MediaOrder::MediaType,
        Some("quarantined_by") => MediaOrder::QuarantinedBy,
        Some(_) => return Err(Error::invalid_param("Unknown value for order_by")),
    })
}

/// A media item as the admin API lists it.
pub fn media_entry(row: &MediaRow) -> Value {
    json!({
        "media_id": row.media_id,
        "media_type": row.content_type,
        "media_length": row.size,
        "upload_name": row.filename,
        "created_ts": row.created_ts,
        "last_access_ts": null,
        "quarantined_by": row.quarantined_by,
        "safe_from_quarantine": false,
    })
}

/// `GET /_synapse/admin/v1/room/{roomId}/media`: the media the room's events point at.
pub async fn room_media_route(
    services: Data<Services>,
    caller: Authenticated,
    room_id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let media = services.admin.room_media(&parse_room(&room_id)?).await?;
    Ok(HttpResponse::Ok().json(media))
}

/// `DELETE /_synapse/admin/v1/media/{serverName}/{mediaId}`: local media only.
pub async fn delete_media_route(
    services: Data<Services>,
    caller: Authenticated,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let media_id = path_arg(&path.1)?;
    services
        .media
        .delete_local(&path_arg(&path.0)?, &media_id)
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "deleted_media": [media_id], "total": 1 })))
}

/// `POST /_synapse/admin/v1/media/quarantine/{serverName}/{mediaId}`: nobody can download it
/// or its thumbnails any more (404 `M_NOT_FOUND`).
pub async fn quarantine_route(
    services: Data<Services>,
    caller: Authenticated,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    services
        .media
        .set_quarantined(
            &path_arg(&path.0)?,
            &path_arg(&path.1)?,
            Some(&caller.0.user_id),
        )
        .await?;
    Ok(HttpResponse::Ok().json(json!({})))
}

/// `POST /_synapse/admin/v1/media/unquarantine/{serverName}/{mediaId}`
pub async fn unquarantine_route(
    services: Data<Services>,
    caller: Authenticated,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    services
        .media
        .set_quarantined(&path_arg(&path.0)?, &path_arg(&path.1)?, None)
        .await?;
    Ok(HttpResponse::Ok().json(json!({})))
}
