//! Typed configuration: defaults, then an optional TOML file, then the environment.
//!
//! No other setting is read from the environment; the only other reads are glibc's own
//! `MALLOC_*` variables (`allocator.rs`) and `PATH` to find PostgreSQL (`embedded_pg.rs`).
//! Invalid settings stop the server at start with one line that names the bad setting.

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use ruma::OwnedServerName;
use serde::Deserialize;

use crate::{
    net::{parse_cidr_list, AddressPolicy, Cidr},
    service::appservice::registration::{self, Registration},
};

mod federation;
mod ops;
use federation::federation_config;
pub use federation::{FederationConfig, TlsFiles};
pub use ops::{LogFormat, OpsConfig};

/// Who may create accounts through `POST /register`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistrationMode {
    /// Nobody; admins create users with `myelin user create`.
    Closed,
    /// Anyone (`m.login.dummy`).
    Open,
    /// Only holders of a registration token (`m.login.registration_token`).
    Token,
}

/// JWT login (`org.matrix.login.jwt`) settings.
#[derive(Debug, Clone)]
pub struct JwtConfig {
    /// The validation key, parsed once at start from the shared secret (HMAC) or PEM public
    /// key (RSA/EC/EdDSA).
    pub key: jsonwebtoken::DecodingKey,
    /// Signing algorithm, e.g. `HS256`.
    pub algorithm: jsonwebtoken::Algorithm,
    /// Required `iss` claim, if any.
    pub issuer: Option<String>,
    /// Required `aud` claim, if any.
    pub audience: Option<String>,
    /// Whether tokens without an `exp` claim are refused.
    pub require_exp: bool,
}

/// Shortest accepted HMAC secret in bytes (RFC 7518 3.2: at least the hash size, 256 bits).
const MIN_HMAC_SECRET_LEN: usize = 32;

/// Whether `algorithm` is an HMAC (shared-secret) algorithm.
fn is_hmac(algorithm: jsonwebtoken::Algorithm) -> bool {
    use jsonwebtoken::Algorithm::{HS256, HS384, HS512};
    matches!(algorithm, HS256 | HS384 | HS512)
}

/// A token bucket: sustained rate and burst size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Requests per second allowed in the long run.
    pub per_second: f64,
    /// Requests allowed at once.
    pub burst: f64,
}

/// The validated server configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The Matrix server name (the part after `:` in user IDs).
    pub server_name: OwnedServerName,
    /// Address the HTTP listener binds to.
    pub listen: SocketAddr,
    /// Directory for the embedded PostgreSQL cluster, media and keys.
    pub data_dir: PathBuf,
    /// External PostgreSQL; `None` means the server runs its own cluster under `data_dir`.
    pub database_url: Option<String>,
    /// Base URL clients reach the server at (for `/.well-known/matrix/client`).
    pub public_baseurl: String,
    /// Registration mode.
    pub registration: RegistrationMode,
    /// Whether rate limits are enforced.
    pub rate_limits_enabled: bool,
    /// Login attempts per IP address and per account.
    pub rate_limit_login: RateLimit,
    /// Registration attempts per IP address.
    pub rate_limit_registration: RateLimit,
    /// Events a local user's client sends (Synapse's `rc_message`), per user.
    pub rate_limit_message: RateLimit,
    /// Largest accepted request body in bytes.
    pub max_request_size: usize,
    /// Lifetime of access tokens issued together with a refresh token.
    pub refreshable_access_token_lifetime_ms: u64,
    /// JWT login, when configured.
    pub jwt: Option<JwtConfig>,
    /// Database connection pool size.
    pub database_pool_size: usize,
    /// Whether presence is tracked and shared.
    pub presence_enabled: bool,
    /// Largest media upload in bytes.
    pub max_upload_size: u64,
    /// Media uploaded before this time (ms since the epoch) stays downloadable through the
    /// legacy unauthenticated `/_matrix/media/v3` endpoints; 0: none is.
    pub legacy_media_until_ms: u64,
    /// Reverse proxies whose `X-Forwarded-For` is believed; empty: the socket peer is the client.
    pub trusted_proxies: Vec<Cidr>,
    /// Which addresses outbound HTTP (push gateways) may connect to.
    pub outbound: AddressPolicy,
    /// Largest image (width times height) decoded for thumbnails and BlurHashes.
    pub max_image_pixels: u64,
    /// The Server-Server API: listener, TLS, trust anchors and which servers may talk to us.
    pub federation: FederationConfig,
    /// Longest delay a delayed event (MSC4140) may ask for; `None` (the default, as in
    /// Synapse): delayed events are refused.
    pub max_event_delay_ms: Option<u64>,
    /// TURN servers handed to clients by `/voip/turnServer`.
    pub turn: TurnConfig,
    /// Whether `preview_url` fetches pages (off by default, as Synapse's
    /// `url_preview_enabled`); off, it answers the empty preview.
    pub url_previews: bool,
    /// Metrics, logs, the consistency sampler and shutdown.
    pub ops: OpsConfig,
    /// Application services, from the registration files in `MYELIN_APPSERVICES`.
    pub appservices: Vec<Registration>,
}

/// TURN settings (`MYELIN_TURN_*`).
#[derive(Debug, Clone, Default)]
pub struct TurnConfig {
    /// `turn:`/`turns:` URIs; none: `/voip/turnServer` answers `{}`.
    pub uris: Vec<String>,
    /// Shared secret for time-limited credentials (coturn's `static-auth-secret`).
    pub shared_secret: Option<String>,
    /// Fixed credentials, when there is no shared secret.
    pub username: Option<String>,
    /// Password for [`TurnConfig::username`].
    pub password: Option<String>,
    /// How long credentials last, in seconds.
    pub ttl_secs: u64,
}

/// The TOML file's shape; every key is optional and named like its environment variable
/// without the `MYELIN_` prefix, in lower case.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    server_name: Option<String>,
    listen: Option<String>,
    data_dir: Option<String>,
    database_url: Option<String>,
    public_baseurl: Option<String>,
    registration: Option<String>,
    rate_limits: Option<toml::Value>,
    rate_limit_login_per_second: Option<f64>,
    rate_limit_login_burst: Option<f64>,
    rate_limit_registration_per_second: Option<f64>,
    rate_limit_registration_burst: Option<f64>,
    rate_limit_message_per_second: Option<f64>,
    rate_limit_message_burst: Option<f64>,
    max_request_size: Option<toml::Value>,
    refreshable_access_token_lifetime: Option<toml::Value>,
    jwt_secret: Option<String>,
    jwt_algorithm: Option<String>,
    jwt_issuer: Option<String>,
    jwt_audience: Option<String>,
    database_pool_size: Option<toml::Value>,
    presence: Option<toml::Value>,
    max_upload_size: Option<toml::Value>,
    legacy_media_until: Option<toml::Value>,
    trusted_proxies: Option<String>,
    outbound_allow: Option<String>,
    outbound_deny: Option<String>,
    max_image_pixels: Option<toml::Value>,
    jwt_require_exp: Option<toml::Value>,
    federation: Option<toml::Value>,
    federation_listen: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
    federation_ca_file: Option<String>,
    well_known_server: Option<String>,
    federation_allowed_servers: Option<String>,
    federation_retry_min_ms: Option<toml::Value>,
    federation_retry_max_ms: Option<toml::Value>,
    federation_max_queued_pdus: Option<toml::Value>,
    federation_room_window: Option<toml::Value>,
    max_event_delay_ms: Option<toml::Value>,
    turn_uris: Option<String>,
    turn_shared_secret: Option<String>,
    turn_username: Option<String>,
    turn_password: Option<String>,
    turn_ttl_secs: Option<toml::Value>,
    url_previews: Option<toml::Value>,
    metrics_listen: Option<String>,
    log_format: Option<String>,
    consistency_sample_minutes: Option<toml::Value>,
    shutdown_grace: Option<toml::Value>,
    statistics_refresh: Option<toml::Value>,
    state_cache_mb: Option<toml::Value>,
    appservices: Option<String>,
}

/// A configuration error: which setting, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {setting}: {problem}")]
pub struct ConfigError {
    /// The setting's name as the user wrote it (env var or TOML key).
    pub setting: String,
    /// What is wrong.
    pub problem: String,
}

fn bad(setting: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        setting: setting.to_owned(),
        problem: problem.into(),
    }
}

/// One raw setting: its value and where it came from (for error messages).
struct Raw {
    value: String,
    source: String,
}

/// Collects raw settings from the file and the environment, environment winning.
struct Sources {
    file: HashMap<&'static str, toml::Value>,
    env: HashMap<String, String>,
    config_path: Option<PathBuf>,
}

impl Sources {
    fn get(&self, key: &'static str) -> Option<Raw> {
        let env_name = format!("MYELIN_{}", key.to_uppercase());
        let env_name = if key == "database_url" {
            "DATABASE_URL".to_owned()
        } else {
            env_name
        };
        if let Some(value) = self.env.get(&env_name) {
            return Some(Raw {
                value: value.clone(),
                source: env_name,
            });
        }
        let value = self.file.get(key)?;
        let path = self
            .config_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let value = match value {
            toml::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        Some(Raw {
            value,
            source: format!("{key} (in {path})"),
        })
    }
}

impl Config {
    /// Loads the configuration from `MYELIN_CONFIG` (or `config_path`) and the process environment.
    pub fn load(config_path: Option<PathBuf>) -> Result<Self, ConfigError> {
        Self::load_from(config_path, std::env::vars().collect())
    }

    /// Loads the configuration from an explicit environment (used by tests).
    pub fn load_from(
        config_path: Option<PathBuf>,
        env: HashMap<String, String>,
    ) -> Result<Self, ConfigError> {
        let config_path = config_path.or_else(|| env.get("MYELIN_CONFIG").map(PathBuf::from));
        let file = match &config_path {
            Some(path) => read_file(path)?,
            None => HashMap::new(),
        };
        Self::from_sources(&Sources {
            file,
            env,
            config_path,
        })
    }

    fn from_sources(src: &Sources) -> Result<Self, ConfigError> {
        let server_name = match src.get("server_name") {
            Some(raw) => OwnedServerName::try_from(raw.value.as_str()).map_err(|_| {
                bad(
                    &raw.source,
                    format!("'{}' is not a valid server name", raw.value),
                )
            })?,
            None => OwnedServerName::try_from("localhost").expect("valid default"),
        };
        let listen = match src.get("listen") {
            Some(raw) => raw.value.parse().map_err(|_| {
                bad(
                    &raw.source,
                    format!("'{}' is not an address:port", raw.value),
                )
            })?,
            None => SocketAddr::from(([127, 0, 0, 1], 8008)),
        };
        let data_dir = src
            .get("data_dir")
            .map_or_else(|| PathBuf::from("myelin-data"), |r| r.value.into());
        let database_url = src
            .get("database_url")
            .map(|r| r.value)
            .filter(|v| !v.is_empty());
        let public_baseurl = match src.get("public_baseurl") {
            Some(raw) if raw.value.starts_with("http://") || raw.value.starts_with("https://") => {
                raw.value.trim_end_matches('/').to_owned() + "/"
            }
            Some(raw) => return Err(bad(&raw.source, "must start with http:// or https://")),
            None => format!("http://{listen}/"),
        };
        let registration = match src.get("registration") {
            None => RegistrationMode::Closed,
            Some(raw) => match raw.value.as_str() {
                "closed" => RegistrationMode::Closed,
                "open" => RegistrationMode::Open,
                "token" => RegistrationMode::Token,
                other => {
                    return Err(bad(
                        &raw.source,
                        format!("'{other}' is not one of closed, open, token"),
                    ))
                }
            },
        };
        let rate_limits_enabled = switch(src, "rate_limits", true)?;
        let presence_enabled = switch(src, "presence", true)?;
        let max_upload_size = integer(src, "max_upload_size", 100 * 1024 * 1024)?;
        let legacy_media_until_ms = match src.get("legacy_media_until") {
            None => 0,
            Some(raw) => raw.value.parse::<u64>().map_err(|_| {
                bad(
                    &raw.source,
                    format!("'{}' is not a time in milliseconds since 1970", raw.value),
                )
            })?,
        };
        let rate_limit_login = RateLimit {
            per_second: positive(src, "rate_limit_login_per_second", 0.17)?,
            burst: positive(src, "rate_limit_login_burst", 3.0)?,
        };
        let rate_limit_registration = RateLimit {
            per_second: positive(src, "rate_limit_registration_per_second", 0.17)?,
            burst: positive(src, "rate_limit_registration_burst", 3.0)?,
        };
        let rate_limit_message = RateLimit {
            per_second: positive(src, "rate_limit_message_per_second", 0.2)?,
            burst: positive(src, "rate_limit_message_burst", 10.0)?,
        };
        let max_request_size = integer(src, "max_request_size", 10 * 1024 * 1024)? as usize;
        let refreshable_access_token_lifetime_ms =
            integer(src, "refreshable_access_token_lifetime", 300)? * 1000;
        let database_pool_size = integer(src, "database_pool_size", 16)? as usize;
        let jwt = match src.get("jwt_secret") {
            None => None,
            Some(secret) => Some(jwt_config(src, secret)?),
        };
        let trusted_proxies = cidrs(src, "trusted_proxies")?;
        let outbound = AddressPolicy {
            allow: cidrs(src, "outbound_allow")?,
            deny: cidrs(src, "outbound_deny")?,
        };
        let max_image_pixels = integer(src, "max_image_pixels", 32_000_000)?;
        let federation = federation_config(src)?;
        let max_event_delay_ms = match src.get("max_event_delay_ms") {
            None => None,
            Some(_) => Some(integer(src, "max_event_delay_ms", 1)?),
        };
        let turn = turn_config(src)?;
        let url_previews = switch(src, "url_previews", false)?;
        let ops = ops::ops_config(src)?;
        let appservices = match src.get("appservices") {
            None => Vec::new(),
            Some(raw) => {
                let paths: Vec<&Path> = raw
                    .value
                    .split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(Path::new)
                    .collect();
                registration::load(&paths, &server_name).map_err(|e| bad(&raw.source, e))?
            }
        };
        Ok(Config {
            server_name,
            listen,
            data_dir,
            database_url,
            public_baseurl,
            registration,
            rate_limits_enabled,
            rate_limit_login,
            rate_limit_registration,
            rate_limit_message,
            max_request_size,
            refreshable_access_token_lifetime_ms,
            jwt,
            database_pool_size,
            presence_enabled,
            max_upload_size,
            legacy_media_until_ms,
            trusted_proxies,
            outbound,
            max_image_pixels,
            federation,
            max_event_delay_ms,
            turn,
            url_previews,
            ops,
            appservices,
        })
    }

    /// Settings that are valid but probably not what the admin wants, one line each.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if let Some(jwt) = &self.jwt {
            if !is_hmac(jwt.algorithm) && jwt.issuer.is_none() && jwt.audience.is_none() {
                warnings.push(
                    "MYELIN_JWT_ALGORITHM is asymmetric but neither MYELIN_JWT_AUDIENCE nor \
                     MYELIN_JWT_ISSUER is set: any token the key's owner signs for another \
                     application logs in here too"
                        .to_owned(),
                );
            }
        }
        warnings
    }
}

/// Reads the JWT settings and parses the key, so a bad key stops the server at start.
fn jwt_config(src: &Sources, secret: Raw) -> Result<JwtConfig, ConfigError> {
    let algorithm = match src.get("jwt_algorithm") {
        None => jsonwebtoken::Algorithm::HS256,
        Some(raw) => raw.value.parse().map_err(|_| {
            bad(
                &raw.source,
                format!("'{}' is not a JWT algorithm", raw.value),
            )
        })?,
    };
    use jsonwebtoken::{Algorithm::*, DecodingKey};
    let bytes = secret.value.as_bytes();
    let key = match algorithm {
        HS256 | HS384 | HS512 => {
            if bytes.len() < MIN_HMAC_SECRET_LEN {
                return Err(bad(
                    &secret.source,
                    format!("an HMAC secret must be at least {MIN_HMAC_SECRET_LEN} bytes"),
                ));
            }
            DecodingKey::from_secret(bytes)
        }
        ES256 | ES384 => DecodingKey::from_ec_pem(bytes),
        EdDSA => DecodingKey::from_ed_pem(bytes),
        // RS* and PS*, and whatever RSA-family algorithm a later jsonwebtoken adds.
        _ => DecodingKey::from_rsa_pem(bytes),
    }
    .map_err(|e| {
        bad(
            &secret.source,
            format!("not a valid {algorithm:?} key: {e}"),
        )
    })?;
    Ok(JwtConfig {
        key,
        algorithm,
        issuer: src.get("jwt_issuer").map(|r| r.value),
        audience: src.get("jwt_audience").map(|r| r.value),
        require_exp: switch(src, "jwt_require_exp", true)?,
    })
}

fn turn_config(src: &Sources) -> Result<TurnConfig, ConfigError> {
    let text = |key| src.get(key).map(|r| r.value).filter(|v| !v.is_empty());
    let uris: Vec<String> = text("turn_uris")
        .map(|v| {
            v.split(',')
                .map(|u| u.trim().to_owned())
                .filter(|u| !u.is_empty())
                .collect()
        })
        .unwrap_or_default();
    if let Some(bad_uri) = uris
        .iter()
        .find(|u| !(u.starts_with("turn:") || u.starts_with("turns:") || u.starts_with("stun:")))
    {
        return Err(bad(
            "MYELIN_TURN_URIS",
            format!("'{bad_uri}' is not a turn:, turns: or stun: URI"),
        ));
    }
    let (username, password) = (text("turn_username"), text("turn_password"));
    if username.is_some() != password.is_some() {
        return Err(bad(
            "MYELIN_TURN_USERNAME",
            "MYELIN_TURN_USERNAME and MYELIN_TURN_PASSWORD go together",
        ));
    }
    Ok(TurnConfig {
        uris,
        shared_secret: text("turn_shared_secret"),
        username,
        password,
        ttl_secs: integer(src, "turn_ttl_secs", 86_400)?,
    })
}

fn cidrs(src: &Sources, key: &'static str) -> Result<Vec<Cidr>, ConfigError> {
    match src.get(key) {
        None => Ok(Vec::new()),
        Some(raw) => parse_cidr_list(&raw.value).map_err(|problem| bad(&raw.source, problem)),
    }
}

fn switch(src: &Sources, key: &'static str, default: bool) -> Result<bool, ConfigError> {
    match src.get(key) {
        None => Ok(default),
        Some(raw) => match raw.value.as_str() {
            "on" | "true" => Ok(true),
            "off" | "false" => Ok(false),
            other => Err(bad(&raw.source, format!("'{other}' is not on or off"))),
        },
    }
}

fn integer(src: &Sources, key: &'static str, default: u64) -> Result<u64, ConfigError> {
    match src.get(key) {
        None => Ok(default),
        Some(raw) => match raw.value.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(bad(
                &raw.source,
                format!("'{}' is not a positive integer", raw.value),
            )),
        },
    }
}

fn positive(src: &Sources, key: &'static str, default: f64) -> Result<f64, ConfigError> {
    match src.get(key) {
        None => Ok(default),
        Some(raw) => match raw.value.parse::<f64>() {
            Ok(n) if n > 0.0 && n.is_finite() => Ok(n),
            _ => Err(bad(
                &raw.source,
                format!("'{}' is not a positive number", raw.value),
            )),
        },
    }
}

fn read_file(path: &PathBuf) -> Result<HashMap<&'static str, toml::Value>, ConfigError> {
    let setting = "MYELIN_CONFIG";
    let text = std::fs::read_to_string(path)
        .map_err(|e| bad(setting, format!("cannot read {}: {e}", path.display())))?;
    let parsed: FileConfig = toml::from_str(&text)
        .map_err(|e| bad(setting, format!("{}: {}", path.display(), e.message())))?;
    let FileConfig {
        server_name,
        listen,
        data_dir,
        database_url,
        public_baseurl,
        registration,
        rate_limits,
        rate_limit_login_per_second,
        rate_limit_login_burst,
        rate_limit_registration_per_second,
        rate_limit_registration_burst,
        rate_limit_message_per_second,
        rate_limit_message_burst,
        max_request_size,
        refreshable_access_token_lifetime,
        jwt_secret,
        jwt_algorithm,
        jwt_issuer,
        jwt_audience,
        database_pool_size,
        presence,
        max_upload_size,
        legacy_media_until,
        trusted_proxies,
        outbound_allow,
        outbound_deny,
        max_image_pixels,
        jwt_require_exp,
        federation,
        federation_listen,
        tls_cert,
        tls_key,
        federation_ca_file,
        well_known_server,
        federation_allowed_servers,
        federation_retry_min_ms,
        federation_retry_max_ms,
        federation_max_queued_pdus,
        federation_room_window,
        max_event_delay_ms,
        turn_uris,
        turn_shared_secret,
        turn_username,
        turn_password,
        turn_ttl_secs,
        url_previews,
        metrics_listen,
        log_format,
        consistency_sample_minutes,
        shutdown_grace,
        statistics_refresh,
        state_cache_mb,
        appservices,
    } = parsed;
    let s = |v: Option<String>| v.map(toml::Value::String);
    let f = |v: Option<f64>| v.map(toml::Value::Float);
    let entries = [
        ("server_name", s(server_name)),
        ("listen", s(listen)),
        ("data_dir", s(data_dir)),
        ("database_url", s(database_url)),
        ("public_baseurl", s(public_baseurl)),
        ("registration", s(registration)),
        ("rate_limits", rate_limits),
        (
            "rate_limit_login_per_second",
            f(rate_limit_login_per_second),
        ),
        ("rate_limit_login_burst", f(rate_limit_login_burst)),
        (
            "rate_limit_registration_per_second",
            f(rate_limit_registration_per_second),
        ),
        (
            "rate_limit_registration_burst",
            f(rate_limit_registration_burst),
        ),
        (
            "rate_limit_message_per_second",
            f(rate_limit_message_per_second),
        ),
        ("rate_limit_message_burst", f(rate_limit_message_burst)),
        ("max_request_size", max_request_size),
        (
            "refreshable_access_token_lifetime",
            refreshable_access_token_lifetime,
        ),
        ("jwt_secret", s(jwt_secret)),
        ("jwt_algorithm", s(jwt_algorithm)),
        ("jwt_issuer", s(jwt_issuer)),
        ("jwt_audience", s(jwt_audience)),
        ("database_pool_size", database_pool_size),
        ("presence", presence),
        ("max_upload_size", max_upload_size),
        ("legacy_media_until", legacy_media_until),
        ("trusted_proxies", s(trusted_proxies)),
        ("outbound_allow", s(outbound_allow)),
        ("outbound_deny", s(outbound_deny)),
        ("max_image_pixels", max_image_pixels),
        ("jwt_require_exp", jwt_require_exp),
        ("federation", federation),
        ("federation_listen", s(federation_listen)),
        ("tls_cert", s(tls_cert)),
        ("tls_key", s(tls_key)),
        ("federation_ca_file", s(federation_ca_file)),
        ("well_known_server", s(well_known_server)),
        ("federation_allowed_servers", s(federation_allowed_servers)),
        ("federation_retry_min_ms", federation_retry_min_ms),
        ("federation_retry_max_ms", federation_retry_max_ms),
        ("federation_max_queued_pdus", federation_max_queued_pdus),
        ("federation_room_window", federation_room_window),
        ("max_event_delay_ms", max_event_delay_ms),
        ("turn_uris", s(turn_uris)),
        ("turn_shared_secret", s(turn_shared_secret)),
        ("turn_username", s(turn_username)),
        ("turn_password", s(turn_password)),
        ("turn_ttl_secs", turn_ttl_secs),
        ("url_previews", url_previews),
        ("metrics_listen", s(metrics_listen)),
        ("log_format", s(log_format)),
        ("consistency_sample_minutes", consistency_sample_minutes),
        ("shutdown_grace", shutdown_grace),
        ("statistics_refresh", statistics_refresh),
        ("state_cache_mb", state_cache_mb),
        ("appservices", s(appservices)),
    ];
    Ok(entries
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_serve_localhost_on_8008() {
        let config = Config::load_from(None, env(&[])).unwrap();
        assert_eq!(config.server_name.as_str(), "localhost");
        assert_eq!(config.listen.to_string(), "127.0.0.1:8008");
        assert_eq!(config.registration, RegistrationMode::Closed);
        assert!(config.rate_limits_enabled);
        assert!(config.database_url.is_none());
    }

    #[test]
    fn bad_setting_is_named_in_the_error() {
        let err = Config::load_from(None, env(&[("MYELIN_LISTEN", "nope")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: MYELIN_LISTEN: 'nope' is not an address:port"
        );
        let err = Config::load_from(None, env(&[("MYELIN_REGISTRATION", "maybe")])).unwrap_err();
        assert!(err.to_string().contains("MYELIN_REGISTRATION"), "{err}");
    }

    #[test]
    fn address_lists_and_jwt_keys_are_checked_at_start() {
        let err = Config::load_from(
            None,
            env(&[("MYELIN_TRUSTED_PROXIES", "10.0.0.0/8, proxy")]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("MYELIN_TRUSTED_PROXIES"), "{err}");
        let config =
            Config::load_from(None, env(&[("MYELIN_OUTBOUND_ALLOW", "127.0.0.1/32 ::1")])).unwrap();
        assert!(config.outbound.permits("127.0.0.1".parse().unwrap()));
        let err = Config::load_from(None, env(&[("MYELIN_JWT_SECRET", "short")])).unwrap_err();
        assert!(err.to_string().contains("at least 32 bytes"), "{err}");
        let rsa = env(&[
            ("MYELIN_JWT_SECRET", "-----BEGIN PUBLIC KEY-----"),
            ("MYELIN_JWT_ALGORITHM", "RS256"),
        ]);
        assert!(Config::load_from(None, rsa).is_err());
    }

    #[test]
    fn environment_overrides_file() {
        let dir = std::env::temp_dir().join(format!("myelin-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("myelin.toml");
        std::fs::write(
            &path,
            "server_name = \"example.org\"\nregistration = \"open\"\nrate_limits = false\n",
        )
        .unwrap();
        let config =
            Config::load_from(Some(path.clone()), env(&[("MYELIN_REGISTRATION", "token")]))
                .unwrap();
        assert_eq!(config.server_name.as_str(), "example.org");
        assert_eq!(config.registration, RegistrationMode::Token);
        assert!(!config.rate_limits_enabled);
        std::fs::write(&path, "server_nam = \"typo\"\n").unwrap();
        let err = Config::load_from(Some(path), env(&[])).unwrap_err();
        assert!(err.to_string().contains("server_nam"), "{err}");
    }
}
