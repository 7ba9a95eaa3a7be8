//! Visibility applies to everything served: bundled relations, member lists at old
//! positions, `/context` state, lazy-loaded members and filtered `/messages` pages.

use serde_json::{json, Value};

use crate::support::{client::enc, Client, TestServer};

async fn send(client: &Client, room: &str, txn: &str, content: Value) -> String {
    let path = format!(
        "/_matrix/client/v3/rooms/{}/send/m.room.message/{txn}",
        enc(room)
    );
    client.put(&path, content).await.ok()["event_id"]
        .as_str()
        .expect("event_id")
        .to_owned()
}

async fn private_room_with(alice: &Client, bob: &Client) -> String {
    let room = alice
        .create_room(json!({ "preset": "private_chat", "invite": [bob.user_id] }))
        .await;
    bob.join(&room).await.ok();
    room
}

#[tokio::test]
async fn bundled_relations_written_after_a_ban_stay_hidden() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = private_room_with(&alice, &bob).await;
    let root = send(
        &alice,
        &room,
        "r",
        json!({ "msgtype": "m.text", "body": "thread root" }),
    )
    .await;
    let doomed = send(
        &alice,
        &room,
        "d",
        json!({ "msgtype": "m.text", "body": "doomed" }),
    )
    .await;
    alice
        .room_action(
            &room,
            "ban",
            json!({ "user_id": bob.user_id, "reason": "bye" }),
        )
        .await
        .ok();
    send(
        &alice,
        &room,
        "t",
        json!({ "msgtype": "m.text", "body": "SECRET written after the ban",
                "m.relates_to": { "rel_type": "m.thread", "event_id": root } }),
    )
    .await;
    send(
        &alice,
        &room,
        "e",
        json!({ "msgtype": "m.text", "body": "* x",
                "m.new_content": { "msgtype": "m.text", "body": "EDIT made after the ban" },
                "m.relates_to": { "rel_type": "m.replace", "event_id": root } }),
    )
    .await;
    send(
        &alice,
        &room,
        "ref",
        json!({ "msgtype": "m.text", "body": "ref",
                "m.relates_to": { "rel_type": "m.reference", "event_id": root } }),
    )
    .await;
    alice
        .put(
            &format!(
                "/_matrix/client/v3/rooms/{}/redact/{}/x",
                enc(&room),
                enc(&doomed)
            ),
            json!({ "reason": "REASON after the ban" }),
        )
        .await
        .ok();

    let event = bob.get_event(&room, &root).await.ok();
    assert!(event["unsigned"]["m.relations"].is_null(), "{event}");
    let threads = bob
        .get(&format!("/_matrix/client/v1/rooms/{}/threads", enc(&room)))
        .await;
    assert!(
        !threads.body.to_string().contains("SECRET"),
        "{}",
        threads.body
    );
    let page = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=b&limit=50",
            enc(&room)
        ))
        .await
        .ok()
        .to_string();
    for leak in ["SECRET", "EDIT made", "REASON after"] {
        assert!(!page.contains(leak), "{leak} leaked: {page}");
    }
    // Alice, still in the room, sees all of it.
    let event = alice.get_event(&room, &root).await.ok();
    let relations = &event["unsigned"]["m.relations"];
    assert_eq!(
        relations["m.thread"]["latest_event"]["content"]["body"],
        "SECRET written after the ban"
    );
    assert_eq!(
        relations["m.replace"]["content"]["m.new_content"]["body"],
        "EDIT made after the ban"
    );
    assert_eq!(
        relations["m.reference"]["chunk"].as_array().unwrap().len(),
        1
    );
}

#[tokio::test]
async fn members_at_an_early_position_never_show_the_current_list_to_departed_users() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let carol = server.register("carol").await;
    let room = alice
        .create_room(json!({ "preset": "private_chat", "invite": [bob.user_id] }))
        .await;
    bob.room_action(&room, "leave", json!({})).await.ok();
    alice
        .room_action(&room, "invite", json!({ "user_id": carol.user_id }))
        .await
        .ok();
    carol.join(&room).await.ok();
    for at in ["", "?at=t0", "?at=s0"] {
        let members = bob
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/members{at}",
                enc(&room)
            ))
            .await
            .ok()
            .to_string();
        assert!(!members.contains(&carol.user_id), "at '{at}': {members}");
    }
}

#[tokio::test]
async fn context_of_ones_own_knock_shows_no_room_state() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let knocker = server.register("knocker").await;
    let room = alice
        .create_room(json!({
            "preset": "private_chat",
            "initial_state": [{ "type": "m.room.join_rules", "state_key": "",
                                "content": { "join_rule": "knock" } }],
        }))
        .await;
    alice
        .put_state(
            &room,
            "m.room.topic",
            "",
            json!({ "topic": "internal: reorg list" }),
        )
        .await
        .ok();
    knocker
        .post(
            &format!("/_matrix/client/v3/knock/{}", enc(&room)),
            json!({ "reason": "let me in" }),
        )
        .await
        .ok();
    let page = knocker
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=b&limit=50",
            enc(&room)
        ))
        .await
        .ok();
    let knock = page["chunk"][0]["event_id"].as_str().unwrap().to_owned();
    let context = knocker
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/context/{}?limit=0",
            enc(&room),
            enc(&knock)
        ))
        .await
        .ok();
    assert!(!context.to_string().contains("reorg"), "{context}");
    assert!(
        context["state"].as_array().is_none_or(Vec::is_empty),
        "{context}"
    );
}

#[tokio::test]
async fn lazy_loaded_members_in_messages_are_as_of_the_page() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = private_room_with(&alice, &bob).await;
    send(
        &alice,
        &room,
        "m",
        json!({ "msgtype": "m.text", "body": "before" }),
    )
    .await;
    alice
        .room_action(&room, "ban", json!({ "user_id": bob.user_id }))
        .await
        .ok();
    alice
        .put(
            &format!(
                "/_matrix/client/v3/profile/{}/displayname",
                enc(&alice.user_id)
            ),
            json!({ "displayname": "NEW NAME" }),
        )
        .await
        .ok();
    let filter = enc(&json!({ "lazy_load_members": true }).to_string());
    let page = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=b&limit=5&filter={filter}",
            enc(&room)
        ))
        .await
        .ok();
    assert!(!page.to_string().contains("NEW NAME"), "{page}");
    assert!(
        page["state"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["state_key"] == alice.user_id),
        "{page}"
    );
}

#[tokio::test]
async fn messages_applies_the_whole_room_event_filter() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = private_room_with(&alice, &bob).await;
    send(
        &alice,
        &room,
        "1",
        json!({ "msgtype": "m.text", "body": "alice text" }),
    )
    .await;
    send(
        &bob,
        &room,
        "2",
        json!({ "msgtype": "m.text", "body": "bob text" }),
    )
    .await;
    send(
        &bob,
        &room,
        "3",
        json!({ "msgtype": "m.image", "body": "pic", "url": "mxc://x/y" }),
    )
    .await;
    // Many events that do not match between the matches, so a page must scan past them.
    for i in 0..30 {
        send(
            &alice,
            &room,
            &format!("f{i}"),
            json!({ "msgtype": "m.text", "body": "filler" }),
        )
        .await;
    }
    let page = |filter: Value| {
        let alice = &alice;
        let room = &room;
        async move {
            let path = format!(
                "/_matrix/client/v3/rooms/{}/messages?dir=b&limit=3&filter={}",
                enc(room),
                enc(&filter.to_string())
            );
            let page = alice.get(&path).await.ok();
            page["chunk"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["content"]["body"].as_str().unwrap_or_default().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        page(json!({ "senders": [bob.user_id], "types": ["m.room.message"] })).await,
        ["pic", "bob text"]
    );
    assert_eq!(
        page(json!({ "not_senders": [alice.user_id], "contains_url": true })).await,
        ["pic"]
    );
    assert_eq!(
        page(json!({ "types": ["m.room.message"], "not_senders": [bob.user_id], "contains_url": false }))
            .await
            .len(),
        3
    );
    assert!(page(json!({ "types": ["m.room.create"] })).await.len() == 1);
    assert!(page(json!({ "not_types": ["m.room.*"] })).await.is_empty());
}

#[tokio::test]
async fn joined_members_is_for_members_even_in_world_readable_rooms() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let peeker = server.register("peeker").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "initial_state": [{ "type": "m.room.history_visibility",
            "state_key": "", "content": { "history_visibility": "world_readable" } }] }))
        .await;
    let path = format!("/_matrix/client/v3/rooms/{}/joined_members", enc(&room));
    // A peeker may read the state of a world-readable room, but not the member list with profiles.
    peeker
        .get(&format!("/_matrix/client/v3/rooms/{}/state", enc(&room)))
        .await
        .ok();
    peeker.get(&path).await.assert_error(403, "M_FORBIDDEN");
    let joined = alice.get(&path).await.ok();
    assert!(joined["joined"][&alice.user_id].is_object(), "{joined}");
}

#[tokio::test]
async fn a_forgotten_room_has_no_state_or_members_for_the_departed_user() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    bob.room_action(&room, "leave", json!({})).await.ok();
    let state = format!("/_matrix/client/v3/rooms/{}/state", enc(&room));
    let members = format!("/_matrix/client/v3/rooms/{}/members", enc(&room));
    bob.get(&state).await.ok();
    bob.get(&members).await.ok();
    bob.room_action(&room, "forget", json!({})).await.ok();
    bob.get(&state).await.assert_error(403, "M_FORBIDDEN");
    bob.get(&members).await.assert_error(403, "M_FORBIDDEN");
    bob.get(&format!("{state}/m.room.create/"))
        .await
        .assert_error(403, "M_FORBIDDEN");
}
