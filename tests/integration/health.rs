//! Liveness (`/health`), readiness (`/readyz`) and `myelin healthcheck`.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde_json::{json, Value};

use crate::support::{
    federation::{federated_server, free_port, https_client},
    wait_until, TestDb, TestServer,
};

/// `GET base + path`: status, content type and body as text.
async fn get(base: &str, path: &str) -> Option<(u16, String, String)> {
    let response = reqwest::get(format!("{base}{path}")).await.ok()?;
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    Some((status, content_type, response.text().await.ok()?))
}

/// `/readyz`'s status and `status` field.
async fn readiness(base: &str) -> Option<(u16, String)> {
    let (status, _, body) = get(base, "/readyz").await?;
    let body: Value = serde_json::from_str(&body).ok()?;
    Some((status, body["status"].as_str()?.to_owned()))
}

async fn wait_for_readiness(base: &str, expected: (u16, &str), within: Duration) {
    wait_until(&format!("/readyz answers {expected:?}"), within, || async {
        readiness(base)
            .await
            .is_some_and(|(status, word)| (status, word.as_str()) == expected)
    })
    .await;
}

async fn assert_alive(base: &str) {
    let (status, content_type, body) = get(base, "/health").await.expect("/health answers");
    assert_eq!((status, body.as_str()), (200, "OK"));
    assert!(content_type.starts_with("text/plain"), "{content_type}");
}

/// Runs `myelin healthcheck` with `args` and the given environment; its exit code.
fn healthcheck(args: &[&str], env: &[(&str, &str)]) -> Option<i32> {
    Command::new(env!("CARGO_BIN_EXE_myelin"))
        .arg("healthcheck")
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .code()
}

#[tokio::test]
async fn health_answers_ok_in_plain_text_and_readyz_says_ready() {
    let server = TestServer::start().await;
    assert_alive(&server.base_url).await;
    wait_for_readiness(&server.base_url, (200, "ready"), Duration::from_secs(10)).await;
    // Only GET: the probes are not a catch-all.
    let post = server.client().post("/health", json!({})).await;
    assert_eq!(post.status.as_u16(), 405, "{}", post.body);
    assert_eq!(post.body["errcode"], "M_UNRECOGNIZED");
}

/// The probes answer on the federation listener too (a load balancer in front of it asks
/// there), although it serves no other client path.
#[tokio::test]
async fn the_probes_answer_on_the_federation_listener() {
    let server = federated_server().await;
    let get = |path: &str| {
        https_client()
            .get(format!("{}{path}", server.federation_url()))
            .send()
    };
    let health = get("/health").await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "OK");
    wait_until(
        "/readyz on the federation listener is 200",
        Duration::from_secs(10),
        || async { get("/readyz").await.is_ok_and(|r| r.status() == 200) },
    )
    .await;
    let versions = get("/_matrix/client/versions").await.unwrap();
    assert_eq!(versions.status(), 404);
}

/// Closing the database to connections (and cutting the open ones) makes the process unready
/// but still alive; opening it again makes it ready without a restart.
#[tokio::test]
async fn readyz_fails_while_the_database_is_unreachable_and_recovers() {
    let server = TestServer::start().await;
    wait_for_readiness(&server.base_url, (200, "ready"), Duration::from_secs(10)).await;
    let mut admin = server.admin_db().await;
    let name = server.database_name().to_owned();
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} ALLOW_CONNECTIONS false; \
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}';"
        ))
        .await
        .unwrap();
    wait_for_readiness(
        &server.base_url,
        (503, "database_unavailable"),
        Duration::from_secs(10),
    )
    .await;
    assert_alive(&server.base_url).await;
    let url = format!("{}/health", server.base_url);
    assert_eq!(healthcheck(&["--url", &url], &[]), Some(0), "liveness only");

    diesel::sql_query(format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
        .execute(&mut admin)
        .await
        .unwrap();
    // The LISTEN connection comes back too (it retries every second).
    wait_for_readiness(&server.base_url, (200, "ready"), Duration::from_secs(15)).await;
    let alice = server.register("alice").await;
    alice.get("/_matrix/client/v3/account/whoami").await.ok();
}

/// The listener is up before the migrations run: `/health` answers, `/readyz` says
/// `starting` and every other path 503 until they are done.
#[tokio::test]
async fn readyz_says_starting_while_migrations_run() {
    let db = TestDb::empty().await;
    // diesel reads its bookkeeping table first: holding it locked holds the migrations.
    let mut blocker = AsyncPgConnection::establish(&db.url).await.unwrap();
    blocker
        .batch_execute(
            "CREATE TABLE __diesel_schema_migrations (version VARCHAR(50) PRIMARY KEY NOT NULL, \
             run_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)",
        )
        .await
        .unwrap();
    // A separate batch: statements before a BEGIN in one batch join its transaction.
    blocker
        .batch_execute("BEGIN; LOCK TABLE __diesel_schema_migrations IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let base = format!("http://{address}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_myelin"))
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", &db.url)
        .env("MYELIN_DATA_DIR", db.data_dir())
        .env("MYELIN_LISTEN", &address)
        .env("MYELIN_SERVER_NAME", crate::support::server_name())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let checks = async {
        wait_until("/health answers", Duration::from_secs(20), || async {
            get(&base, "/health").await.is_some()
        })
        .await;
        assert_alive(&base).await;
        assert_eq!(readiness(&base).await, Some((503, "starting".into())));
        let (status, _, body) = get(&base, "/_matrix/client/versions").await.unwrap();
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!((status, body["errcode"].as_str()), (503, Some("M_UNKNOWN")));
        let listen = [("MYELIN_LISTEN", address.as_str())];
        assert_eq!(healthcheck(&[], &listen), Some(0));

        blocker.batch_execute("COMMIT").await.unwrap();
        wait_for_readiness(&base, (200, "ready"), Duration::from_secs(60)).await;
        let versions = get(&base, "/_matrix/client/versions").await.unwrap();
        assert_eq!(versions.0, 200, "{}", versions.2);
    };
    let result = tokio::time::timeout(Duration::from_secs(90), checks).await;
    let _ = child.kill();
    let _ = child.wait();
    result.expect("the server became ready after its migrations");
}

#[tokio::test]
async fn healthcheck_exits_zero_only_when_health_answers_ok() {
    let server = TestServer::start().await;
    let address = server.base_url.trim_start_matches("http://").to_owned();
    assert_eq!(healthcheck(&[], &[("MYELIN_LISTEN", &address)]), Some(0));
    let health = format!("{}/health", server.base_url);
    assert_eq!(healthcheck(&["--url", &health], &[]), Some(0));
    // 200 with another body is not a healthy server.
    let versions = format!("{}/_matrix/client/versions", server.base_url);
    assert_eq!(healthcheck(&["--url", &versions], &[]), Some(1));
    // Nothing listening: a prompt failure.
    let closed = format!("127.0.0.1:{}", free_port());
    let started = Instant::now();
    assert_eq!(healthcheck(&[], &[("MYELIN_LISTEN", &closed)]), Some(1));
    assert!(started.elapsed() < Duration::from_secs(5));
}
