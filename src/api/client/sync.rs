//! `/sync` and `/messages`.

use std::time::Duration;

use actix_web::{web::Data, HttpResponse};
use ruma::api::{
    client::{
        filter::FilterDefinition,
        message::get_message_events::v3 as messages,
        sync::sync_events::v3::{self as sync_events, Filter},
    },
    Direction,
};

use super::rooms::to_raw;
use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    metrics::Resumed,
    service::{
        rooms::messages::PageRequest,
        sync::{
            token::{parse_pagination, SyncToken},
            EventFilter, SyncFilter, SyncRequest,
        },
        Services,
    },
};

/// Most events one `/messages` page returns.
const MAX_PAGE: usize = 1_000;

/// `GET /_matrix/client/v3/sync`
///
/// What stays alive while the sync is parked is kept small: this future is allocated once
/// per request, at the size of everything it holds across its largest await, and ten
/// thousand parked clients are ten thousand of these. The parsed request arrives boxed and is
/// taken apart in a boxed step, so the future holds the owned [`SyncRequest`] and the wait.
pub async fn sync_route(
    services: Data<Services>,
    body: Box<Ruma<sync_events::Request>>,
) -> Result<HttpResponse> {
    let sync = Box::pin(prepare_sync(&services, body)).await?;
    let (response, resumed) = services.sync.sync(&services.rooms, &sync).await?;
    json_counted(&response, "v3", resumed)
}

/// Reads the request's filter and token, and marks the user as syncing (their presence).
/// Takes the box itself: a box moved out of is freed only when it goes out of scope, and the
/// handler's argument is in scope until the handler ends.
async fn prepare_sync(
    services: &Services,
    body: Box<Ruma<sync_events::Request>>,
) -> Result<SyncRequest> {
    let caller = body.caller()?.clone();
    let Ruma { body: request, .. } = *body;
    let filter = match request.filter {
        None => SyncFilter::from_definition(&FilterDefinition::default()),
        Some(Filter::FilterDefinition(definition)) => SyncFilter::from_definition(&definition),
        Some(Filter::FilterId(id)) => {
            let stored = services
                .account_data
                .get_filter(&caller.user_id, &id)
                .await?;
            let definition: FilterDefinition =
                serde_json::from_value(stored).map_err(Error::internal)?;
            SyncFilter::from_definition(&definition)
        }
        Some(_) => return Err(Error::invalid_param("Unsupported filter")),
    };
    let since = request.since.as_deref().map(SyncToken::parse).transpose()?;
    // A shadow-banned user's presence is never shared (here or with other servers).
    if !caller.shadow_banned {
        services
            .presence
            .syncing(&caller.user_id, &request.set_presence)
            .await?;
    }
    Ok(SyncRequest {
        user_id: caller.user_id,
        device_id: caller.device_id,
        since,
        full_state: request.full_state,
        timeout: request.timeout.unwrap_or(Duration::ZERO),
        filter,
    })
}

/// A sync response as JSON, its size counted in the metrics under `api`, and the time since
/// the sync `resumed` for it (the last part of the delivery latency).
pub(super) fn json_counted(
    response: &impl serde::Serialize,
    api: &'static str,
    resumed: Resumed,
) -> Result<HttpResponse> {
    let body = serde_json::to_vec(response).map_err(Error::internal)?;
    crate::metrics::metrics()
        .sync_response_bytes
        .get_or_create(&crate::metrics::ApiLabel { api })
        .observe(body.len() as f64);
    resumed.observe_written(api);
    Ok(HttpResponse::Ok()
        .content_type(mime::APPLICATION_JSON)
        .body(body))
}

/// `GET /_matrix/client/v3/rooms/{roomId}/messages`
pub async fn messages_route(
    services: Data<Services>,
    body: Ruma<messages::Request>,
) -> Result<RumaResponse<messages::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    let page = PageRequest {
        user_id: &caller.user_id,
        room_id: &request.room_id,
        from: request.from.as_deref().map(parse_pagination).transpose()?,
        to: request.to.as_deref().map(parse_pagination).transpose()?,
        backwards: request.dir == Direction::Backward,
        limit: (u64::from(request.limit) as usize).clamp(1, MAX_PAGE),
        lazy_load_members: !request.filter.lazy_load_options.is_disabled(),
        filter: EventFilter::from_room_filter(&request.filter),
    };
    let found = services.federation.messages(&services.rooms, &page).await?;
    let mut response = messages::Response::new();
    response.start = found.start;
    response.end = found.end;
    response.chunk = found.chunk.iter().map(to_raw).collect::<Result<_>>()?;
    response.state = found.state.iter().map(to_raw).collect::<Result<_>>()?;
    Ok(response.into())
}

#[cfg(test)]
mod tests {
    use actix_web::Handler;

    /// The size of the future a handler returns (allocated once per request), without calling
    /// it.
    fn future_size<F: Handler<Args>, Args>(_: F) -> usize {
        std::mem::size_of::<F::Future>()
    }

    /// A parked sync keeps its handler's future for as long as it waits (ten thousand parked
    /// clients, ten thousand of these): the request is taken apart before the wait, so the
    /// future holds the owned request and the wait's own state, not the parsed request and
    /// the steps before the wait. Debug builds, at the time of writing: `/sync` 1,968 bytes
    /// (3,096 with the parsed request inline, 4,104 before either), sliding sync 1,424
    /// (3,160 with the connection's load and save inline).
    #[test]
    fn a_parked_sync_keeps_a_small_future() {
        let sync = future_size(super::sync_route);
        assert!(sync <= 2_560, "the /sync handler's future is {sync} bytes");
        let sliding = future_size(super::super::sliding_sync::sliding_sync_route);
        assert!(
            sliding <= 2_048,
            "the sliding sync handler's future is {sliding} bytes"
        );
    }
}
