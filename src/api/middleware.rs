//! Request middleware: CORS on every response, one tracing span per request, no U+0000 in a
//! path or query string, and a long-poll's headers kept in a map of their own size.

use std::time::Instant;

use actix_web::{
    body::{BoxBody, MessageBody},
    dev::{Service, ServiceRequest, ServiceResponse, Transform},
    http::{
        header::{HeaderMap, HeaderName, HeaderValue},
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

/// Moves a request's headers into a map of their own size before the route runs. actix-http
/// parses every request's headers into a map made for 16 (about 6.7 KiB) and keeps it until
/// the response: for a long-poll, a minute, ten thousand at a time. A handful of headers fit
/// in a map a quarter of that size. Nothing is kept per request: the route's own future is
/// the one returned.
pub struct CompactHeaders;

impl<S, B> Transform<S, ServiceRequest> for CompactHeaders
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
{
    type Response = ServiceResponse<B>;
    type Error = actix_web::Error;
    type Transform = CompactHeadersService<S>;
    type InitError = ();
    type Future = std::future::Ready<Result<Self::Transform, ()>>;

    fn new_transform(&self, service: S) -> Self::Future {
        std::future::ready(Ok(CompactHeadersService { route: service }))
    }
}

/// [`CompactHeaders`] around one route.
pub struct CompactHeadersService<S> {
    route: S,
}

impl<S, B> Service<ServiceRequest> for CompactHeadersService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
{
    type Response = ServiceResponse<B>;
    type Error = actix_web::Error;
    type Future = S::Future;

    actix_web::dev::forward_ready!(route);

    fn call(&self, mut req: ServiceRequest) -> Self::Future {
        let compact: HeaderMap = req
            .headers()
            .iter()
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        *req.headers_mut() = compact;
        self.route.call(req)
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

#[cfg(test)]
mod tests {
    use actix_web::{
        dev::{fn_service, Service, ServiceRequest, Transform},
        http::header::{HeaderMap, HeaderName, HeaderValue},
        test, HttpResponse,
    };

    use super::CompactHeaders;

    /// The route sees every header value, repeated names included, in a map sized for them
    /// instead of the one actix-http parsed them into, made for 16.
    #[actix_web::test]
    async fn compact_headers_keep_every_value_in_a_map_of_their_size() {
        let route = CompactHeaders
            .new_transform(fn_service(|req: ServiceRequest| async move {
                let mut pairs: Vec<(String, String)> = req
                    .headers()
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
                    .collect();
                pairs.sort();
                let seen = (req.headers().capacity(), pairs);
                Ok::<_, actix_web::Error>(req.into_response(HttpResponse::Ok().json(seen)))
            }))
            .await
            .unwrap();
        let sent = [
            ("authorization", "Bearer token"),
            ("accept", "application/json"),
            ("accept", "text/plain"),
        ];
        let mut parsed = HeaderMap::with_capacity(16);
        for (name, value) in sent {
            parsed.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let mut request = test::TestRequest::get().uri("/").to_srv_request();
        *request.headers_mut() = parsed;
        let response = route.call(request).await.unwrap();
        let (capacity, pairs): (usize, Vec<(String, String)>) =
            test::read_body_json(response).await;
        let mut expected = sent.map(|(n, v)| (n.to_owned(), v.to_owned()));
        expected.sort();
        assert_eq!(pairs, expected);
        assert!(capacity < 16, "a map made for {capacity} headers");
    }
}
