//! PostgreSQL storage: the connection pool, migrations and the SQL queries. The exceptions sit
//! where the lock they take matters: the room's advisory lock (`service/rooms/writer.rs`) and
//! the leader lock of background senders (`storage/leader.rs`).
//!
//! Query functions take a connection so services can compose several into one transaction.
//! Lookups return `Option`; the service decides what a missing row means.

pub mod account_data;
pub mod admin_history;
pub mod admin_rooms;
pub mod admin_users;
pub mod appservice;
pub mod backup;
pub mod client_events;
pub mod consistency;
pub mod dag;
pub mod dehydrated_devices;
pub mod delayed_events;
pub mod devices;
pub mod e2ee;
pub mod event_graph;
pub mod federation;
pub mod federation_received;
pub mod federation_sending;
pub mod leader;
pub mod media;
pub mod memberships;
pub mod openid;
pub mod presence;
pub mod push;
pub mod pushers;
mod query_timer;
pub mod receipts;
pub mod registration;
pub mod relations;
pub mod remote_devices;
pub mod reports;
pub mod room_index;
pub mod room_servers;
pub mod rooms;
pub mod schema;
pub mod search;
pub mod sliding_sync;
pub mod state;
pub mod statistics;
pub mod streams;
pub mod summaries;
pub mod timelines;
pub mod to_device;
pub mod transaction;
pub mod users;

use std::{
    cell::RefCell,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use diesel_async::{
    async_connection_wrapper::AsyncConnectionWrapper,
    pooled_connection::{
        deadpool::{Object, Pool},
        AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
    },
    AsyncPgConnection,
};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

use crate::error::{Error, Result};

/// A pooled connection.
pub type Conn = Object<AsyncPgConnection>;

/// Raw SQL that is prepared once per connection and then reused, like the query builder's
/// statements. Diesel never caches `sql_query` statements: each run would be parsed again, and
/// in a pipeline the parse is a round trip during which nothing else is sent. The text must
/// not vary between runs (values go in binds), or every variant would stay cached. Only for
/// statements whose plan does not depend on the values: after five runs PostgreSQL may
/// switch a prepared statement to a generic plan, which for the big joins (presence, device
/// lists, search) was many times slower, so those stay `sql_query`. A statement made of one
/// indexed lookup per element of an array (unread counts) has one plan for any length.
pub fn cached_sql(sql: impl Into<std::borrow::Cow<'static, str>>) -> CachedSql {
    CachedSql(sql.into())
}

/// See [`cached_sql`].
#[derive(Debug, Clone)]
pub struct CachedSql(std::borrow::Cow<'static, str>);

impl CachedSql {
    /// Binds the next `$n` parameter.
    pub fn bind<ST, Value>(self, value: Value) -> CachedBind<Self, Value, ST> {
        CachedBind {
            query: self,
            value,
            sql_type: std::marker::PhantomData,
        }
    }
}

/// A [`CachedSql`] statement with its parameters bound so far.
#[derive(Debug, Clone)]
pub struct CachedBind<Query, Value, ST> {
    query: Query,
    value: Value,
    sql_type: std::marker::PhantomData<ST>,
}

impl<Query, Value, ST> CachedBind<Query, Value, ST> {
    /// Binds the next `$n` parameter.
    pub fn bind<ST2, Value2>(self, value: Value2) -> CachedBind<Self, Value2, ST2> {
        CachedBind {
            query: self,
            value,
            sql_type: std::marker::PhantomData,
        }
    }
}

impl<Query, Value, ST> diesel::query_builder::QueryFragment<diesel::pg::Pg>
    for CachedBind<Query, Value, ST>
where
    Query: diesel::query_builder::QueryFragment<diesel::pg::Pg>,
    Value: diesel::serialize::ToSql<ST, diesel::pg::Pg>,
    diesel::pg::Pg: diesel::sql_types::HasSqlType<ST>,
{
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
    ) -> diesel::QueryResult<()> {
        self.query.walk_ast(out.reborrow())?;
        // The text carries its own `$n` placeholders, as with `sql_query`.
        out.push_bind_param_value_only::<ST, Value>(&self.value)
    }
}

impl<Query, Value, ST> diesel::query_builder::QueryId for CachedBind<Query, Value, ST> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Query, Value, ST> diesel::query_builder::Query for CachedBind<Query, Value, ST> {
    type SqlType = diesel::sql_types::Untyped;
}

impl diesel::query_builder::QueryFragment<diesel::pg::Pg> for CachedSql {
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
    ) -> diesel::QueryResult<()> {
        out.push_sql(&self.0);
        Ok(())
    }
}

impl diesel::query_builder::QueryId for CachedSql {
    type QueryId = ();
    // Not static: the cache is keyed by the SQL text.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl diesel::query_builder::Query for CachedSql {
    type SqlType = diesel::sql_types::Untyped;
}

/// The migrations in `migrations/`, compiled into the binary.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// The connection pools.
///
/// Each HTTP worker thread has a pool of its own, so its connections are driven on that
/// thread: a query then never hands off to another thread and back (two thread wake-ups per
/// round trip, which perf showed as about half of the server's CPU time in a send). Work on
/// other threads (background tasks, commands) uses the shared pool.
#[derive(Clone)]
pub struct Db {
    url: Arc<str>,
    shared: Pool<AsyncPgConnection>,
    /// Handed out to HTTP worker threads by [`Db::adopt_for_this_thread`].
    worker_pools: Arc<[Pool<AsyncPgConnection>]>,
    next_worker_pool: Arc<AtomicUsize>,
}

thread_local! {
    /// The pool of the HTTP worker running on this thread.
    static THREAD_POOL: RefCell<Option<Pool<AsyncPgConnection>>> = const { RefCell::new(None) };
}

impl Db {
    /// Builds pools for `url`: `max_size` connections split evenly between the shared pool and
    /// one pool per HTTP worker, each getting at least 2 (so more than `max_size` in all when
    /// that is under 2 per thread). Connections are made lazily, each timing its statements
    /// for the metrics.
    pub fn connect(url: &str, max_size: usize, http_workers: usize) -> Result<Self> {
        query_timer::install();
        let per_worker = (max_size / (http_workers + 1)).max(2);
        let shared_size = max_size.saturating_sub(per_worker * http_workers).max(2);
        let worker_pools = (0..http_workers)
            .map(|_| build_pool(url, per_worker))
            .collect::<Result<_>>()?;
        Ok(Db {
            url: url.into(),
            shared: build_pool(url, shared_size)?,
            worker_pools,
            next_worker_pool: Arc::default(),
        })
    }

    /// Gives the calling thread (an HTTP worker) a pool of its own. Called once per worker;
    /// a restarted worker shares a pool with another.
    pub fn adopt_for_this_thread(&self) {
        if self.worker_pools.is_empty() {
            return;
        }
        let next = self.next_worker_pool.fetch_add(1, Ordering::Relaxed);
        let pool = self.worker_pools[next % self.worker_pools.len()].clone();
        THREAD_POOL.with(|local| *local.borrow_mut() = Some(pool));
    }

    /// The pool for work on this thread, and its metrics label.
    fn pool_and_label(&self) -> (Pool<AsyncPgConnection>, &'static str) {
        THREAD_POOL
            .with(|local| local.borrow().clone())
            .map_or_else(|| (self.shared.clone(), "shared"), |pool| (pool, "worker"))
    }

    /// The pool for work on this thread.
    fn pool(&self) -> Pool<AsyncPgConnection> {
        self.pool_and_label().0
    }

    /// Takes a connection from this thread's pool.
    pub async fn conn(&self) -> Result<Conn> {
        let (pool, label) = self.pool_and_label();
        let started = std::time::Instant::now();
        let conn = pool.get().await;
        crate::metrics::metrics()
            .db_pool_wait
            .get_or_create(&crate::metrics::PoolLabel { pool: label })
            .observe(started.elapsed().as_secs_f64());
        Ok(conn?)
    }

    /// The state of the shared pool and of the HTTP workers' pools taken together.
    pub fn pool_statuses(&self) -> [(&'static str, PoolStatus); 2] {
        let mut workers = PoolStatus::default();
        for pool in self.worker_pools.iter() {
            workers.add(PoolStatus::of(pool));
        }
        [
            ("worker", workers),
            ("shared", PoolStatus::of(&self.shared)),
        ]
    }

    /// A connection of its own, outside every pool, for a session that lasts as long as the
    /// process (a leader's advisory lock): held in a pool it would take a connection from
    /// everyone else for good.
    pub async fn dedicated_conn(&self) -> Result<AsyncPgConnection> {
        use diesel_async::AsyncConnection;
        AsyncPgConnection::establish(&self.url)
            .await
            .map_err(|e| Error::internal(format!("database connection: {e}")))
    }

    /// Whether requests on this thread are queueing for a connection in earnest (at least as
    /// many waiting as the pool holds): the moment to shed work nothing durable depends on
    /// (typing, presence). A waiter or two is not enough: a worker's pool may hold two
    /// connections, and a couple of syncs computing at once would shed every typing update
    /// (a user's typing then never shows).
    pub fn is_saturated(&self) -> bool {
        let status = self.pool().status();
        status.waiting >= status.max_size.max(1)
    }
}

/// Connections of one or more pools.
#[derive(Debug, Default, Clone, Copy)]
pub struct PoolStatus {
    /// Most connections the pools may hold.
    pub max_size: usize,
    /// Connections open now.
    pub size: usize,
    /// Open connections not checked out.
    pub idle: usize,
    /// Callers waiting for a connection.
    pub waiting: usize,
}

impl PoolStatus {
    fn of(pool: &Pool<AsyncPgConnection>) -> Self {
        let status = pool.status();
        PoolStatus {
            max_size: status.max_size,
            size: status.size,
            idle: status.available,
            waiting: status.waiting,
        }
    }

    fn add(&mut self, other: PoolStatus) {
        self.max_size += other.max_size;
        self.size += other.size;
        self.idle += other.idle;
        self.waiting += other.waiting;
    }
}

fn build_pool(url: &str, max_size: usize) -> Result<Pool<AsyncPgConnection>> {
    // No test query on every checkout (a round trip per request): a connection whose server
    // went away is closed, and a closed connection is discarded on return.
    let mut config = ManagerConfig::default();
    config.recycling_method = RecyclingMethod::Fast;
    config.custom_setup = Box::new(|url| Box::pin(establish_with_planner_settings(url)));
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(url, config);
    Pool::builder(manager)
        .max_size(max_size)
        .build()
        .map_err(Error::internal)
}

/// A connection whose planner does not pay start-up costs for statements that guess big:
/// - No JIT. PostgreSQL compiles a statement to machine code once its estimated cost passes
///   `jit_above_cost`, and a recursive query's guessed size passes it easily: in a room of a
///   million events an auth chain then took 166 ms, nearly all compiling, against 0.63 ms
///   without. Nothing served here is long enough to win that back.
/// - Parallel workers only for big scans. Starting them took 4 to 6 ms here, and a full-text
///   match is always guessed at thousands of rows (no statistics know a word): a rare word's
///   search in a million events took 5.2 ms with two workers, 0.16 ms without. At 20 times
///   the default setup cost, a scan of the whole room (the common word's, cost 344,000)
///   still gets them, and is twice as fast for it.
async fn establish_with_planner_settings(url: &str) -> diesel::ConnectionResult<AsyncPgConnection> {
    use diesel_async::{AsyncConnection, SimpleAsyncConnection};
    let mut conn = AsyncPgConnection::establish(url).await?;
    conn.batch_execute("SET jit = off; SET parallel_setup_cost = 20000")
        .await
        .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
    Ok(conn)
}

/// Session advisory lock held while migrating ("myelmigr").
const MIGRATION_LOCK: i64 = 0x6d79_656c_6d69_6772;

/// Applies every pending migration to the database at `url`; returns how many ran.
/// Processes of a scale-out start together: one migrates at a time (an advisory lock, held
/// until this connection closes), and the others then find nothing pending.
pub async fn run_migrations(url: &str) -> Result<usize, String> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        use diesel::RunQueryDsl;
        let mut conn =
            <AsyncConnectionWrapper<AsyncPgConnection> as diesel::Connection>::establish(&url)
                .map_err(|e| format!("cannot connect to the database: {e}"))?;
        diesel::sql_query(format!("SELECT pg_advisory_lock({MIGRATION_LOCK})"))
            .execute(&mut conn)
            .map_err(|e| format!("cannot lock the database for migrating: {e}"))?;
        let applied = conn
            .run_pending_migrations(MIGRATIONS)
            .map_err(|e| format!("migration failed: {e}"))?;
        Ok(applied.len())
    })
    .await
    .map_err(|e| format!("migration task failed: {e}"))?
}

/// Whether the server's autovacuum is on. Without it nothing refreshes the planner's
/// statistics, and queries over tables that grew since the last `ANALYZE` get plans made for
/// empty tables.
pub async fn autovacuum_is_on(mut conn: &AsyncPgConnection) -> diesel::QueryResult<bool> {
    use diesel_async::RunQueryDsl;
    #[derive(diesel::QueryableByName)]
    struct Setting {
        #[diesel(sql_type = diesel::sql_types::Text)]
        setting: String,
    }
    let row: Setting =
        diesel::sql_query("SELECT setting FROM pg_settings WHERE name = 'autovacuum'")
            .get_result(&mut conn)
            .await?;
    Ok(row.setting == "on")
}

/// A round trip to the database (`SELECT 1`), for the readiness check.
pub async fn ping(mut conn: &AsyncPgConnection) -> diesel::QueryResult<()> {
    use diesel_async::RunQueryDsl;
    diesel::sql_query("SELECT 1")
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Milliseconds since the Unix epoch, the unit of every `*_ts` column.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A `LIKE`/`ILIKE` pattern matching strings that contain `term` literally.
pub fn like_contains(term: &str) -> String {
    let escaped = term
        .replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_");
    format!("%{escaped}%")
}

/// True when a diesel error is a unique-constraint violation (a lost race on an insert).
pub fn is_unique_violation(err: &diesel::result::Error) -> bool {
    matches!(
        err,
        diesel::result::Error::DatabaseError(diesel::result::DatabaseErrorKind::UniqueViolation, _)
    )
}
