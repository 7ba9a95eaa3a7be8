//! Edits, reactions, threads and references: bundled on read paths, listed by /relations.

use serde_json::{json, Value};

use crate::support::{client::enc, user_id, Client, TestServer};

async fn send(client: &Client, room: &str, kind: &str, txn: &str, content: Value) -> String {
    let path = format!(
        "/_matrix/client/v3/rooms/{}/send/{kind}/{}",
        enc(room),
        enc(txn)
    );
    client.put(&path, content).await.ok()["event_id"]
        .as_str()
        .expect("event_id")
        .to_owned()
}

fn edit(target: &str, body: &str) -> Value {
    json!({
        "msgtype": "m.text",
        "body": format!("* {body}"),
        "m.new_content": { "msgtype": "m.text", "body": body },
        "m.relates_to": { "rel_type": "m.replace", "event_id": target },
    })
}

async fn redact(client: &Client, room: &str, event: &str, txn: &str) {
    let path = format!(
        "/_matrix/client/v3/rooms/{}/redact/{}/{txn}",
        enc(room),
        enc(event)
    );
    client.put(&path, json!({})).await.ok();
}

async fn get_event(client: &Client, room: &str, event: &str) -> Value {
    client.get_event(room, event).await.ok()
}

fn edited_body(event: &Value) -> Option<&str> {
    event["unsigned"]["m.relations"]["m.replace"]["content"]["m.new_content"]["body"].as_str()
}

async fn room_with(server: &TestServer) -> (Client, Client, String) {
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    (alice, bob, room)
}

#[tokio::test]
async fn the_latest_valid_edit_is_bundled_on_every_read_path() {
    let server = TestServer::start().await;
    let (alice, bob, room) = room_with(&server).await;
    let original = send(
        &alice,
        &room,
        "m.room.message",
        "o",
        json!({ "msgtype": "m.text", "body": "draft" }),
    )
    .await;
    // A bot streaming an answer: 200 edits of one message.
    let mut last = String::new();
    for i in 0..200 {
        last = send(
            &alice,
            &room,
            "m.room.message",
            &format!("e{i}"),
            edit(&original, &format!("part {i}")),
        )
        .await;
    }
    assert_eq!(
        edited_body(&get_event(&bob, &room, &original).await),
        Some("part 199")
    );
    // Not applied: someone else's edit, an edit of an edit.
    send(
        &bob,
        &room,
        "m.room.message",
        "b",
        edit(&original, "hijacked"),
    )
    .await;
    send(
        &alice,
        &room,
        "m.room.message",
        "ee",
        edit(&last, "edit of an edit"),
    )
    .await;
    assert_eq!(
        edited_body(&get_event(&bob, &room, &original).await),
        Some("part 199")
    );

    // The same bundle in /messages, /context and /sync.
    let page = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=b&limit=300",
            enc(&room)
        ))
        .await
        .ok();
    let in_page = page["chunk"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event_id"] == original.as_str())
        .unwrap();
    assert_eq!(edited_body(in_page), Some("part 199"));
    let context = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/context/{}?limit=2",
            enc(&room),
            enc(&original)
        ))
        .await
        .ok();
    assert_eq!(edited_body(&context["event"]), Some("part 199"));
    let short = send(
        &alice,
        &room,
        "m.room.message",
        "s",
        json!({ "msgtype": "m.text", "body": "typo" }),
    )
    .await;
    send(&alice, &room, "m.room.message", "se", edit(&short, "fixed")).await;
    let sync = bob.sync(None, 0, None).await;
    let synced = sync["rooms"]["join"][&room]["timeline"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event_id"] == short.as_str())
        .expect("the message is in the timeline")
        .clone();
    assert_eq!(edited_body(&synced), Some("fixed"));

    // Redacting the latest edit brings back the one before.
    redact(&alice, &room, &last, "r1").await;
    assert_eq!(
        edited_body(&get_event(&bob, &room, &original).await),
        Some("part 198")
    );
}

#[tokio::test]
async fn a_second_identical_reaction_is_refused_and_redacted_reactions_go() {
    let server = TestServer::start().await;
    let (alice, bob, room) = room_with(&server).await;
    let message = send(
        &alice,
        &room,
        "m.room.message",
        "m",
        json!({ "msgtype": "m.text", "body": "vote" }),
    )
    .await;
    let reaction =
        json!({ "m.relates_to": { "rel_type": "m.annotation", "event_id": message, "key": "👍" } });
    let first = send(&bob, &room, "m.reaction", "r1", reaction.clone()).await;
    let path = format!("/_matrix/client/v3/rooms/{}/send/m.reaction/r2", enc(&room));
    bob.put(&path, reaction.clone())
        .await
        .assert_error(400, "M_DUPLICATE_ANNOTATION");
    send(&alice, &room, "m.reaction", "a1", reaction.clone()).await;

    let listed = bob
        .get(&format!(
            "/_matrix/client/v1/rooms/{}/relations/{}/m.annotation/m.reaction",
            enc(&room),
            enc(&message)
        ))
        .await
        .ok();
    assert_eq!(listed["chunk"].as_array().unwrap().len(), 2);
    redact(&bob, &room, &first, "x").await;
    let listed = bob
        .get(&format!(
            "/_matrix/client/v1/rooms/{}/relations/{}/m.annotation",
            enc(&room),
            enc(&message)
        ))
        .await
        .ok();
    assert_eq!(listed["chunk"].as_array().unwrap().len(), 1);
    assert_eq!(listed["chunk"][0]["sender"], user_id("alice"));
    // With the reaction redacted, the same reaction may be sent again.
    send(&bob, &room, "m.reaction", "r3", reaction).await;
}

#[tokio::test]
async fn threads_carry_a_summary_and_are_listed() {
    let server = TestServer::start().await;
    let (alice, bob, room) = room_with(&server).await;
    let carol = server.register("carol").await;
    carol.join(&room).await.ok();
    let root = send(
        &alice,
        &room,
        "m.room.message",
        "root",
        json!({ "msgtype": "m.text", "body": "topic" }),
    )
    .await;
    let reply = |n: u32| {
        json!({
            "msgtype": "m.text",
            "body": format!("reply {n}"),
            "m.relates_to": { "rel_type": "m.thread", "event_id": root },
        })
    };
    send(&bob, &room, "m.room.message", "t1", reply(1)).await;
    let second = send(&bob, &room, "m.room.message", "t2", reply(2)).await;

    let seen_by_bob = get_event(&bob, &room, &root).await;
    let summary = &seen_by_bob["unsigned"]["m.relations"]["m.thread"];
    assert_eq!(summary["count"], 2);
    assert_eq!(summary["latest_event"]["event_id"], second.as_str());
    assert_eq!(summary["current_user_participated"], true);
    let seen_by_carol = get_event(&carol, &room, &root).await;
    assert_eq!(
        seen_by_carol["unsigned"]["m.relations"]["m.thread"]["current_user_participated"],
        false
    );
    let seen_by_alice = get_event(&alice, &room, &root).await;
    assert_eq!(
        seen_by_alice["unsigned"]["m.relations"]["m.thread"]["current_user_participated"], true,
        "the root's sender takes part in the thread"
    );

    let all = carol
        .get(&format!("/_matrix/client/v1/rooms/{}/threads", enc(&room)))
        .await
        .ok();
    assert_eq!(all["chunk"][0]["event_id"], root.as_str());
    assert_eq!(
        all["chunk"][0]["unsigned"]["m.relations"]["m.thread"]["count"],
        2
    );
    let mine = carol
        .get(&format!(
            "/_matrix/client/v1/rooms/{}/threads?include=participated",
            enc(&room)
        ))
        .await
        .ok();
    assert!(mine["chunk"].as_array().unwrap().is_empty());

    // A thread cannot branch off a thread reply; a redacted reply leaves the summary.
    let path = format!(
        "/_matrix/client/v3/rooms/{}/send/m.room.message/bad",
        enc(&room)
    );
    let branch = json!({ "msgtype": "m.text", "body": "x", "m.relates_to": { "rel_type": "m.thread", "event_id": second } });
    bob.put(&path, branch)
        .await
        .assert_error(400, "M_INVALID_PARAM");
    redact(&bob, &room, &second, "r").await;
    let after = get_event(&carol, &room, &root).await;
    assert_eq!(after["unsigned"]["m.relations"]["m.thread"]["count"], 1);
}

#[tokio::test]
async fn relations_page_and_stay_inside_the_room_and_its_readers() {
    let server = TestServer::start().await;
    let (alice, bob, room) = room_with(&server).await;
    let eve = server.register("eve").await;
    let other = eve.create_room(json!({ "preset": "private_chat" })).await;
    let target = send(
        &alice,
        &room,
        "m.room.message",
        "t",
        json!({ "msgtype": "m.text", "body": "see this" }),
    )
    .await;
    for i in 0..5 {
        let reference = json!({ "msgtype": "m.text", "body": format!("ref {i}"), "m.relates_to": { "rel_type": "m.reference", "event_id": target } });
        send(&bob, &room, "m.room.message", &format!("ref{i}"), reference).await;
    }
    let bundled = get_event(&alice, &room, &target).await;
    assert_eq!(
        bundled["unsigned"]["m.relations"]["m.reference"]["chunk"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    let base = format!(
        "/_matrix/client/v1/rooms/{}/relations/{}",
        enc(&room),
        enc(&target)
    );
    let page = alice.get(&format!("{base}?limit=2")).await.ok();
    let bodies = |page: &Value| -> Vec<String> {
        page["chunk"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["content"]["body"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(bodies(&page), ["ref 4", "ref 3"], "newest first");
    let next = page["next_batch"].as_str().unwrap();
    let page2 = alice
        .get(&format!("{base}?limit=2&from={}", enc(next)))
        .await
        .ok();
    assert_eq!(bodies(&page2), ["ref 2", "ref 1"]);
    let forwards = alice.get(&format!("{base}?dir=f&limit=10")).await.ok();
    assert_eq!(bodies(&forwards).len(), 5);
    assert_eq!(bodies(&forwards)[0], "ref 0");

    // Someone outside the room sees nothing; a relation across rooms is refused.
    eve.get(&base).await.assert_error(404, "M_NOT_FOUND");
    let path = format!(
        "/_matrix/client/v3/rooms/{}/send/m.room.message/x",
        enc(&other)
    );
    let across = json!({ "msgtype": "m.text", "body": "x", "m.relates_to": { "rel_type": "m.reference", "event_id": target } });
    eve.put(&path, across)
        .await
        .assert_error(400, "M_INVALID_PARAM");
}

/// `to` is inclusive: from one page's `next_batch` to the next page's is exactly that page,
/// paging backwards (the default) and forwards.
#[tokio::test]
async fn relations_from_one_next_batch_to_the_next_return_exactly_that_page() {
    let server = TestServer::start().await;
    let (alice, bob, room) = room_with(&server).await;
    let target = send(
        &alice,
        &room,
        "m.room.message",
        "t",
        json!({ "msgtype": "m.text", "body": "see this" }),
    )
    .await;
    for i in 0..9 {
        let reference = json!({ "msgtype": "m.text", "body": format!("ref {i}"), "m.relates_to": { "rel_type": "m.reference", "event_id": target } });
        send(&bob, &room, "m.room.message", &format!("ref{i}"), reference).await;
    }
    let base = format!(
        "/_matrix/client/v1/rooms/{}/relations/{}?limit=3",
        enc(&room),
        enc(&target)
    );
    let bodies = |page: &Value| -> Vec<String> {
        page["chunk"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["content"]["body"].as_str().unwrap().to_owned())
            .collect()
    };
    for (dir, page2_bodies) in [
        ("b", ["ref 5", "ref 4", "ref 3"]),
        ("f", ["ref 3", "ref 4", "ref 5"]),
    ] {
        let page1 = alice.get(&format!("{base}&dir={dir}")).await.ok();
        let after1 = page1["next_batch"].as_str().unwrap();
        let page2 = alice
            .get(&format!("{base}&dir={dir}&from={}", enc(after1)))
            .await
            .ok();
        assert_eq!(bodies(&page2), page2_bodies, "dir={dir}");
        let after2 = page2["next_batch"].as_str().unwrap();
        let range = alice
            .get(&format!(
                "{base}&dir={dir}&from={}&to={}",
                enc(after1),
                enc(after2)
            ))
            .await
            .ok();
        assert_eq!(
            bodies(&range),
            page2_bodies,
            "dir={dir}: from..to is page 2"
        );
        // A wider limit stops at `to` all the same.
        let wide = alice
            .get(&format!(
                "{}&dir={dir}&from={}&to={}",
                base.replace("limit=3", "limit=9"),
                enc(after1),
                enc(after2)
            ))
            .await
            .ok();
        assert_eq!(bodies(&wide), page2_bodies, "dir={dir}, limit 9");
    }
}
