//! `GET` and `POST /_matrix/federation/v1/publicRooms`: our published room directory, the same
//! one clients see.

use actix_web::web::Data;
use ruma::{
    api::federation::directory::{get_public_rooms, get_public_rooms_filtered},
    directory::{PublicRoomsChunk, RoomNetwork},
    UInt,
};

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::Services,
};

/// One page of the directory: chunk, next and previous batch, total.
type Page = (
    Vec<PublicRoomsChunk>,
    Option<String>,
    Option<String>,
    Option<UInt>,
);

/// A page of the local directory. Rooms of third-party networks: there are none.
async fn page(
    services: &Services,
    term: Option<&str>,
    limit: Option<UInt>,
    since: Option<&str>,
    network: &RoomNetwork,
) -> Result<Page> {
    if matches!(network, RoomNetwork::ThirdParty(_)) {
        return Ok((Vec::new(), None, None, Some(UInt::MIN)));
    }
    let limit = limit.map(|l| u64::from(l).clamp(1, 500) as usize);
    let (entries, next, prev, total) = services.rooms.public_rooms(term, limit, since).await?;
    let chunk = entries
        .into_iter()
        .map(|e| serde_json::from_value(e).map_err(Error::internal))
        .collect::<Result<_>>()?;
    Ok((chunk, next, prev, UInt::new(total as u64)))
}

/// `GET /_matrix/federation/v1/publicRooms`
pub async fn public_rooms_route(
    services: Data<Services>,
    body: Ruma<get_public_rooms::v1::Request>,
) -> Result<RumaResponse<get_public_rooms::v1::Response>> {
    body.origin()?;
    let r = &body.body;
    let (chunk, next, prev, total) = page(
        &services,
        None,
        r.limit,
        r.since.as_deref(),
        &r.room_network,
    )
    .await?;
    let mut response = get_public_rooms::v1::Response::new();
    response.chunk = chunk;
    response.next_batch = next;
    response.prev_batch = prev;
    response.total_room_count_estimate = total;
    Ok(response.into())
}

/// `POST /_matrix/federation/v1/publicRooms`
pub async fn public_rooms_filtered_route(
    services: Data<Services>,
    body: Ruma<get_public_rooms_filtered::v1::Request>,
) -> Result<RumaResponse<get_public_rooms_filtered::v1::Response>> {
    body.origin()?;
    let r = &body.body;
    let (chunk, next, prev, total) = page(
        &services,
        r.filter.generic_search_term.as_deref(),
        r.limit,
        r.since.as_deref(),
        &r.room_network,
    )
    .await?;
    let mut response = get_public_rooms_filtered::v1::Response::new();
    response.chunk = chunk;
    response.next_batch = next;
    response.prev_batch = prev;
    response.total_room_count_estimate = total;
    Ok(response.into())
}
