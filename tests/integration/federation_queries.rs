//! Federation queries in and out, through the client API: profiles, room aliases, public room
//! directories, OpenID userinfo and authenticated media.

use serde_json::{json, Value};

use crate::support::{
    client::enc,
    federation::{pair, send_raw, FakeServer},
    Client, TestServer,
};

/// Registers `localpart` on `server` and sets its display name.
async fn user_named(server: &TestServer, localpart: &str, name: &str) -> Client {
    let client = server.register(localpart).await;
    client
        .put(
            &format!(
                "/_matrix/client/v3/profile/{}/displayname",
                enc(&client.user_id)
            ),
            json!({ "displayname": name }),
        )
        .await
        .ok();
    client
}

#[tokio::test]
async fn profiles_are_read_across_servers_both_ways() {
    let (a, b) = pair().await;
    let alice = user_named(&a, "alice", "Alice on A").await;
    let bob = user_named(&b, "bob", "Bob on B").await;

    for (reader, other, name) in [(&alice, &bob, "Bob on B"), (&bob, &alice, "Alice on A")] {
        let whole = reader
            .get(&format!("/_matrix/client/v3/profile/{}", enc(&other.user_id)))
            .await
            .ok();
        assert_eq!(whole["displayname"], name, "{whole}");
        let field = reader
            .get(&format!(
                "/_matrix/client/v3/profile/{}/displayname",
                enc(&other.user_id)
            ))
            .await
            .ok();
        assert_eq!(field, json!({ "displayname": name }));
        // Set on neither side: a remote 404 is M_NOT_FOUND here too.
        reader
            .get(&format!(
                "/_matrix/client/v3/profile/{}/avatar_url",
                enc(&other.user_id)
            ))
            .await
            .assert_error(404, "M_NOT_FOUND");
    }

    let nobody = b.user_id("nobody");
    alice
        .get(&format!("/_matrix/client/v3/profile/{}", enc(&nobody)))
        .await
        .assert_error(404, "M_NOT_FOUND");
    alice
        .get(&format!(
            "/_matrix/client/v3/profile/{}/displayname",
            enc(&nobody)
        ))
        .await
        .assert_error(404, "M_NOT_FOUND");
}

#[tokio::test]
async fn a_profile_on_an_unreachable_server_is_a_gateway_error() {
    let (a, _b) = pair().await;
    let alice = a.register("alice").await;
    // A port nothing listens on (the fake server is gone once dropped).
    let gone = FakeServer::start().await.user_id("ghost");
    alice
        .get(&format!("/_matrix/client/v3/profile/{}", enc(&gone)))
        .await
        .assert_error(502, "M_UNKNOWN");
}

#[tokio::test]
async fn query_profile_answers_local_users_only_and_needs_a_signature() {
    let (a, _b) = pair().await;
    user_named(&a, "alice", "Alice").await;
    let fake = FakeServer::start().await;

    let uri = format!(
        "/_matrix/federation/v1/query/profile?user_id={}",
        enc(&a.user_id("alice"))
    );
    let (status, body) = fake.request(&a, "GET", &uri, None).await;
    assert_eq!((status, &body["displayname"]), (200, &json!("Alice")));
    let field = format!("{uri}&field=avatar_url");
    let (status, body) = fake.request(&a, "GET", &field, None).await;
    assert_eq!((status, &body["errcode"]), (404, &json!("M_NOT_FOUND")));

    for user in [fake.user_id("alice"), a.user_id("nobody")] {
        let uri = format!("/_matrix/federation/v1/query/profile?user_id={}", enc(&user));
        let (status, body) = fake.request(&a, "GET", &uri, None).await;
        assert_eq!((status, &body["errcode"]), (404, &json!("M_NOT_FOUND")), "{user}");
    }

    let (status, body) = send_raw(&a, "GET", &uri, None, None).await;
    assert_eq!((status, &body["errcode"]), (401, &json!("M_UNAUTHORIZED")));

    let (status, body) = fake
        .request(&a, "GET", "/_matrix/federation/v1/query/nonsense?x=1", None)
        .await;
    assert_eq!((status, &body["errcode"]), (404, &json!("M_UNRECOGNIZED")));
}

#[tokio::test]
async fn aliases_resolve_across_servers_both_ways() {
    let (a, b) = pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    let room_a = alice
        .create_room(json!({ "room_alias_name": "lobby" }))
        .await;
    let room_b = bob.create_room(json!({ "room_alias_name": "lobby" })).await;
    let alias_a = format!("#lobby:{}", a.server_name());
    let alias_b = format!("#lobby:{}", b.server_name());

    for (reader, alias, room, home) in [
        (&alice, &alias_b, &room_b, b.server_name()),
        (&bob, &alias_a, &room_a, a.server_name()),
    ] {
        let found = reader
            .get(&format!("/_matrix/client/v3/directory/room/{}", enc(alias)))
            .await
            .ok();
        assert_eq!(found["room_id"], json!(room), "{found}");
        assert_eq!(found["servers"][0], home, "{found}");
    }

    let missing = format!("#nothing:{}", b.server_name());
    alice
        .get(&format!(
            "/_matrix/client/v3/directory/room/{}",
            enc(&missing)
        ))
        .await
        .assert_error(404, "M_NOT_FOUND");

    // Over federation, only our own aliases are answered.
    let fake = FakeServer::start().await;
    let uri = |alias: &str| {
        format!(
            "/_matrix/federation/v1/query/directory?room_alias={}",
            enc(alias)
        )
    };
    let (status, body) = fake.request(&a, "GET", &uri(&alias_a), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["room_id"], json!(room_a));
    assert_eq!(body["servers"], json!([a.server_name()]));
    let (status, body) = fake.request(&a, "GET", &uri(&alias_b), None).await;
    assert_eq!((status, &body["errcode"]), (404, &json!("M_NOT_FOUND")));
}

/// Publishes a new room named `name` in `client`'s server's directory.
async fn published_room(client: &Client, name: &str) -> String {
    client
        .create_room(json!({ "name": name, "visibility": "public" }))
        .await
}

fn room_ids(page: &Value) -> Vec<&str> {
    page["chunk"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["room_id"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn public_rooms_of_another_server_are_listed_both_ways() {
    let (a, b) = pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    let on_a = published_room(&alice, "Apples on A").await;
    let on_b = published_room(&bob, "Bananas on B").await;
    let also_b = published_room(&bob, "Berries on B").await;

    for (reader, server, expected) in [
        (&alice, b.server_name(), vec![on_b.as_str(), also_b.as_str()]),
        (&bob, a.server_name(), vec![on_a.as_str()]),
    ] {
        let page = reader
            .get(&format!("/_matrix/client/v3/publicRooms?server={server}"))
            .await
            .ok();
        let mut ids = room_ids(&page);
        ids.sort();
        let mut expected = expected.clone();
        expected.sort();
        assert_eq!(ids, expected, "{page}");
        assert_eq!(page["total_room_count_estimate"], expected.len());
    }

    // POST with a search term and a limit, asked of B by A.
    let page = alice
        .post(
            &format!("/_matrix/client/v3/publicRooms?server={}", b.server_name()),
            json!({ "filter": { "generic_search_term": "berries" } }),
        )
        .await
        .ok();
    assert_eq!(room_ids(&page), vec![also_b.as_str()], "{page}");
    let first = alice
        .get(&format!(
            "/_matrix/client/v3/publicRooms?server={}&limit=1",
            b.server_name()
        ))
        .await
        .ok();
    assert_eq!(room_ids(&first).len(), 1);
    let since = first["next_batch"].as_str().expect("a next page");
    let second = alice
        .get(&format!(
            "/_matrix/client/v3/publicRooms?server={}&limit=1&since={since}",
            b.server_name()
        ))
        .await
        .ok();
    assert_eq!(room_ids(&second).len(), 1);
    assert_ne!(room_ids(&first), room_ids(&second));

    // Our own name is the local directory.
    let local = alice
        .get(&format!(
            "/_matrix/client/v3/publicRooms?server={}",
            a.server_name()
        ))
        .await
        .ok();
    assert_eq!(room_ids(&local), vec![on_a.as_str()]);

    // A third-party network has no rooms here.
    let fake = FakeServer::start().await;
    let (status, body) = fake
        .request(
            &a,
            "POST",
            "/_matrix/federation/v1/publicRooms",
            Some(json!({ "third_party_instance_id": "irc" })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["chunk"], json!([]));
    let (status, body) = fake
        .request(&a, "GET", "/_matrix/federation/v1/publicRooms", None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(room_ids(&body), vec![on_a.as_str()]);
}
