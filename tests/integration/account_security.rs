//! Hardening of accounts: client IPs, JWT validation, UIA for passwordless accounts, guessing
//! limits, and registration-token bookkeeping.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::support::{Client, ServerOptions, TestServer};

const REGISTER: &str = "/_matrix/client/v3/register";
const JWT_SECRET: &str = "a-jwt-secret-of-at-least-32-bytes!";

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn jwt(claims: Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes()).unwrap(),
    )
    .unwrap()
}

async fn jwt_login(server: &TestServer, claims: Value) -> crate::support::client::Response {
    server
        .client()
        .post(
            "/_matrix/client/v3/login",
            json!({ "type": "org.matrix.login.jwt", "token": jwt(claims) }),
        )
        .await
}

async fn jwt_server() -> TestServer {
    TestServer::start_with(ServerOptions::default().env("MYELIN_JWT_SECRET", JWT_SECRET)).await
}

fn with_limits() -> ServerOptions {
    ServerOptions::default().env("MYELIN_RATE_LIMITS", "on")
}

#[tokio::test]
async fn forged_forwarding_headers_do_not_reset_rate_limits() {
    let server = TestServer::start_with(with_limits()).await;
    let mut statuses = Vec::new();
    for i in 0..6 {
        let client = server
            .client()
            .with_header("X-Forwarded-For", &format!("198.51.100.{i}"))
            .with_header("Forwarded", &format!("for=\"spoof-{i}\""));
        let response = client
            .post(
                REGISTER,
                json!({ "username": format!("spoof{i}"), "password": "pw", "auth": { "type": "m.login.dummy" } }),
            )
            .await;
        statuses.push(response.status.as_u16());
    }
    assert!(statuses.contains(&429), "never limited: {statuses:?}");
}

/// The `last_seen_ip` a new device gets from a request with this `X-Forwarded-For`.
async fn last_seen_ip(options: ServerOptions, forwarded: &str) -> Value {
    let server = TestServer::start_with(options).await;
    let user = server.client().register("dev", "pw").await;
    let devices = user
        .with_header("X-Forwarded-For", forwarded)
        .get("/_matrix/client/v3/devices")
        .await
        .ok();
    devices["devices"][0]["last_seen_ip"].clone()
}

#[tokio::test]
async fn forged_forwarding_headers_do_not_set_device_ips() {
    let ip = last_seen_ip(ServerOptions::default(), "1.2.3.4").await;
    assert_eq!(ip, "127.0.0.1");
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_forwarded_client_is_used() {
    let trusting = ServerOptions::default().env("MYELIN_TRUSTED_PROXIES", "127.0.0.1/32");
    let ip = last_seen_ip(trusting, "6.6.6.6, 203.0.113.7").await;
    assert_eq!(ip, "203.0.113.7");
}

#[tokio::test]
async fn passwordless_accounts_cannot_pass_uia_with_a_token_alone() {
    let server = jwt_server().await;
    let login = jwt_login(&server, json!({ "sub": "sso", "exp": now_s() + 600 }))
        .await
        .ok();
    let sso = server.client().with_session(&login);
    for (path, body) in [
        (
            "/_matrix/client/v3/account/password",
            json!({ "new_password": "attacker", "auth": { "type": "m.login.dummy" } }),
        ),
        (
            "/_matrix/client/v3/account/password",
            json!({ "new_password": "attacker" }),
        ),
        (
            "/_matrix/client/v3/account/deactivate",
            json!({ "auth": { "type": "m.login.dummy" } }),
        ),
    ] {
        sso.post(path, body).await.assert_error(403, "M_FORBIDDEN");
    }
    server
        .client()
        .login_response("sso", "attacker")
        .await
        .assert_error(403, "M_FORBIDDEN");
    sso.get("/_matrix/client/v3/account/whoami").await.ok();
    // Registration's dummy flow is unaffected.
    server.client().register("plain", "pw").await;
}

#[tokio::test]
async fn jwts_need_an_expiry_and_must_be_valid_already() {
    let server = jwt_server().await;
    jwt_login(&server, json!({ "sub": "noexp" }))
        .await
        .assert_error(403, "M_FORBIDDEN");
    jwt_login(
        &server,
        json!({ "sub": "later", "exp": now_s() + 600, "nbf": now_s() + 300 }),
    )
    .await
    .assert_error(403, "M_FORBIDDEN");
    jwt_login(&server, json!({ "sub": "expired", "exp": now_s() - 600 }))
        .await
        .assert_error(403, "M_FORBIDDEN");
    let ok = jwt_login(&server, json!({ "sub": "fine", "exp": now_s() + 600 }))
        .await
        .ok();
    assert_eq!(ok["user_id"], server.user_id("fine"));
}

#[tokio::test]
async fn jwt_expiry_can_be_made_optional() {
    let server = TestServer::start_with(
        ServerOptions::default()
            .env("MYELIN_JWT_SECRET", JWT_SECRET)
            .env("MYELIN_JWT_REQUIRE_EXP", "off"),
    )
    .await;
    jwt_login(&server, json!({ "sub": "noexp" })).await.ok();
}

#[test]
fn weak_or_unreadable_jwt_keys_stop_the_server_at_start() {
    use std::{process::Stdio, time::Duration};
    let data = std::env::temp_dir().join(format!("myelin-jwt-start-{}", std::process::id()));
    for (secret, algorithm) in [("", "HS256"), ("short", "HS256"), ("not a pem", "RS256")] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_myelin"))
            .env_clear()
            .env("MYELIN_JWT_SECRET", secret)
            .env("MYELIN_JWT_ALGORITHM", algorithm)
            // Should a bad key be accepted, the server must not start anywhere that matters.
            .env("MYELIN_DATA_DIR", &data)
            .env("DATABASE_URL", "host=/nonexistent dbname=none")
            .env("MYELIN_LISTEN", "127.0.0.1:0")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{secret:?} was accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("MYELIN_JWT_SECRET"), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&data);
}

#[tokio::test]
async fn guessing_the_password_through_uia_is_rate_limited() {
    let server = TestServer::start_with(with_limits()).await;
    let victim = server.register("victim").await;
    let mut limited = None;
    for i in 0..30 {
        let response = victim
            .post(
                "/_matrix/client/v3/account/password",
                json!({ "new_password": "x", "auth": victim.password_auth(&format!("guess{i}"), None) }),
            )
            .await;
        if response.status == 429 {
            limited = Some((i, response));
            break;
        }
    }
    let (attempt, response) = limited.expect("30 wrong passwords were never limited");
    response.assert_error(429, "M_LIMIT_EXCEEDED");
    assert!(response.body["retry_after_ms"].as_u64().unwrap() > 0);
    assert!(attempt <= 5, "limited only after {attempt} guesses");
}

#[tokio::test]
async fn only_wrong_passwords_spend_the_accounts_login_bucket() {
    // Through a trusted proxy, each request can come from its own client address.
    let server = TestServer::start_with(
        with_limits()
            .env("MYELIN_TRUSTED_PROXIES", "127.0.0.1/32")
            .env("MYELIN_RATE_LIMIT_LOGIN_BURST", "3"),
    )
    .await;
    server.client().register("owner", "password").await;
    let from = |i: u8| {
        server
            .client()
            .with_header("X-Forwarded-For", &format!("203.0.113.{i}"))
    };
    // More successful logins than the burst, each from another address: none is limited.
    for i in 0..5 {
        from(i).login("owner", "password").await;
    }
    // Wrong passwords do spend it, whatever address they come from.
    for i in 10..13 {
        from(i)
            .login_response("owner", "wrong")
            .await
            .assert_error(403, "M_FORBIDDEN");
    }
    from(20)
        .login_response("owner", "password")
        .await
        .assert_error(429, "M_LIMIT_EXCEEDED");
}

/// A server in token registration mode, its admin, and a token with `uses_allowed` uses.
async fn token_server(token: &str, uses_allowed: u32) -> (TestServer, Client) {
    let server =
        TestServer::start_with(ServerOptions::default().env("MYELIN_REGISTRATION", "token")).await;
    let admin = server.create_admin("root", "rootpw").await;
    admin
        .post(
            "/_synapse/admin/v1/registration_tokens/new",
            json!({ "token": token, "uses_allowed": uses_allowed }),
        )
        .await
        .ok();
    (server, admin)
}

/// The admin API's view of the first registration token: (pending, completed).
async fn token_uses(admin: &Client) -> (Value, Value) {
    let listed = admin
        .get("/_synapse/admin/v1/registration_tokens")
        .await
        .ok();
    let token = &listed["registration_tokens"][0];
    (token["pending"].clone(), token["completed"].clone())
}

#[tokio::test]
async fn a_failed_registration_gives_its_token_use_back() {
    let (server, admin) = token_server("two", 100).await;
    // Pairs racing for one name: one account each, the loser's reservation released.
    let mut created = 0;
    for pair in 0..4 {
        let attempt = || async {
            server
                .client()
                .post(
                    REGISTER,
                    json!({ "username": format!("race{pair}"), "password": "pw", "auth": { "type": "m.login.registration_token", "token": "two" } }),
                )
                .await
        };
        let (a, b) = tokio::join!(attempt(), attempt());
        for response in [a, b] {
            if response.status == 200 {
                created += 1;
            } else {
                response.assert_error(400, "M_USER_IN_USE");
            }
        }
    }
    assert_eq!(created, 4);
    assert_eq!(token_uses(&admin).await, (json!(0), json!(4)));
}

#[tokio::test]
async fn an_expired_uia_session_gives_its_token_use_back() {
    use diesel_async::RunQueryDsl;
    let (server, admin) = token_server("once", 1).await;
    // A client that completed the token stage long ago and never finished registering.
    let mut db = server.db().await;
    for sql in [
        "UPDATE registration_tokens SET pending = 1 WHERE token = 'once'",
        "INSERT INTO uia_sessions (session_id, user_id, completed_stages, registration_token, created_ts) \
         VALUES ('abandoned', NULL, '[\"m.login.registration_token\"]', 'once', 0)",
    ] {
        diesel::sql_query(sql).execute(&mut db).await.unwrap();
    }
    let client = server.client();
    let ok = client
        .post(REGISTER, json!({ "username": "late", "password": "pw", "auth": { "type": "m.login.registration_token", "token": "once" } }))
        .await
        .ok();
    assert_eq!(ok["user_id"], server.user_id("late"));
    assert_eq!(token_uses(&admin).await, (json!(0), json!(1)));
}

#[tokio::test]
async fn a_uia_session_authorises_only_the_operation_it_was_started_for() {
    let server = TestServer::start().await;
    let victim = server.register("victim").await;
    // A session begun for a password change (the 401 names it)...
    let started = victim
        .post(
            "/_matrix/client/v3/account/password",
            json!({ "new_password": "new-password" }),
        )
        .await;
    assert_eq!(started.status.as_u16(), 401, "{}", started.body);
    let session = started.body["session"].as_str().unwrap().to_owned();
    // ...cannot be completed for a deactivation, or a device deletion.
    let deactivate = victim
        .post(
            "/_matrix/client/v3/account/deactivate",
            json!({ "auth": victim.password_auth("password", Some(&session)) }),
        )
        .await;
    deactivate.assert_error(403, "M_FORBIDDEN");
    let delete = victim
        .post(
            "/_matrix/client/v3/delete_devices",
            json!({ "devices": [victim.device_id],
                    "auth": victim.password_auth("password", Some(&session)) }),
        )
        .await;
    delete.assert_error(403, "M_FORBIDDEN");
    victim.get("/_matrix/client/v3/account/whoami").await.ok();
    // The operation it was started for goes through.
    victim
        .post(
            "/_matrix/client/v3/account/password",
            json!({ "new_password": "new-password",
                    "auth": victim.password_auth("password", Some(&session)) }),
        )
        .await
        .ok();
}
