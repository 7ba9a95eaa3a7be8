//! Spaces across servers: `GET /_matrix/federation/v1/hierarchy/{roomId}` for our rooms (who
//! may preview what, the server ACL, 404 for the rest), and the client `/hierarchy` and
//! `/room_summary` asking another server about rooms this one is not in.

use serde_json::{json, Value};

use crate::support::{
    client::enc,
    federation::{federated_server, join_remote, pair, FakeServer},
    Client, TestServer,
};

async fn space(client: &Client, preset: &str, version: Option<&str>) -> String {
    let mut body = json!({
        "preset": preset,
        "name": "Space",
        "creation_content": { "type": "m.space" },
    });
    if let Some(version) = version {
        body["room_version"] = json!(version);
    }
    client.create_room(body).await
}

async fn add_child(client: &Client, server: &TestServer, space: &str, child: &str) {
    client
        .put_state(
            space,
            "m.space.child",
            child,
            json!({ "via": [server.server_name()] }),
        )
        .await
        .ok();
}

fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap_or_else(|| panic!("not an array: {list}"))
        .iter()
        .map(|v| {
            v.as_str()
                .or_else(|| v["room_id"].as_str())
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn federation_hierarchy_answers_what_the_origin_may_preview() {
    let server = federated_server().await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let root = space(&alice, "public_chat", None).await;
    let public = alice
        .create_room(json!({ "preset": "public_chat", "name": "Public" }))
        .await;
    let private = alice
        .create_room(json!({ "preset": "private_chat", "name": "SECRET" }))
        .await;
    let restricted = alice
        .create_room(json!({
            "preset": "private_chat",
            "initial_state": [{
                "type": "m.room.join_rules",
                "state_key": "",
                "content": { "join_rule": "restricted",
                             "allow": [{ "type": "m.room_membership", "room_id": root }] },
            }],
        }))
        .await;
    for child in [&public, &private, &restricted] {
        add_child(&alice, &server, &root, child).await;
    }
    let uri = |room: &str| format!("/_matrix/federation/v1/hierarchy/{}", enc(room));

    let (status, body) = fake.request(&server, "GET", &uri(&root), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["room"]["room_id"], root);
    assert_eq!(body["room"]["room_type"], "m.space");
    assert_eq!(body["room"]["children_state"].as_array().unwrap().len(), 3);
    assert_eq!(ids(&body["children"]), vec![public.clone()]);
    let mut hidden = ids(&body["inaccessible_children"]);
    hidden.sort();
    let mut expected = vec![private.clone(), restricted.clone()];
    expected.sort();
    assert_eq!(hidden, expected);
    assert!(!body["children"].to_string().contains("SECRET"));

    // Once one of its users is in the space, the restricted child is the origin's to see;
    // once one is in the private room, that too.
    join_remote(&server, &root, &fake.user_id("bob")).await;
    join_remote(&server, &private, &fake.user_id("bob")).await;
    let (status, body) = fake.request(&server, "GET", &uri(&root), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids(&body["children"]).len(), 3, "{body}");
    assert_eq!(body["inaccessible_children"], json!([]));
    let restricted_entry = body["children"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["room_id"] == restricted)
        .unwrap();
    assert_eq!(restricted_entry["allowed_room_ids"], json!([root]));

    // suggested_only: no child is suggested.
    let (_, body) = fake
        .request(
            &server,
            "GET",
            &format!("{}?suggested_only=true", uri(&root)),
            None,
        )
        .await;
    assert_eq!(body["room"]["children_state"], json!([]));
    assert_eq!(body["children"], json!([]));

    // A private room the origin has no one in, an unknown room, and a room whose ACL denies
    // the origin: all 404 M_NOT_FOUND.
    let other_private = alice.create_room(json!({ "preset": "private_chat" })).await;
    let unknown = format!("!nowhere:{}", server.server_name());
    for room in [&other_private, &unknown] {
        let (status, body) = fake.request(&server, "GET", &uri(room), None).await;
        assert_eq!(
            (status, body["errcode"].as_str()),
            (404, Some("M_NOT_FOUND")),
            "{body}"
        );
    }
    // A server the room's ACL denies may not see it: an IP-literal server, once IP literals
    // are refused.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let ip_fake = FakeServer::serving(listener, &format!("127.0.0.1:{port}"));
    let (status, body) = ip_fake.request(&server, "GET", &uri(&root), None).await;
    assert_eq!(status, 200, "{body}");
    alice
        .put_state(
            &root,
            "m.room.server_acl",
            "",
            json!({ "allow": ["*"], "allow_ip_literals": false }),
        )
        .await
        .ok();
    let (status, body) = ip_fake.request(&server, "GET", &uri(&root), None).await;
    assert_eq!(
        (status, body["errcode"].as_str()),
        (404, Some("M_NOT_FOUND")),
        "{body}"
    );
    // Unsigned requests are refused.
    let (status, _) =
        crate::support::federation::send_raw(&server, "GET", &uri(&public), None, None).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn client_hierarchy_and_summary_ask_the_other_server_for_rooms_we_are_not_in() {
    let (a, b) = pair().await;
    let bob = b.register("bob").await;
    // A v11 space names its server in its ID, so A can ask that server about it.
    let root = space(&bob, "public_chat", Some("11")).await;
    let public = bob
        .create_room(json!({ "preset": "public_chat", "name": "Remote public", "topic": "hi" }))
        .await;
    let private = bob
        .create_room(json!({ "preset": "private_chat", "name": "SECRET" }))
        .await;
    let subspace = space(&bob, "public_chat", None).await;
    let nested = bob
        .create_room(json!({ "preset": "public_chat", "name": "Nested" }))
        .await;
    add_child(&bob, &b, &root, &public).await;
    add_child(&bob, &b, &root, &private).await;
    add_child(&bob, &b, &root, &subspace).await;
    add_child(&bob, &b, &subspace, &nested).await;

    let alice = a.register("alice").await;
    let page = alice
        .get(&format!(
            "/_matrix/client/v1/rooms/{}/hierarchy",
            enc(&root)
        ))
        .await
        .ok();
    assert_eq!(
        ids(&page["rooms"]),
        [
            root.clone(),
            public.clone(),
            subspace.clone(),
            nested.clone()
        ],
        "{page}"
    );
    assert!(!page.to_string().contains("SECRET"), "{page}");
    let entry = &page["rooms"][1];
    assert_eq!(entry["name"], "Remote public");
    assert_eq!(entry["topic"], "hi");
    assert_eq!(entry["children_state"], json!([]));

    // The summary of a remote room, through the via server, with Alice's membership.
    let summary = alice
        .get(&format!(
            "/_matrix/client/v1/room_summary/{}?via={}",
            enc(&public),
            enc(b.server_name())
        ))
        .await
        .ok();
    assert_eq!(summary["room_id"], public);
    assert_eq!(summary["name"], "Remote public");
    assert_eq!(summary["membership"], "leave");
    // A remote room Alice may not preview: the same 404 as for a room nobody knows.
    let hidden = alice
        .get(&format!(
            "/_matrix/client/v1/room_summary/{}?via={}",
            enc(&private),
            enc(b.server_name())
        ))
        .await;
    hidden.assert_error(404, "M_NOT_FOUND");
    assert!(!hidden.body.to_string().contains("SECRET"));
    alice
        .get(&format!(
            "/_matrix/client/v1/room_summary/{}",
            enc(&private)
        ))
        .await
        .assert_error(404, "M_NOT_FOUND");
}

#[tokio::test]
async fn a_direct_chat_invite_from_another_server_is_recorded_in_m_direct_on_join() {
    let (a, b) = pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    let dm = alice
        .create_room(json!({
            "preset": "trusted_private_chat",
            "is_direct": true,
            "invite": [bob.user_id],
        }))
        .await;
    crate::support::wait_until(
        "Bob's invite to arrive",
        std::time::Duration::from_secs(15),
        || async {
            let sync = bob.sync(None, 0, None).await;
            sync["rooms"]["invite"].get(&dm).is_some()
        },
    )
    .await;
    bob.join(&dm).await.ok();
    let direct = bob
        .get(&format!(
            "/_matrix/client/v3/user/{}/account_data/m.direct",
            enc(&bob.user_id)
        ))
        .await
        .ok();
    assert_eq!(direct, json!({ (alice.user_id.clone()): [dm] }));
}
