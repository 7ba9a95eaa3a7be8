//! `POST /search`.

use actix_web::{
    web::{Data, Query},
    HttpResponse,
};
use serde::Deserialize;
use serde_json::Value;

use crate::{
    api::ruma::{Authenticated, JsonBody},
    error::Result,
    service::Services,
};

/// The `next_batch` query parameter.
#[derive(Deserialize)]
pub struct SearchQuery {
    next_batch: Option<String>,
}

/// `POST /_matrix/client/v3/search` (parsed by hand: ruma cannot tell an absent
/// `event_context` from a default one, and context is only sent when asked for).
pub async fn search_route(
    services: Data<Services>,
    caller: Authenticated,
    query: Query<SearchQuery>,
    body: JsonBody<Value>,
) -> Result<HttpResponse> {
    let answer = services
        .rooms
        .search(&caller.0.user_id, &body.0, query.next_batch.as_deref())
        .await?;
    Ok(HttpResponse::Ok().json(answer))
}
