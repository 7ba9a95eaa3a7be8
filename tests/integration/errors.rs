//! Every bad input gets a Matrix error with the right status, never a 500.

use reqwest::Method;
use serde_json::json;

use crate::support::{client::enc, user_id, ServerOptions, TestServer};

#[tokio::test]
async fn unknown_paths_and_wrong_methods_are_unrecognized() {
    let server = TestServer::start().await;
    let client = server.client();
    client
        .get("/_matrix/client/v3/no/such/endpoint")
        .await
        .assert_error(404, "M_UNRECOGNIZED");
    client
        .get("/nothing")
        .await
        .assert_error(404, "M_UNRECOGNIZED");
    client
        .request(Method::DELETE, "/_matrix/client/versions", None)
        .await
        .assert_error(405, "M_UNRECOGNIZED");
    client
        .get("/_matrix/client/v3/logout")
        .await
        .assert_error(405, "M_UNRECOGNIZED");
}

#[tokio::test]
async fn malformed_bodies_get_not_json_or_bad_json() {
    let server = TestServer::start().await;
    let client = server.client();
    client
        .raw(
            Method::POST,
            "/_matrix/client/v3/login",
            b"{not json".to_vec(),
        )
        .await
        .assert_error(400, "M_NOT_JSON");
    client
        .post(
            "/_matrix/client/v3/login",
            json!({ "type": "m.login.password", "password": 5 }),
        )
        .await
        .assert_error(400, "M_BAD_JSON");
    client
        .post("/_matrix/client/v3/register", json!({ "username": 12 }))
        .await
        .assert_error(400, "M_BAD_JSON");
    let alice = server.register("alice").await;
    alice
        .post(
            &format!("/_matrix/client/v3/user/{}/filter", enc(&user_id("alice"))),
            json!({ "room": { "timeline": { "limit": "ten" } } }),
        )
        .await
        .assert_error(400, "M_BAD_JSON");
    alice
        .raw(
            Method::PUT,
            &format!(
                "/_matrix/client/v3/user/{}/account_data/x.y",
                enc(&user_id("alice"))
            ),
            b"[1,2".to_vec(),
        )
        .await
        .assert_error(400, "M_NOT_JSON");
    alice
        .put(
            &format!(
                "/_matrix/client/v3/user/{}/account_data/x.y",
                enc(&user_id("alice"))
            ),
            json!([1, 2]),
        )
        .await
        .assert_error(400, "M_BAD_JSON");
}

#[tokio::test]
async fn missing_and_unknown_tokens_are_told_apart() {
    let server = TestServer::start().await;
    let mut client = server.client();
    client
        .get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_MISSING_TOKEN");
    client.token = Some("myl_forged".into());
    client
        .get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");
    let by_query = server
        .client()
        .get("/_matrix/client/v3/account/whoami?access_token=nope")
        .await;
    by_query.assert_error(401, "M_UNKNOWN_TOKEN");
}

#[tokio::test]
async fn oversized_bodies_are_too_large() {
    let server =
        TestServer::start_with(ServerOptions::default().env("MYELIN_MAX_REQUEST_SIZE", "1024"))
            .await;
    let body = json!({ "username": "x".repeat(4096) });
    server
        .client()
        .post("/_matrix/client/v3/register", body)
        .await
        .assert_error(413, "M_TOO_LARGE");
}

#[tokio::test]
async fn cors_preflight_and_headers_are_served() {
    let server = TestServer::start().await;
    let client = server.client();
    let preflight = client
        .request(Method::OPTIONS, "/_matrix/client/v3/login", None)
        .await;
    assert_eq!(preflight.status.as_u16() / 100, 2);
    assert_eq!(preflight.headers["access-control-allow-origin"], "*");
    assert!(preflight.headers["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .contains("Authorization"));
    let error = client.get("/_matrix/client/v3/account/whoami").await;
    assert_eq!(
        error.headers["access-control-allow-origin"], "*",
        "errors carry CORS headers too"
    );
}

#[tokio::test]
async fn acting_on_another_users_data_is_forbidden() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    server.register("bob").await;
    alice
        .put(
            &format!(
                "/_matrix/client/v3/user/{}/account_data/x.y",
                enc(&user_id("bob"))
            ),
            json!({}),
        )
        .await
        .assert_error(403, "M_FORBIDDEN");
    alice
        .get(&format!(
            "/_matrix/client/v3/user/{}/filter/1",
            enc(&user_id("bob"))
        ))
        .await
        .assert_error(403, "M_FORBIDDEN");
    alice
        .put(
            &format!(
                "/_matrix/client/v3/profile/{}/displayname",
                enc(&user_id("bob"))
            ),
            json!({ "displayname": "pwned" }),
        )
        .await
        .assert_error(403, "M_FORBIDDEN");
    alice
        .get("/_matrix/client/v3/profile/not-a-user-id")
        .await
        .assert_error(400, "M_INVALID_PARAM");
}
