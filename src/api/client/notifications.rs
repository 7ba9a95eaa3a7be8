//! `GET /notifications`: the user's notification history.

use actix_web::{web::Data, HttpResponse};
use ruma::api::client::push::get_notifications::v3 as get_notifications;
use serde_json::json;

use crate::{api::ruma::Ruma, error::Result, service::Services};

/// `GET /_matrix/client/v3/notifications`
pub async fn get_notifications_route(
    services: Data<Services>,
    body: Ruma<get_notifications::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let request = &body.body;
    let (notifications, next_token) = services
        .rooms
        .notifications(
            &caller.user_id,
            request.from.as_deref(),
            request.limit.map(u64::from),
            request.only.as_deref() == Some("highlight"),
        )
        .await?;
    let mut response = json!({ "notifications": notifications });
    if let Some(token) = next_token {
        response["next_token"] = token.into();
    }
    Ok(HttpResponse::Ok().json(response))
}
