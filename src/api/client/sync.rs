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
/// What stays alive while the sync is parked is kept small: the awaits before it are boxed,
/// so that this future (allocated once per request, at the size of its largest await) holds
/// little more than the parked sync's own state. Ten thousand parked clients are ten
/// thousand of these.
pub async fn sync_route(
    services: Data<Services>,
    body: Ruma<sync_events::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?.clone();
    let request = body.body;
    let filter = match request.filter {
        None => SyncFilter::from_definition(&FilterDefinition::default()),
        Some(Filter::FilterDefinition(definition)) => SyncFilter::from_definition(&definition),
        Some(Filter::FilterId(id)) => {
            let stored = Box::pin(services.account_data.get_filter(&caller.user_id, &id)).await?;
            let definition: FilterDefinition =
                serde_json::from_value(stored).map_err(Error::internal)?;
            SyncFilter::from_definition(&definition)
        }
        Some(_) => return Err(Error::invalid_param("Unsupported filter")),
    };
    let since = request.since.as_deref().map(SyncToken::parse).transpose()?;
    // A shadow-banned user's presence is never shared (here or with other servers).
    if !caller.shadow_banned {
        Box::pin(
            services
                .presence
                .syncing(&caller.user_id, &request.set_presence),
        )
        .await?;
    }
    let sync = SyncRequest {
        user_id: &caller.user_id,
        device_id: caller.device_id.as_str(),
        since,
        full_state: request.full_state,
        timeout: request.timeout.unwrap_or(Duration::ZERO),
        filter,
    };
    let (response, resumed) = services.sync.sync(&services.rooms, &sync).await?;
    json_counted(&response, "v3", resumed)
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
