//! `/sync`'s rooms in full: the state section against the timeline, state events as the event
//! endpoint serves them, many rooms built in batches and lazy-loaded members.

use serde_json::{json, Value};

use crate::support::{
    client::{enc, timeline},
    server_name, user_id, TestServer,
};

/// `value` without any `age` (it moves between two reads).
fn without_ages(mut value: Value) -> Value {
    match &mut value {
        Value::Object(map) => {
            map.remove("age");
            for (_, v) in map.iter_mut() {
                *v = without_ages(v.take());
            }
        }
        Value::Array(items) => {
            for v in items.iter_mut() {
                *v = without_ages(v.take());
            }
        }
        _ => {}
    }
    value
}

#[tokio::test]
async fn a_full_state_sync_serves_each_state_event_as_the_event_endpoint_does() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "name": "State" }))
        .await;
    bob.join(&room).await.ok();
    let avatar = json!({ "url": format!("mxc://{}/avatar", server_name()) });
    alice
        .put_state(&room, "m.room.avatar", "", avatar)
        .await
        .ok();
    let tricky = json!({
        "text": "quote \" backslash \\ tab \t accent é emoji 🎉 control \u{1}",
        "big": 9007199254740991_i64,
        "negative": -5,
        "nested": { "list": [1, { "none": null }], "yes": true, "empty": {} },
    });
    alice
        .put_state(
            &room,
            "com.example.tricky",
            "key with spaces",
            tricky.clone(),
        )
        .await
        .ok();
    let topic = alice
        .put_state(&room, "m.room.topic", "", json!({ "topic": "secret" }))
        .await
        .ok();
    let topic_id = topic["event_id"].as_str().unwrap();
    let redact = format!(
        "/_matrix/client/v3/rooms/{}/redact/{}/r1",
        enc(&room),
        enc(topic_id)
    );
    alice.put(&redact, json!({ "reason": "oops" })).await.ok();

    // Timeline limit 1: the state section holds all but the redaction.
    let one = json!({ "room": { "timeline": { "limit": 1 } } });
    let full = bob.sync(None, 0, Some(&one.to_string())).await;
    let state = full["rooms"]["join"][&room]["state"]["events"]
        .as_array()
        .unwrap()
        .clone();
    let current = bob
        .get(&format!("/_matrix/client/v3/rooms/{}/state", enc(&room)))
        .await
        .ok();
    let mut served: Vec<&str> = state
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    let mut expected: Vec<&str> = current
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    // The sync's state ends before its timeline (the redaction, not a state event).
    let timeline_ids: Vec<&str> = timeline(&full, &room)
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    expected.retain(|id| !timeline_ids.contains(id));
    served.sort();
    expected.sort();
    assert_eq!(served, expected);
    let members = bob
        .get(&format!("/_matrix/client/v3/rooms/{}/members", enc(&room)))
        .await
        .ok();
    let members = members["chunk"].as_array().unwrap();
    assert_eq!(members.len(), 2, "{members:?}");
    let left = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/members?membership=leave",
            enc(&room)
        ))
        .await
        .ok();
    assert_eq!(left["chunk"], json!([]));
    // Each read path that serves state as its parts serves what `/event` serves; a sync's
    // events without their room ID (`ClientEventWithoutRoomID`: the room is their key).
    let in_sync = state.iter().map(|event| (event, true));
    let elsewhere = current.as_array().unwrap().iter().chain(members);
    for (event, from_sync) in in_sync.chain(elsewhere.map(|event| (event, false))) {
        let mut alone = bob
            .get_event(&room, event["event_id"].as_str().unwrap())
            .await
            .ok();
        assert_eq!(alone["room_id"], room.as_str());
        if from_sync {
            alone.as_object_mut().unwrap().remove("room_id");
            if let Some(redaction) = alone["unsigned"].get_mut("redacted_because") {
                redaction.as_object_mut().unwrap().remove("room_id");
            }
        }
        assert_eq!(without_ages(event.clone()), without_ages(alone), "{event}");
        assert!(event["unsigned"]["age"].as_i64().is_some(), "{event}");
    }
    for event in timeline(&full, &room) {
        assert!(event.get("room_id").is_none(), "{event}");
    }
    let of_type = |kind: &str| {
        state
            .iter()
            .find(|e| e["type"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in {state:?}"))
            .clone()
    };
    assert_eq!(of_type("com.example.tricky")["content"], tricky);
    assert_eq!(
        of_type("com.example.tricky")["state_key"],
        "key with spaces"
    );
    let redacted = of_type("m.room.topic");
    assert_eq!(redacted["content"], json!({}));
    assert_eq!(
        redacted["unsigned"]["redacted_because"]["content"]["reason"],
        "oops"
    );

    // Filters apply to state read as its parts as they do to whole events.
    let state_with = |mut filter: Value| {
        let bob = bob.clone();
        let room = room.clone();
        filter["room"]["timeline"] = json!({ "limit": 1 });
        async move {
            let sync = bob.sync(None, 0, Some(&filter.to_string())).await;
            sync["rooms"]["join"][&room]["state"]["events"]
                .as_array()
                .unwrap()
                .clone()
        }
    };
    let with_url = state_with(json!({ "room": { "state": { "contains_url": true } } })).await;
    let types: Vec<&str> = with_url
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, vec!["m.room.avatar"]);
    let without_url = state_with(json!({ "room": { "state": { "contains_url": false } } })).await;
    assert_eq!(without_url.len(), state.len() - 1);
    assert!(without_url.iter().all(|e| e["type"] != "m.room.avatar"));
    let fields = state_with(json!({
        "event_fields": ["type", "content.text"],
        "room": { "state": { "types": ["com.example.tricky"] } },
    }))
    .await;
    assert_eq!(
        fields,
        vec![json!({ "type": "com.example.tricky", "content": { "text": tricky["text"] } })]
    );
}

#[tokio::test]
async fn the_state_section_is_the_state_before_the_timeline_in_full_and_limited_syncs() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "name": "Old" }))
        .await;
    bob.join(&room).await.ok();
    let since = bob.next_batch().await;
    alice
        .put_state(&room, "m.room.topic", "", json!({ "topic": "first" }))
        .await
        .ok();
    for i in 0..3 {
        alice
            .send_text(&room, &format!("m{i}"), "between")
            .await
            .ok();
    }
    alice
        .put_state(&room, "m.room.name", "", json!({ "name": "New" }))
        .await
        .ok();
    alice
        .put_state(&room, "m.room.topic", "", json!({ "topic": "second" }))
        .await
        .ok();
    alice.send_text(&room, "last", "last").await.ok();

    let three = json!({ "room": { "timeline": { "limit": 3 } } }).to_string();
    let content_of = |sync: &Value, kind: &str| -> Vec<Value> {
        sync["rooms"]["join"][&room]["state"]["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == kind)
            .map(|e| e["content"].clone())
            .collect()
    };
    // Full: the timeline is the new name, the second topic and the last message; the state
    // before it has the old name and the first topic.
    let full = bob.sync(None, 0, Some(&three)).await;
    assert_eq!(timeline(&full, &room).len(), 3);
    assert_eq!(
        content_of(&full, "m.room.name"),
        vec![json!({ "name": "Old" })]
    );
    assert_eq!(
        content_of(&full, "m.room.topic"),
        vec![json!({ "topic": "first" })]
    );
    // Limited since the token: what changed before the timeline (the first topic), not what
    // the timeline itself changes.
    let limited = bob.sync(Some(&since), 0, Some(&three)).await;
    assert_eq!(limited["rooms"]["join"][&room]["timeline"]["limited"], true);
    assert_eq!(content_of(&limited, "m.room.name"), Vec::<Value>::new());
    assert_eq!(
        content_of(&limited, "m.room.topic"),
        vec![json!({ "topic": "first" })]
    );
}

/// A sync builds its rooms in batches, each batch's newest events read in one statement and
/// their relations in another: every room, on either side of a batch's end, gets its own
/// newest events, its own `limited` and its own events' relations.
#[tokio::test]
async fn every_room_of_a_many_room_sync_gets_its_own_newest_events_and_relations() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    // More rooms than one batch (32), with zero to three messages each.
    let rooms = alice.rooms_with_messages(34).await;
    // An edited message with a thread in the first room and in the last (another batch).
    let send = |room: &str, txn: &str, content: Value| {
        // Transaction IDs are the device's, across rooms.
        let path = format!(
            "/_matrix/client/v3/rooms/{}/send/m.room.message/{txn}-{}",
            enc(room),
            enc(room)
        );
        let alice = &alice;
        async move {
            alice.put(&path, content).await.ok()["event_id"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let mut related = Vec::new();
    for room in [&rooms[0], &rooms[33]] {
        let original = send(
            room,
            "o",
            json!({ "msgtype": "m.text", "body": "original" }),
        )
        .await;
        let edit = send(
            room,
            "e",
            json!({
                "msgtype": "m.text",
                "body": "* edited",
                "m.new_content": { "msgtype": "m.text", "body": "edited" },
                "m.relates_to": { "rel_type": "m.replace", "event_id": original },
            }),
        )
        .await;
        let reply = send(
            room,
            "r",
            json!({
                "msgtype": "m.text",
                "body": "in the thread",
                "m.relates_to": { "rel_type": "m.thread", "event_id": original },
            }),
        )
        .await;
        related.push((room.clone(), original, edit, reply));
    }

    let limit = 8;
    let filter = json!({ "room": { "timeline": { "limit": limit } } }).to_string();
    let sync = alice.sync(None, 0, Some(&filter)).await;
    let joined = sync["rooms"]["join"].as_object().unwrap();
    assert_eq!(joined.len(), rooms.len());
    let mut limited_rooms = 0;
    for room in &rooms {
        let history = alice.page_back(room, None, None, 50).await;
        let ids = |events: Vec<&Value>| -> Vec<String> {
            events
                .iter()
                .map(|e| e["event_id"].as_str().unwrap().to_owned())
                .collect()
        };
        let newest = ids(history
            .iter()
            .skip(history.len().saturating_sub(limit))
            .collect());
        assert_eq!(ids(timeline(&sync, room)), newest, "{room}");
        let limited = history.len() > limit;
        assert_eq!(joined[room]["timeline"]["limited"], limited, "{room}");
        limited_rooms += usize::from(limited);
        let bundled: Vec<&Value> = timeline(&sync, room)
            .into_iter()
            .filter(|e| e["unsigned"].get("m.relations").is_some())
            .collect();
        match related.iter().find(|(r, ..)| r == room) {
            Some((_, original, edit, reply)) => {
                assert_eq!(bundled.len(), 1, "{room}: {bundled:?}");
                let relations = &bundled[0]["unsigned"]["m.relations"];
                assert_eq!(bundled[0]["event_id"], original.as_str());
                assert_eq!(relations["m.replace"]["event_id"], edit.as_str());
                assert_eq!(
                    relations["m.thread"]["latest_event"]["event_id"],
                    reply.as_str()
                );
                assert_eq!(relations["m.thread"]["count"], 1);
            }
            None => assert!(bundled.is_empty(), "{room}: {bundled:?}"),
        }
    }
    // Both kinds of room were there.
    assert!(
        limited_rooms > 0 && limited_rooms < rooms.len(),
        "{limited_rooms}"
    );
}

/// A first sync's filter: timeline limit 1, lazy-loaded members or not, and a type excluded
/// that no other round's filter names, so no response is served from an earlier one's.
fn first_sync_filter(round: usize, lazy: bool) -> String {
    json!({ "room": {
        "timeline": { "limit": 1, "not_types": [format!("never.{round}")] },
        "state": { "lazy_load_members": lazy },
    } })
    .to_string()
}

/// A joined room's state events in a sync response.
fn joined_state<'s>(sync: &'s Value, room: &str) -> &'s Vec<Value> {
    sync["rooms"]["join"][room]["state"]["events"]
        .as_array()
        .unwrap()
}

/// The user IDs of a joined room's member events in a sync response's state, sorted.
fn state_members(sync: &Value, room: &str) -> Vec<String> {
    let mut members: Vec<String> = joined_state(sync, room)
        .iter()
        .filter(|e| e["type"] == "m.room.member")
        .map(|e| e["state_key"].as_str().unwrap().to_owned())
        .collect();
    members.sort();
    members
}

#[tokio::test]
async fn each_room_of_a_sync_gets_its_own_state_and_lazy_loaded_members() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let carol = server.register("carol").await;
    let dave = server.register("dave").await;
    let names = ["A", "B", "C"];
    let mut rooms = Vec::new();
    for name in names {
        let room = json!({ "preset": "public_chat", "name": name });
        rooms.push(alice.create_room(room).await);
    }
    // Bob and carol are in A and B, whose last messages are from one each; C ends with dave's
    // join, and he had no member event before it.
    for room in &rooms[..2] {
        bob.join(room).await.ok();
        carol.join(room).await.ok();
    }
    dave.join(&rooms[2]).await.ok();
    bob.send_text(&rooms[0], "a", "from bob").await.ok();
    carol.send_text(&rooms[1], "b", "from carol").await.ok();

    let state_of = |sync: &Value, room: &str| -> (Vec<String>, Value) {
        let name = joined_state(sync, room)
            .iter()
            .find(|e| e["type"] == "m.room.name")
            .map_or(Value::Null, |e| e["content"]["name"].clone());
        (state_members(sync, room), name)
    };
    let users = |names: &[&str]| -> Vec<String> { names.iter().map(|n| user_id(n)).collect() };
    // Each twice: the first sync reads the state events, the second serves them from memory.
    for (round, lazy) in [(0, true), (1, true), (2, false), (3, false)] {
        let sync = alice
            .sync(None, 0, Some(&first_sync_filter(round, lazy)))
            .await;
        let expected = match lazy {
            true => [users(&["alice", "bob"]), users(&["alice", "carol"])],
            false => [
                users(&["alice", "bob", "carol"]),
                users(&["alice", "bob", "carol"]),
            ],
        };
        for (i, room) in rooms.iter().enumerate() {
            let members = expected
                .get(i)
                .cloned()
                .unwrap_or_else(|| users(&["alice"]));
            assert_eq!(
                state_of(&sync, room),
                (members, json!(names[i])),
                "room {}, lazy {lazy}",
                names[i]
            );
        }
    }
}

/// A lazy-loading sync reads a small state group's member entries whole and looks up the wanted
/// members one by one in a big one: here alice's and the first joiner's member events sit in a
/// skip delta of 32 changes, more than four times the two wanted members, so the lookups must
/// find them (the small groups are the other test's).
#[tokio::test]
async fn a_lazy_sync_finds_members_whose_events_sit_in_a_big_state_group() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let joiners = server.register_joined(&room, "joiner", 30).await;
    joiners[0]
        .send_text(&room, "t", "from the first")
        .await
        .ok();

    for (round, lazy) in [(0, true), (1, true), (2, false)] {
        let sync = alice
            .sync(None, 0, Some(&first_sync_filter(round, lazy)))
            .await;
        let members = state_members(&sync, &room);
        let mut expected = vec![user_id("alice"), user_id("joiner0")];
        if !lazy {
            expected.extend((1..30).map(|i| user_id(&format!("joiner{i}"))));
        }
        expected.sort();
        assert_eq!(members, expected, "lazy {lazy}");
    }
}
