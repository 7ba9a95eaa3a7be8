//! `GET /_matrix/client/v1/rooms/{roomId}/hierarchy`: a space's tree, depth first, with
//! only the rooms the caller may see or preview; pagination, `max_depth`, `suggested_only`
//! and the errors for bad parameters.

use serde_json::{json, Value};

use crate::support::{client::enc, server_name, Client, TestServer};

async fn create_space(client: &Client, name: &str, preset: &str) -> String {
    client
        .create_room(json!({
            "name": name,
            "preset": preset,
            "creation_content": { "type": "m.space" },
        }))
        .await
}

async fn add_child(client: &Client, space: &str, child: &str, content: Value) {
    client
        .put_state(space, "m.space.child", child, content)
        .await
        .ok();
}

async fn hierarchy(client: &Client, space: &str, query: &str) -> crate::support::client::Response {
    client
        .get(&format!(
            "/_matrix/client/v1/rooms/{}/hierarchy{query}",
            enc(space)
        ))
        .await
}

fn room_ids(page: &Value) -> Vec<String> {
    page["rooms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["room_id"].as_str().unwrap().to_owned())
        .collect()
}

/// The expected room IDs, in order.
fn ids(list: &[&String]) -> Vec<String> {
    list.iter().map(|s| (*s).clone()).collect()
}

fn entry<'a>(page: &'a Value, room_id: &str) -> &'a Value {
    page["rooms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["room_id"] == room_id)
        .unwrap_or_else(|| panic!("{room_id} missing from {page}"))
}

/// A public space with a public room, a room restricted to the space, a private room and a
/// public sub-space holding one more room; children ordered by `order`.
struct Tree {
    space: String,
    public: String,
    restricted: String,
    private: String,
    subspace: String,
    nested: String,
}

async fn tree(alice: &Client) -> Tree {
    let via = json!([server_name()]);
    let space = create_space(alice, "Space", "public_chat").await;
    let public = alice
        .create_room(json!({ "preset": "public_chat", "name": "Public", "topic": "all welcome" }))
        .await;
    let restricted = alice
        .create_room(json!({
            "preset": "private_chat",
            "name": "Members only",
            "initial_state": [{
                "type": "m.room.join_rules",
                "state_key": "",
                "content": { "join_rule": "restricted",
                             "allow": [{ "type": "m.room_membership", "room_id": space }] },
            }],
        }))
        .await;
    let private = alice
        .create_room(json!({ "preset": "private_chat", "name": "SECRET ROOM" }))
        .await;
    let subspace = create_space(alice, "Subspace", "public_chat").await;
    let nested = alice
        .create_room(json!({ "preset": "public_chat", "name": "Nested" }))
        .await;
    add_child(
        alice,
        &space,
        &public,
        json!({ "via": via, "order": "a", "suggested": true }),
    )
    .await;
    add_child(
        alice,
        &space,
        &restricted,
        json!({ "via": via, "order": "b" }),
    )
    .await;
    add_child(alice, &space, &private, json!({ "via": via, "order": "c" })).await;
    add_child(
        alice,
        &space,
        &subspace,
        json!({ "via": via, "order": "d" }),
    )
    .await;
    add_child(alice, &subspace, &nested, json!({ "via": via })).await;
    // A removed child (no `via`) and one without a usable `via` are not children.
    let removed = alice.create_room(json!({ "preset": "public_chat" })).await;
    add_child(alice, &space, &removed, json!({})).await;
    add_child(alice, &space, &removed, json!({ "via": [] })).await;
    Tree {
        space,
        public,
        restricted,
        private,
        subspace,
        nested,
    }
}

#[tokio::test]
async fn hierarchy_lists_the_tree_depth_first_with_what_each_member_may_see() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let t = tree(&alice).await;

    let page = hierarchy(&alice, &t.space, "").await.ok();
    assert_eq!(
        room_ids(&page),
        ids(&[
            &t.space,
            &t.public,
            &t.restricted,
            &t.private,
            &t.subspace,
            &t.nested
        ]),
        "depth first, children by order: {page}"
    );
    assert!(page.get("next_batch").is_none(), "{page}");
    let root = entry(&page, &t.space);
    assert_eq!(root["room_type"], "m.space");
    assert_eq!(root["name"], "Space");
    assert_eq!(root["join_rule"], "public");
    assert_eq!(root["num_joined_members"], 1);
    assert_eq!(root["world_readable"], false);
    assert_eq!(root["guest_can_join"], false);
    let children_state = root["children_state"].as_array().unwrap();
    assert_eq!(
        children_state.len(),
        4,
        "removed children are left out: {root}"
    );
    assert_eq!(children_state[0]["type"], "m.space.child");
    assert_eq!(children_state[0]["state_key"], t.public);
    assert_eq!(children_state[0]["sender"], alice.user_id);
    assert!(children_state[0]["origin_server_ts"].is_i64());
    let public = entry(&page, &t.public);
    assert_eq!(public["topic"], "all welcome");
    assert_eq!(public["children_state"], json!([]));
    let restricted = entry(&page, &t.restricted);
    assert_eq!(restricted["join_rule"], "restricted");
    assert_eq!(restricted["allowed_room_ids"], json!([t.space]));

    // Bob is in the space only: the private room is left out, the restricted one (he may
    // join it through the space) is there.
    let bob = server.register("bob").await;
    bob.join(&t.space).await.ok();
    let page = hierarchy(&bob, &t.space, "").await.ok();
    assert_eq!(
        room_ids(&page),
        ids(&[&t.space, &t.public, &t.restricted, &t.subspace, &t.nested])
    );
    assert!(!page.to_string().contains("SECRET ROOM"), "{page}");

    // Carol is in nothing: she may still preview the public space, but not the restricted
    // room.
    let carol = server.register("carol").await;
    let page = hierarchy(&carol, &t.space, "").await.ok();
    assert_eq!(
        room_ids(&page),
        ids(&[&t.space, &t.public, &t.subspace, &t.nested])
    );

    // Once invited to the private room, Bob sees it too.
    alice
        .room_action(&t.private, "invite", json!({ "user_id": bob.user_id }))
        .await
        .ok();
    let page = hierarchy(&bob, &t.space, "").await.ok();
    assert!(room_ids(&page).contains(&t.private), "{page}");
}

#[tokio::test]
async fn hierarchy_pages_limits_depth_and_suggested_only() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let t = tree(&alice).await;

    let mut seen = Vec::new();
    let mut query = "?limit=2".to_owned();
    loop {
        let page = hierarchy(&alice, &t.space, &query).await.ok();
        assert!(room_ids(&page).len() <= 2, "{page}");
        seen.extend(room_ids(&page));
        match page["next_batch"].as_str() {
            Some(next) => query = format!("?limit=2&from={}", enc(next)),
            None => break,
        }
    }
    assert_eq!(
        seen,
        ids(&[
            &t.space,
            &t.public,
            &t.restricted,
            &t.private,
            &t.subspace,
            &t.nested
        ]),
        "pages add up to the whole tree, once each"
    );

    let page = hierarchy(&alice, &t.space, "?max_depth=0").await.ok();
    assert_eq!(room_ids(&page), ids(&[&t.space]));
    let page = hierarchy(&alice, &t.space, "?max_depth=1").await.ok();
    assert_eq!(
        room_ids(&page),
        ids(&[&t.space, &t.public, &t.restricted, &t.private, &t.subspace])
    );
    let page = hierarchy(&alice, &t.space, "?suggested_only=true")
        .await
        .ok();
    assert_eq!(room_ids(&page), ids(&[&t.space, &t.public]));
    assert_eq!(
        entry(&page, &t.space)["children_state"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // A token is only good with the parameters it was made with.
    let first = hierarchy(&alice, &t.space, "?limit=1").await.ok();
    let next = enc(first["next_batch"].as_str().unwrap());
    hierarchy(
        &alice,
        &t.space,
        &format!("?from={next}&suggested_only=true"),
    )
    .await
    .assert_error(400, "M_INVALID_PARAM");
    hierarchy(&alice, &t.space, &format!("?from={next}&max_depth=1"))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    hierarchy(&alice, &t.space, "?from=garbage")
        .await
        .assert_error(400, "M_INVALID_PARAM");
}

#[tokio::test]
async fn hierarchy_refuses_bad_parameters_and_rooms_the_caller_may_not_see() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let space = create_space(&alice, "Private space", "private_chat").await;
    let secret = alice
        .create_room(json!({ "preset": "private_chat", "name": "SECRET" }))
        .await;
    add_child(&alice, &space, &secret, json!({ "via": [server_name()] })).await;

    for query in [
        "?limit=0",
        "?limit=-1",
        "?limit=x",
        "?max_depth=-1",
        "?suggested_only=maybe",
    ] {
        let response = hierarchy(&alice, &space, query).await;
        assert_eq!(response.status.as_u16(), 400, "{query}: {}", response.body);
        assert!(
            ["M_INVALID_PARAM", "M_BAD_JSON"].contains(&response.body["errcode"].as_str().unwrap()),
            "{query}: {}",
            response.body
        );
    }
    alice
        .get("/_matrix/client/v1/rooms/not-a-room/hierarchy")
        .await
        .assert_error(400, "M_INVALID_PARAM");
    server
        .client()
        .get(&format!(
            "/_matrix/client/v1/rooms/{}/hierarchy",
            enc(&space)
        ))
        .await
        .assert_error(401, "M_MISSING_TOKEN");

    // Mallory may not see the private space: the same answer as for a room that does not
    // exist, and nothing of its children.
    let mallory = server.register("mallory").await;
    let hidden = hierarchy(&mallory, &space, "").await;
    hidden.assert_error(403, "M_FORBIDDEN");
    assert!(!hidden.body.to_string().contains("SECRET"));
    let unknown = format!("!nowhere:{}", server_name());
    hierarchy(&mallory, &unknown, "")
        .await
        .assert_error(403, "M_FORBIDDEN");
    // Even a child she may see is not reached through a space she may not.
    hierarchy(&mallory, &secret, "")
        .await
        .assert_error(403, "M_FORBIDDEN");
}
