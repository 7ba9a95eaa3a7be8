//! Federation queries in and out, through the client API: profiles, room aliases, public room
//! directories, OpenID userinfo and authenticated media.

use serde_json::{json, Value};

use reqwest::{header, Method, StatusCode};

use crate::{
    media::{png, send, upload},
    support::{
        client::enc,
        federation::{federated_options, free_port, https_client, pair, send_raw, FakeServer},
        Client, TestServer,
    },
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
            .get(&format!(
                "/_matrix/client/v3/profile/{}",
                enc(&other.user_id)
            ))
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
        let uri = format!(
            "/_matrix/federation/v1/query/profile?user_id={}",
            enc(&user)
        );
        let (status, body) = fake.request(&a, "GET", &uri, None).await;
        assert_eq!(
            (status, &body["errcode"]),
            (404, &json!("M_NOT_FOUND")),
            "{user}"
        );
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
        (
            &alice,
            b.server_name(),
            vec![on_b.as_str(), also_b.as_str()],
        ),
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

    // Only a logged-in user may make A ask B.
    a.client()
        .get(&format!(
            "/_matrix/client/v3/publicRooms?server={}",
            b.server_name()
        ))
        .await
        .assert_error(401, "M_MISSING_TOKEN");

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

/// `GET` of a client media path on the client's server.
async fn get_media(client: &Client, path: &str) -> reqwest::Response {
    send(client, Method::GET, path, Vec::new(), &[]).await
}

/// The `server/id` of an `mxc://` URI.
fn mxc_path(uploaded: &Value) -> String {
    uploaded["content_uri"]
        .as_str()
        .unwrap()
        .strip_prefix("mxc://")
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn remote_media_is_fetched_once_and_then_served_from_the_cache() {
    let (mut a, b) = pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    let picture = png(64, 48);
    let uploaded = upload(&alice, picture.clone(), "image/png", "pic.png").await;
    let path = mxc_path(&uploaded);
    let (origin, media_id) = path.split_once('/').unwrap();
    assert_eq!(origin, a.server_name());

    let download = format!("/_matrix/client/v1/media/download/{path}");
    let thumbnail =
        format!("/_matrix/client/v1/media/thumbnail/{path}?width=32&height=32&method=crop");
    let check_download = |response: reqwest::Response| {
        let picture = picture.clone();
        async move {
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.headers()[header::CONTENT_TYPE], "image/png");
            let disposition = response.headers()[header::CONTENT_DISPOSITION]
                .to_str()
                .unwrap()
                .to_owned();
            assert!(disposition.contains("pic.png"), "{disposition}");
            assert_eq!(response.bytes().await.unwrap().to_vec(), picture);
        }
    };
    let check_thumbnail = |response: reqwest::Response| async move {
        assert_eq!(response.status(), StatusCode::OK);
        let bytes = response.bytes().await.unwrap();
        let image = image::load_from_memory(&bytes).unwrap();
        assert_eq!((image.width(), image.height()), (32, 32));
    };

    check_download(get_media(&bob, &download).await).await;
    check_thumbnail(get_media(&bob, &thumbnail).await).await;
    let cached = format!(
        "SELECT count(*) AS n FROM remote_media WHERE origin = '{origin}' AND media_id = '{media_id}'"
    );
    assert_eq!(b.count(&cached).await, 1);
    assert_eq!(
        b.count("SELECT count(*) AS n FROM remote_media_thumbnails")
            .await,
        1
    );

    // Media A does not have: 404 from A is 404 here, and nothing is cached.
    let missing = format!(
        "/_matrix/client/v1/media/download/{}/doesnotexist",
        a.server_name()
    );
    let response = get_media(&bob, &missing).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["errcode"], "M_NOT_FOUND");
    assert_eq!(b.count("SELECT count(*) AS n FROM remote_media").await, 1);

    // With A gone, B still serves what it fetched, and only that.
    a.kill();
    check_download(get_media(&bob, &download).await).await;
    check_thumbnail(get_media(&bob, &thumbnail).await).await;
    let other = format!("/_matrix/client/v1/media/thumbnail/{path}?width=96&height=96&method=crop");
    let response = get_media(&bob, &other).await;
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["errcode"], "M_UNKNOWN");
}

#[tokio::test]
async fn federation_media_answers_multipart_for_local_media_only() {
    let (a, _b) = pair().await;
    let alice = a.register("alice").await;
    let uploaded = upload(&alice, b"hello there".to_vec(), "text/plain", "note.txt").await;
    let path = mxc_path(&uploaded);
    let (_, media_id) = path.split_once('/').unwrap();
    let fake = FakeServer::start().await;

    let uri = format!("/_matrix/federation/v1/media/download/{media_id}");
    let response = https_client()
        .get(format!("{}{uri}", a.federation_url()))
        .header(
            "authorization",
            fake.sign(a.server_name(), "GET", &uri, None),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("multipart/mixed; boundary="),
        "{content_type}"
    );
    let body = String::from_utf8(response.bytes().await.unwrap().to_vec()).unwrap();
    assert!(body.contains("application/json"), "{body}");
    assert!(body.contains("{}"), "{body}");
    assert!(
        body.to_lowercase().contains("content-type: text/plain"),
        "{body}"
    );
    assert!(body.contains("note.txt"), "{body}");
    assert!(body.contains("hello there"), "{body}");

    for uri in [
        "/_matrix/federation/v1/media/download/nothing".to_owned(),
        "/_matrix/federation/v1/media/thumbnail/nothing?width=32&height=32".to_owned(),
    ] {
        let (status, body) = fake.request(&a, "GET", &uri, None).await;
        assert_eq!(
            (status, &body["errcode"]),
            (404, &json!("M_NOT_FOUND")),
            "{uri}"
        );
    }
    let (status, body) = send_raw(&a, "GET", &uri, None, None).await;
    assert_eq!((status, &body["errcode"]), (401, &json!("M_UNAUTHORIZED")));
}

#[tokio::test]
async fn remote_media_over_the_upload_limit_is_refused_and_not_kept() {
    let (a, b) = tokio::join!(
        TestServer::start_with(federated_options(free_port())),
        TestServer::start_with(
            federated_options(free_port()).env("MYELIN_MAX_UPLOAD_SIZE", "1000")
        ),
    );
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    let uploaded = upload(&alice, vec![7u8; 5000], "application/octet-stream", "big").await;
    let response = get_media(
        &bob,
        &format!("/_matrix/client/v1/media/download/{}", mxc_path(&uploaded)),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(b.count("SELECT count(*) AS n FROM remote_media").await, 0);
}

#[tokio::test]
async fn openid_tokens_name_their_user_until_they_expire() {
    use diesel_async::RunQueryDsl;

    let (a, _b) = pair().await;
    let alice = a.register("alice").await;
    let bob = a.register("bob").await;
    let request = |client: &Client, user: &str| {
        let client = client.clone();
        let path = format!("/_matrix/client/v3/user/{}/openid/request_token", enc(user));
        async move { client.post(&path, json!({})).await }
    };
    let granted = request(&alice, &alice.user_id).await.ok();
    assert_eq!(granted["token_type"], "Bearer");
    assert_eq!(granted["matrix_server_name"], a.server_name());
    assert_eq!(granted["expires_in"], 3600);
    let token = granted["access_token"].as_str().unwrap();

    // No X-Matrix: the token is the authentication.
    let userinfo = |token: &str| {
        let uri = format!(
            "/_matrix/federation/v1/openid/userinfo?access_token={}",
            enc(token)
        );
        let a = &a;
        async move { send_raw(a, "GET", &uri, None, None).await }
    };
    let (status, body) = userinfo(token).await;
    assert_eq!((status, body), (200, json!({ "sub": alice.user_id })));

    request(&bob, &alice.user_id)
        .await
        .assert_error(403, "M_FORBIDDEN");
    let (status, body) = userinfo("not-a-token").await;
    assert_eq!((status, &body["errcode"]), (401, &json!("M_UNKNOWN_TOKEN")));

    diesel::sql_query("UPDATE openid_tokens SET expires_ts = 0")
        .execute(&mut a.db().await)
        .await
        .unwrap();
    let (status, body) = userinfo(token).await;
    assert_eq!((status, &body["errcode"]), (401, &json!("M_UNKNOWN_TOKEN")));
}
