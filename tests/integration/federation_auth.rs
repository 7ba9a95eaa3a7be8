//! X-Matrix request authentication: what a signature covers (method, raw URI, body,
//! destination), whose keys count, and which servers may talk to us at all.

use serde_json::json;

use crate::support::{
    federation::{federated_options, free_port, send_raw, FakeServer},
    Client, TestServer,
};

/// The percent-encoded user ID as a query value.
fn encoded(user_id: &str) -> String {
    user_id.replace('@', "%40").replace(':', "%3A")
}

#[tokio::test]
async fn a_signature_covers_method_uri_body_and_destination() {
    let server = TestServer::start_with(federated_options(free_port())).await;
    let fake = FakeServer::start().await;
    let alice = Client::new(&server.base_url).register("alice", "pw").await;
    let bob = Client::new(&server.base_url).register("bob", "pw").await;
    let uri = format!(
        "/_matrix/federation/v1/query/profile?user_id={}",
        encoded(&alice.user_id)
    );
    let (status, profile) = fake.request(&server, "GET", &uri, None).await;
    assert_eq!(status, 200, "{profile}");

    let refused = |(status, body): (u16, serde_json::Value)| {
        assert_eq!(
            (status, body["errcode"].as_str()),
            (401, Some("M_UNAUTHORIZED")),
            "{body}"
        );
    };
    // Signed for one URI, sent to another.
    let other_uri = format!(
        "/_matrix/federation/v1/query/profile?user_id={}",
        encoded(&bob.user_id)
    );
    let header = fake.sign(server.server_name(), "GET", &other_uri, None);
    refused(send_raw(&server, "GET", &uri, None, Some(header)).await);
    // The same request with its query re-encoded is another URI.
    let reencoded = uri.replace("%40", "@");
    let header = fake.sign(server.server_name(), "GET", &uri, None);
    refused(send_raw(&server, "GET", &reencoded, None, Some(header)).await);
    // Signed for another destination.
    let header = fake.sign("elsewhere.example.org", "GET", &uri, None);
    refused(send_raw(&server, "GET", &uri, None, Some(header)).await);
    // A signature that is valid base64 but not this request's.
    let header = fake.sign(server.server_name(), "GET", &uri, None);
    let forged = header.replacen("sig=", "sig=AAAA", 1);
    refused(send_raw(&server, "GET", &uri, None, Some(forged)).await);
    // Signed for another method.
    let header = fake.sign(server.server_name(), "POST", &uri, None);
    refused(send_raw(&server, "GET", &uri, None, Some(header)).await);
    // No header, a bearer token, a malformed X-Matrix header.
    refused(send_raw(&server, "GET", &uri, None, None).await);
    refused(send_raw(&server, "GET", &uri, None, Some("Bearer abc".into())).await);
    refused(send_raw(&server, "GET", &uri, None, Some("X-Matrix origin=".into())).await);

    // The body is signed too.
    let rooms = "/_matrix/federation/v1/publicRooms";
    let (status, body) = fake
        .request(&server, "POST", rooms, Some(json!({ "limit": 5 })))
        .await;
    assert_eq!(status, 200, "{body}");
    let header = fake.sign(
        server.server_name(),
        "POST",
        rooms,
        Some(&json!({ "limit": 5 })),
    );
    let tampered = serde_json::to_vec(&json!({ "limit": 6 })).unwrap();
    refused(send_raw(&server, "POST", rooms, Some(tampered), Some(header)).await);
}

#[tokio::test]
async fn keys_that_cannot_be_had_and_our_own_name_are_refused() {
    let server = TestServer::start_with(federated_options(free_port())).await;
    let alice = Client::new(&server.base_url).register("alice", "pw").await;
    let uri = format!(
        "/_matrix/federation/v1/query/profile?user_id={}",
        encoded(&alice.user_id)
    );
    // A server whose key document cannot be fetched: its listener is gone.
    let gone = FakeServer::start().await;
    let header = gone.sign(server.server_name(), "GET", &uri, None);
    drop(gone);
    let (status, body) = send_raw(&server, "GET", &uri, None, Some(header)).await;
    assert_eq!(
        (status, body["errcode"].as_str()),
        (401, Some("M_UNAUTHORIZED"))
    );

    // A request claiming to come from the server itself.
    let fake = FakeServer::start().await;
    let header = fake
        .sign(server.server_name(), "GET", &uri, None)
        .replace(fake.name(), server.server_name());
    let (status, body) = send_raw(&server, "GET", &uri, None, Some(header)).await;
    assert_eq!(
        (status, body["errcode"].as_str()),
        (401, Some("M_UNAUTHORIZED"))
    );
}

#[tokio::test]
async fn only_allowed_servers_may_federate() {
    let fake = FakeServer::start().await;
    let allowed = FakeServer::start().await;
    let server = TestServer::start_with(
        federated_options(free_port()).env("MYELIN_FEDERATION_ALLOWED_SERVERS", allowed.name()),
    )
    .await;
    let alice = Client::new(&server.base_url).register("alice", "pw").await;
    let uri = format!(
        "/_matrix/federation/v1/query/profile?user_id={}",
        encoded(&alice.user_id)
    );
    let (status, body) = fake.request(&server, "GET", &uri, None).await;
    assert_eq!(
        (status, body["errcode"].as_str()),
        (403, Some("M_FORBIDDEN"))
    );
    let (status, body) = allowed.request(&server, "GET", &uri, None).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_server_name_without_a_port_is_found_through_well_known() {
    use crate::support::federation::StaticHttps;
    // `localhost` is delegated by https://localhost/.well-known/matrix/server (port 443: the
    // tests run as root) to the federation listener of the server named `localhost`.
    let port = free_port();
    let delegated =
        TestServer::start_with(federated_options(port).env("MYELIN_SERVER_NAME", "localhost"))
            .await;
    let _well_known = StaticHttps::bind(
        "127.0.0.1:443",
        vec![(
            "/.well-known/matrix/server",
            json!({ "m.server": format!("localhost:{port}") }),
        )],
    )
    .await
    .expect("binding 127.0.0.1:443 (run the tests as root)");
    let bob = Client::new(&delegated.base_url).register("bob", "pw").await;
    bob.put(
        &format!("/_matrix/client/v3/profile/{}/displayname", bob.user_id),
        json!({ "displayname": "Bob Delegated" }),
    )
    .await
    .ok();

    let asking = TestServer::start_with(federated_options(free_port())).await;
    let alice = Client::new(&asking.base_url).register("alice", "pw").await;
    let profile = alice
        .get(&format!("/_matrix/client/v3/profile/{}", bob.user_id))
        .await
        .ok();
    assert_eq!(profile["displayname"], "Bob Delegated");
}
