//! Stored sync filters.

use actix_web::web::Data;
use ruma::api::client::filter::{create_filter::v3 as create_filter, get_filter::v3 as get_filter};

use super::ensure_self;
use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::Services,
};

/// `POST /_matrix/client/v3/user/{userId}/filter`
pub async fn create_filter_route(
    services: Data<Services>,
    body: Ruma<create_filter::Request>,
) -> Result<RumaResponse<create_filter::Response>> {
    let caller = body.caller()?;
    ensure_self(&caller.user_id, &body.body.user_id, "create filters")?;
    let filter = serde_json::to_value(&body.body.filter).map_err(Error::internal)?;
    let filter_id = services
        .account_data
        .create_filter(&caller.user_id, &filter)
        .await?;
    Ok(create_filter::Response::new(filter_id).into())
}

/// `GET /_matrix/client/v3/user/{userId}/filter/{filterId}`
pub async fn get_filter_route(
    services: Data<Services>,
    body: Ruma<get_filter::Request>,
) -> Result<RumaResponse<get_filter::Response>> {
    let caller = body.caller()?;
    ensure_self(&caller.user_id, &body.body.user_id, "get filters")?;
    let stored = services
        .account_data
        .get_filter(&caller.user_id, &body.body.filter_id)
        .await?;
    let filter = serde_json::from_value(stored).map_err(Error::internal)?;
    Ok(get_filter::Response::new(filter).into())
}
