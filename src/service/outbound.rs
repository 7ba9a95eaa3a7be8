//! The one HTTP client for every request the server makes to other hosts (push gateways
//! today; federation and application services later).
//!
//! Its policy, so user-supplied URLs cannot reach into the server's own network:
//! - only addresses the [`AddressPolicy`] permits (no loopback, private, link-local, CGNAT,
//!   multicast ... unless `MYELIN_OUTBOUND_ALLOW` says so). Names are checked by a resolver
//!   hook on every connection, so a name that later resolves somewhere else (DNS rebinding) is
//!   still refused; IP-literal URLs never reach the resolver and are checked before sending;
//! - no redirects (a gateway could otherwise bounce the request anywhere), except for URL
//!   previews, which follow a few, each target checked like the first URL;
//! - no system proxy (the resolver would then only see the proxy's name);
//! - connect and whole-request timeouts, and a cap on how much of a response body is read.
//!
//! One exception, and only for origins the admin wrote into the configuration: application
//! services (bridges) usually listen on loopback or a private network, which the policy
//! refuses. Their registration file's `url` is trusted as the admin's decision, the way
//! `MYELIN_OUTBOUND_ALLOW` is: [`Outbound::send_to_configured`] reaches exactly those origins
//! (scheme, host and port) and nothing else, so no user-supplied URL gains from it.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use reqwest::{
    dns::{Addrs, Name, Resolve, Resolving},
    StatusCode, Url,
};
use serde_json::Value;

use crate::net::AddressPolicy;

/// How long establishing a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a whole request, response body included, may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why an outbound request did not produce a response.
#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    /// The URL is not an absolute http(s) URL.
    #[error("not an http(s) URL: {0}")]
    BadUrl(String),
    /// The destination is an address the policy refuses.
    #[error("{0}")]
    Refused(String),
    /// The response body is larger than the caller accepts.
    #[error("response body larger than {0} bytes")]
    TooLarge(usize),
    /// Connecting, sending or receiving failed (including timeouts and refused names).
    #[error("{}", with_causes(.0))]
    Http(#[from] reqwest::Error),
}

/// An error and its causes on one line: reqwest's own message leaves out why it failed (a
/// refused address, a timeout, a reset).
fn with_causes(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(err);
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

/// A response whose body was read in full (within the caller's limit).
#[derive(Debug)]
pub struct OutboundResponse {
    /// The HTTP status.
    pub status: StatusCode,
    /// The body.
    pub body: Vec<u8>,
}

/// A page fetched with [`Outbound::get_page`].
#[derive(Debug)]
pub struct FetchedPage {
    /// The URL the page came from, after redirects.
    pub url: Url,
    /// The HTTP status.
    pub status: StatusCode,
    /// Its `Content-Type`, if any.
    pub content_type: Option<String>,
    /// The first bytes of the body (at most the caller's limit; the rest is not read).
    pub body: Vec<u8>,
}

/// Resolves names, keeping only the addresses the policy permits. Federation's SRV targets
/// are looked up in place of the name the certificate is checked against (`targets`).
pub(crate) struct PolicyResolver {
    pub(crate) policy: Arc<AddressPolicy>,
    pub(crate) targets: Option<Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>>,
}

impl Resolve for PolicyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let target = self.targets.as_ref().and_then(|targets| {
            targets
                .lock()
                .expect("not poisoned")
                .get(name.as_str())
                .cloned()
        });
        Box::pin(async move {
            let host = target.unwrap_or_else(|| name.as_str().to_owned());
            let permitted: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|addr| policy.permits(addr.ip()))
                .collect();
            if permitted.is_empty() {
                return Err(format!(
                    "{host} has no address outbound requests may reach (MYELIN_OUTBOUND_ALLOW)"
                )
                .into());
            }
            Ok(Box::new(permitted.into_iter()) as Addrs)
        })
    }
}

/// The outbound HTTP client, shared by every caller.
pub struct Outbound {
    http: reqwest::Client,
    policy: Arc<AddressPolicy>,
    /// For the origins in `configured` only: no address filter, no redirects, no proxy.
    configured_http: reqwest::Client,
    configured: Vec<Url>,
}

impl Outbound {
    /// Builds the client with the address policy from the configuration; `configured` are
    /// the URLs the admin configured (application services), whose origins bypass the
    /// address policy.
    pub fn new(policy: AddressPolicy, configured: &[&str]) -> Self {
        let policy = Arc::new(policy);
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(PolicyResolver {
                policy: policy.clone(),
                targets: None,
            }))
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("myelin/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("the HTTP client builds");
        let configured_http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("myelin/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("the HTTP client builds");
        let configured = configured
            .iter()
            .filter_map(|url| Url::parse(url).ok())
            .collect();
        Outbound {
            http,
            policy,
            configured_http,
            configured,
        }
    }

    /// Sends a JSON request to a URL under an origin the admin configured (an application
    /// service's `url`) with a bearer token, waiting at most `timeout` for the whole answer,
    /// and reads at most `max_body` bytes of it. Any other origin is refused.
    pub async fn send_to_configured(
        &self,
        method: reqwest::Method,
        url: &str,
        bearer: &str,
        body: Option<&Value>,
        timeout: Duration,
        max_body: usize,
    ) -> Result<OutboundResponse, OutboundError> {
        let parsed = Url::parse(url).map_err(|_| OutboundError::BadUrl(url.to_owned()))?;
        if !self
            .configured
            .iter()
            .any(|c| c.origin() == parsed.origin())
        {
            return Err(OutboundError::Refused(format!(
                "{url} is not under a configured application service URL"
            )));
        }
        let mut request = self
            .configured_http
            .request(method, parsed)
            .bearer_auth(bearer)
            .timeout(timeout);
        if let Some(body) = body {
            request = request.json(body);
        }
        read_limited(request.send().await?, max_body).await
    }

    /// Parses `url` and refuses what the policy can tell without DNS: other schemes and
    /// IP literals outside the permitted ranges (names are checked when connecting).
    pub fn check_url(&self, url: &str) -> Result<Url, OutboundError> {
        let parsed = Url::parse(url).map_err(|_| OutboundError::BadUrl(url.to_owned()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(OutboundError::BadUrl(url.to_owned()));
        }
        let host = parsed
            .host_str()
            .ok_or_else(|| OutboundError::BadUrl(url.to_owned()))?;
        // The URL parser has already normalised IPv4 literals (`0x7f.1` is `127.0.0.1`).
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        let Ok(ip) = literal.parse::<IpAddr>() else {
            return Ok(parsed);
        };
        if self.policy.permits(ip) {
            Ok(parsed)
        } else {
            Err(OutboundError::Refused(format!(
                "{ip} is not an address outbound requests may reach (MYELIN_OUTBOUND_ALLOW)"
            )))
        }
    }

    /// GETs `url` for a preview, following at most `max_redirects` redirects, each one's
    /// target checked like the first URL (names by the resolver on connecting), and reads at
    /// most `max_body(content type)` bytes of the body: a page is cut there, not refused.
    pub async fn get_page(
        &self,
        url: &str,
        max_body: impl Fn(Option<&str>) -> usize,
        max_redirects: usize,
    ) -> Result<FetchedPage, OutboundError> {
        let mut url = self.check_url(url)?;
        for _ in 0..=max_redirects {
            let mut response = self
                .http
                .get(url.clone())
                .header(
                    "accept",
                    "text/html, application/xhtml+xml;q=0.9, */*;q=0.1",
                )
                .send()
                .await?;
            let status = response.status();
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get("location")
                    .and_then(|l| l.to_str().ok())
                    .ok_or_else(|| OutboundError::BadUrl("redirect without Location".into()))?;
                let next = url
                    .join(location)
                    .map_err(|_| OutboundError::BadUrl(location.to_owned()))?;
                url = self.check_url(next.as_str())?;
                continue;
            }
            let content_type = response
                .headers()
                .get("content-type")
                .and_then(|t| t.to_str().ok())
                .map(str::to_owned);
            let max_body = max_body(content_type.as_deref());
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await? {
                let room = max_body - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if body.len() == max_body {
                    break;
                }
            }
            return Ok(FetchedPage {
                url,
                status,
                content_type,
                body,
            });
        }
        Err(OutboundError::Refused(format!(
            "more than {max_redirects} redirects"
        )))
    }

    /// POSTs `body` as JSON to `url` and reads at most `max_body` bytes of the answer.
    pub async fn post_json(
        &self,
        url: &str,
        body: &Value,
        max_body: usize,
    ) -> Result<OutboundResponse, OutboundError> {
        let url = self.check_url(url)?;
        read_limited(self.http.post(url).json(body).send().await?, max_body).await
    }
}

/// Reads a response's body, failing when it is larger than `max_body` bytes.
async fn read_limited(
    mut response: reqwest::Response,
    max_body: usize,
) -> Result<OutboundResponse, OutboundError> {
    let status = response.status();
    if response
        .content_length()
        .is_some_and(|n| n > max_body as u64)
    {
        return Err(OutboundError::TooLarge(max_body));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > max_body {
            return Err(OutboundError::TooLarge(max_body));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(OutboundResponse { status, body })
}
