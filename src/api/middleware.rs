//! Request middleware: CORS on every response, one tracing span per request, and no U+0000 in
//! a path or query string.

use std::time::Instant;

use actix_web::{
    body::{BoxBody, MessageBody},
    dev::{ServiceRequest, ServiceResponse},
    http::{
        header::{HeaderName, HeaderValue},
        Method, StatusCode,
    },
    middleware::Next,
    HttpMessage, HttpResponse, ResponseError,
};
use tracing::Instrument;

use super::ruma::RouteTemplate;
use crate::{error::Error, service::sessions::Caller};

const CORS_HEADERS: [(&str, &str); 3] = [
    ("access-control-allow-origin", "*"),
    (
        "access-control-allow-methods",
        "GET, POST, PUT, DELETE, OPTIONS",
    ),
    (
        "access-control-allow-headers",
        "X-Requested-With, Content-Type, Authorization",
    ),
];

fn add_cors(headers: &mut actix_web::http::header::HeaderMap) {
    for (name, value) in CORS_HEADERS {
        headers.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
}

/// The port of the federation listener, when there is one.
#[derive(Debug, Clone, Copy)]
pub struct FederationPort(pub Option<u16>);

/// Keeps the two listeners apart: the federation listener serves only federation and key
/// paths, and once it exists the main listener no longer serves them (404 `M_UNRECOGNIZED`).
/// The health probes answer on both.
pub async fn split_listeners(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let federation_port = req
        .app_data::<actix_web::web::Data<FederationPort>>()
        .and_then(|port| port.0);
    if let Some(port) = federation_port {
        let on_federation_listener = req.app_config().local_addr().port() == port;
        let federation_path = super::federation::is_federation_path(req.path());
        let probe = super::health::is_probe_path(req.path());
        if on_federation_listener != federation_path && !probe {
            let response = Error::unrecognized(StatusCode::NOT_FOUND).error_response();
            return Ok(req.into_response(response));
        }
    }
    next.call(req)
        .await
        .map(ServiceResponse::map_into_boxed_body)
}

/// Answers CORS preflights and adds the spec's CORS headers to every response.
pub async fn cors(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    if req.method() == Method::OPTIONS {
        let mut response = HttpResponse::new(StatusCode::NO_CONTENT);
        add_cors(response.headers_mut());
        return Ok(req.into_response(response));
    }
    let mut response = next.call(req).await?.map_into_boxed_body();
    add_cors(response.headers_mut());
    Ok(response)
}

/// Refuses, for every route, a path or query string that decodes to U+0000 with 400
/// `M_INVALID_PARAM`: no Matrix identifier, event type, transaction ID or token contains it, and
/// PostgreSQL `text` cannot store it.
pub async fn refuse_nul(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let decodes_to_nul = |s: &str| percent_encoding::percent_decode_str(s).any(|b| b == 0);
    let uri = req.uri();
    if decodes_to_nul(uri.path()) || uri.query().is_some_and(decodes_to_nul) {
        let error = Error::invalid_param("The path and query must not contain U+0000 (NUL)");
        return Ok(req.into_response(error.error_response()));
    }
    Ok(next.call(req).await?.map_into_boxed_body())
}

/// A `'static` label for a request method (`OTHER` for extension methods, so a client cannot
/// make new time series).
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        Method::HEAD => "HEAD",
        Method::PATCH => "PATCH",
        _ => "OTHER",
    }
}

/// Runs the request in a span, logs method, route template, status, latency and user, and
/// counts it in the HTTP metrics. Only the route template is logged, never the path or the
/// query string (they carry IDs, and `?access_token=` a secret).
pub async fn trace(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let method = method_label(req.method());
    let probe = super::health::is_probe_path(req.path());
    let span = tracing::info_span!(
        "request",
        method,
        route = tracing::field::Empty,
        user = tracing::field::Empty
    );
    let response = next.call(req).instrument(span.clone()).await?;
    let metrics = crate::metrics::metrics();
    // Ruma endpoints record their template; matching the route table again is the fallback.
    let template = response
        .request()
        .extensions()
        .get::<RouteTemplate>()
        .map(|t| t.0);
    let route = template
        .or_else(|| {
            response
                .request()
                .match_pattern()
                .map(|pattern| metrics.route(&pattern))
        })
        .unwrap_or("<unmatched>");
    span.record("route", route);
    if let Some(caller) = response.request().extensions().get::<Caller>() {
        span.record("user", caller.user_id.as_str());
    }
    let status = response.status().as_u16();
    metrics.observe_http(method, route, status, started);
    if status == StatusCode::TOO_MANY_REQUESTS.as_u16() {
        metrics.rate_limited.inc();
    }
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    let latency_ms = format!("{latency_ms:.2}");
    // Probes come every few seconds; at INFO they would drown the log.
    if probe {
        span.in_scope(|| tracing::debug!(status, latency_ms, "served"));
    } else {
        span.in_scope(|| tracing::info!(status, latency_ms, "served"));
    }
    Ok(response)
}
