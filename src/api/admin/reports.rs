//! `/_synapse/admin/v1/event_reports`: the reports users made of events, as Synapse's admin
//! API serves them (so admin UIs such as synapse-admin read them).

use std::collections::HashMap;

use actix_web::{web, web::Data, HttpResponse};
use serde_json::json;

use super::{backwards_param, ensure_admin, int_param};
use crate::{
    api::ruma::Authenticated,
    error::{Error, Result},
    service::{reports::ReportFilters, Services},
};

/// Reports per page unless `limit` says otherwise (Synapse's default).
const DEFAULT_LIMIT: i64 = 100;

fn report_id(raw: &str) -> Result<i64> {
    raw.parse::<i64>()
        .ok()
        .filter(|id| *id >= 0)
        .ok_or_else(|| {
            Error::invalid_param(
                "The report_id parameter must be a string representing a positive integer",
            )
        })
}

/// `GET /_synapse/admin/v1/event_reports?from=&limit=&dir=&room_id=&user_id=&event_sender_user_id=`:
/// newest first
/// unless `dir=f`; `next_token` is the `from` of the next page.
pub async fn list_event_reports_route(
    services: Data<Services>,
    caller: Authenticated,
    query: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let from = int_param(&query, "from", 0)?;
    let limit = int_param(&query, "limit", DEFAULT_LIMIT)?;
    let oldest_first = !backwards_param(&query, true)?;
    let page = services
        .reports
        .list_event_reports(
            from,
            limit,
            oldest_first,
            ReportFilters {
                room_id: query.get("room_id").map(String::as_str),
                user_id: query.get("user_id").map(String::as_str),
                event_sender: query.get("event_sender_user_id").map(String::as_str),
            },
        )
        .await?;
    let mut body = json!({ "event_reports": page.reports, "total": page.total });
    if let Some(next) = page.next_token {
        body["next_token"] = json!(next);
    }
    Ok(HttpResponse::Ok().json(body))
}

/// `GET /_synapse/admin/v1/event_reports/{reportId}`: one report with the reported event.
pub async fn get_event_report_route(
    services: Data<Services>,
    caller: Authenticated,
    id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    let report = services.reports.get_event_report(report_id(&id)?).await?;
    Ok(HttpResponse::Ok().json(report))
}

/// `DELETE /_synapse/admin/v1/event_reports/{reportId}`
pub async fn delete_event_report_route(
    services: Data<Services>,
    caller: Authenticated,
    id: web::Path<String>,
) -> Result<HttpResponse> {
    ensure_admin(&caller.0)?;
    services
        .reports
        .delete_event_report(report_id(&id)?)
        .await?;
    Ok(HttpResponse::Ok().json(json!({})))
}
