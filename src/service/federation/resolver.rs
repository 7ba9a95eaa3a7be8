//! Server-name resolution (spec "Resolving server names"): which host and port to connect to
//! for a server name, which name the certificate must carry, and which `Host` header to send.
//!
//! In order: an IP literal or a name with a port is used as it is; otherwise
//! `/.well-known/matrix/server` may delegate to another name (resolved the same way, without a
//! second delegation), then SRV `_matrix-fed._tcp`, the deprecated `_matrix._tcp`, and finally
//! port 8448. Results are cached: delegations as long as the well-known answer allows
//! (Cache-Control, default 24 h, at most 48 h), failures for an hour.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use ruma::{OwnedServerName, ServerName};

/// The default federation port.
pub const DEFAULT_PORT: u16 = 8448;
/// How long a well-known answer is trusted without Cache-Control.
const WELL_KNOWN_DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
/// The longest a well-known answer is trusted, whatever it says.
const WELL_KNOWN_MAX_TTL: Duration = Duration::from_secs(48 * 3600);
/// How long a missing or broken well-known is remembered.
const WELL_KNOWN_ERROR_TTL: Duration = Duration::from_secs(3600);
/// How long an SRV answer (or its absence) is used.
const SRV_TTL: Duration = Duration::from_secs(3600);

/// Where to send requests for a server name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// The name the TLS certificate must be valid for (and the SNI), or an IP literal.
    pub tls_name: String,
    /// The host to connect to, when it differs from `tls_name` (an SRV target).
    pub connect_host: Option<String>,
    /// The port to connect to.
    pub port: u16,
    /// The `Host` header.
    pub host_header: String,
}

impl Destination {
    /// The base URL of requests: `https://tls_name:port`.
    pub fn base_url(&self) -> String {
        let host = if self.tls_name.parse::<std::net::Ipv6Addr>().is_ok() {
            format!("[{}]", self.tls_name)
        } else {
            self.tls_name.clone()
        };
        format!("https://{host}:{}", self.port)
    }
}

/// The lookups resolution needs; the server's implementation does DNS and HTTPS, tests fake it.
pub trait Lookups {
    /// `GET https://host/.well-known/matrix/server`: the `m.server` value and how long the
    /// answer may be cached (`None` cache time: no Cache-Control), or `None` when there is no
    /// usable answer.
    fn well_known(
        &self,
        host: &str,
    ) -> impl std::future::Future<Output = Option<(String, Option<Duration>)>> + Send;

    /// SRV records of `name`, best first: `(target, port)`.
    fn srv(&self, name: &str) -> impl std::future::Future<Output = Vec<(String, u16)>> + Send;
}

/// The host of a server name as the certificate names it: an IPv6 literal without brackets.
fn bare_host(name: &ServerName) -> &str {
    name.host().trim_start_matches('[').trim_end_matches(']')
}

/// Caches resolutions per server name.
#[derive(Default)]
pub struct Resolver {
    cache: Mutex<HashMap<String, (Destination, Instant)>>,
}

impl Resolver {
    /// Resolves `server`, from the cache when it is fresh.
    pub async fn resolve<L: Lookups>(&self, server: &ServerName, lookups: &L) -> Destination {
        let now = Instant::now();
        if let Some((dest, expires)) = self
            .cache
            .lock()
            .expect("not poisoned")
            .get(server.as_str())
        {
            if *expires > now {
                return dest.clone();
            }
        }
        let (dest, ttl) = resolve_uncached(server, lookups).await;
        let mut cache = self.cache.lock().expect("not poisoned");
        // Bounded: an attacker naming many servers must not grow it forever.
        if cache.len() > 10_000 {
            cache.retain(|_, (_, expires)| *expires > now);
            if cache.len() > 10_000 {
                cache.clear();
            }
        }
        cache.insert(server.as_str().to_owned(), (dest.clone(), now + ttl));
        dest
    }

    /// Forgets a cached resolution (after the destination failed, so the next try looks again).
    pub fn forget(&self, server: &ServerName) {
        self.cache
            .lock()
            .expect("not poisoned")
            .remove(server.as_str());
    }
}

/// The spec's algorithm, and how long its answer may be cached.
async fn resolve_uncached<L: Lookups>(server: &ServerName, lookups: &L) -> (Destination, Duration) {
    let host = bare_host(server);
    // Steps 1 and 2: IP literals and explicit ports are used as they are (nothing was looked
    // up, so the answer is good for as long as anything is cached).
    if server.is_ip_literal() || server.port().is_some() {
        let port = server.port().unwrap_or(DEFAULT_PORT);
        return (direct(host, port, server.as_str()), WELL_KNOWN_MAX_TTL);
    }
    // Step 3: delegation; an `m.server` that is not a server name counts as none.
    let delegated = lookups
        .well_known(host)
        .await
        .and_then(|(name, ttl)| Some((OwnedServerName::try_from(name).ok()?, ttl)));
    match delegated {
        Some((delegated, ttl)) => {
            let ttl = ttl
                .unwrap_or(WELL_KNOWN_DEFAULT_TTL)
                .min(WELL_KNOWN_MAX_TTL);
            let d_host = bare_host(&delegated);
            if delegated.is_ip_literal() || delegated.port().is_some() {
                let port = delegated.port().unwrap_or(DEFAULT_PORT);
                (direct(d_host, port, delegated.as_str()), ttl)
            } else {
                let (dest, srv_ttl) = by_srv(d_host, lookups).await;
                (dest, ttl.min(srv_ttl))
            }
        }
        None => {
            let (dest, ttl) = by_srv(host, lookups).await;
            (dest, ttl.min(WELL_KNOWN_ERROR_TTL))
        }
    }
}

/// Steps 3.3-3.5 and 4-6: SRV `_matrix-fed._tcp`, then `_matrix._tcp`, then port 8448. The
/// certificate and `Host` are for `host`, not the SRV target.
async fn by_srv<L: Lookups>(host: &str, lookups: &L) -> (Destination, Duration) {
    for prefix in ["_matrix-fed._tcp", "_matrix._tcp"] {
        if let Some((target, port)) = lookups.srv(&format!("{prefix}.{host}")).await.first() {
            let target = target.trim_end_matches('.').to_owned();
            return (
                Destination {
                    tls_name: host.to_owned(),
                    connect_host: (target != host).then_some(target),
                    port: *port,
                    host_header: host.to_owned(),
                },
                SRV_TTL,
            );
        }
    }
    (direct(host, DEFAULT_PORT, host), SRV_TTL)
}

fn direct(host: &str, port: u16, host_header: &str) -> Destination {
    Destination {
        tls_name: host.to_owned(),
        connect_host: None,
        port,
        host_header: host_header.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Fake {
        well_known: HashMap<&'static str, &'static str>,
        srv: HashMap<&'static str, (&'static str, u16)>,
    }

    impl Lookups for Fake {
        async fn well_known(&self, host: &str) -> Option<(String, Option<Duration>)> {
            self.well_known.get(host).map(|s| (s.to_string(), None))
        }
        async fn srv(&self, name: &str) -> Vec<(String, u16)> {
            self.srv
                .get(name)
                .map(|(t, p)| vec![(t.to_string(), *p)])
                .unwrap_or_default()
        }
    }

    async fn resolve(name: &str, fake: &Fake) -> Destination {
        let name = OwnedServerName::try_from(name).unwrap();
        resolve_uncached(&name, fake).await.0
    }

    fn dest(tls: &str, connect: Option<&str>, port: u16, host: &str) -> Destination {
        Destination {
            tls_name: tls.into(),
            connect_host: connect.map(Into::into),
            port,
            host_header: host.into(),
        }
    }

    #[tokio::test]
    async fn literals_and_explicit_ports_skip_every_lookup() {
        let mut fake = Fake::default();
        fake.well_known.insert("example.org", "elsewhere.org");
        fake.srv
            .insert("_matrix-fed._tcp.example.org", ("srv.org", 1));
        assert_eq!(
            resolve("127.0.0.1", &fake).await,
            dest("127.0.0.1", None, 8448, "127.0.0.1")
        );
        assert_eq!(
            resolve("[::1]:8000", &fake).await,
            dest("::1", None, 8000, "[::1]:8000")
        );
        assert_eq!(
            resolve("example.org:9000", &fake).await,
            dest("example.org", None, 9000, "example.org:9000")
        );
        assert_eq!(
            dest("::1", None, 8000, "x").base_url(),
            "https://[::1]:8000"
        );
    }

    #[tokio::test]
    async fn well_known_delegates_then_srv_then_8448() {
        let mut fake = Fake::default();
        fake.well_known.insert("a.org", "matrix.a.org:443");
        fake.well_known.insert("b.org", "delegated.b.org");
        fake.srv
            .insert("_matrix-fed._tcp.delegated.b.org", ("target.b.net.", 8449));
        fake.srv.insert("_matrix._tcp.c.org", ("old.c.org", 8000));
        assert_eq!(
            resolve("a.org", &fake).await,
            dest("matrix.a.org", None, 443, "matrix.a.org:443")
        );
        assert_eq!(
            resolve("b.org", &fake).await,
            dest(
                "delegated.b.org",
                Some("target.b.net"),
                8449,
                "delegated.b.org"
            )
        );
        assert_eq!(
            resolve("c.org", &fake).await,
            dest("c.org", Some("old.c.org"), 8000, "c.org")
        );
        assert_eq!(
            resolve("d.org", &fake).await,
            dest("d.org", None, 8448, "d.org")
        );
    }
}
