//! `/relations` and `/threads`.

use actix_web::{web::Data, HttpResponse};
use ruma::api::{
    client::{
        relations::{
            get_relating_events::v1 as all_relations,
            get_relating_events_with_rel_type::v1 as by_type,
            get_relating_events_with_rel_type_and_event_type::v1 as by_type_and_event_type,
        },
        threads::get_threads::v1 as threads,
    },
    Direction,
};

use crate::{api::ruma::Ruma, error::Result, service::Services};

/// What the three `/relations` endpoints share.
struct RelationsQuery<'a> {
    rel_type: Option<String>,
    event_type: Option<String>,
    from: Option<&'a str>,
    to: Option<&'a str>,
    dir: &'a Direction,
    limit: Option<u64>,
}

async fn relations(
    services: &Services,
    caller: &crate::service::sessions::Caller,
    room_id: &ruma::RoomId,
    event_id: &ruma::EventId,
    query: RelationsQuery<'_>,
) -> Result<HttpResponse> {
    let answer = services
        .rooms
        .relations(
            &caller.user_id,
            room_id,
            event_id.as_str(),
            query.rel_type.as_deref(),
            query.event_type.as_deref(),
            query.from,
            query.to,
            *query.dir == Direction::Forward,
            query.limit,
        )
        .await?;
    Ok(HttpResponse::Ok().json(answer))
}

/// `GET /_matrix/client/v1/rooms/{roomId}/relations/{eventId}`
pub async fn relations_route(
    services: Data<Services>,
    body: Ruma<all_relations::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let r = &body.body;
    let query = RelationsQuery {
        rel_type: None,
        event_type: None,
        from: r.from.as_deref(),
        to: r.to.as_deref(),
        dir: &r.dir,
        limit: r.limit.map(u64::from),
    };
    relations(&services, caller, &r.room_id, &r.event_id, query).await
}

/// `GET /_matrix/client/v1/rooms/{roomId}/relations/{eventId}/{relType}`
pub async fn relations_by_type_route(
    services: Data<Services>,
    body: Ruma<by_type::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let r = &body.body;
    let query = RelationsQuery {
        rel_type: Some(r.rel_type.to_string()),
        event_type: None,
        from: r.from.as_deref(),
        to: r.to.as_deref(),
        dir: &r.dir,
        limit: r.limit.map(u64::from),
    };
    relations(&services, caller, &r.room_id, &r.event_id, query).await
}

/// `GET /_matrix/client/v1/rooms/{roomId}/relations/{eventId}/{relType}/{eventType}`
pub async fn relations_by_type_and_event_type_route(
    services: Data<Services>,
    body: Ruma<by_type_and_event_type::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let r = &body.body;
    let query = RelationsQuery {
        rel_type: Some(r.rel_type.to_string()),
        event_type: Some(r.event_type.to_string()),
        from: r.from.as_deref(),
        to: r.to.as_deref(),
        dir: &r.dir,
        limit: r.limit.map(u64::from),
    };
    relations(&services, caller, &r.room_id, &r.event_id, query).await
}

/// `GET /_matrix/client/v1/rooms/{roomId}/threads`
pub async fn threads_route(
    services: Data<Services>,
    body: Ruma<threads::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let r = &body.body;
    let participated = matches!(r.include, threads::IncludeThreads::Participated);
    let answer = services
        .rooms
        .threads(
            &caller.user_id,
            &r.room_id,
            participated,
            r.from.as_deref(),
            r.limit.map(u64::from),
        )
        .await?;
    Ok(HttpResponse::Ok().json(answer))
}
