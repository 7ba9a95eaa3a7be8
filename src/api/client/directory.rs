//! Room aliases, the public room directory and the user directory.

use actix_web::{web::Data, HttpRequest};
use ruma::{
    api::client::{
        alias::{
            create_alias::v3 as create_alias, delete_alias::v3 as delete_alias,
            get_alias::v3 as get_alias,
        },
        directory::{
            get_public_rooms::v3 as public_rooms,
            get_public_rooms_filtered::v3 as public_rooms_filtered,
            get_room_visibility::v3 as get_visibility, set_room_visibility::v3 as set_visibility,
        },
        room::{aliases::v3 as room_aliases, Visibility},
        user_directory::search_users::v3 as search_users,
    },
    directory::{Filter, PublicRoomsChunk},
    OwnedRoomAliasId, ServerName, UInt,
};
use serde_json::Value;

use crate::{
    api::ruma::{authenticate, Ruma, RumaResponse},
    error::{Error, Result},
    service::Services,
};

/// `PUT /_matrix/client/v3/directory/room/{roomAlias}`
pub async fn create_alias_route(
    services: Data<Services>,
    body: Ruma<create_alias::Request>,
) -> Result<RumaResponse<create_alias::Response>> {
    let caller = body.caller()?;
    services
        .appservices
        .check_alias_unclaimed(body.body.room_alias.as_str(), caller.appservice.as_deref())?;
    services
        .rooms
        .create_alias(&caller.user_id, &body.body.room_alias, &body.body.room_id)
        .await?;
    Ok(create_alias::Response::new().into())
}

/// `GET /_matrix/client/v3/directory/room/{roomAlias}`
pub async fn get_alias_route(
    services: Data<Services>,
    body: Ruma<get_alias::Request>,
) -> Result<RumaResponse<get_alias::Response>> {
    let alias = &body.body.room_alias;
    let (room_id, servers) = if alias.server_name() == services.config.server_name {
        match services.rooms.resolve_local_alias(alias).await {
            // An appservice may create it on demand (IRC-style bridges).
            Err(err)
                if err.errcode() == "M_NOT_FOUND"
                    && services.appservices.query_alias(alias).await =>
            {
                services.rooms.resolve_local_alias(alias).await?
            }
            resolved => resolved?,
        }
    } else {
        services.federation.remote_alias(alias).await?
    };
    Ok(get_alias::Response::new(room_id, servers).into())
}

/// `DELETE /_matrix/client/v3/directory/room/{roomAlias}`
pub async fn delete_alias_route(
    services: Data<Services>,
    body: Ruma<delete_alias::Request>,
) -> Result<RumaResponse<delete_alias::Response>> {
    let caller = body.caller()?;
    services
        .rooms
        .delete_alias(caller, &body.body.room_alias)
        .await?;
    Ok(delete_alias::Response::new().into())
}

/// `GET /_matrix/client/v3/rooms/{roomId}/aliases`
pub async fn room_aliases_route(
    services: Data<Services>,
    body: Ruma<room_aliases::Request>,
) -> Result<RumaResponse<room_aliases::Response>> {
    let caller = body.caller()?;
    let aliases = services
        .rooms
        .room_aliases(&caller.user_id, &body.body.room_id)
        .await?;
    let aliases: Vec<OwnedRoomAliasId> = aliases
        .into_iter()
        .filter_map(|a| a.try_into().ok())
        .collect();
    Ok(room_aliases::Response::new(aliases).into())
}

/// `GET /_matrix/client/v3/directory/list/room/{roomId}`
pub async fn get_visibility_route(
    services: Data<Services>,
    body: Ruma<get_visibility::Request>,
) -> Result<RumaResponse<get_visibility::Response>> {
    let public = services
        .rooms
        .directory_visibility(&body.body.room_id)
        .await?;
    Ok(get_visibility::Response::new(if public {
        Visibility::Public
    } else {
        Visibility::Private
    })
    .into())
}

/// `PUT /_matrix/client/v3/directory/list/room/{roomId}`
pub async fn set_visibility_route(
    services: Data<Services>,
    body: Ruma<set_visibility::Request>,
) -> Result<RumaResponse<set_visibility::Response>> {
    let caller = body.caller()?;
    let public = body.body.visibility == Visibility::Public;
    services
        .rooms
        .set_directory_visibility(caller, &body.body.room_id, public)
        .await?;
    Ok(set_visibility::Response::new().into())
}

fn chunk(entries: Vec<Value>) -> Result<Vec<PublicRoomsChunk>> {
    entries
        .into_iter()
        .map(|e| serde_json::from_value(e).map_err(Error::internal))
        .collect()
}

fn page_limit(limit: Option<UInt>) -> Option<usize> {
    limit.map(|l| u64::from(l).clamp(1, 500) as usize)
}

/// The server of `?server=` when it is another one (our own name is the local directory).
fn remote<'a>(services: &Services, server: Option<&'a ServerName>) -> Option<&'a ServerName> {
    server.filter(|s| *s != services.config.server_name)
}

/// `GET /_matrix/client/v3/publicRooms`
pub async fn public_rooms_route(
    services: Data<Services>,
    body: Ruma<public_rooms::Request>,
    req: HttpRequest,
) -> Result<RumaResponse<public_rooms::Response>> {
    let request = &body.body;
    if let Some(server) = remote(&services, request.server.as_deref()) {
        // Only a logged-in user may make us ask another server (as Synapse); the endpoint
        // itself needs no token, so the extractor did not look for one.
        authenticate(&req, &services, true)
            .await?
            .ok_or_else(Error::missing_token)?;
        let page = services
            .federation
            .remote_public_rooms(
                server,
                request.limit,
                request.since.clone(),
                Filter::new(),
                ruma::directory::RoomNetwork::Matrix,
            )
            .await?;
        let mut response = public_rooms::Response::new(page.chunk);
        response.next_batch = page.next_batch;
        response.prev_batch = page.prev_batch;
        response.total_room_count_estimate = page.total_room_count_estimate;
        return Ok(response.into());
    }
    let (entries, next, prev, total) = services
        .rooms
        .public_rooms(None, page_limit(request.limit), request.since.as_deref())
        .await?;
    let mut response = public_rooms::Response::new(chunk(entries)?);
    response.next_batch = next;
    response.prev_batch = prev;
    response.total_room_count_estimate = UInt::new(total as u64);
    Ok(response.into())
}

/// `POST /_matrix/client/v3/publicRooms`
pub async fn public_rooms_filtered_route(
    services: Data<Services>,
    body: Ruma<public_rooms_filtered::Request>,
) -> Result<RumaResponse<public_rooms_filtered::Response>> {
    let request = &body.body;
    if let Some(server) = remote(&services, request.server.as_deref()) {
        let page = services
            .federation
            .remote_public_rooms(
                server,
                request.limit,
                request.since.clone(),
                request.filter.clone(),
                request.room_network.clone(),
            )
            .await?;
        let mut response = public_rooms_filtered::Response::new();
        response.chunk = page.chunk;
        response.next_batch = page.next_batch;
        response.prev_batch = page.prev_batch;
        response.total_room_count_estimate = page.total_room_count_estimate;
        return Ok(response.into());
    }
    let term = request.filter.generic_search_term.as_deref();
    let (entries, next, prev, total) = services
        .rooms
        .public_rooms(term, page_limit(request.limit), request.since.as_deref())
        .await?;
    let mut response = public_rooms_filtered::Response::new();
    response.chunk = chunk(entries)?;
    response.next_batch = next;
    response.prev_batch = prev;
    response.total_room_count_estimate = UInt::new(total as u64);
    Ok(response.into())
}

/// `POST /_matrix/client/v3/user_directory/search`
pub async fn search_users_route(
    services: Data<Services>,
    body: Ruma<search_users::Request>,
) -> Result<RumaResponse<search_users::Response>> {
    let caller = body.caller()?;
    let limit = u64::from(body.body.limit).clamp(1, 100) as usize;
    let (hits, limited) = services
        .rooms
        .search_users(&caller.user_id, &body.body.search_term, limit)
        .await?;
    let results = hits
        .into_iter()
        .map(|hit| {
            let value = serde_json::json!({ "user_id": hit.user_id, "display_name": hit.displayname, "avatar_url": hit.avatar_url });
            serde_json::from_value(value).map_err(Error::internal)
        })
        .collect::<Result<_>>()?;
    Ok(search_users::Response::new(results, limited).into())
}
