//! Simplified sliding sync (MSC4186) over raw HTTP: errors and `pos`, lists and windows,
//! room results (timeline, required state, lazy members, counts). List filters are in
//! sliding_sync_filters, more room results in sliding_sync_rooms.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{
    client::{enc, Client, Response},
    TestServer,
};

pub const SSS: &str = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync";

/// One sliding sync request.
pub async fn sss(client: &Client, pos: Option<&str>, timeout_ms: u64, body: Value) -> Response {
    let mut path = format!("{SSS}?timeout={timeout_ms}");
    if let Some(pos) = pos {
        path.push_str(&format!("&pos={}", enc(pos)));
    }
    client.post(&path, body).await
}

/// A list named `all` over `[0, end]` with Element X's shape.
pub fn list(end: u64, timeline_limit: u64, required_state: Value) -> Value {
    json!({ "lists": { "all": {
        "ranges": [[0, end]],
        "timeline_limit": timeline_limit,
        "required_state": required_state,
        "filters": {},
    } } })
}

pub fn pos(response: &Value) -> String {
    response["pos"].as_str().expect("pos").to_owned()
}

/// The message bodies of a room result's timeline (none when it has no timeline).
pub fn messages(room: &Value) -> Vec<String> {
    room["timeline"]
        .as_array()
        .map(|events| {
            events
                .iter()
                .filter(|e| e["type"] == "m.room.message")
                .map(|e| e["content"]["body"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn bodies(room: &Value) -> Vec<String> {
    room["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .inspect(|e| assert!(e.get("room_id").is_none(), "the room is the key: {e}"))
        .filter(|e| e["type"] == "m.room.message")
        .map(|e| e["content"]["body"].as_str().unwrap().to_owned())
        .collect()
}

pub fn state_keys(room: &Value, kind: &str) -> Vec<String> {
    let mut keys: Vec<String> = room["required_state"]
        .as_array()
        .unwrap()
        .iter()
        .inspect(|e| assert!(e.get("room_id").is_none(), "the room is the key: {e}"))
        .filter(|e| e["type"] == kind)
        .map(|e| e["state_key"].as_str().unwrap().to_owned())
        .collect();
    keys.sort();
    keys
}

/// The rooms of a list's window as a new connection (`conn_id` "window check") sees them:
/// only a connection's first response carries `ops`.
pub async fn fresh_window(client: &Client, mut body: Value, name: &str) -> Vec<String> {
    body["conn_id"] = json!("window check");
    window(&sss(client, None, 0, body).await.ok(), name)
}

pub fn window(response: &Value, name: &str) -> Vec<String> {
    response["lists"][name]["ops"][0]["room_ids"]
        .as_array()
        .map(|ids| {
            ids.iter()
                .map(|id| id.as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn discovery_paths_and_bad_input() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let versions = server.client().get("/_matrix/client/versions").await.ok();
    assert_eq!(
        versions["unstable_features"]["org.matrix.simplified_msc3575"],
        true
    );
    for path in [SSS, "/_matrix/client/v4/sync"] {
        let ok = alice.post(path, json!({})).await.ok();
        assert!(ok["pos"].is_string(), "{path} answers");
        server
            .client()
            .post(path, json!({}))
            .await
            .assert_error(401, "M_MISSING_TOKEN");
    }
    let many_lists: serde_json::Map<String, Value> = (0..101)
        .map(|n| (format!("l{n}"), json!({ "ranges": [[0, 1]] })))
        .collect();
    sss(&alice, None, 0, json!({ "lists": many_lists }))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    sss(&alice, None, 0, list(5, 1001, json!([])))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    sss(
        &alice,
        None,
        0,
        json!({ "lists": { "a": { "ranges": [[5, 1]] } } }),
    )
    .await
    .assert_error(400, "M_INVALID_PARAM");
    sss(
        &alice,
        None,
        0,
        json!({ "lists": { "a": { "ranges": "x" } } }),
    )
    .await
    .assert_error(400, "M_BAD_JSON");
    sss(
        &alice,
        None,
        0,
        json!({ "lists": { "a": { "required_state": [["a"]] } } }),
    )
    .await
    .assert_error(400, "M_BAD_JSON");
    sss(
        &alice,
        None,
        0,
        json!({ "room_subscriptions": { "not-a-room": {} } }),
    )
    .await
    .assert_error(400, "M_INVALID_PARAM");
    alice
        .raw(reqwest::Method::POST, SSS, b"{not json".to_vec())
        .await
        .assert_error(400, "M_NOT_JSON");
    alice
        .post(&format!("{SSS}?timeout=soon"), json!({}))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    // Wrong shapes anywhere: a 400, never a 500.
    for bad in [
        json!({ "lists": [] }),
        json!({ "lists": { "a": { "ranges": [[-1, 5]] } } }),
        json!({ "lists": { "a": { "ranges": [[0, 1, 2]] } } }),
        json!({ "lists": { "a": { "timeline_limit": -1 } } }),
        json!({ "lists": { "a": { "filters": { "is_dm": "yes" } } } }),
        json!({ "lists": { "a": { "filters": { "spaces": [1] } } } }),
        json!({ "lists": { "a": { "required_state": { "include": [{ "type": 5 }] } } } }),
        json!({ "lists": { "a": { "required_state": 7 } } }),
        json!({ "conn_id": 5 }),
        json!({ "conn_id": "x".repeat(65) }),
        json!({ "room_subscriptions": { "!a:b": { "timeline_limit": "many" } } }),
        json!({ "extensions": { "to_device": { "enabled": true, "since": 5 } } }),
        json!({ "extensions": { "to_device": { "enabled": true, "since": "later" } } }),
        json!({ "extensions": { "receipts": { "enabled": true, "lists": "all" } } }),
        json!([1, 2]),
        json!("body"),
    ] {
        let response = sss(&alice, None, 0, bad.clone()).await;
        assert_eq!(response.status.as_u16(), 400, "{bad}: {}", response.body);
        assert!(response.body["errcode"].is_string(), "{bad}");
    }
    // Unknown filters, extensions and legacy fields are ignored.
    let ok = sss(
        &alice,
        None,
        0,
        json!({ "lists": { "a": {
            "ranges": [[0, 9]], "sort": ["by_recency"], "slow_get_all_rooms": true,
            "bump_event_types": ["m.room.message"],
            "filters": { "is_tombstoned": false, "whatever": 1 },
        } }, "extensions": { "io.element.unknown": { "enabled": true } },
           "unsubscribe_rooms": [] }),
    )
    .await
    .ok();
    assert_eq!(ok["lists"]["a"]["count"], 0);
}

#[tokio::test]
async fn unknown_foreign_expired_and_future_pos() {
    use diesel_async::RunQueryDsl;
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let alice_phone = server.client().login("alice", "password").await;
    alice.create_room(json!({ "name": "one" })).await;
    let body = list(9, 1, json!([]));
    let first = sss(&alice, None, 0, body.clone()).await.ok();
    let first_pos = pos(&first);
    // The same pos is served again (a retry), and its successor too.
    let again = sss(&alice, Some(&first_pos), 0, body.clone()).await.ok();
    sss(&alice, Some(&first_pos), 0, body.clone()).await.ok();
    let next = sss(&alice, Some(&pos(&again)), 0, body.clone()).await.ok();
    // A grown timeline limit changes what the connection knows: a new version.
    let newer = sss(&alice, Some(&pos(&next)), 0, list(9, 2, json!([])))
        .await
        .ok();
    assert_ne!(pos(&newer).split('/').next(), pos(&next).split('/').next());
    let next = sss(&alice, Some(&pos(&newer)), 0, list(9, 2, json!([])))
        .await
        .ok();
    let body = list(9, 2, json!([]));

    for garbage in ["", "x", "1/", "/s1", "-1/s1", "1/sabc"] {
        sss(&alice, Some(garbage), 0, body.clone())
            .await
            .assert_error(400, "M_UNKNOWN_POS");
    }
    // Another user's, another device's, another connection's pos.
    sss(&bob, Some(&pos(&next)), 0, body.clone())
        .await
        .assert_error(400, "M_UNKNOWN_POS");
    sss(&alice_phone, Some(&pos(&next)), 0, body.clone())
        .await
        .assert_error(400, "M_UNKNOWN_POS");
    let mut other_conn = body.clone();
    other_conn["conn_id"] = json!("other");
    sss(&alice, Some(&pos(&next)), 0, other_conn)
        .await
        .assert_error(400, "M_UNKNOWN_POS");
    // An older version once a newer one was used.
    sss(&alice, Some(&pos(&again)), 0, body.clone())
        .await
        .assert_error(400, "M_UNKNOWN_POS");
    // A stream position from the future.
    let (version, _) = pos(&next)
        .split_once('/')
        .map(|(v, t)| (v.to_owned(), t.to_owned()))
        .unwrap();
    sss(
        &alice,
        Some(&format!("{version}/s999999999")),
        0,
        body.clone(),
    )
    .await
    .assert_error(400, "M_UNKNOWN_POS");
    // The connection still works, until it expires.
    let current = sss(&alice, Some(&pos(&next)), 0, body.clone()).await.ok();
    let mut db = server.db().await;
    diesel::sql_query("UPDATE sliding_sync_connections SET last_used_ts = 0")
        .execute(&mut db)
        .await
        .unwrap();
    sss(&alice, Some(&pos(&current)), 0, body.clone())
        .await
        .assert_error(400, "M_UNKNOWN_POS");
    // Starting again works.
    let fresh = sss(&alice, None, 0, body).await.ok();
    assert_eq!(fresh["lists"]["all"]["count"], 1);
}

#[tokio::test]
async fn windows_grow_and_a_room_moves_up() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let mut rooms = Vec::new();
    for n in 0..12 {
        let room = alice
            .create_room(json!({ "name": format!("room {n}") }))
            .await;
        alice
            .send_text(&room, &format!("t{n}"), &format!("hello {n}"))
            .await
            .ok();
        rooms.push(room);
    }
    // Newest activity first.
    let newest_first: Vec<String> = rooms.iter().rev().cloned().collect();
    let required = json!([["m.room.name", ""], ["m.room.member", "$ME"]]);
    let first = sss(&alice, None, 0, list(4, 5, required.clone()))
        .await
        .ok();
    assert_eq!(first["lists"]["all"]["count"], 12);
    assert_eq!(window(&first, "all"), newest_first[..5].to_vec());
    let sent = first["rooms"].as_object().unwrap();
    assert_eq!(sent.len(), 5);
    for room in &newest_first[..5] {
        let result = &sent[room];
        assert_eq!(result["initial"], true);
        assert!(result["name"].as_str().unwrap().starts_with("room "));
        assert_eq!(bodies(result).len(), 1);
        assert_eq!(
            result["timeline"].as_array().unwrap().len(),
            5,
            "timeline_limit 5"
        );
        assert_eq!(result["limited"], true);
        assert!(result["bump_stamp"].as_u64().unwrap() > 0);
        assert_eq!(
            state_keys(result, "m.room.member"),
            vec![alice.user_id.clone()]
        );
    }

    // Growing the window sends only the rooms not sent yet.
    let grown = sss(&alice, Some(&pos(&first)), 0, list(11, 5, required.clone()))
        .await
        .ok();
    assert_eq!(grown["lists"]["all"]["count"], 12);
    let mut got: Vec<String> = grown["rooms"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    got.sort();
    let mut expected = newest_first[5..].to_vec();
    expected.sort();
    assert_eq!(got, expected);

    // Back to a small window; a message in the oldest room moves it to the top and it is
    // sent as a delta (it was sent before), the others are not.
    let small = sss(&alice, Some(&pos(&grown)), 0, list(4, 5, required.clone()))
        .await
        .ok();
    assert!(small["rooms"].as_object().unwrap().is_empty(), "{small}");
    let oldest = &rooms[0];
    alice.send_text(oldest, "up", "back on top").await.ok();
    let moved = sss(&alice, Some(&pos(&small)), 0, list(4, 5, required.clone()))
        .await
        .ok();
    assert!(moved["lists"]["all"].get("ops").is_none(), "{moved}");
    assert_eq!(
        fresh_window(&alice, list(4, 5, required.clone()), "all").await[0],
        *oldest
    );
    let result = &moved["rooms"][oldest];
    assert!(result.get("initial").is_none(), "a delta: {result}");
    assert_eq!(bodies(result), vec!["back on top"]);
    assert_eq!(result["num_live"], 1);
    assert_eq!(moved["rooms"].as_object().unwrap().len(), 1);

    // Out of the window, a room misses messages; when it comes back it gets exactly them.
    let pushed_out = &rooms[1];
    let before = sss(&alice, Some(&pos(&moved)), 0, list(0, 5, required.clone()))
        .await
        .ok();
    for n in 0..3 {
        alice
            .send_text(pushed_out, &format!("missed{n}"), &format!("missed {n}"))
            .await
            .ok();
    }
    alice
        .send_text(oldest, "top-again", "still on top")
        .await
        .ok();
    let only_top = sss(&alice, Some(&pos(&before)), 0, list(0, 5, required.clone()))
        .await
        .ok();
    let keys: Vec<&String> = only_top["rooms"].as_object().unwrap().keys().collect();
    assert_eq!(keys, vec![oldest], "only the window's room");
    let regrown = sss(&alice, Some(&pos(&only_top)), 0, list(11, 5, required))
        .await
        .ok();
    let back = &regrown["rooms"][pushed_out];
    assert!(back.get("initial").is_none(), "{back}");
    assert_eq!(bodies(back), vec!["missed 0", "missed 1", "missed 2"]);
    assert_eq!(back["limited"], false);
}

#[tokio::test]
async fn timeline_limit_prev_batch_and_expansion() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "name": "long" })).await;
    for n in 0..30 {
        alice
            .send_text(&room, &format!("m{n}"), &format!("m{n}"))
            .await
            .ok();
    }
    let sub = |limit: u64| json!({ "room_subscriptions": { room.clone(): { "timeline_limit": limit, "required_state": [] } } });
    let first = sss(&alice, None, 0, sub(10)).await.ok();
    let result = &first["rooms"][&room];
    let expected: Vec<String> = (20..30).map(|n| format!("m{n}")).collect();
    assert_eq!(bodies(result), expected);
    assert_eq!(result["limited"], true);
    assert_eq!(result["num_live"], 0);
    // `/messages` from prev_batch continues exactly before the timeline.
    let older = alice
        .page_back(&room, result["prev_batch"].as_str(), None, 7)
        .await;
    let older_bodies: Vec<String> = older
        .iter()
        .filter(|e| e["type"] == "m.room.message")
        .map(|e| e["content"]["body"].as_str().unwrap().to_owned())
        .collect();
    let expected_older: Vec<String> = (0..20).map(|n| format!("m{n}")).collect();
    assert_eq!(older_bodies, expected_older);

    // A new event, then a bigger limit: the timeline is sent again, expanded.
    alice.send_text(&room, "new", "new").await.ok();
    let expanded = sss(&alice, Some(&pos(&first)), 0, sub(20)).await.ok();
    let result = &expanded["rooms"][&room];
    assert_eq!(result["unstable_expanded_timeline"], true, "{result}");
    assert_eq!(bodies(result).len(), 20);
    assert_eq!(bodies(result).last().unwrap(), "new");
    assert_eq!(result["num_live"], 1);
    // Lowering it resends nothing.
    let lowered = sss(&alice, Some(&pos(&expanded)), 0, sub(1)).await.ok();
    assert!(
        lowered["rooms"].as_object().unwrap().is_empty(),
        "{lowered}"
    );
    // More new events than the limit: limited.
    for n in 0..3 {
        alice
            .send_text(&room, &format!("burst{n}"), &format!("burst{n}"))
            .await
            .ok();
    }
    let burst = sss(&alice, Some(&pos(&lowered)), 0, sub(2)).await.ok();
    let result = &burst["rooms"][&room];
    assert_eq!(bodies(result), vec!["burst1", "burst2"]);
    assert_eq!(result["limited"], true);
}

#[tokio::test]
async fn required_state_changes_and_lazy_members() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let carol = server.register("carol").await;
    let dave = server.register("dave").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "name": "Lazy", "topic": "first" }))
        .await;
    for user in [&bob, &carol, &dave] {
        user.join(&room).await.ok();
    }
    bob.send_text(&room, "b", "from bob").await.ok();
    carol.send_text(&room, "c", "from carol").await.ok();
    let config = |required: Value| json!({ "room_subscriptions": { room.clone(): { "timeline_limit": 2, "required_state": required } } });
    let lazy = json!([
        ["m.room.member", "$LAZY"],
        ["m.room.member", "$ME"],
        ["m.room.name", ""]
    ]);
    let first = sss(&alice, None, 0, config(lazy.clone())).await.ok();
    let result = &first["rooms"][&room];
    let mut expected = vec![
        alice.user_id.clone(),
        bob.user_id.clone(),
        carol.user_id.clone(),
    ];
    expected.sort();
    assert_eq!(
        state_keys(result, "m.room.member"),
        expected,
        "senders and me only"
    );
    assert!(state_keys(result, "m.room.topic").is_empty());
    assert_eq!(result["joined_count"], 4);

    // Adding the topic to required_state sends the current topic, with no new event.
    let mut with_topic = lazy.clone();
    with_topic
        .as_array_mut()
        .unwrap()
        .push(json!(["m.room.topic", ""]));
    let added = sss(&alice, Some(&pos(&first)), 0, config(with_topic.clone()))
        .await
        .ok();
    let result = &added["rooms"][&room];
    assert_eq!(
        state_keys(result, "m.room.topic"),
        vec![String::new()],
        "{result}"
    );
    assert!(bodies(result).is_empty());
    // Not asked again: nothing.
    let steady = sss(&alice, Some(&pos(&added)), 0, config(with_topic.clone()))
        .await
        .ok();
    assert!(steady["rooms"].as_object().unwrap().is_empty(), "{steady}");
    // A message from someone whose member event was never sent, the state unchanged: the
    // delta brings their member event and no other state.
    dave.send_text(&room, "d", "from dave").await.ok();
    let spoke = sss(&alice, Some(&pos(&steady)), 0, config(with_topic.clone()))
        .await
        .ok();
    let result = &spoke["rooms"][&room];
    assert_eq!(bodies(result), vec!["from dave"], "{result}");
    assert_eq!(
        state_keys(result, "m.room.member"),
        vec![dave.user_id.clone()],
        "{result}"
    );
    assert!(state_keys(result, "m.room.topic").is_empty(), "{result}");
    assert!(result.get("joined_count").is_none(), "{result}");
    // A membership change of someone who sends nothing reaches a non-limited delta.
    dave.room_action(&room, "leave", json!({})).await.ok();
    let left = sss(&alice, Some(&pos(&spoke)), 0, config(with_topic.clone()))
        .await
        .ok();
    let result = &left["rooms"][&room];
    assert_eq!(
        state_keys(result, "m.room.member"),
        vec![dave.user_id.clone()],
        "{result}"
    );
    assert_eq!(result["joined_count"], 3);
    // Removing the topic from the config, then changing it: not sent as state.
    alice
        .put_state(&room, "m.room.topic", "", json!({ "topic": "second" }))
        .await
        .ok();
    let narrowed = sss(&alice, Some(&pos(&left)), 0, config(lazy)).await.ok();
    let result = &narrowed["rooms"][&room];
    assert!(state_keys(result, "m.room.topic").is_empty(), "{result}");
    // Wildcards: every state event.
    let all = sss(&alice, None, 0, config(json!([["*", "*"]]))).await.ok();
    let result = &all["rooms"][&room];
    assert_eq!(state_keys(result, "m.room.member").len(), 4);
    assert_eq!(state_keys(result, "m.room.topic"), vec![String::new()]);
}

#[tokio::test]
async fn counts_come_from_receipts_too() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let alice_phone = server.client().login("alice", "password").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    let mut last = String::new();
    for n in 0..3 {
        last = bob
            .send_text(&room, &format!("b{n}"), &format!("hi {n}"))
            .await
            .ok()["event_id"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    bob.put(
        &format!("/_matrix/client/v3/rooms/{}/send/m.room.message/mention", enc(&room)),
        json!({ "msgtype": "m.text", "body": "hey alice", "m.mentions": { "user_ids": [alice.user_id] } }),
    )
    .await
    .ok();
    let body = list(9, 1, json!([]));
    let first = sss(&alice, None, 0, body.clone()).await.ok();
    let result = &first["rooms"][&room];
    assert_eq!(result["notification_count"], 4, "{result}");
    assert_eq!(result["highlight_count"], 1);
    let steady = sss(&alice, Some(&pos(&first)), 0, body.clone()).await.ok();
    assert!(steady["rooms"].as_object().unwrap().is_empty());
    // Read on the other device: the room comes with its new counts and nothing else.
    alice_phone
        .post(
            &format!(
                "/_matrix/client/v3/rooms/{}/receipt/m.read/{}",
                enc(&room),
                enc(&last)
            ),
            json!({}),
        )
        .await
        .ok();
    let read = sss(&alice, Some(&pos(&steady)), 0, body).await.ok();
    let result = &read["rooms"][&room];
    assert_eq!(result["notification_count"], 1, "{read}");
    assert_eq!(result["highlight_count"], 1);
    assert!(bodies(result).is_empty());
}

#[tokio::test]
async fn long_poll_wakes_and_keeps_counts() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    let body = list(9, 1, json!([]));
    let first = sss(&alice, None, 0, body.clone()).await.ok();
    let started = Instant::now();
    let empty = sss(&alice, Some(&pos(&first)), 300, body.clone())
        .await
        .ok();
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(
        empty["lists"]["all"]["count"], 1,
        "count in an empty response"
    );
    let waiting = {
        let alice = alice.clone();
        let pos = pos(&empty);
        let body = body.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let response = sss(&alice, Some(&pos), 10_000, body).await.ok();
            (response, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    alice.send_text(&room, "wake", "wake up").await.ok();
    let (response, took) = waiting.await.unwrap();
    assert!(
        took < Duration::from_secs(5),
        "woken, not timed out: {took:?}"
    );
    assert_eq!(bodies(&response["rooms"][&room]), vec!["wake up"]);
}
