//! Prometheus metrics: one registry per process, served as text on the metrics listener
//! (`MYELIN_METRICS_LISTEN`, see `server::serve_metrics`).
//!
//! Labels come only from small fixed sets: HTTP method, route *template*, status, and the
//! enums below. Never a user, room, event, device or server name: a label value is a
//! time series, and IDs would make one per user. Hot paths look up a child by `&'static str`
//! labels (no allocation once the child exists).
//!
//! The registry is process-wide, as in every Prometheus client: a metric is a fact about the
//! process, and passing a handle through every service would add a parameter to dozens of
//! constructors for no gain. Each server process exposes its own numbers; Prometheus adds
//! `instance`.

mod process;

use std::{
    collections::HashSet,
    sync::{LazyLock, RwLock},
    time::Instant,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// Latency buckets in seconds: Myelin's ~1 ms sends to a 10 s slow request.
const LATENCY: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Long-poll waits: up to the longest timeout (60 s).
const WAIT: [f64; 12] = [
    0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
];
/// Sizes in bytes: 256 * 4^k up to 64 MiB.
const SIZES: [f64; 10] = [
    256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0, 67108864.0,
];

/// The statement kinds of `myelin_db_query_seconds`.
pub const STATEMENTS: [&str; 6] = [
    "select",
    "insert",
    "update",
    "delete",
    "transaction",
    "other",
];

/// Rooms in one response.
const ROOMS: [f64; 10] = [0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 500.0, 1000.0];

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// A histogram family whose children use one of the bucket sets above.
macro_rules! histogram_family {
    ($name:ident, $buckets:ident) => {
        fn $name<L: Clone + std::hash::Hash + Eq>() -> HistogramFamily<L> {
            Family::new_with_constructor(|| Histogram::new($buckets))
        }
    };
}
histogram_family!(latency_histograms, LATENCY);
histogram_family!(wait_histograms, WAIT);
histogram_family!(size_histograms, SIZES);
histogram_family!(room_histograms, ROOMS);

/// `method`, `route`, `status` of one response.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// The HTTP method.
    pub method: &'static str,
    /// The route template (`/_matrix/client/v3/rooms/{roomId}/send/{eventType}/{txnId}`).
    pub route: &'static str,
    /// The status code.
    pub status: u16,
}

/// `method`, `route`, `status_class` (`2xx` .. `5xx`) of one response.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpClassLabels {
    /// The HTTP method.
    pub method: &'static str,
    /// The route template.
    pub route: &'static str,
    /// `1xx` .. `5xx`.
    pub status_class: &'static str,
}

/// One label whose values come from a fixed set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Kind {
    /// The value.
    pub kind: &'static str,
}

/// A send's kind and how it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SendLabels {
    /// `message`, `state` or `redaction`.
    pub kind: &'static str,
    /// `created`, `replayed`, `refused` (4xx) or `failed` (5xx).
    pub outcome: &'static str,
}

/// Which sync protocol and what kind of sync.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SyncLabels {
    /// `v3` (`/sync`) or `sliding`.
    pub api: &'static str,
    /// `initial`, `incremental` (answered at once) or `long_poll` (parked first).
    pub kind: &'static str,
}

/// Which sync protocol.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabel {
    /// `v3` or `sliding`.
    pub api: &'static str,
}

/// A stream, by its name in `stream_positions`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabel {
    /// `events`, `receipts`, ...
    pub stream: String,
}

/// A connection pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    /// `worker` (the HTTP workers' pools together) or `shared`.
    pub pool: &'static str,
}

/// A pool and a connection state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolStateLabels {
    /// `worker` or `shared`.
    pub pool: &'static str,
    /// `idle` or `busy`.
    pub state: &'static str,
}

/// A cache lookup.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    /// The cache (`access_tokens`, `push_rules`, `sliding_room_meta`, `state_events`, ...).
    pub cache: &'static str,
    /// `hit` or `miss`.
    pub result: &'static str,
}

/// Where a persisted event came from.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventOrigin {
    /// `client` (written here for a client's request, appservices' and admins' included),
    /// `server` (written here on a user's behalf: a deactivation's leaves, a delayed event) or
    /// `federation` (another server's: received PDUs and backfill, an invite from another
    /// server, our users' joins and leaves made through a resident server).
    pub origin: &'static str,
}

/// A database statement's kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatementLabel {
    /// `select`, `insert`, `update`, `delete`, `transaction` (begin, commit, rollback,
    /// savepoints) or `other` (`WITH ...`, DDL, ...).
    pub statement: &'static str,
}

/// What happened to one unit of work.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    /// `ok`, `failed`, ...
    pub outcome: &'static str,
}

/// A consistency check's kind and result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckLabels {
    /// `unread_counts` or `room_index`.
    pub check: &'static str,
    /// `ok` or `mismatch`.
    pub result: &'static str,
}

/// Every metric this process exports.
pub struct Metrics {
    registry: Registry,
    /// Responses by method, route and status.
    pub http_requests: Family<HttpLabels, Counter>,
    /// Arrival to response produced, by method, route and status class.
    pub http_duration: HistogramFamily<HttpClassLabels>,
    /// Sends by kind and outcome.
    pub send_requests: Family<SendLabels, Counter>,
    /// Arrival to event committed, for sends that created an event.
    pub send_ack: HistogramFamily<Kind>,
    /// Events stored, by where they came from (counted once committed).
    pub events_persisted: Family<EventOrigin, Counter>,
    /// Delivery, part 1: a send's database transaction, begin to commit.
    pub delivery_commit: Histogram,
    /// Delivery, part 2: a notification's arrival at this process to a parked sync resuming.
    pub delivery_wake: HistogramFamily<ApiLabel>,
    /// Delivery, part 3: a parked sync resuming to its response body written.
    pub delivery_respond: HistogramFamily<ApiLabel>,
    /// Syncs by protocol and kind.
    pub sync_requests: Family<SyncLabels, Counter>,
    /// Time computing responses (all computations of one request), excluding the wait.
    pub sync_build: HistogramFamily<SyncLabels>,
    /// Time parked before data or the timeout.
    pub sync_wait: HistogramFamily<ApiLabel>,
    /// Response body sizes.
    pub sync_response_bytes: HistogramFamily<ApiLabel>,
    /// Rooms per response.
    pub sync_rooms: HistogramFamily<ApiLabel>,
    /// Syncs parked now.
    pub sync_long_polls: Gauge,
    /// Highest position taken, per stream (set at each scrape).
    pub stream_position: Family<StreamLabel, Gauge>,
    /// Highest position below which everything is committed, per stream.
    pub stream_persisted_upto: Family<StreamLabel, Gauge>,
    /// Connections per pool and state (set at each scrape).
    pub db_pool_connections: Family<PoolStateLabels, Gauge>,
    /// Each pool's maximum size.
    pub db_pool_max_connections: Family<PoolLabel, Gauge>,
    /// Callers queued for a connection.
    pub db_pool_waiting: Family<PoolLabel, Gauge>,
    /// Time to check a connection out.
    pub db_pool_wait: HistogramFamily<PoolLabel>,
    /// Statement times (issued to result) by statement kind.
    pub db_query: HistogramFamily<StatementLabel>,
    /// `M_LIMIT_EXCEEDED` answers.
    pub rate_limited: Counter,
    /// Transient work dropped under load, by kind (`typing`, `presence`).
    pub shed: Family<Kind, Counter>,
    /// Cache lookups by cache and result.
    pub cache_requests: Family<CacheLabels, Counter>,
    /// Pushes to gateways by outcome (`sent`, `failed`, `rejected`).
    pub push_notifications: Family<Outcome, Counter>,
    /// Media uploads by outcome (`stored`, `deduplicated`).
    pub media_uploads: Family<Outcome, Counter>,
    /// Media bytes by direction (`in` for uploads, `out` for downloads).
    pub media_bytes: Family<Kind, Counter>,
    /// Media downloads served (local files, thumbnails included).
    pub media_downloads: Counter,
    /// Outbound federation transactions by outcome (`sent`, `failed`).
    pub federation_transactions: Family<Outcome, Counter>,
    /// Passes of the federation queue over new events (one database transaction each).
    pub federation_queue_passes: Counter,
    /// Consistency checks by check and result.
    pub consistency_checks: Family<CheckLabels, Counter>,
    /// Tables whose planner statistics this process refreshed (`ANALYZE`).
    pub statistics_refreshes: Counter,
    /// Routes seen through `match_pattern` (not ruma's static templates), kept once each.
    routes: RwLock<HashSet<&'static str>>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::default();
        macro_rules! reg {
            ($name:literal, $help:literal, $metric:expr) => {{
                let metric = $metric;
                registry.register($name, $help, metric.clone());
                metric
            }};
        }
        let metrics = Metrics {
            http_requests: reg!(
                "myelin_http_requests",
                "HTTP responses by method, route template and status",
                Family::default()
            ),
            http_duration: reg!(
                "myelin_http_request_duration_seconds",
                "Request arrival to response produced (long-polls included)",
                latency_histograms()
            ),
            send_requests: reg!(
                "myelin_send_requests",
                "Sends by kind and outcome (created, replayed txnId, refused 4xx, failed 5xx)",
                Family::default()
            ),
            send_ack: reg!(
                "myelin_send_ack_seconds",
                "Send start to event committed, for sends that created an event",
                latency_histograms()
            ),
            events_persisted: reg!(
                "myelin_events_persisted",
                "Events stored in a room's stream (outliers aside), once committed, by origin",
                Family::default()
            ),
            delivery_commit: reg!(
                "myelin_delivery_commit_seconds",
                "Delivery part 1: a send's database transaction, begin to commit",
                Histogram::new(LATENCY)
            ),
            delivery_wake: reg!(
                "myelin_delivery_wake_seconds",
                "Delivery part 2: a commit's notification arriving here to a parked sync resuming",
                latency_histograms()
            ),
            delivery_respond: reg!(
                "myelin_delivery_respond_seconds",
                "Delivery part 3: a woken sync resuming to its response body written",
                latency_histograms()
            ),
            sync_requests: reg!(
                "myelin_sync_requests",
                "Syncs by protocol and kind (initial, incremental, long_poll)",
                Family::default()
            ),
            sync_build: reg!(
                "myelin_sync_build_seconds",
                "Time computing sync responses, long-poll wait excluded",
                latency_histograms()
            ),
            sync_wait: reg!(
                "myelin_sync_wait_seconds",
                "Time a sync was parked before data or its timeout",
                wait_histograms()
            ),
            sync_response_bytes: reg!(
                "myelin_sync_response_bytes",
                "Sync response body sizes",
                size_histograms()
            ),
            sync_rooms: reg!(
                "myelin_sync_rooms",
                "Rooms per sync response",
                room_histograms()
            ),
            sync_long_polls: reg!(
                "myelin_sync_long_polls",
                "Syncs parked now",
                Gauge::default()
            ),
            stream_position: reg!(
                "myelin_stream_position",
                "Highest stream position taken",
                Family::default()
            ),
            stream_persisted_upto: reg!(
                "myelin_stream_persisted_upto",
                "Highest stream position at or below which everything is committed",
                Family::default()
            ),
            db_pool_connections: reg!(
                "myelin_db_pool_connections",
                "Open pooled connections by pool and state",
                Family::default()
            ),
            db_pool_max_connections: reg!(
                "myelin_db_pool_max_connections",
                "Configured pool sizes",
                Family::default()
            ),
            db_pool_waiting: reg!(
                "myelin_db_pool_waiting",
                "Callers queued for a pooled connection",
                Family::default()
            ),
            db_pool_wait: reg!(
                "myelin_db_pool_wait_seconds",
                "Time to check a connection out of a pool",
                latency_histograms()
            ),
            db_query: reg!(
                "myelin_db_query_seconds",
                "Database statement times, issued to result (pipelined ones include the wait \
                 behind earlier statements), by statement kind",
                latency_histograms()
            ),
            rate_limited: reg!(
                "myelin_rate_limited",
                "Requests answered M_LIMIT_EXCEEDED",
                Counter::default()
            ),
            shed: reg!(
                "myelin_shed",
                "Transient work dropped under load (typing, presence)",
                Family::default()
            ),
            cache_requests: reg!(
                "myelin_cache_requests",
                "Cache lookups by cache and result",
                Family::default()
            ),
            push_notifications: reg!(
                "myelin_push_notifications",
                "Pushes to gateways by outcome",
                Family::default()
            ),
            media_uploads: reg!(
                "myelin_media_uploads",
                "Media uploads by outcome",
                Family::default()
            ),
            media_bytes: reg!(
                "myelin_media_bytes",
                "Media bytes uploaded (in) and served (out)",
                Family::default()
            ),
            media_downloads: reg!(
                "myelin_media_downloads",
                "Media downloads and thumbnails served",
                Counter::default()
            ),
            federation_transactions: reg!(
                "myelin_federation_transactions",
                "Outbound federation transactions by outcome",
                Family::default()
            ),
            federation_queue_passes: reg!(
                "myelin_federation_queue_passes",
                "Passes of the federation queue over new events, one database transaction each",
                Counter::default()
            ),
            consistency_checks: reg!(
                "myelin_consistency_checks",
                "Derived state recomputed from facts by the sampler, by check and result",
                Family::default()
            ),
            statistics_refreshes: reg!(
                "myelin_statistics_refreshes",
                "Tables whose planner statistics this process refreshed (ANALYZE)",
                Counter::default()
            ),
            routes: RwLock::default(),
            registry,
        };
        let mut metrics = metrics;
        metrics
            .registry
            .register_collector(Box::new(process::ProcessCollector::new()));
        metrics.create_known_series();
        metrics
    }

    /// Creates the series of the fixed label sets at zero, so they are scraped (and `rate()`
    /// works) before their first event.
    fn create_known_series(&self) {
        for kind in ["message", "state", "redaction"] {
            for outcome in ["created", "replayed", "refused", "failed"] {
                let _ = self
                    .send_requests
                    .get_or_create(&SendLabels { kind, outcome });
            }
        }
        for api in ["v3", "sliding"] {
            for kind in ["initial", "incremental", "long_poll"] {
                let _ = self.sync_requests.get_or_create(&SyncLabels { api, kind });
            }
            let _ = self.sync_wait.get_or_create(&ApiLabel { api });
            let _ = self.delivery_wake.get_or_create(&ApiLabel { api });
            let _ = self.delivery_respond.get_or_create(&ApiLabel { api });
        }
        for origin in ["client", "server", "federation"] {
            let _ = self.events_persisted.get_or_create(&EventOrigin { origin });
        }
        for statement in STATEMENTS {
            let _ = self.db_query.get_or_create(&StatementLabel { statement });
        }
        for kind in ["typing", "presence"] {
            let _ = self.shed.get_or_create(&Kind { kind });
        }
        for kind in ["in", "out"] {
            let _ = self.media_bytes.get_or_create(&Kind { kind });
        }
        for check in ["unread_counts", "room_index"] {
            for result in ["ok", "mismatch"] {
                let _ = self
                    .consistency_checks
                    .get_or_create(&CheckLabels { check, result });
            }
        }
        let outcomes: [(&Family<Outcome, Counter>, &[&'static str]); 3] = [
            (&self.push_notifications, &["sent", "failed", "rejected"]),
            (&self.media_uploads, &["stored", "deduplicated"]),
            (
                &self.federation_transactions,
                &["sent", "failed", "dropped"],
            ),
        ];
        for (family, names) in outcomes {
            for &outcome in names {
                let _ = family.get_or_create(&Outcome { outcome });
            }
        }
    }

    /// Counts one HTTP response and its latency.
    pub fn observe_http(
        &self,
        method: &'static str,
        route: &'static str,
        status: u16,
        started: Instant,
    ) {
        self.http_requests
            .get_or_create(&HttpLabels {
                method,
                route,
                status,
            })
            .inc();
        let status_class = match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        self.http_duration
            .get_or_create(&HttpClassLabels {
                method,
                route,
                status_class,
            })
            .observe(started.elapsed().as_secs_f64());
    }

    /// The `'static` form of a route pattern from actix's route table (a bounded set: one
    /// per registered route, leaked once).
    pub fn route(&self, pattern: &str) -> &'static str {
        if let Some(&known) = self
            .routes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(pattern)
        {
            return known;
        }
        let mut routes = self.routes.write().unwrap_or_else(|e| e.into_inner());
        match routes.get(pattern) {
            Some(&known) => known,
            None => {
                let leaked: &'static str = Box::leak(pattern.to_owned().into_boxed_str());
                routes.insert(leaked);
                leaked
            }
        }
    }

    /// Counts a cache lookup.
    pub fn cache(&self, cache: &'static str, hit: bool) {
        self.cache_lookups(cache, u64::from(hit), u64::from(!hit));
    }

    /// Counts many lookups of one cache at once.
    pub fn cache_lookups(&self, cache: &'static str, hits: u64, misses: u64) {
        for (result, count) in [("hit", hits), ("miss", misses)] {
            if count > 0 {
                self.cache_requests
                    .get_or_create(&CacheLabels { cache, result })
                    .inc_by(count);
            }
        }
    }

    /// Counts events stored by a committed transaction.
    pub fn events_persisted(&self, origin: &'static str, count: u64) {
        if count > 0 {
            self.events_persisted
                .get_or_create(&EventOrigin { origin })
                .inc_by(count);
        }
    }

    /// Counts one thing by a single-valued label family.
    pub fn count(family: &Family<Outcome, Counter>, outcome: &'static str) {
        family.get_or_create(&Outcome { outcome }).inc();
    }

    /// The metrics in the Prometheus text format (OpenMetrics 1.0).
    pub fn encode(&self) -> String {
        let mut text = String::with_capacity(32 * 1024);
        if let Err(err) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!("encoding metrics: {err}");
        }
        text
    }
}

/// When a parked sync resumed from a wake-up for the data it answers with (none when it
/// answered without parking, at its timeout or at a shutdown), carried to where its body is
/// written: the last part of the delivery latency.
#[derive(Clone, Copy, Debug, Default)]
pub struct Resumed(Option<Instant>);

impl Resumed {
    /// A sync resuming now.
    pub fn now() -> Self {
        Resumed(Some(Instant::now()))
    }

    /// No wake-up to measure from.
    pub fn none() -> Self {
        Resumed(None)
    }

    /// Counts the time since the sync resumed, its body now written (under `api`).
    pub fn observe_written(self, api: &'static str) {
        if let Some(resumed) = self.0 {
            metrics()
                .delivery_respond
                .get_or_create(&ApiLabel { api })
                .observe(resumed.elapsed().as_secs_f64());
        }
    }
}

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Counts a parked long-poll for as long as it lives.
pub struct LongPollGuard(());

impl LongPollGuard {
    /// Counts one more parked sync.
    pub fn new() -> Self {
        metrics().sync_long_polls.inc();
        LongPollGuard(())
    }
}

impl Default for LongPollGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for LongPollGuard {
    fn drop(&mut self) {
        metrics().sync_long_polls.dec();
    }
}
