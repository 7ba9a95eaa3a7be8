//! The federation HTTP client: resolves server names, signs every request with X-Matrix and
//! checks every address it connects to against the outbound policy.
//!
//! Certificates are verified against the public web roots plus `MYELIN_FEDERATION_CA_FILE`.
//! No redirects, no proxy, a connect and a whole-request timeout, and a cap on the response
//! body, like the other outbound client (`service/outbound.rs`).

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use ruma::{
    api::{
        auth_scheme::{AuthScheme, NoAuthentication},
        federation::authentication::{ServerSignatures, XMatrixSigningInput},
        path_builder::SinglePath,
        IncomingResponseExt, OutgoingRequest, OutgoingRequestExt,
    },
    signatures::Ed25519KeyPair,
    OwnedServerName, ServerName,
};

use super::resolver::{Destination, Lookups, Resolver};
use crate::{
    config::FederationConfig,
    net::AddressPolicy,
    service::{keys::ServerKeys, outbound::PolicyResolver},
};

/// How long establishing a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a whole request may take, response body included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest JSON answer read from another server.
pub const MAX_JSON_RESPONSE: usize = 16 * 1024 * 1024;
/// The largest `.well-known/matrix/server` answer read.
const MAX_WELL_KNOWN: usize = 64 * 1024;
/// How many redirects a `.well-known` lookup follows.
const MAX_WELL_KNOWN_REDIRECTS: usize = 3;

/// Why a federation request produced no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum FederationError {
    /// Federation is off, the destination is not allowed, or it is this server.
    #[error("{0}")]
    NotAllowed(String),
    /// The destination could not be reached (DNS, policy, TLS, connection, timeout).
    #[error("{0}")]
    Unreachable(String),
    /// The destination answered with a Matrix error.
    #[error("{server} answered {status} {errcode}: {error}")]
    Remote {
        /// Who answered.
        server: OwnedServerName,
        /// The HTTP status.
        status: u16,
        /// The Matrix errcode (`M_UNKNOWN` when the body had none).
        errcode: String,
        /// The error text.
        error: String,
    },
    /// The answer was not what the endpoint defines.
    #[error("{0}")]
    BadResponse(String),
}

impl FederationError {
    /// Whether the destination answered at all (a 4xx is an answer, not an outage).
    pub fn is_remote(&self) -> bool {
        matches!(self, FederationError::Remote { .. })
    }
}

/// How a federation request is authenticated: X-Matrix, or not at all (the key document).
pub trait FederationAuth: AuthScheme {
    /// The signing input for a request from `origin` to `destination`.
    fn input<'a>(
        origin: &ServerName,
        destination: &ServerName,
        key_pair: &'a Ed25519KeyPair,
    ) -> Self::Input<'a>;
}

impl FederationAuth for ServerSignatures {
    fn input<'a>(
        origin: &ServerName,
        destination: &ServerName,
        key_pair: &'a Ed25519KeyPair,
    ) -> XMatrixSigningInput<'a> {
        XMatrixSigningInput::new(origin.to_owned(), destination.to_owned(), key_pair)
    }
}

impl FederationAuth for NoAuthentication {
    fn input(_: &ServerName, _: &ServerName, _: &Ed25519KeyPair) {}
}

/// A response read in full.
pub struct RawResponse {
    /// The HTTP status.
    pub status: u16,
    /// The headers.
    pub headers: http::HeaderMap,
    /// The body.
    pub body: Vec<u8>,
}

/// The federation client, shared by every caller.
pub struct FederationClient {
    http: reqwest::Client,
    policy: Arc<AddressPolicy>,
    /// SRV targets: the name a certificate is checked against -> the host actually dialled.
    srv_targets: Arc<Mutex<HashMap<String, String>>>,
    resolver: Resolver,
    dns: Option<hickory_resolver::TokioResolver>,
    origin: OwnedServerName,
    keys: Arc<ServerKeys>,
    config: FederationConfig,
}

impl FederationClient {
    /// Builds the client; fails when the CA file cannot be read or holds no certificate.
    pub fn new(
        origin: OwnedServerName,
        keys: Arc<ServerKeys>,
        config: FederationConfig,
        policy: AddressPolicy,
    ) -> Result<Self, String> {
        let policy = Arc::new(policy);
        let srv_targets = Arc::new(Mutex::new(HashMap::new()));
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(PolicyResolver {
                policy: policy.clone(),
                targets: Some(srv_targets.clone()),
            }))
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .https_only(true)
            .user_agent(concat!("myelin/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &config.ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| format!("MYELIN_FEDERATION_CA_FILE: {}: {e}", path.display()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("MYELIN_FEDERATION_CA_FILE: {}: {e}", path.display()))?;
            if certs.is_empty() {
                return Err(format!(
                    "MYELIN_FEDERATION_CA_FILE: {} holds no certificate",
                    path.display()
                ));
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().map_err(|e| e.to_string())?;
        // Without a usable resolv.conf SRV lookups are skipped (names still resolve).
        let dns = hickory_resolver::TokioResolver::builder_tokio()
            .and_then(|b| b.build())
            .ok();
        Ok(FederationClient {
            http,
            policy,
            srv_targets,
            resolver: Resolver::default(),
            dns,
            origin,
            keys,
            config,
        })
    }

    /// This server's name (the `origin` of every request).
    pub fn origin(&self) -> &ServerName {
        &self.origin
    }

    /// Refuses destinations we may not contact: federation off, not allowed, or ourselves.
    fn check_destination(&self, destination: &ServerName) -> Result<(), FederationError> {
        if !self.config.enabled {
            return Err(FederationError::NotAllowed(
                "federation is off (MYELIN_FEDERATION)".into(),
            ));
        }
        if destination == self.origin {
            return Err(FederationError::NotAllowed(format!(
                "{destination} is this server"
            )));
        }
        if !self.config.allows(destination) {
            return Err(FederationError::NotAllowed(format!(
                "{destination} is not in MYELIN_FEDERATION_ALLOWED_SERVERS"
            )));
        }
        Ok(())
    }

    /// Where requests for `destination` go, with its SRV target registered for the dialler and
    /// an IP literal checked against the policy (names are checked when they resolve).
    async fn destination(&self, destination: &ServerName) -> Result<Destination, FederationError> {
        let dest = self.resolver.resolve(destination, &NetLookups(self)).await;
        if let Some(target) = &dest.connect_host {
            self.srv_targets
                .lock()
                .expect("not poisoned")
                .insert(dest.tls_name.clone(), target.clone());
        }
        if let Ok(ip) = dest.tls_name.parse::<IpAddr>() {
            if !self.policy.permits(ip) {
                return Err(FederationError::Unreachable(format!(
                    "{ip} is not an address outbound requests may reach (MYELIN_OUTBOUND_ALLOW)"
                )));
            }
        }
        Ok(dest)
    }

    /// Whether the URL's host, when it is an IP literal, is an address we may reach (names are
    /// checked by the resolver hook when they are looked up).
    fn permits_literal(&self, url: &reqwest::Url) -> bool {
        let Some(host) = url.host_str() else {
            return false;
        };
        match host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            Ok(ip) => self.policy.permits(ip),
            Err(_) => true,
        }
    }

    /// Sends a ruma federation request to `destination`, signed, and parses the answer.
    pub async fn send<R>(
        &self,
        destination: &ServerName,
        request: R,
    ) -> Result<R::IncomingResponse, FederationError>
    where
        R: OutgoingRequest<PathBuilder = SinglePath>,
        R::Authentication: FederationAuth,
    {
        self.send_limited(destination, request, MAX_JSON_RESPONSE)
            .await
    }

    /// Like [`send`](Self::send), reading at most `max_body` bytes of the answer (media).
    pub async fn send_limited<R>(
        &self,
        destination: &ServerName,
        request: R,
        max_body: usize,
    ) -> Result<R::IncomingResponse, FederationError>
    where
        R: OutgoingRequest<PathBuilder = SinglePath>,
        R::Authentication: FederationAuth,
    {
        let raw = self.send_raw(destination, request, max_body).await?;
        let mut builder = http::Response::builder().status(raw.status);
        for (name, value) in &raw.headers {
            builder = builder.header(name, value);
        }
        let response = builder
            .body(raw.body.as_slice())
            .map_err(|e| FederationError::BadResponse(e.to_string()))?;
        R::IncomingResponse::try_from_http_response(response).map_err(|e| {
            FederationError::BadResponse(format!("{destination}: unexpected answer: {e}"))
        })
    }

    /// Sends a signed request and reads at most `max_body` bytes of the answer. A status of
    /// 400 or more becomes [`FederationError::Remote`].
    pub async fn send_raw<R>(
        &self,
        destination: &ServerName,
        request: R,
        max_body: usize,
    ) -> Result<RawResponse, FederationError>
    where
        R: OutgoingRequest<PathBuilder = SinglePath>,
        R::Authentication: FederationAuth,
    {
        self.check_destination(destination)?;
        let dest = self.destination(destination).await?;
        let signing = R::Authentication::input(&self.origin, destination, &self.keys.key_pair);
        let request = request
            .try_into_http_request::<Vec<u8>>(&dest.base_url(), signing, ())
            .map_err(|e| FederationError::BadResponse(format!("request: {e}")))?;
        let mut request = reqwest::Request::try_from(request)
            .map_err(|e| FederationError::BadResponse(format!("request: {e}")))?;
        if let Ok(host) = http::HeaderValue::from_str(&dest.host_header) {
            request.headers_mut().insert(http::header::HOST, host);
        }
        let raw = self.execute(request, max_body).await.inspect_err(|_| {
            // Look again next time: the destination may have moved.
            self.resolver.forget(destination);
        })?;
        if raw.status >= 400 {
            let body: serde_json::Value = serde_json::from_slice(&raw.body).unwrap_or_default();
            return Err(FederationError::Remote {
                server: destination.to_owned(),
                status: raw.status,
                errcode: body["errcode"].as_str().unwrap_or("M_UNKNOWN").to_owned(),
                error: body["error"].as_str().unwrap_or_default().to_owned(),
            });
        }
        Ok(raw)
    }

    async fn execute(
        &self,
        request: reqwest::Request,
        max_body: usize,
    ) -> Result<RawResponse, FederationError> {
        let url = request.url().to_string();
        let unreachable = |e: reqwest::Error| {
            let mut text = format!("{url}: {e}");
            let mut cause = std::error::Error::source(&e);
            while let Some(inner) = cause {
                text.push_str(": ");
                text.push_str(&inner.to_string());
                cause = inner.source();
            }
            FederationError::Unreachable(text)
        };
        let mut response = self.http.execute(request).await.map_err(unreachable)?;
        let status = response.status().as_u16();
        if response
            .content_length()
            .is_some_and(|n| n > max_body as u64)
        {
            return Err(FederationError::BadResponse(format!(
                "{url}: answer larger than {max_body} bytes"
            )));
        }
        let headers = response.headers().clone();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
            if body.len() + chunk.len() > max_body {
                return Err(FederationError::BadResponse(format!(
                    "{url}: answer larger than {max_body} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(RawResponse {
            status,
            headers,
            body,
        })
    }
}

/// The real lookups: HTTPS for `.well-known`, DNS for SRV.
struct NetLookups<'a>(&'a FederationClient);

impl Lookups for NetLookups<'_> {
    async fn well_known(&self, host: &str) -> Option<(String, Option<Duration>)> {
        // The spec lets `.well-known` redirect (the client follows no redirects by itself):
        // a few hops, HTTPS only, each address checked like any other.
        let mut url =
            reqwest::Url::parse(&format!("https://{host}/.well-known/matrix/server")).ok()?;
        let mut response = None;
        for _ in 0..=MAX_WELL_KNOWN_REDIRECTS {
            if url.scheme() != "https" || !self.0.permits_literal(&url) {
                return None;
            }
            let request = self
                .0
                .http
                .get(url.clone())
                .timeout(Duration::from_secs(10))
                .build()
                .ok()?;
            let answer = self.0.execute(request, MAX_WELL_KNOWN).await.ok()?;
            if !matches!(answer.status, 301 | 302 | 303 | 307 | 308) {
                response = Some(answer);
                break;
            }
            let location = answer.headers.get(http::header::LOCATION)?.to_str().ok()?;
            url = url.join(location).ok()?;
        }
        let response = response?;
        if response.status != 200 {
            return None;
        }
        let body: serde_json::Value = serde_json::from_slice(&response.body).ok()?;
        let server = body.get("m.server")?.as_str()?.to_owned();
        let max_age = response
            .headers
            .get(http::header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.split(',')
                    .find_map(|part| part.trim().strip_prefix("max-age=")?.parse::<u64>().ok())
            })
            .map(Duration::from_secs);
        Some((server, max_age))
    }

    async fn srv(&self, name: &str) -> Vec<(String, u16)> {
        use hickory_resolver::proto::rr::RData;
        let Some(dns) = &self.0.dns else {
            return Vec::new();
        };
        let Ok(lookup) = dns.srv_lookup(format!("{name}.")).await else {
            return Vec::new();
        };
        let mut records: Vec<_> = lookup
            .answers()
            .iter()
            .filter_map(|record| match &record.data {
                RData::SRV(srv) => Some((srv.priority, srv.target.to_string(), srv.port)),
                _ => None,
            })
            .collect();
        records.sort_by_key(|(priority, ..)| *priority);
        records
            .into_iter()
            .map(|(_, target, port)| (target, port))
            .collect()
    }
}
