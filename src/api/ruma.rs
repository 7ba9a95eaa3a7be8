//! The seam between actix-web (http 0.2) and ruma (http 1): the [`Ruma`] extractor parses a
//! request with ruma's own types and authenticates it once, by the endpoint's auth scheme;
//! [`RumaResponse`] turns a ruma response back into an actix response.

use std::{any::TypeId, future::Future, pin::Pin};

use actix_web::{
    dev::Payload, http::StatusCode, web, FromRequest, HttpMessage, HttpRequest, HttpResponse,
    Responder,
};
use futures_util::StreamExt;
use ruma::api::{
    auth_scheme::{AccessToken, AccessTokenOptional, AppserviceToken, AppserviceTokenOptional},
    client::account::register,
    error::{DeserializationError, FromHttpRequestError},
    federation::authentication::ServerSignatures,
    path_builder::PathBuilder,
    IncomingRequest, IncomingRequestExt, OutgoingResponse, OutgoingResponseExt,
};
use ruma::{OwnedServerName, ServerName};
use serde::de::DeserializeOwned;

use crate::{
    api::client_ip::client_ip,
    error::{Error, Result},
    service::{sessions::Caller, Services},
};

/// A parsed and authenticated ruma request.
pub struct Ruma<T> {
    /// The request, as ruma parsed it.
    pub body: T,
    /// The authenticated caller, for endpoints that take an access token.
    pub caller: Option<Caller>,
    /// The authenticated origin server, for federation endpoints (X-Matrix).
    pub origin: Option<OwnedServerName>,
}

impl<T> Ruma<T> {
    /// The caller of an endpoint that requires authentication.
    pub fn caller(&self) -> Result<&Caller> {
        self.caller.as_ref().ok_or_else(Error::missing_token)
    }

    /// The server that signed a federation request.
    pub fn origin(&self) -> Result<&ServerName> {
        self.origin
            .as_deref()
            .ok_or_else(|| Error::internal("federation endpoint without X-Matrix"))
    }
}

/// The path template of the endpoint that served a request (for logs and metrics).
#[derive(Debug, Clone, Copy)]
pub struct RouteTemplate(pub &'static str);

/// A ruma response, sent as JSON.
pub struct RumaResponse<T>(pub T);

impl<T> From<T> for RumaResponse<T> {
    fn from(response: T) -> Self {
        RumaResponse(response)
    }
}

impl<T: OutgoingResponse> Responder for RumaResponse<T> {
    type Body = actix_web::body::BoxBody;

    fn respond_to(self, _req: &HttpRequest) -> HttpResponse {
        match self.0.try_into_http_response::<Vec<u8>>() {
            Ok(response) => {
                let (parts, body) = response.into_parts();
                let status = StatusCode::from_u16(parts.status.as_u16()).unwrap_or(StatusCode::OK);
                let mut builder = HttpResponse::build(status);
                for (name, value) in &parts.headers {
                    builder.append_header((name.as_str(), value.as_bytes()));
                }
                builder.body(body)
            }
            Err(err) => actix_web::ResponseError::error_response(&Error::internal(format!(
                "response: {err}"
            ))),
        }
    }
}

/// The shared services, from the app data.
pub fn services(req: &HttpRequest) -> Result<web::Data<Services>> {
    req.app_data::<web::Data<Services>>()
        .cloned()
        .ok_or_else(|| Error::internal("services missing"))
}

/// Reads the whole body, refusing more than the configured limit with `M_TOO_LARGE`.
pub async fn read_body(req: &HttpRequest, payload: &mut Payload, limit: usize) -> Result<Vec<u8>> {
    if let Some(length) = req
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
    {
        if length > limit {
            return Err(Error::too_large(format!(
                "Request body is larger than {limit} bytes"
            )));
        }
    }
    let mut body = Vec::new();
    while let Some(chunk) = payload.next().await {
        let chunk =
            chunk.map_err(|e| Error::bad_json(format!("Could not read request body: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(Error::too_large(format!(
                "Request body is larger than {limit} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Reads a JSON request body (see [`read_body`]) and refuses one with U+0000 in any string.
async fn read_json_body(req: &HttpRequest, payload: &mut Payload) -> Result<Vec<u8>> {
    let services = services(req)?;
    let body = read_body(req, payload, services.config.max_request_size).await?;
    refuse_nul_strings(&body)?;
    Ok(body)
}

/// Refuses a JSON body with U+0000 in a string, key or value, with 400 `M_BAD_JSON`: PostgreSQL
/// `jsonb` and `text` cannot store it. Only a body whose bytes contain the escape `\u0000` is
/// parsed to confirm (in `"\\u0000"` the escape is a backslash, followed by plain text). A
/// body that does not parse is left to the parse that follows, which names the error.
fn refuse_nul_strings(body: &[u8]) -> Result<()> {
    const ESCAPE: &[u8] = b"\\u0000";
    if !body.windows(ESCAPE.len()).any(|w| w == ESCAPE) {
        return Ok(());
    }
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(value) if contains_nul(&value) => Err(Error::bad_json(
            "Strings in the request body must not contain U+0000 (NUL)",
        )),
        _ => Ok(()),
    }
}

/// Whether any string in a JSON value, object keys included, contains U+0000.
fn contains_nul(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(contains_nul),
        Value::Object(map) => map
            .iter()
            .any(|(key, value)| key.contains('\0') || contains_nul(value)),
        _ => false,
    }
}

/// The access token of a request: `Authorization: Bearer` or the deprecated query parameter.
fn access_token(req: &HttpRequest) -> Result<Option<String>> {
    if let Some(header) = req.headers().get("authorization") {
        let value = header.to_str().map_err(|_| Error::unknown_token(false))?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or_else(|| Error::unknown_token(false))?;
        return Ok(Some(token.trim().to_owned()));
    }
    let query =
        web::Query::<std::collections::HashMap<String, String>>::from_query(req.query_string())
            .map(|q| q.into_inner())
            .unwrap_or_default();
    Ok(query.get("access_token").cloned())
}

/// Authenticates a request by access token; `required` decides whether a missing token is an error.
pub async fn authenticate(
    req: &HttpRequest,
    services: &Services,
    required: bool,
) -> Result<Option<Caller>> {
    authenticate_for(req, services, required, false).await
}

/// [`authenticate`], where an application service may assert a user it has not registered
/// yet when `unregistered_ok` (on `/register`).
async fn authenticate_for(
    req: &HttpRequest,
    services: &Services,
    required: bool,
    unregistered_ok: bool,
) -> Result<Option<Caller>> {
    let Some(token) = access_token(req)? else {
        return if required {
            Err(Error::missing_token())
        } else {
            Ok(None)
        };
    };
    let caller = match services.appservices.by_token(&token) {
        Some(registration) => {
            let query = web::Query::<std::collections::HashMap<String, String>>::from_query(
                req.query_string(),
            )
            .map(|q| q.into_inner())
            .unwrap_or_default();
            // MSC3202's name came first; mautrix-go sends both.
            let device = query
                .get("device_id")
                .or_else(|| query.get("org.matrix.msc3202.device_id"));
            services
                .appservices
                .caller(
                    registration,
                    query.get("user_id").map(String::as_str),
                    device.map(String::as_str),
                    unregistered_ok,
                )
                .await?
        }
        None => {
            let ip = client_ip(req, &services.config.trusted_proxies).to_string();
            services.sessions.authenticate(&token, Some(&ip)).await?
        }
    };
    req.extensions_mut().insert(caller.clone());
    Ok(Some(caller))
}

/// Maps ruma's parse failures onto Matrix errors.
fn request_error(err: FromHttpRequestError) -> Error {
    match err {
        FromHttpRequestError::MethodMismatch { .. } => {
            Error::unrecognized(StatusCode::METHOD_NOT_ALLOWED)
        }
        FromHttpRequestError::Deserialization(err) => match err {
            DeserializationError::Json(e) => Error::bad_json(e.to_string()),
            DeserializationError::Query(e) => {
                let message = e.to_string();
                if message.contains("missing field") {
                    Error::missing_param(message)
                } else {
                    Error::invalid_param(message)
                }
            }
            DeserializationError::Ident(e) => Error::invalid_param(e.to_string()),
            other => Error::bad_json(other.to_string()),
        },
        other => Error::bad_json(other.to_string()),
    }
}

/// Whether a body is present and is not JSON at all.
fn is_not_json(body: &[u8]) -> bool {
    !body.is_empty() && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_err()
}

/// Converts the actix request into an `http` 1.x request for ruma.
fn to_http_request(req: &HttpRequest, body: &[u8]) -> Result<http::Request<Vec<u8>>> {
    let mut builder = http::Request::builder()
        .method(req.method().as_str())
        .uri(req.uri().to_string());
    for (name, value) in req.headers() {
        builder = builder.header(name.as_str(), value.as_bytes());
    }
    builder
        .body(body.to_vec())
        .map_err(|e| Error::bad_json(format!("Malformed request: {e}")))
}

/// The decoded path arguments, in the order of the endpoint's path template (a parameter the
/// matched route lacks, such as an omitted state key, is empty).
fn path_args(req: &HttpRequest, template: &str) -> Result<Vec<String>> {
    template
        .split('/')
        .filter_map(|segment| segment.strip_prefix('{')?.strip_suffix('}'))
        .map(|name| {
            let raw = req.match_info().get(name).unwrap_or_default();
            percent_encoding::percent_decode_str(raw)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| Error::invalid_param(format!("Path parameter {name} is not UTF-8")))
        })
        .collect()
}

impl<T> FromRequest for Ruma<T>
where
    T: IncomingRequest + 'static,
{
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let req = req.clone();
        let mut payload = payload.take();
        Box::pin(async move {
            let services = services(&req)?;
            let body = read_json_body(&req, &mut payload).await?;
            let scheme = TypeId::of::<T::Authentication>();
            // An appservice registers its users before they exist.
            let registering = TypeId::of::<T>() == TypeId::of::<register::v3::Request>();
            let caller = if scheme == TypeId::of::<AccessToken>() {
                authenticate(&req, &services, true).await?
            } else if registering {
                authenticate_for(&req, &services, false, true).await?
            } else if [
                TypeId::of::<AccessTokenOptional>(),
                TypeId::of::<AppserviceToken>(),
                TypeId::of::<AppserviceTokenOptional>(),
            ]
            .contains(&scheme)
            {
                authenticate(&req, &services, false).await?
            } else {
                None
            };
            if is_not_json(&body) {
                return Err(Error::not_json("Content not JSON"));
            }
            // X-Matrix signs the body as sent, so it is checked before the bodiless-POST fixup.
            let origin = if scheme == TypeId::of::<ServerSignatures>() {
                let request = to_http_request(&req, &body)?;
                let (parts, body) = request.into_parts();
                let request = http::Request::from_parts(parts, body.as_slice());
                Some(services.federation.authenticate(&request).await?)
            } else {
                None
            };
            // Clients (matrix-nio's join, for one) send bodiless POSTs where every field is
            // optional; read them as `{}`, as Synapse does.
            let body = if body.is_empty()
                && (req.method() == actix_web::http::Method::POST
                    || req.method() == actix_web::http::Method::PUT)
            {
                b"{}".to_vec()
            } else {
                body
            };
            let http_request = to_http_request(&req, &body)?;
            let (parts, body) = http_request.into_parts();
            let template = T::PATH_BUILDER.all_paths().last().unwrap_or_default();
            req.extensions_mut().insert(RouteTemplate(template));
            let args = path_args(&req, template)?;
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let parsed = parse_catching_panics(|| {
                T::try_from_http_request(http::Request::from_parts(parts, body.as_slice()), &args)
            })?
            .map_err(request_error)?;
            Ok(Ruma {
                body: parsed,
                caller,
                origin,
            })
        })
    }
}

thread_local! {
    /// Whether this thread is parsing a request, where a panic is bad input, not a bug.
    static PARSING_REQUEST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs a ruma request parser. A few of ruma's deserializers index JSON maps and panic on a
/// missing key (`type` in a login body, for one): bad input must never take a worker down, so
/// such a panic is a 400, and [`install_panic_hook`] logs it as one line, not a backtrace.
fn parse_catching_panics<R>(parse: impl FnOnce() -> R) -> Result<R> {
    PARSING_REQUEST.with(|parsing| parsing.set(true));
    let parsed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(parse));
    PARSING_REQUEST.with(|parsing| parsing.set(false));
    parsed.map_err(|_| Error::bad_json("Malformed request body"))
}

/// Keeps the default panic report for bugs, and logs a panic while parsing a request (bad
/// input, answered 400) as one debug line: a client sending `{}` to `/login` in a loop must
/// not fill the log with backtraces.
pub fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if PARSING_REQUEST.with(std::cell::Cell::get) {
            tracing::debug!("a request's parser panicked on bad input: {info}");
        } else {
            default(info);
        }
    }));
}

/// A JSON body for the endpoints ruma has no type for, with Matrix errors for bad input.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + 'static> FromRequest for JsonBody<T> {
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let req = req.clone();
        let mut payload = payload.take();
        Box::pin(async move {
            let body = read_json_body(&req, &mut payload).await?;
            let body = if body.is_empty() {
                b"{}".to_vec()
            } else {
                body
            };
            let value: serde_json::Value =
                serde_json::from_slice(&body).map_err(|_| Error::not_json("Content not JSON"))?;
            serde_json::from_value(value)
                .map(JsonBody)
                .map_err(|e| Error::bad_json(e.to_string()))
        })
    }
}

/// A [`Ruma`] request on the heap, for a handler whose future lives long (a parked
/// long-poll): actix keeps the extracted arguments inline in the request's future, so a
/// parsed request (a `/sync` request's inline filter is over a KiB) would stay allocated
/// for as long as the handler waits, even after the handler took it apart.
impl<T> FromRequest for Box<Ruma<T>>
where
    T: IncomingRequest + 'static,
{
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let extracting = Ruma::<T>::from_request(req, payload);
        Box::pin(async move { extracting.await.map(Box::new) })
    }
}

/// The authenticated caller, for handlers that are not ruma endpoints.
pub struct Authenticated(pub Caller);

impl FromRequest for Authenticated {
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self>>>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            let services = services(&req)?;
            let caller = authenticate(&req, &services, true)
                .await?
                .ok_or_else(Error::missing_token)?;
            Ok(Authenticated(caller))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_catching_panics, refuse_nul_strings, PARSING_REQUEST};

    #[test]
    fn a_parser_panic_is_a_bad_json_error_and_ends_the_parsing_state() {
        let err = parse_catching_panics(|| -> u8 { panic!("no entry found for key") })
            .expect_err("a panic is an error");
        assert_eq!(err.errcode(), "M_BAD_JSON");
        assert!(!PARSING_REQUEST.with(std::cell::Cell::get));
        assert_eq!(parse_catching_panics(|| 7).unwrap(), 7);
        assert!(!PARSING_REQUEST.with(std::cell::Cell::get));
    }

    #[test]
    fn nul_in_any_string_is_refused() {
        assert!(refuse_nul_strings(br#"{"body":"a\u0000b"}"#).is_err());
        assert!(refuse_nul_strings(br#"{"a\u0000":1}"#).is_err());
        assert!(refuse_nul_strings(br#"[[{"x":["\u0000"]}]]"#).is_err());
    }

    #[test]
    fn escaped_backslash_and_other_escapes_pass() {
        assert!(refuse_nul_strings(br#"{"body":"a\\u0000b"}"#).is_ok());
        assert!(refuse_nul_strings(br#"{"body":"\u0001 \ud83d\ude00"}"#).is_ok());
        assert!(refuse_nul_strings(b"").is_ok());
        // Not JSON: the parse that follows reports it.
        assert!(refuse_nul_strings(br#"{"body":"\u0000"#).is_ok());
    }
}
