//! `/context` and `timestamp_to_event`: the events around one, the event nearest a time, and
//! what each leaves out (the filter, what the reader may not see).

use serde_json::json;

use crate::support::{client::enc, TestServer};

#[tokio::test]
async fn context_and_timestamp_to_event() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            alice
                .send_text(&room, &format!("c{i}"), &format!("m{i}"))
                .await
                .ok()["event_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let context = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/context/{}?limit=2",
            enc(&room),
            enc(&ids[2])
        ))
        .await
        .ok();
    assert_eq!(context["event"]["event_id"], ids[2].as_str());
    assert_eq!(context["events_before"][0]["event_id"], ids[1].as_str());
    assert_eq!(context["events_after"][0]["event_id"], ids[3].as_str());
    assert!(context["state"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["type"] == "m.room.create"));

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let path = format!(
        "/_matrix/client/v1/rooms/{}/timestamp_to_event?ts={now}&dir=b",
        enc(&room)
    );
    let found = alice.get(&path).await.ok();
    assert_eq!(found["event_id"], ids[4].as_str());
}

#[tokio::test]
async fn timestamp_to_event_skips_events_the_reader_may_not_see() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let eve = server.register("eve").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "initial_state": [{ "type": "m.room.history_visibility",
            "state_key": "", "content": { "history_visibility": "joined" } }] }))
        .await;
    let hidden = alice.send_text(&room, "t0", "before bob").await.ok();
    let hidden = alice
        .get_event(&room, hidden["event_id"].as_str().unwrap())
        .await
        .ok();
    let join = bob.join(&room).await.ok();
    assert!(join["room_id"].is_string());
    let seen = alice.send_text(&room, "t1", "while bob is in").await.ok();
    bob.room_action(&room, "leave", json!({})).await.ok();
    alice.send_text(&room, "t2", "after bob").await.ok();
    let path = |ts: u128, dir: &str| {
        format!(
            "/_matrix/client/v1/rooms/{}/timestamp_to_event?ts={ts}&dir={dir}",
            enc(&room)
        )
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    // Backwards from now the nearest event is after bob left; the nearest he may see is his leave.
    let found = bob.get(&path(now, "b")).await.ok();
    let event = bob
        .get_event(&room, found["event_id"].as_str().unwrap())
        .await
        .ok();
    assert_eq!(event["type"], "m.room.member", "{event}");
    assert_eq!(event["content"]["membership"], "leave");
    // Forwards from a message sent before he joined (hidden), his join comes first.
    let sent_at = hidden["origin_server_ts"].as_u64().unwrap();
    let found = bob.get(&path(sent_at.into(), "f")).await.ok();
    let event = bob
        .get_event(&room, found["event_id"].as_str().unwrap())
        .await
        .ok();
    assert_eq!(event["content"]["membership"], "join", "{event}");
    assert_ne!(found["event_id"], seen["event_id"]);
    // One answer for "nothing you may see", whether or not the room has events there.
    let none = bob.get(&path(now + 60_000, "f")).await;
    none.assert_error(404, "M_NOT_FOUND");
    let outsider = eve.get(&path(now, "b")).await;
    outsider.assert_error(404, "M_NOT_FOUND");
    assert_eq!(none.body["error"], outsider.body["error"]);
}

#[tokio::test]
async fn context_applies_its_filter() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    let target = alice.send_text(&room, "t0", "target").await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    alice
        .put_state(&room, "m.room.topic", "", json!({ "topic": "noise" }))
        .await
        .ok();
    alice.send_text(&room, "t1", "after").await.ok();
    let filter = enc(&json!({ "types": ["m.room.message"] }).to_string());
    let context = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/context/{}?limit=10&filter={filter}",
            enc(&room),
            enc(&target)
        ))
        .await
        .ok();
    let after: Vec<&str> = context["events_after"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(after, vec!["m.room.message"]);
}
