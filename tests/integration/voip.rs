//! `/voip/turnServer`: `{}` without a TURN server, coturn's time-limited credentials with a
//! shared secret, fixed ones otherwise.

use base64::{engine::general_purpose::STANDARD, Engine};
use serde_json::json;

use crate::support::{ServerOptions, TestServer};

const TURN: &str = "/_matrix/client/v3/voip/turnServer";

#[tokio::test]
async fn turn_server_is_empty_without_configuration_and_needs_a_token() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    assert_eq!(alice.get(TURN).await.ok(), json!({}));
    server
        .client()
        .get(TURN)
        .await
        .assert_error(401, "M_MISSING_TOKEN");
}

#[tokio::test]
async fn turn_credentials_from_a_shared_secret_are_time_limited_and_verifiable() {
    let options = ServerOptions::default()
        .env(
            "MYELIN_TURN_URIS",
            "turn:turn.example.org:3478?transport=udp, turns:turn.example.org:5349",
        )
        .env("MYELIN_TURN_SHARED_SECRET", "north wind")
        .env("MYELIN_TURN_TTL_SECS", "600");
    let server = TestServer::start_with(options).await;
    let alice = server.register("alice").await;
    let answer = alice.get(TURN).await.ok();
    assert_eq!(
        answer["uris"],
        json!([
            "turn:turn.example.org:3478?transport=udp",
            "turns:turn.example.org:5349"
        ])
    );
    assert_eq!(answer["ttl"], 600);
    let username = answer["username"].as_str().unwrap();
    let (expiry, user) = username.split_once(':').unwrap();
    assert_eq!(user, alice.user_id);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let expiry: u64 = expiry.parse().unwrap();
    assert!(
        expiry >= now + 590 && expiry <= now + 610,
        "{expiry} vs {now}"
    );
    // What coturn computes to check it: base64(HMAC-SHA1(secret, username)).
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, b"north wind");
    let expected = STANDARD.encode(ring::hmac::sign(&key, username.as_bytes()).as_ref());
    assert_eq!(answer["password"], expected.as_str());
}

#[tokio::test]
async fn fixed_turn_credentials_are_handed_out_as_configured() {
    let options = ServerOptions::default()
        .env("MYELIN_TURN_URIS", "turn:turn.example.org")
        .env("MYELIN_TURN_USERNAME", "myelin")
        .env("MYELIN_TURN_PASSWORD", "secret");
    let server = TestServer::start_with(options).await;
    let alice = server.register("alice").await;
    let answer = alice.get(TURN).await.ok();
    assert_eq!(answer["username"], "myelin");
    assert_eq!(answer["password"], "secret");
    assert_eq!(answer["ttl"], 86400);
}
