//! Push rules (the server-default ruleset until per-user rules land with push support).

use actix_web::web::Data;
use ruma::{api::client::push::get_pushrules_all::v3 as get_all, push::Ruleset};

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::Result,
    service::Services,
};

/// `GET /_matrix/client/v3/pushrules/`
pub async fn get_pushrules_all_route(
    _services: Data<Services>,
    body: Ruma<get_all::Request>,
) -> Result<RumaResponse<get_all::Response>> {
    let caller = body.caller()?;
    Ok(get_all::Response::new(Ruleset::server_default(&caller.user_id)).into())
}
