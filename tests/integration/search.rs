//! `POST /search`: full-text search that never returns what the searcher cannot see.

use serde_json::{json, Value};

use crate::support::{client::enc, user_id, Client, TestServer};

async fn search(client: &Client, criteria: Value) -> Value {
    client
        .post(
            "/_matrix/client/v3/search",
            json!({ "search_categories": { "room_events": criteria } }),
        )
        .await
        .ok()["search_categories"]["room_events"]
        .clone()
}

fn bodies(results: &Value) -> Vec<String> {
    results["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["result"]["content"]["body"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn search_finds_words_in_visible_messages_only() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let eve = server.register("eve").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "name": "zoo" }))
        .await;
    bob.join(&room).await.ok();
    let secret_room = eve.create_room(json!({ "preset": "private_chat" })).await;
    eve.send_text(&secret_room, "s", "the secret fox plan")
        .await
        .ok();
    alice
        .send_text(&room, "1", "The quick brown fox")
        .await
        .ok();
    bob.send_text(&room, "2", "a lazy dog").await.ok();
    let redacted = alice.send_text(&room, "3", "fox to be deleted").await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    alice
        .put(
            &format!(
                "/_matrix/client/v3/rooms/{}/redact/{}/r",
                enc(&room),
                enc(&redacted)
            ),
            json!({}),
        )
        .await
        .ok();
    alice
        .send_text(&room, "4", "Foxes? one fox again")
        .await
        .ok();

    let found = search(&bob, json!({ "search_term": "fox", "order_by": "recent" })).await;
    assert_eq!(
        bodies(&found),
        ["Foxes? one fox again", "The quick brown fox"]
    );
    assert_eq!(found["count"], 2);
    assert_eq!(found["highlights"], json!(["fox"]));
    assert!(found["results"][0]["rank"].as_f64().unwrap() > 0.0);
    assert_eq!(found["results"][0]["result"]["room_id"], room.as_str());

    let by_bob = search(
        &bob,
        json!({ "search_term": "dog", "filter": { "senders": [user_id("bob")] } }),
    )
    .await;
    assert_eq!(bodies(&by_bob), ["a lazy dog"]);
    let not_alice = search(
        &bob,
        json!({ "search_term": "fox", "filter": { "not_senders": [user_id("alice")] } }),
    )
    .await;
    assert!(bodies(&not_alice).is_empty());

    // Pages, context, state and groups.
    let first = search(
        &bob,
        json!({
            "search_term": "fox",
            "order_by": "recent",
            "filter": { "limit": 1 },
            "event_context": { "before_limit": 1, "after_limit": 1, "include_profile": true },
            "include_state": true,
            "groupings": { "group_by": [{ "key": "room_id" }] },
        }),
    )
    .await;
    assert_eq!(bodies(&first), ["Foxes? one fox again"]);
    let context = &first["results"][0]["context"];
    assert_eq!(context["events_before"].as_array().unwrap().len(), 1);
    assert!(context["profile_info"][&user_id("alice")].is_object());
    assert!(first["state"][&room]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["type"] == "m.room.name"));
    assert_eq!(
        first["groups"]["room_id"][&room]["results"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let next = first["next_batch"].as_str().expect("next_batch").to_owned();
    let second = bob
        .post(
            &format!("/_matrix/client/v3/search?next_batch={}", enc(&next)),
            json!({ "search_categories": { "room_events": { "search_term": "fox", "order_by": "recent", "filter": { "limit": 1 } } } }),
        )
        .await
        .ok();
    assert_eq!(
        bodies(&second["search_categories"]["room_events"]),
        ["The quick brown fox"]
    );

    // Bad requests.
    bob.post(
        "/_matrix/client/v3/search",
        json!({ "search_categories": { "room_events": {} } }),
    )
    .await
    .assert_error(400, "M_MISSING_PARAM");
    bob.post(
        "/_matrix/client/v3/search?next_batch=nonsense",
        json!({ "search_categories": { "room_events": { "search_term": "fox" } } }),
    )
    .await
    .assert_error(400, "M_INVALID_PARAM");
}

#[tokio::test]
async fn history_from_before_joining_a_joined_only_room_is_not_searchable() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let carol = server.register("carol").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    alice
        .put_state(
            &room,
            "m.room.history_visibility",
            "",
            json!({ "history_visibility": "joined" }),
        )
        .await
        .ok();
    alice.send_text(&room, "1", "otter before carol").await.ok();
    carol.join(&room).await.ok();
    alice.send_text(&room, "2", "otter after carol").await.ok();
    let found = search(&carol, json!({ "search_term": "otter" })).await;
    assert_eq!(bodies(&found), ["otter after carol"]);
    let all = search(&alice, json!({ "search_term": "otter" })).await;
    assert_eq!(bodies(&all).len(), 2);
}

/// `count` counts only results the searcher may see: history from before they joined a
/// `joined`-visibility room does not show up in it (review finding W).
#[tokio::test]
async fn search_count_tells_nothing_about_invisible_history() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(json!({
            "preset": "public_chat",
            "initial_state": [{ "type": "m.room.history_visibility", "state_key": "", "content": { "history_visibility": "joined" } }],
        }))
        .await;
    alice.send_text(&room, "1", "merger with acme").await.ok();
    alice.send_text(&room, "2", "acme again").await.ok();
    bob.join(&room).await.ok();
    let before_joining = search(&bob, json!({ "search_term": "acme" })).await;
    assert_eq!(bodies(&before_joining), Vec::<String>::new());
    assert_eq!(before_joining["count"], 0);

    alice.send_text(&room, "3", "acme is public now").await.ok();
    let after = search(&bob, json!({ "search_term": "acme" })).await;
    assert_eq!(bodies(&after), ["acme is public now"]);
    assert_eq!(after["count"], 1);
    let everything = search(&alice, json!({ "search_term": "acme" })).await;
    assert_eq!(everything["count"], 3);
}

/// Without `order_by`, the best matches come first (the spec's default, `rank`), whatever their
/// age; `recent` orders the same matches newest first.
#[tokio::test]
async fn best_matches_come_first_by_default() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "private_chat" })).await;
    for (txn, body) in [("1", "fox fox fox"), ("2", "a fox"), ("3", "the fox again")] {
        alice.send_text(&room, txn, body).await.ok();
    }
    let ranked = search(&alice, json!({ "search_term": "fox" })).await;
    assert_eq!(bodies(&ranked)[0], "fox fox fox", "{ranked}");
    let rank = |n: usize| ranked["results"][n]["rank"].as_f64().unwrap();
    assert!(rank(0) > rank(1), "{ranked}");
    let recent = search(
        &alice,
        json!({ "search_term": "fox", "order_by": "recent" }),
    )
    .await;
    assert_eq!(
        bodies(&recent),
        ["the fox again", "a fox", "fox fox fox"],
        "{recent}"
    );
}
