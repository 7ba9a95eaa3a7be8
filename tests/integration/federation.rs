//! Federation transport: the TLS listener, the key document, listener separation, the off
//! switch and server discovery.

use ruma::{
    serde::Base64,
    signatures::{PublicKeyMap, PublicKeySet},
    CanonicalJsonObject,
};
use serde_json::Value;

use crate::support::{
    federation::{federated_options, free_port, https_client, pair, send_raw, FakeServer},
    Client, ServerOptions, TestServer,
};

/// Verifies a key document's self-signature with the keys it lists.
fn self_signature_verifies(doc: &Value) -> bool {
    let name = doc["server_name"].as_str().unwrap();
    let keys: PublicKeySet = doc["verify_keys"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(id, key)| {
            (
                id.clone(),
                Base64::parse(key["key"].as_str().unwrap()).unwrap(),
            )
        })
        .collect();
    let object: CanonicalJsonObject = serde_json::from_value(doc.clone()).unwrap();
    ruma::signatures::verify_json(&PublicKeyMap::from([(name.to_owned(), keys)]), &object).is_ok()
}

#[tokio::test]
async fn the_key_document_is_served_over_tls_self_signed_for_a_week() {
    let server = TestServer::start_with(federated_options(free_port())).await;
    let response = https_client()
        .get(format!("{}/_matrix/key/v2/server", server.federation_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let doc: Value = response.json().await.unwrap();
    assert_eq!(doc["server_name"], server.server_name());
    assert!(self_signature_verifies(&doc), "{doc}");
    let mut tampered = doc.clone();
    tampered["valid_until_ts"] = Value::from(1);
    assert!(!self_signature_verifies(&tampered));
    let valid_for_days = (doc["valid_until_ts"].as_i64().unwrap()
        - std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64)
        / 86_400_000;
    assert!((6..=7).contains(&valid_for_days), "{valid_for_days} days");

    // The same key after a restart: other servers pin it.
    let key = doc["verify_keys"].clone();
    let mut server = server;
    server.kill();
    server.relaunch().await;
    let again: Value = https_client()
        .get(format!("{}/_matrix/key/v2/server", server.federation_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again["verify_keys"], key);
}

#[tokio::test]
async fn each_listener_serves_only_its_own_api() {
    let server = TestServer::start_with(federated_options(free_port())).await;
    let version: Value = https_client()
        .get(format!(
            "{}/_matrix/federation/v1/version",
            server.federation_url()
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(version["server"]["name"], "Myelin");

    // The client API is not on the federation listener ...
    let response = https_client()
        .get(format!(
            "{}/_matrix/client/versions",
            server.federation_url()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["errcode"], "M_UNRECOGNIZED");
    // ... and federation is not on the client listener once it has its own.
    let client = Client::new(&server.base_url);
    client
        .get("/_matrix/federation/v1/version")
        .await
        .assert_error(404, "M_UNRECOGNIZED");
    client.get("/_matrix/client/versions").await.ok();
}

#[tokio::test]
async fn without_a_federation_listener_federation_is_served_on_the_main_listener() {
    let server = TestServer::start().await;
    let client = Client::new(&server.base_url);
    let doc = client.get("/_matrix/key/v2/server").await.ok();
    assert_eq!(doc["server_name"], server.server_name());
    assert!(self_signature_verifies(&doc));
    // No delegation unless configured.
    client
        .get("/.well-known/matrix/server")
        .await
        .assert_error(404, "M_NOT_FOUND");
}

#[tokio::test]
async fn federation_off_answers_unrecognized_and_well_known_only_when_configured() {
    let server = TestServer::start_with(
        ServerOptions::default()
            .env("MYELIN_FEDERATION", "off")
            .env("MYELIN_WELL_KNOWN_SERVER", "matrix.example.org:443"),
    )
    .await;
    let client = Client::new(&server.base_url);
    for path in [
        "/_matrix/key/v2/server",
        "/_matrix/federation/v1/version",
        "/_matrix/federation/v1/query/profile?user_id=%40a%3Ab",
    ] {
        client.get(path).await.assert_error(404, "M_UNRECOGNIZED");
    }
    client
        .get("/.well-known/matrix/server")
        .await
        .assert_error(404, "M_NOT_FOUND");

    let delegating = TestServer::start_with(
        ServerOptions::default().env("MYELIN_WELL_KNOWN_SERVER", "matrix.example.org:443"),
    )
    .await;
    let body = Client::new(&delegating.base_url)
        .get("/.well-known/matrix/server")
        .await
        .ok();
    assert_eq!(body["m.server"], "matrix.example.org:443");
}

#[tokio::test]
async fn a_bad_listener_setting_stops_the_start_with_one_line() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_myelin"))
        .arg("serve")
        .env_clear()
        .env("MYELIN_FEDERATION_LISTEN", "127.0.0.1:0")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("MYELIN_TLS_CERT"), "{stderr}");
}

#[tokio::test]
async fn two_servers_and_a_fake_one_start_on_loopback() {
    let (a, b) = pair().await;
    assert_ne!(a.server_name(), b.server_name());
    let fake = FakeServer::start().await;
    // The fake server's key document is what a server fetches to check its signatures.
    let doc: Value = https_client()
        .get(format!("https://{}/_matrix/key/v2/server", fake.name()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["server_name"], fake.name());
    assert!(self_signature_verifies(&doc));
}

/// Federation routes that take no X-Matrix signature (the spec's "no authentication").
const UNSIGNED_FEDERATION_ROUTES: &[&str] = &[
    "/_matrix/key/v2/server",
    "/_matrix/federation/v1/version",
    "/_matrix/federation/v1/openid/userinfo",
];

#[tokio::test]
async fn every_federation_route_needs_a_signature_and_survives_bad_input() {
    let server = TestServer::start_with(federated_options(free_port())).await;
    let fake = FakeServer::start().await;
    let routes: Vec<_> = myelin::api::served_routes()
        .into_iter()
        .filter(|(_, path)| {
            path.starts_with("/_matrix/federation/") || path.starts_with("/_matrix/key/")
        })
        .collect();
    assert!(routes.len() >= 2);
    for (method, template) in routes {
        // Every path parameter gets a value of the wrong shape.
        let uri: String = template
            .split('/')
            .map(|segment| {
                if segment.starts_with('{') {
                    "%21not%20an%20id"
                } else {
                    segment
                }
            })
            .collect::<Vec<_>>()
            .join("/");
        let body = matches!(method.as_str(), "PUT" | "POST").then(|| b"{\"a\":[1,{}]}".to_vec());
        let (status, answer) = send_raw(&server, &method, &uri, body.clone(), None).await;
        assert!(status < 500, "unsigned {method} {uri}: {status} {answer}");
        if !UNSIGNED_FEDERATION_ROUTES.contains(&template.as_str()) {
            assert_eq!(
                (status, answer["errcode"].as_str()),
                (401, Some("M_UNAUTHORIZED")),
                "unsigned {method} {uri} must be refused"
            );
        }
        let signed_body = body.map(|b| serde_json::from_slice(&b).unwrap());
        let (status, answer) = fake.request(&server, &method, &uri, signed_body).await;
        assert!(status < 500, "signed {method} {uri}: {status} {answer}");
        assert!(
            answer["errcode"].is_string() || status == 200,
            "{method} {uri}: {answer}"
        );
    }
}
