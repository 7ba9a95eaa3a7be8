//! Test support: a throwaway database per test and the real `myelin` binary serving it over HTTP.

pub mod appservice;
pub mod client;
pub mod federation;
pub mod remote_members;

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::Duration,
};

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use rand::Rng;

pub use client::Client;

/// The server name test servers run with: `MYELIN_TEST_SERVER_NAME`, or `localhost:8448` so
/// that every test sees IDs whose server name carries a port.
pub fn server_name() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        std::env::var("MYELIN_TEST_SERVER_NAME")
            .ok()
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| "localhost:8448".into())
    })
}

/// `@{localpart}:{server_name()}`.
pub fn user_id(localpart: &str) -> String {
    format!("@{localpart}:{}", server_name())
}

/// `#{alias}:{server_name()}`.
pub fn alias(alias: &str) -> String {
    format!("#{alias}:{}", server_name())
}

/// `!{local}:{server_name()}` (a room ID of this server's form; the room need not exist).
pub fn room_id(local: &str) -> String {
    format!("!{local}:{}", server_name())
}

/// Where test databases are created: the admin URL and the migrated template's name.
struct Cluster {
    admin_url: String,
    url_for: Box<dyn Fn(&str) -> String + Send + Sync>,
    template: String,
}

static CLUSTER: tokio::sync::OnceCell<Cluster> = tokio::sync::OnceCell::const_new();

/// The template database is named after a hash of the migrations, so a changed schema gets a
/// fresh template and concurrent test processes share an unchanged one.
fn template_name() -> String {
    use sha2::{Digest, Sha256};
    let mut dirs: Vec<_> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    let mut hasher = Sha256::new();
    for dir in dirs {
        for file in ["up.sql", "down.sql"] {
            hasher.update(std::fs::read(dir.join(file)).unwrap_or_default());
        }
    }
    let digest = hasher.finalize();
    format!(
        "myelin_tpl_{}",
        digest
            .iter()
            .take(6)
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// Replaces the database name in a URL (`postgres://.../db`) or key-value string (`dbname=db`).
fn with_database(url: &str, database: &str) -> String {
    if url.contains("dbname=") {
        url.split_whitespace()
            .map(|kv| {
                if kv.starts_with("dbname=") {
                    format!("dbname={database}")
                } else {
                    kv.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        let (base, query) = url
            .split_once('?')
            .map_or((url, None), |(b, q)| (b, Some(q)));
        let base = base.rsplit_once('/').map_or(base, |(prefix, _)| prefix);
        match query {
            Some(q) => format!("{base}/{database}?{q}"),
            None => format!("{base}/{database}"),
        }
    }
}

fn start_embedded_cluster() -> String {
    let dir = std::env::temp_dir().join(format!("myelin-test-pg-{}", std::process::id()));
    let pg = myelin::embedded_pg::EmbeddedPostgres::new(&dir)
        .expect("PostgreSQL binaries")
        .for_tests();
    pg.start().expect("start test cluster");
    // Stop the cluster and remove it once this test process is gone.
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
         kill -INT $(head -1 {data}/postmaster.pid) 2>/dev/null; sleep 3; rm -rf {dir}",
        pid = std::process::id(),
        data = dir.join("postgres/data").display(),
        dir = dir.display(),
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .ok();
    pg.url("postgres")
}

async fn prepare_cluster() -> Cluster {
    let admin_url = match std::env::var("TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => tokio::task::spawn_blocking(start_embedded_cluster)
            .await
            .unwrap(),
    };
    let template = template_name();
    let mut conn = AsyncPgConnection::establish(&admin_url)
        .await
        .expect("connect to test PostgreSQL");
    // One process builds the template; the others wait on the lock and then find it.
    diesel::sql_query("SELECT pg_advisory_lock(727274)")
        .execute(&mut conn)
        .await
        .unwrap();
    let exists: Vec<Name> = diesel::sql_query(format!(
        "SELECT datname FROM pg_database WHERE datname = '{template}'"
    ))
    .load(&mut conn)
    .await
    .unwrap();
    if exists.is_empty() {
        let building = format!("{template}_building");
        diesel::sql_query(format!("DROP DATABASE IF EXISTS {building}"))
            .execute(&mut conn)
            .await
            .unwrap();
        diesel::sql_query(format!("CREATE DATABASE {building}"))
            .execute(&mut conn)
            .await
            .unwrap();
        myelin::storage::run_migrations(&with_database(&admin_url, &building))
            .await
            .expect("migrate template");
        diesel::sql_query(format!("ALTER DATABASE {building} RENAME TO {template}"))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    diesel::sql_query("SELECT pg_advisory_unlock(727274)")
        .execute(&mut conn)
        .await
        .unwrap();
    let base = admin_url.clone();
    Cluster {
        admin_url,
        url_for: Box::new(move |db| with_database(&base, db)),
        template,
    }
}

#[derive(diesel::QueryableByName)]
struct Name {
    #[diesel(sql_type = diesel::sql_types::Text)]
    #[allow(dead_code)]
    datname: String,
}

async fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(prepare_cluster).await
}

/// A fresh database cloned from the migrated template; dropped when the value is dropped.
pub struct TestDb {
    /// Connection URL of this test's database.
    pub url: String,
    name: String,
}

impl TestDb {
    /// Creates a fresh database for one test.
    pub async fn new() -> Self {
        let cluster = cluster().await;
        let name = format!("myelin_test_{:016x}", rand::rng().random::<u64>());
        let mut conn = AsyncPgConnection::establish(&cluster.admin_url)
            .await
            .unwrap();
        // CREATE DATABASE from one template may fail while another clone is in progress: retry.
        for attempt in 0.. {
            let created = diesel::sql_query(format!(
                "CREATE DATABASE {name} TEMPLATE {}",
                cluster.template
            ))
            .execute(&mut conn)
            .await;
            match created {
                Ok(_) => break,
                Err(e) if attempt < 50 => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("cannot create test database: {e}"),
            }
        }
        TestDb {
            url: (cluster.url_for)(&name),
            name,
        }
    }

    /// A fresh database with no migrations applied (for testing the migrations themselves).
    pub async fn empty() -> Self {
        let cluster = cluster().await;
        let name = format!("myelin_test_{:016x}", rand::rng().random::<u64>());
        let mut conn = AsyncPgConnection::establish(&cluster.admin_url)
            .await
            .unwrap();
        diesel::sql_query(format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("cannot create test database: {e}"));
        TestDb {
            url: (cluster.url_for)(&name),
            name,
        }
    }

    /// A data directory (media files) for this test's server processes.
    pub fn data_dir(&self) -> std::path::PathBuf {
        std::env::temp_dir()
            .join("myelin-test-data")
            .join(&self.name)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some(cluster) = CLUSTER.get() else { return };
        let admin_url = cluster.admin_url.clone();
        let name = self.name.clone();
        let _ = std::fs::remove_dir_all(self.data_dir());
        // Drop runs outside async context: use a private runtime on a helper thread.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                if let Ok(mut conn) = AsyncPgConnection::establish(&admin_url).await {
                    let _ =
                        diesel::sql_query(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                            .execute(&mut conn)
                            .await;
                }
            });
        })
        .join();
    }
}

/// Polls `condition` every 10 ms until it holds; panics naming `what` once `within` has passed.
/// For waiting on something the test can observe instead of sleeping and hoping.
pub async fn wait_until<F, Fut>(what: &str, within: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + within;
    while !condition().await {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {within:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A running `myelin` binary on its own database and a random port.
pub struct TestServer {
    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub base_url: String,
    /// Base URL of the metrics listener, when `MYELIN_METRICS_LISTEN` is set.
    pub metrics_url: Option<String>,
    child: Child,
    _db: TestDb,
    options: ServerOptions,
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// A started server process: the child, its base URL and its metrics URL.
type Spawned = (Child, String, Option<String>);

async fn spawn_server(db: &TestDb, options: &ServerOptions) -> Spawned {
    try_spawn_server(db, options)
        .await
        .expect("server did not report its address")
}

/// Starts a server; `None` when it exits before listening (its reason is on stderr).
async fn try_spawn_server(db: &TestDb, options: &ServerOptions) -> Option<Spawned> {
    try_spawn_server_with_stderr(db, options, Stdio::inherit()).await
}

/// Starts a server on `db` whose stderr (its log) goes to a pipe the caller reads; the
/// caller stops the child.
pub async fn spawn_server_capturing_log(db: &TestDb, options: &ServerOptions) -> (Child, String) {
    let (child, base_url, _) = try_spawn_server_with_stderr(db, options, Stdio::piped())
        .await
        .expect("server did not report its address");
    (child, base_url)
}

async fn try_spawn_server_with_stderr(
    db: &TestDb,
    options: &ServerOptions,
    stderr: Stdio,
) -> Option<Spawned> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_myelin"));
    command
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", &db.url)
        .env("MYELIN_DATA_DIR", db.data_dir())
        .env("MYELIN_LISTEN", "127.0.0.1:0")
        .env(
            "RUST_LOG",
            std::env::var("MYELIN_TEST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::piped())
        .stderr(stderr);
    for (key, value) in &options.env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("start myelin");
    let stdout = child.stdout.take().unwrap();
    let (base_url, metrics_url) = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        // The metrics listener is announced before the main one.
        let mut metrics = None;
        let base = lines.by_ref().map_while(Result::ok).find_map(|line| {
            if let Some(url) = line.strip_prefix("myelin: metrics listening on ") {
                metrics = Some(url.to_owned());
            }
            line.strip_prefix("myelin: listening on ")
                .map(str::to_owned)
        });
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        (base, metrics)
    })
    .await
    .unwrap();
    let Some(base_url) = base_url else {
        let _ = child.kill();
        let _ = child.wait();
        return None;
    };
    Some((child, base_url, metrics_url))
}

/// Settings a test can change before the server starts.
#[derive(Clone)]
pub struct ServerOptions {
    env: Vec<(String, String)>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            env: vec![
                ("MYELIN_REGISTRATION".into(), "open".into()),
                ("MYELIN_RATE_LIMITS".into(), "off".into()),
                ("MYELIN_SERVER_NAME".into(), server_name().into()),
            ],
        }
    }
}

impl ServerOptions {
    /// Moves a federating server (named `localhost:{port}`, its federation listener on that
    /// port) to another free port; `false` when these options are not such a server's.
    fn move_federation_port(&mut self) -> bool {
        let get = |key: &str| {
            self.env
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let (Some(name), Some(listen)) =
            (get("MYELIN_SERVER_NAME"), get("MYELIN_FEDERATION_LISTEN"))
        else {
            return false;
        };
        let port = listen.rsplit(':').next().unwrap_or_default();
        if name != format!("localhost:{port}") {
            return false;
        }
        let port = federation::free_port();
        for (key, value) in [
            ("MYELIN_SERVER_NAME", format!("localhost:{port}")),
            ("MYELIN_FEDERATION_LISTEN", format!("127.0.0.1:{port}")),
        ] {
            self.env.retain(|(k, _)| k != key);
            self.env.push((key.into(), value));
        }
        true
    }

    /// Leaves one environment variable unset.
    pub fn without(mut self, key: &str) -> Self {
        self.env.retain(|(k, _)| k != key);
        self
    }

    /// Sets one environment variable for the server process.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.into()));
        self
    }
}

impl TestServer {
    /// Starts a server with open registration and no rate limits.
    pub async fn start() -> Self {
        Self::start_with(ServerOptions::default()).await
    }

    /// Starts a server with the given settings.
    pub async fn start_with(mut options: ServerOptions) -> Self {
        let mut db = TestDb::new().await;
        let mut attempts = 0;
        let (child, base_url, metrics_url) = loop {
            if let Some(started) = try_spawn_server(&db, &options).await {
                break started;
            }
            // A federation port chosen free was taken before the server bound it (another
            // test's server listening on port 0 got it): a new name on a new port, on a new
            // database, as the first attempt never served anyone.
            attempts += 1;
            assert!(
                attempts < 5 && options.move_federation_port(),
                "server did not report its address"
            );
            db = TestDb::new().await;
        };
        TestServer {
            base_url,
            metrics_url,
            child,
            _db: db,
            options,
        }
    }

    /// Stops the server process and starts a new one on the same database (a restart).
    pub async fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.relaunch().await;
    }

    /// Kills the server process (SIGKILL: no shutdown, nothing flushed), leaving its database.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same database and settings (after [`TestServer::kill`]).
    pub async fn relaunch(&mut self) {
        let (child, base_url, metrics_url) = spawn_server(&self._db, &self.options).await;
        self.child = child;
        self.base_url = base_url;
        self.metrics_url = metrics_url;
    }

    /// Sends the server process SIGTERM (a graceful shutdown) without waiting for it.
    pub fn terminate(&self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid");
        // SAFETY: kill has no memory-safety preconditions; the pid is our own child's.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "kill -TERM");
    }

    /// Waits up to `within` for the process to exit; its status, or `None` if it still runs.
    pub async fn wait_for_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the server") {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts another server process on the same database (scale-out), stopped when dropped.
    pub async fn second_process(&self) -> ExtraProcess {
        self.second_process_with(self.options.clone()).await
    }

    /// Starts another process on the same database with other settings (say, without the
    /// federation listener the first process holds).
    pub async fn second_process_with(&self, options: ServerOptions) -> ExtraProcess {
        let (child, base_url, _) = spawn_server(&self._db, &options).await;
        ExtraProcess { base_url, child }
    }

    /// The server's data directory (media files live under `media/`).
    pub fn data_dir(&self) -> std::path::PathBuf {
        self._db.data_dir()
    }

    /// The server process's peak resident memory so far, in KiB (`VmHWM`).
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("read the server's /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc status")
    }

    /// A direct connection to this server's database, for assertions on what was stored.
    pub async fn db(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self._db.url)
            .await
            .expect("connect to the test database")
    }

    /// Counts rows with a SQL query returning one `BIGINT` column named `n`.
    pub async fn count(&self, sql: &str) -> i64 {
        let row: Count = diesel::sql_query(sql)
            .get_result(&mut self.db().await)
            .await
            .unwrap();
        row.n
    }

    /// A sync token from which `client`'s next `/sync` can be seen to have started: the device
    /// is sent a to-device message and synced past it (that sync takes whatever else is new),
    /// so a sync from the returned token deletes the message from the device's inbox. The
    /// server deletes it after reading the stream positions the sync answers up to, so once
    /// [`TestServer::wait_until_long_polls_started`] sees the inboxes empty, a long-poll from
    /// this token has read its positions: anything committed later must wake it.
    pub async fn long_poll_token(&self, client: &Client, since: &str) -> String {
        let txn = format!("probe{:016x}", rand::rng().random::<u64>());
        client
            .put(
                &format!("/_matrix/client/v3/sendToDevice/m.myelin.probe/{txn}"),
                serde_json::json!({ "messages": { &client.user_id: { &client.device_id: {} } } }),
            )
            .await
            .ok();
        let synced = client.sync(Some(since), 0, None).await;
        assert!(
            synced["to_device"]["events"]
                .as_array()
                .is_some_and(|events| events.iter().any(|e| e["type"] == "m.myelin.probe")),
            "the probe message was not delivered: {synced}"
        );
        assert!(
            self.to_device_inbox_len(&[client]).await > 0,
            "the probe message left the inbox before it was acknowledged"
        );
        synced["next_batch"].as_str().unwrap().to_owned()
    }

    /// Waits until every client's long-poll from a [`TestServer::long_poll_token`] has read its
    /// stream positions (its probe message is gone).
    pub async fn wait_until_long_polls_started(&self, clients: &[&Client]) {
        wait_until(
            "the long-polls have read their stream positions",
            Duration::from_secs(20),
            || async { self.to_device_inbox_len(clients).await == 0 },
        )
        .await;
    }

    async fn to_device_inbox_len(&self, clients: &[&Client]) -> i64 {
        let devices = clients
            .iter()
            .map(|c| format!("('{}', '{}')", c.user_id, c.device_id))
            .collect::<Vec<_>>()
            .join(", ");
        self.count(&format!(
            "SELECT count(*) AS n FROM to_device_inbox WHERE (user_id, device_id) IN ({devices})"
        ))
        .await
    }

    /// The name of this server's database.
    pub fn database_name(&self) -> &str {
        &self._db.name
    }

    /// A connection to the cluster's admin database, for acting on this server's database from
    /// outside (say, closing it to connections).
    pub async fn admin_db(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&cluster().await.admin_url)
            .await
            .expect("connect to the admin database")
    }

    /// The database URL this server uses (for running CLI commands against it).
    pub fn database_url(&self) -> &str {
        &self._db.url
    }

    /// The server name this server runs with (`MYELIN_SERVER_NAME`).
    pub fn server_name(&self) -> &str {
        self.options
            .env
            .iter()
            .find_map(|(key, value)| (key == "MYELIN_SERVER_NAME").then_some(value.as_str()))
            .expect("the options always set a server name")
    }

    /// `@{localpart}:{server name}` on this server.
    pub fn user_id(&self, localpart: &str) -> String {
        format!("@{localpart}:{}", self.server_name())
    }

    /// Creates a server admin with the CLI, as a self-hoster would, and logs them in.
    pub async fn create_admin(&self, localpart: &str, password: &str) -> Client {
        let status = Command::new(env!("CARGO_BIN_EXE_myelin"))
            .args([
                "user",
                "create",
                localpart,
                "--password",
                password,
                "--admin",
            ])
            .env("DATABASE_URL", self.database_url())
            .env("MYELIN_SERVER_NAME", self.server_name())
            .status()
            .expect("myelin user create");
        assert!(status.success());
        self.client().login(localpart, password).await
    }

    /// A client without a token.
    pub fn client(&self) -> Client {
        Client::new(&self.base_url)
    }

    /// Registers a user (password `password`) and returns a logged-in client.
    pub async fn register(&self, localpart: &str) -> Client {
        self.client().register(localpart, "password").await
    }

    /// Registers `{prefix}0` to `{prefix}{count - 1}` in order, each joining `room` (asserted),
    /// and returns their clients in that order.
    pub async fn register_joined(&self, room: &str, prefix: &str, count: usize) -> Vec<Client> {
        let mut clients = Vec::with_capacity(count);
        for i in 0..count {
            let client = self.register(&format!("{prefix}{i}")).await;
            client.join(room).await.ok();
            clients.push(client);
        }
        clients
    }
}

/// An additional server process sharing a [`TestServer`]'s database.
pub struct ExtraProcess {
    /// Base URL of this process.
    pub base_url: String,
    child: Child,
}

impl Drop for ExtraProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
