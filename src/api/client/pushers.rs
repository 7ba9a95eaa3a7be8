//! `GET /pushers` and `POST /pushers/set`.

use actix_web::{web::Data, HttpResponse};
use ruma::api::client::push::{get_pushers::v3 as get_pushers, set_pusher::v3 as set_pusher};
use serde_json::json;

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::Result,
    service::Services,
};

/// `GET /_matrix/client/v3/pushers`
pub async fn get_pushers_route(
    services: Data<Services>,
    body: Ruma<get_pushers::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let pushers = services.pushers.list(&caller.user_id).await?;
    Ok(HttpResponse::Ok().json(json!({ "pushers": pushers })))
}

/// `POST /_matrix/client/v3/pushers/set`
pub async fn set_pusher_route(
    services: Data<Services>,
    body: Ruma<set_pusher::Request>,
) -> Result<RumaResponse<set_pusher::Response>> {
    let caller = body.caller()?;
    services
        .pushers
        .set(
            &caller.user_id,
            caller.device_id.as_str(),
            body.body.action.clone(),
        )
        .await?;
    Ok(set_pusher::Response::new().into())
}
