//! Every bad input gets a Matrix error with the right status, never a 500.

use reqwest::Method;
use serde_json::json;

use crate::support::{client::enc, server_name, user_id, ServerOptions, TestServer};

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
    // ruma's login parser panics on a body without `type`: still a 400.
    client
        .post("/_matrix/client/v3/login", json!({}))
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

/// Rows a refused write must not have touched.
const WRITTEN: &str = "SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM account_data) \
    + (SELECT count(*) FROM profile_fields) + (SELECT count(*) FROM filters) \
    + (SELECT count(*) FROM backup_versions) + (SELECT count(*) FROM to_device_inbox) \
    + (SELECT count(*) FROM pushers) + (SELECT count(*) FROM rooms) AS n";

#[tokio::test]
async fn nul_in_a_json_string_is_bad_json_and_writes_nothing() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    let room = enc(&room);
    let me = alice.user_id.clone();
    let before = server.count(WRITTEN).await;
    let nul = "a\u{0}b";
    let cases = [
        (
            Method::PUT,
            format!("/_matrix/client/v3/rooms/{room}/send/m.room.message/t1"),
            json!({ "msgtype": "m.text", "body": nul }),
        ),
        (
            Method::PUT,
            format!("/_matrix/client/v3/rooms/{room}/state/m.room.topic/"),
            json!({ "topic": "x", "extra": { nul: 1 } }),
        ),
        (
            Method::PUT,
            format!("/_matrix/client/v3/user/{me}/account_data/x.y"),
            json!({ "a": [nul] }),
        ),
        (
            Method::PUT,
            format!("/_matrix/client/v3/user/{me}/rooms/{room}/account_data/x.y"),
            json!({ nul: true }),
        ),
        (
            Method::PUT,
            format!("/_matrix/client/v3/profile/{me}/displayname"),
            json!({ "displayname": nul }),
        ),
        (
            Method::POST,
            format!("/_matrix/client/v3/user/{me}/filter"),
            json!({ "room": { "timeline": { "types": [nul] } } }),
        ),
        (
            Method::POST,
            "/_matrix/client/v3/room_keys/version".to_owned(),
            json!({ "algorithm": "m.megolm_backup.v1.curve25519-aes-sha2", "auth_data": { "public_key": nul } }),
        ),
        (
            Method::PUT,
            "/_matrix/client/v3/sendToDevice/m.test/t1".to_owned(),
            json!({ "messages": { me: { "*": { "x": nul } } } }),
        ),
        (
            Method::POST,
            "/_matrix/client/v3/pushers/set".to_owned(),
            json!({ "kind": "http", "app_id": "a", "pushkey": "k", "app_display_name": "x", "device_display_name": "d",
                 "lang": "en", "data": { "url": "https://push.example/_matrix/push/v1/notify", "x": nul } }),
        ),
        (
            Method::POST,
            "/_matrix/client/v3/createRoom".to_owned(),
            json!({ "name": nul }),
        ),
        (
            Method::POST,
            "/_matrix/client/v3/search".to_owned(),
            json!({ "search_categories": { "room_events": { "search_term": nul } } }),
        ),
    ];
    for (method, path, body) in cases {
        let response = alice.request(method, &path, Some(body)).await;
        assert_eq!(
            response.body["error"], "Strings in the request body must not contain U+0000 (NUL)",
            "{path}"
        );
        response.assert_error(400, "M_BAD_JSON");
    }
    assert_eq!(server.count(WRITTEN).await, before, "nothing written");
    // An escaped backslash followed by `u0000` is text, not a NUL.
    let sent = alice
        .raw(
            Method::PUT,
            &format!("/_matrix/client/v3/rooms/{room}/send/m.room.message/t2"),
            br#"{"msgtype":"m.text","body":"a\\u0000b"}"#.to_vec(),
        )
        .await
        .ok();
    let event = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{room}/event/{}",
            enc(sent["event_id"].as_str().unwrap())
        ))
        .await
        .ok();
    assert_eq!(event["content"]["body"], "a\\u0000b");
}

#[tokio::test]
async fn nul_in_a_path_or_query_is_invalid_param() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = enc(&alice.create_room(json!({})).await);
    let before = server.count(WRITTEN).await;
    let message = json!({ "msgtype": "m.text", "body": "hi" });
    for (method, path) in [
        (
            Method::PUT,
            format!("/_matrix/client/v3/rooms/{room}/send/m.room.message/t%00"),
        ),
        (
            Method::PUT,
            format!("/_matrix/client/v3/rooms/{room}/send/m.x%00y/t1"),
        ),
        (
            Method::PUT,
            format!("/_matrix/client/v3/rooms/{room}/state/m.x/a%00"),
        ),
        (
            Method::GET,
            format!(
                "/_matrix/client/v3/directory/room/%23a%00:{}",
                server_name()
            ),
        ),
        (
            Method::GET,
            format!("/_matrix/client/v3/rooms/{room}/messages?dir=b&from=%00"),
        ),
        (
            Method::POST,
            "/_matrix/media/v3/upload?filename=a%00b".to_owned(),
        ),
        (
            Method::DELETE,
            "/_synapse/admin/v1/registration_tokens/a%00".to_owned(),
        ),
    ] {
        alice
            .request(method, &path, Some(message.clone()))
            .await
            .assert_error(400, "M_INVALID_PARAM");
    }
    assert_eq!(server.count(WRITTEN).await, before, "nothing written");
    // `%2500` is the text `%00`, which a transaction ID may hold.
    alice
        .put(
            &format!("/_matrix/client/v3/rooms/{room}/send/m.room.message/t%2500"),
            message,
        )
        .await
        .ok();
}

#[tokio::test]
async fn lone_surrogates_are_a_json_error() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = enc(&alice.create_room(json!({})).await);
    let before = server.count(WRITTEN).await;
    for (method, path, body) in [
        (
            Method::PUT,
            format!("/_matrix/client/v3/rooms/{room}/send/m.room.message/t1"),
            &br#"{"msgtype":"m.text","body":"a\ud800b"}"#[..],
        ),
        (
            Method::PUT,
            format!("/_matrix/client/v3/rooms/{room}/state/m.room.topic/"),
            br#"{"topic":"\udc00"}"#,
        ),
        (
            Method::PUT,
            format!(
                "/_matrix/client/v3/user/{}/account_data/x.y",
                user_id("alice")
            ),
            br#"{"\ud83d":1}"#,
        ),
        (
            Method::PUT,
            format!(
                "/_matrix/client/v3/profile/{}/displayname",
                user_id("alice")
            ),
            br#"{"displayname":"\ud83d\u0041"}"#,
        ),
        (
            Method::POST,
            "/_matrix/client/v3/search".to_owned(),
            br#"{"search_categories":{"room_events":{"search_term":"\udfff"}}}"#,
        ),
    ] {
        let response = alice.raw(method, &path, body.to_vec()).await;
        assert_eq!(response.status.as_u16(), 400, "{path}: {}", response.body);
        assert!(
            ["M_BAD_JSON", "M_NOT_JSON"]
                .contains(&response.body["errcode"].as_str().unwrap_or_default()),
            "{path}: {}",
            response.body
        );
    }
    assert_eq!(server.count(WRITTEN).await, before, "nothing written");
}
