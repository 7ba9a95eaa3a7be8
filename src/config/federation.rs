//! Federation settings: whether the Server-Server API is served, its TLS listener, whom it
//! talks to and how it retries and paces what it sends.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use ruma::OwnedServerName;

use super::{bad, integer, switch, ConfigError, Sources};

/// A paced room's window (see `room_window`): one transaction's worth, half of the backlog
/// at which Synapse drops a room's waiting events.
const DEFAULT_ROOM_WINDOW: u64 = 50;

/// Federation settings (`MYELIN_FEDERATION*`, `MYELIN_TLS_*`, `MYELIN_WELL_KNOWN_SERVER`).
#[derive(Debug, Clone, Default)]
pub struct FederationConfig {
    /// Whether the Server-Server API is served and other servers are contacted at all.
    pub enabled: bool,
    /// A separate listener serving only federation and key endpoints over TLS; without it,
    /// federation is served on `listen` (for a TLS reverse proxy in front).
    pub listen: Option<SocketAddr>,
    /// The PEM certificate chain and private key of the federation listener.
    pub tls: Option<TlsFiles>,
    /// Extra trust anchors (PEM) for outbound federation, beside the public web roots.
    pub ca_file: Option<PathBuf>,
    /// What `/.well-known/matrix/server` delegates to (`host[:port]`); 404 when unset.
    pub well_known_server: Option<String>,
    /// Servers allowed to federate with us; `None` allows every server.
    pub allowed_servers: Option<Vec<OwnedServerName>>,
    /// The delay before the first retry to an unreachable server (doubled per failure,
    /// jittered).
    pub retry_min: Duration,
    /// The longest delay between retries to an unreachable server.
    pub retry_max: Duration,
    /// Most of our events queued for one server and not yet sent: beyond that, while it is
    /// down, the oldest are dropped and it fetches them back with `get_missing_events`.
    pub max_queued_pdus: u64,
    /// Most PDUs of one room sent to a server that answers `/send` before processing them and
    /// not yet known to be processed (Synapse drops a room's backlog past 100); 0: no pacing.
    pub room_window: u64,
}

impl FederationConfig {
    /// Whether `server` may talk to us and be talked to.
    pub fn allows(&self, server: &ruma::ServerName) -> bool {
        self.allowed_servers
            .as_ref()
            .is_none_or(|list| list.iter().any(|s| s == server))
    }
}

/// A TLS certificate chain and its key, both PEM files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key.
    pub key: PathBuf,
}

/// Reads the federation settings; a listener without a certificate and key is an error.
pub(super) fn federation_config(src: &Sources) -> Result<FederationConfig, ConfigError> {
    let listen = match src.get("federation_listen") {
        None => None,
        Some(raw) => Some(raw.value.parse().map_err(|_| {
            bad(
                &raw.source,
                format!("'{}' is not an address:port", raw.value),
            )
        })?),
    };
    let path = |key| src.get(key).map(|r| PathBuf::from(r.value));
    let tls = match (path("tls_cert"), path("tls_key")) {
        (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
        (None, None) => None,
        _ => {
            return Err(bad(
                "MYELIN_TLS_CERT",
                "MYELIN_TLS_CERT and MYELIN_TLS_KEY go together",
            ))
        }
    };
    if listen.is_some() && tls.is_none() {
        return Err(bad(
            "MYELIN_FEDERATION_LISTEN",
            "the federation listener serves TLS: set MYELIN_TLS_CERT and MYELIN_TLS_KEY",
        ));
    }
    let allowed_servers = match src.get("federation_allowed_servers") {
        None => None,
        Some(raw) => Some(
            raw.value
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|s| !s.is_empty())
                .map(|s| {
                    OwnedServerName::try_from(s)
                        .map_err(|_| bad(&raw.source, format!("'{s}' is not a server name")))
                })
                .collect::<Result<_, _>>()?,
        ),
    };
    let retry_min = Duration::from_millis(integer(src, "federation_retry_min_ms", 2_000)?);
    let retry_max = Duration::from_millis(integer(src, "federation_retry_max_ms", 3_600_000)?);
    if retry_max < retry_min {
        return Err(bad(
            "MYELIN_FEDERATION_RETRY_MAX_MS",
            "must not be less than MYELIN_FEDERATION_RETRY_MIN_MS",
        ));
    }
    Ok(FederationConfig {
        enabled: switch(src, "federation", true)?,
        listen,
        tls,
        ca_file: path("federation_ca_file"),
        well_known_server: src
            .get("well_known_server")
            .map(|r| r.value)
            .filter(|v| !v.is_empty()),
        allowed_servers,
        retry_min,
        retry_max,
        max_queued_pdus: integer(src, "federation_max_queued_pdus", 10_000)?,
        room_window: integer(src, "federation_room_window", DEFAULT_ROOM_WINDOW)?,
    })
}
