//! Operations settings: the metrics listener, the log format, the consistency sampler and the
//! shutdown grace period.

use std::{net::SocketAddr, time::Duration};

use super::{bad, integer, switch, ConfigError, Sources};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (colours only on a terminal).
    Text,
    /// One JSON object per line.
    Json,
}

/// Settings for running the server in production (`MYELIN_METRICS_LISTEN`,
/// `MYELIN_LOG_FORMAT`, `MYELIN_CONSISTENCY_SAMPLE_MINUTES`, `MYELIN_SHUTDOWN_GRACE`,
/// `MYELIN_STATISTICS_REFRESH`).
#[derive(Debug, Clone)]
pub struct OpsConfig {
    /// Where Prometheus metrics are served (`GET /metrics`); `None`: not at all.
    pub metrics_listen: Option<SocketAddr>,
    /// How log lines are written.
    pub log_format: LogFormat,
    /// How often the consistency sampler runs; `None`: never.
    pub consistency_sample_every: Option<Duration>,
    /// How long a shutdown waits for requests in flight.
    pub shutdown_grace: Duration,
    /// Whether the server refreshes the planner statistics of tables that changed.
    pub statistics_refresh: bool,
    /// About how many bytes of state events each process keeps in memory, by event ID and by
    /// state group (each bounded by it).
    pub state_cache_bytes: usize,
}

/// Reads the operations settings.
pub(super) fn ops_config(src: &Sources) -> Result<OpsConfig, ConfigError> {
    let metrics_listen = match src.get("metrics_listen") {
        None => None,
        Some(raw) if raw.value.is_empty() => None,
        Some(raw) => Some(raw.value.parse().map_err(|_| {
            bad(
                &raw.source,
                format!("'{}' is not an address:port", raw.value),
            )
        })?),
    };
    let log_format = match src.get("log_format") {
        None => LogFormat::Text,
        Some(raw) => match raw.value.as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => return Err(bad(&raw.source, format!("'{other}' is not text or json"))),
        },
    };
    // Fractions of a minute are allowed so a test can sample every second.
    let consistency_sample_every = match src.get("consistency_sample_minutes") {
        None => None,
        Some(raw) => match raw.value.parse::<f64>() {
            Ok(minutes) if minutes > 0.0 && minutes.is_finite() && minutes < 1e6 => {
                Some(Duration::from_secs_f64(minutes * 60.0))
            }
            _ => {
                return Err(bad(
                    &raw.source,
                    format!("'{}' is not a positive number of minutes", raw.value),
                ))
            }
        },
    };
    let shutdown_grace = Duration::from_secs(integer(src, "shutdown_grace", 10)?);
    let statistics_refresh = switch(src, "statistics_refresh", true)?;
    let state_cache_mebibytes = integer(src, "state_cache_mb", 64)?;
    let state_cache_bytes =
        usize::try_from(state_cache_mebibytes.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    Ok(OpsConfig {
        metrics_listen,
        log_format,
        consistency_sample_every,
        shutdown_grace,
        statistics_refresh,
        state_cache_bytes,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::config::Config;

    fn load(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::load_from(None, env)
    }

    #[test]
    fn operations_settings_default_to_off_and_parse() {
        let ops = load(&[]).unwrap().ops;
        assert_eq!(ops.metrics_listen, None);
        assert_eq!(ops.log_format, LogFormat::Text);
        assert_eq!(ops.consistency_sample_every, None);
        assert_eq!(ops.shutdown_grace, Duration::from_secs(10));
        assert!(ops.statistics_refresh);
        assert_eq!(ops.state_cache_bytes, 64 << 20);

        let ops = load(&[
            ("MYELIN_METRICS_LISTEN", "127.0.0.1:9108"),
            ("MYELIN_LOG_FORMAT", "json"),
            ("MYELIN_CONSISTENCY_SAMPLE_MINUTES", "0.5"),
            ("MYELIN_SHUTDOWN_GRACE", "3"),
            ("MYELIN_STATISTICS_REFRESH", "off"),
            ("MYELIN_STATE_CACHE_MB", "8"),
        ])
        .unwrap()
        .ops;
        assert_eq!(ops.metrics_listen, Some("127.0.0.1:9108".parse().unwrap()));
        assert_eq!(ops.log_format, LogFormat::Json);
        assert_eq!(ops.consistency_sample_every, Some(Duration::from_secs(30)));
        assert_eq!(ops.shutdown_grace, Duration::from_secs(3));
        assert!(!ops.statistics_refresh);
        assert_eq!(ops.state_cache_bytes, 8 << 20);
    }

    #[test]
    fn bad_operations_settings_name_the_setting() {
        for (key, value) in [
            ("MYELIN_METRICS_LISTEN", "nope"),
            ("MYELIN_LOG_FORMAT", "xml"),
            ("MYELIN_CONSISTENCY_SAMPLE_MINUTES", "-1"),
            ("MYELIN_SHUTDOWN_GRACE", "0"),
            ("MYELIN_STATISTICS_REFRESH", "sometimes"),
            ("MYELIN_STATE_CACHE_MB", "0"),
        ] {
            let err = load(&[(key, value)]).unwrap_err();
            assert_eq!(err.setting, key, "{err}");
        }
    }
}
