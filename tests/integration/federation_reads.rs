//! Room reads served to other servers: `/event`, `/state`, `/state_ids`, `/event_auth`,
//! `/backfill` and `/get_missing_events`, with the room, ACL and history-visibility rules of
//! `service/federation/room_access.rs`.
//!
//! The asking server is a [`FakeServer`] (its own key, X-Matrix-signed requests). Until
//! Federation 2's joins exist, a user of it becomes a member the way a federated join will
//! make one: an `m.room.member` event in the room's DAG and state, written straight into the
//! database by `put_remote_member` (test support). A membership row alone would not be honest here: the
//! history-visibility check reads the origin's memberships from the state at each event.

use std::collections::{BTreeSet, HashMap};

use diesel::{
    sql_query,
    sql_types::{BigInt, Jsonb, Text},
    QueryableByName,
};
use diesel_async::RunQueryDsl;
use rand::Rng;
use serde_json::{json, Value};

use crate::support::{
    client::enc,
    federation::{federated_server, join_remote, put_remote_member, send_raw, FakeServer},
    Client, TestServer,
};

#[derive(QueryableByName)]
struct Stored {
    #[diesel(sql_type = Text)]
    event_id: String,
    #[diesel(sql_type = BigInt)]
    depth: i64,
    #[diesel(sql_type = Jsonb)]
    pdu: Value,
}

/// A room's stored events by ID.
async fn stored_events(server: &TestServer, room: &str) -> HashMap<String, Stored> {
    sql_query("SELECT event_id, depth, pdu FROM events WHERE room_id = $1")
        .bind::<Text, _>(room)
        .load::<Stored>(&mut server.db().await)
        .await
        .unwrap()
        .into_iter()
        .map(|row| (row.event_id.clone(), row))
        .collect()
}

/// Sends a message and answers its event ID.
async fn send(client: &Client, room: &str, text: &str) -> String {
    let txn = format!("t{:016x}", rand::rng().random::<u64>());
    client.send_text(room, &txn, text).await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Sets a state event and answers its event ID.
async fn set_state(client: &Client, room: &str, kind: &str, content: Value) -> String {
    client.put_state(room, kind, "", content).await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The event IDs of the room's current state, as the client API shows it.
async fn current_state_ids(client: &Client, room: &str) -> BTreeSet<String> {
    let state = client
        .get(&format!("/_matrix/client/v3/rooms/{}/state", enc(room)))
        .await
        .ok();
    state
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap().to_owned())
        .collect()
}

/// Every event reachable from `from` through `auth_events` (computed from the stored PDUs).
fn auth_closure(stored: &HashMap<String, Stored>, from: &[&String]) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut todo: Vec<String> = from
        .iter()
        .flat_map(|id| auth_events(&stored[*id].pdu))
        .collect();
    while let Some(id) = todo.pop() {
        if found.insert(id.clone()) {
            todo.extend(auth_events(&stored[&id].pdu));
        }
    }
    found
}

fn auth_events(pdu: &Value) -> Vec<String> {
    pdu["auth_events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap().to_owned())
        .collect()
}

/// A list of event IDs or PDUs from a JSON answer, as a set of strings.
fn set_of(values: &Value) -> BTreeSet<String> {
    values
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {values}"))
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| canonical(v))
        })
        .collect()
}

/// A JSON value as canonical JSON (sorted keys), to compare PDUs as strings.
fn canonical(value: &Value) -> String {
    ruma::CanonicalJsonValue::try_from(value.clone())
        .unwrap()
        .to_string()
}

/// The stored PDUs of `ids`, as a set of strings.
fn pdus_of<'a>(
    stored: &HashMap<String, Stored>,
    ids: impl IntoIterator<Item = &'a String>,
) -> BTreeSet<String> {
    ids.into_iter()
        .map(|id| canonical(&stored[id].pdu))
        .collect()
}

/// A stored PDU as served to a server that may not see it: redacted by the rules of room
/// version 12 (the version rooms are created with).
fn redacted(pdu: &Value) -> Value {
    let object = match ruma::CanonicalJsonValue::try_from(pdu.clone()).unwrap() {
        ruma::CanonicalJsonValue::Object(object) => object,
        other => panic!("not an object: {other}"),
    };
    let rules = ruma::RoomVersionId::V12.rules().unwrap();
    let pruned = ruma::canonical_json::redact(object, &rules.redaction, None).unwrap();
    serde_json::to_value(pruned).unwrap()
}

/// A signed `GET` from `fake` to `server`.
async fn get(fake: &FakeServer, server: &TestServer, uri: &str) -> (u16, Value) {
    fake.request(server, "GET", uri, None).await
}

/// A signed `POST /get_missing_events` from `fake` to `server`.
async fn missing(fake: &FakeServer, server: &TestServer, room: &str, body: Value) -> (u16, Value) {
    let uri = format!("/_matrix/federation/v1/get_missing_events/{}", enc(room));
    fake.request(server, "POST", &uri, Some(body)).await
}

/// The URIs of the six reads, for `event` in `room`.
fn read_uris(room: &str, event: &str) -> Vec<String> {
    let (room, event) = (enc(room), enc(event));
    vec![
        format!("/_matrix/federation/v1/event/{event}"),
        format!("/_matrix/federation/v1/state/{room}?event_id={event}"),
        format!("/_matrix/federation/v1/state_ids/{room}?event_id={event}"),
        format!("/_matrix/federation/v1/event_auth/{room}/{event}"),
        format!("/_matrix/federation/v1/backfill/{room}?v={event}&limit=10"),
    ]
}

/// Asserts that every read of `event` in `room` by `fake` gets `status` and `errcode`.
async fn assert_every_read(
    fake: &FakeServer,
    server: &TestServer,
    room: &str,
    event: &str,
    status: u16,
    errcode: &str,
) {
    for uri in read_uris(room, event) {
        let (got, body) = get(fake, server, &uri).await;
        assert_eq!(
            (got, body["errcode"].as_str()),
            (status, Some(errcode)),
            "{uri}: {body}"
        );
    }
    let (got, body) = missing(
        fake,
        server,
        room,
        json!({ "earliest_events": [], "latest_events": [event] }),
    )
    .await;
    assert_eq!(
        (got, body["errcode"].as_str()),
        (status, Some(errcode)),
        "get_missing_events: {body}"
    );
}

#[tokio::test]
async fn each_read_answers_a_resident_server_in_the_spec_shape() {
    let server = federated_server().await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    join_remote(&server, &room, &fake.user_id("carol")).await;
    let m1 = send(&alice, &room, "one").await;
    let topic1 = set_state(&alice, &room, "m.room.topic", json!({ "topic": "first" })).await;
    let m2 = send(&alice, &room, "two").await;
    let before_topic2 = current_state_ids(&alice, &room).await;
    let topic2 = set_state(&alice, &room, "m.room.topic", json!({ "topic": "second" })).await;
    let m3 = send(&alice, &room, "three").await;
    let now_state = current_state_ids(&alice, &room).await;
    let stored = stored_events(&server, &room).await;

    // `/event`: a transaction of the one stored PDU, signed, nothing added.
    let (status, body) = get(
        &fake,
        &server,
        &format!("/_matrix/federation/v1/event/{}", enc(&m2)),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["origin"], server.server_name());
    assert!(body["origin_server_ts"].is_u64(), "{body}");
    assert_eq!(body["pdus"], json!([stored[&m2].pdu]));
    assert!(body["pdus"][0]["signatures"].is_object() && body["pdus"][0].get("unsigned").is_none());

    // `/state_ids` at a state event: the state before it (the state after a state event is
    // its own group), plus the auth chain of that state.
    let uri = format!(
        "/_matrix/federation/v1/state_ids/{}?event_id={}",
        enc(&room),
        enc(&topic2)
    );
    let (status, body) = get(&fake, &server, &uri).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(set_of(&body["pdu_ids"]), before_topic2);
    assert!(before_topic2.contains(&topic1) && !before_topic2.contains(&topic2));
    let state: Vec<&String> = before_topic2.iter().collect();
    let chain = auth_closure(&stored, &state);
    assert!(!chain.is_empty());
    assert_eq!(set_of(&body["auth_chain_ids"]), chain);

    // At a message, the state before it is the current state.
    let uri = format!(
        "/_matrix/federation/v1/state_ids/{}?event_id={}",
        enc(&room),
        enc(&m3)
    );
    let (status, body) = get(&fake, &server, &uri).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(set_of(&body["pdu_ids"]), now_state);

    // `/state`: the same as PDUs.
    let uri = format!(
        "/_matrix/federation/v1/state/{}?event_id={}",
        enc(&room),
        enc(&topic2)
    );
    let (status, body) = get(&fake, &server, &uri).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(set_of(&body["pdus"]), pdus_of(&stored, &before_topic2));
    assert_eq!(set_of(&body["auth_chain"]), pdus_of(&stored, &chain));

    // `/event_auth`: the event's whole auth chain.
    let uri = format!(
        "/_matrix/federation/v1/event_auth/{}/{}",
        enc(&room),
        enc(&m3)
    );
    let (status, body) = get(&fake, &server, &uri).await;
    assert_eq!(status, 200, "{body}");
    let chain = auth_closure(&stored, &[&m3]);
    assert!(
        chain.len() >= 2,
        "power levels and alice's join at least: {chain:?}"
    );
    assert_eq!(set_of(&body["auth_chain"]), pdus_of(&stored, &chain));

    // `/backfill`: from m3 (included) back, newest first.
    let uri = format!(
        "/_matrix/federation/v1/backfill/{}?v={}&limit=3",
        enc(&room),
        enc(&m3)
    );
    let (status, body) = get(&fake, &server, &uri).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["origin"], server.server_name());
    assert!(body["origin_server_ts"].is_u64(), "{body}");
    let expected: Vec<&Value> = [&m3, &topic2, &m2]
        .iter()
        .map(|id| &stored[*id].pdu)
        .collect();
    assert_eq!(body["pdus"], json!(expected));

    // `/get_missing_events`: between what the asker has and what it saw, oldest first.
    let (status, body) = missing(
        &fake,
        &server,
        &room,
        json!({ "earliest_events": [m1], "latest_events": [m3], "limit": 10 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let expected: Vec<&Value> = [&topic1, &m2, &topic2]
        .iter()
        .map(|id| &stored[*id].pdu)
        .collect();
    assert_eq!(body["events"], json!(expected));
    // Nothing below `min_depth`.
    let (status, body) = missing(
        &fake,
        &server,
        &room,
        json!({ "earliest_events": [], "latest_events": [m3], "min_depth": stored[&m2].depth }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let expected: Vec<&Value> = [&m2, &topic2].iter().map(|id| &stored[*id].pdu).collect();
    assert_eq!(body["events"], json!(expected));
}

#[tokio::test]
async fn a_server_without_a_member_is_forbidden_unless_the_room_is_world_readable() {
    let server = federated_server().await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let message = send(&alice, &room, "members only").await;
    assert_every_read(&fake, &server, &room, &message, 403, "M_FORBIDDEN").await;
    // A room this server does not know gets the same answer.
    let unknown = format!("!unknown:{}", server.server_name());
    for uri in read_uris(&unknown, &message).into_iter().skip(1) {
        let (status, body) = get(&fake, &server, &uri).await;
        assert_eq!(
            (status, body["errcode"].as_str()),
            (403, Some("M_FORBIDDEN")),
            "{uri}: {body}"
        );
    }

    // Once the room is world-readable anyone may read it, but what was sent while it was
    // `shared` stays hidden from a server none of whose users ever joined: served redacted.
    let visibility = set_state(
        &alice,
        &room,
        "m.room.history_visibility",
        json!({ "history_visibility": "world_readable" }),
    )
    .await;
    let open = send(&alice, &room, "for everyone").await;
    let stored = stored_events(&server, &room).await;
    let event = |id: &str| format!("/_matrix/federation/v1/event/{}", enc(id));
    let (status, body) = get(&fake, &server, &event(&open)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["pdus"], json!([stored[&open].pdu]));
    let (status, body) = get(&fake, &server, &event(&message)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["pdus"], json!([redacted(&stored[&message].pdu)]));
    // The change of visibility itself counts as the more open of before and after.
    let (_, body) = get(&fake, &server, &event(&visibility)).await;
    assert_eq!(body["pdus"], json!([stored[&visibility].pdu]));
    let uri = format!(
        "/_matrix/federation/v1/backfill/{}?v={}&limit=3",
        enc(&room),
        enc(&open)
    );
    let (status, body) = get(&fake, &server, &uri).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["pdus"],
        json!([
            stored[&open].pdu,
            stored[&visibility].pdu,
            redacted(&stored[&message].pdu)
        ])
    );
}

#[tokio::test]
async fn events_a_server_may_not_see_are_served_redacted() {
    let server = federated_server().await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let carol = fake.user_id("carol");
    let dave = fake.user_id("dave");
    let event = |id: &str| format!("/_matrix/federation/v1/event/{}", enc(id));

    // `joined`: what was sent before the server's user joined is redacted, the rest whole.
    let room = alice
        .create_room(json!({ "initial_state": [{
            "type": "m.room.history_visibility", "state_key": "",
            "content": { "history_visibility": "joined" },
        }] }))
        .await;
    let before = send(&alice, &room, "before carol").await;
    let join = join_remote(&server, &room, &carol).await;
    let after = send(&alice, &room, "after carol").await;
    let stored = stored_events(&server, &room).await;
    let (_, body) = get(&fake, &server, &event(&before)).await;
    assert_eq!(body["pdus"], json!([redacted(&stored[&before].pdu)]));
    let (_, body) = get(&fake, &server, &event(&after)).await;
    assert_eq!(body["pdus"], json!([stored[&after].pdu]));
    let uri = format!(
        "/_matrix/federation/v1/backfill/{}?v={}&limit=3",
        enc(&room),
        enc(&after)
    );
    let (status, body) = get(&fake, &server, &uri).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["pdus"],
        json!([
            stored[&after].pdu,
            stored[&join].pdu,
            redacted(&stored[&before].pdu)
        ])
    );
    let (status, body) = missing(
        &fake,
        &server,
        &room,
        json!({ "earliest_events": [], "latest_events": [after], "limit": 2 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["events"],
        json!([redacted(&stored[&before].pdu), stored[&join].pdu])
    );

    // `shared`: a user of the server joined after the event, so it is served whole.
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let before = send(&alice, &room, "before carol").await;
    join_remote(&server, &room, &carol).await;
    let stored = stored_events(&server, &room).await;
    let (_, body) = get(&fake, &server, &event(&before)).await;
    assert_eq!(body["pdus"], json!([stored[&before].pdu]));

    // `invited`: from the invite on; any user of the server counts.
    let room = alice
        .create_room(json!({ "initial_state": [{
            "type": "m.room.history_visibility", "state_key": "",
            "content": { "history_visibility": "invited" },
        }] }))
        .await;
    let early = send(&alice, &room, "before the invite").await;
    put_remote_member(&server, &room, &alice.user_id, &carol, "invite").await;
    let invited = send(&alice, &room, "carol is invited").await;
    join_remote(&server, &room, &dave).await;
    let stored = stored_events(&server, &room).await;
    let (_, body) = get(&fake, &server, &event(&early)).await;
    assert_eq!(body["pdus"], json!([redacted(&stored[&early].pdu)]));
    let (_, body) = get(&fake, &server, &event(&invited)).await;
    assert_eq!(body["pdus"], json!([stored[&invited].pdu]));
}

#[tokio::test]
async fn visibility_changes_and_the_origins_own_memberships_count_on_both_sides() {
    let server = federated_server().await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let carol = fake.user_id("carol");
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let visibility = |value: &str| {
        set_state(
            &alice,
            &room,
            "m.room.history_visibility",
            // A key redaction drops, so that a redacted copy differs from the event.
            json!({ "history_visibility": value, "comment": "changed by a test" }),
        )
    };
    let shared = send(&alice, &room, "shared, before carol ever joined").await;
    visibility("world_readable").await;
    let to_joined = visibility("joined").await;
    let hidden = send(&alice, &room, "joined only, carol not there").await;
    let join = join_remote(&server, &room, &carol).await;
    let seen = send(&alice, &room, "carol is there").await;
    let leave = put_remote_member(&server, &room, &carol, &carol, "leave").await;
    let gone = send(&alice, &room, "carol left").await;
    // No user of the server is in the room now: world-readable lets it read at all.
    let to_open = visibility("world_readable").await;
    let stored = stored_events(&server, &room).await;

    for (id, whole, why) in [
        (
            &shared,
            true,
            "shared, and a user of the server joined after it",
        ),
        (&to_joined, true, "world_readable before it"),
        (
            &hidden,
            false,
            "joined only, before the server's user joined",
        ),
        (&join, true, "the server's user joined"),
        (&seen, true, "the server's user was joined"),
        (&leave, true, "the leaving user was joined before it"),
        (&gone, false, "joined only, after the server's user left"),
        (&to_open, true, "world_readable after it"),
    ] {
        let uri = format!("/_matrix/federation/v1/event/{}", enc(id));
        let (status, body) = get(&fake, &server, &uri).await;
        assert_eq!(status, 200, "{why}: {body}");
        let expected = match whole {
            true => stored[id].pdu.clone(),
            false => redacted(&stored[id].pdu),
        };
        assert_eq!(body["pdus"], json!([expected]), "{why}");
    }
}

#[tokio::test]
async fn a_server_the_acl_denies_is_forbidden() {
    let server = federated_server().await;
    // An IP-literal server name: ACLs match hosts without ports, and this host is not the
    // `localhost` the room's own server runs on.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let fake = FakeServer::serving(listener, &format!("127.0.0.1:{port}"));
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    join_remote(&server, &room, &fake.user_id("carol")).await;
    let message = send(&alice, &room, "hello").await;
    let uri = format!("/_matrix/federation/v1/event/{}", enc(&message));
    let (status, body) = get(&fake, &server, &uri).await;
    assert_eq!(status, 200, "{body}");

    let acl = |content: Value| set_state(&alice, &room, "m.room.server_acl", content);
    acl(json!({ "allow": ["*"], "allow_ip_literals": false })).await;
    assert_every_read(&fake, &server, &room, &message, 403, "M_FORBIDDEN").await;
    acl(json!({ "allow": ["*"], "deny": ["127.0.0.?"] })).await;
    assert_every_read(&fake, &server, &room, &message, 403, "M_FORBIDDEN").await;
    acl(json!({ "allow": ["127.*"], "deny": ["evil.example"] })).await;
    let (status, body) = get(&fake, &server, &uri).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn an_event_of_another_room_is_not_found_through_a_room_path() {
    let server = federated_server().await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let carol = fake.user_id("carol");
    let room_a = alice.create_room(json!({ "preset": "public_chat" })).await;
    let room_b = alice.create_room(json!({ "preset": "public_chat" })).await;
    let room_c = alice.create_room(json!({ "preset": "public_chat" })).await;
    join_remote(&server, &room_a, &carol).await;
    join_remote(&server, &room_b, &carol).await;
    let in_b = send(&alice, &room_b, "in B").await;
    let in_c = send(&alice, &room_c, "in C").await;
    let unknown = "$unknownevent";

    // Room-scoped paths answer an event of another room exactly as an unknown event.
    for uri in read_uris(&room_a, &in_b).into_iter().skip(1) {
        let (status, body) = get(&fake, &server, &uri).await;
        let (unknown_status, unknown_body) =
            get(&fake, &server, &uri.replace(&enc(&in_b), &enc(unknown))).await;
        assert_eq!(status, unknown_status, "{uri}: {body}");
        assert_eq!(body["errcode"], unknown_body["errcode"], "{uri}");
        if uri.contains("/backfill/") {
            // Backfill skips events it cannot start from, as a backfilling server names
            // events we may lack.
            assert_eq!((status, &body["pdus"]), (200, &json!([])), "{uri}");
        } else {
            assert_eq!(
                (status, body["errcode"].as_str()),
                (404, Some("M_NOT_FOUND")),
                "{uri}"
            );
        }
    }
    for latest in [&in_b, &unknown.to_owned()] {
        let (status, body) = missing(
            &fake,
            &server,
            &room_a,
            json!({ "earliest_events": [], "latest_events": [latest] }),
        )
        .await;
        assert_eq!((status, &body["events"]), (200, &json!([])), "{body}");
    }

    // `/event` names no room: the event's own room decides.
    let event = |id: &str| format!("/_matrix/federation/v1/event/{}", enc(id));
    assert_eq!(get(&fake, &server, &event(&in_b)).await.0, 200);
    let (status, body) = get(&fake, &server, &event(&in_c)).await;
    assert_eq!(
        (status, body["errcode"].as_str()),
        (403, Some("M_FORBIDDEN")),
        "{body}"
    );
    let (status, body) = get(&fake, &server, &event(unknown)).await;
    assert_eq!(
        (status, body["errcode"].as_str()),
        (404, Some("M_NOT_FOUND")),
        "{body}"
    );
}

#[tokio::test]
async fn backfill_and_get_missing_events_are_capped() {
    let server = federated_server().await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    join_remote(&server, &room, &fake.user_id("carol")).await;
    let mut last = String::new();
    for i in 0..110 {
        last = send(&alice, &room, &format!("message {i}")).await;
    }
    let stored = stored_events(&server, &room).await;
    let depths = |events: &Value| -> Vec<i64> {
        events
            .as_array()
            .unwrap()
            .iter()
            .map(|pdu| pdu["depth"].as_i64().unwrap())
            .collect()
    };
    let tip = stored[&last].depth;

    let uri = format!(
        "/_matrix/federation/v1/backfill/{}?v={}&limit=10000",
        enc(&room),
        enc(&last)
    );
    let (status, body) = get(&fake, &server, &uri).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        depths(&body["pdus"]),
        (tip - 99..=tip).rev().collect::<Vec<_>>()
    );
    let uri = format!(
        "/_matrix/federation/v1/backfill/{}?v={}&limit=0",
        enc(&room),
        enc(&last)
    );
    let (status, body) = get(&fake, &server, &uri).await;
    assert_eq!((status, &body["pdus"]), (200, &json!([])), "{body}");

    let (status, body) = missing(
        &fake,
        &server,
        &room,
        json!({ "earliest_events": [], "latest_events": [last], "limit": 10000 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(depths(&body["events"]), (tip - 20..tip).collect::<Vec<_>>());
    // The default limit is 10.
    let (status, body) = missing(
        &fake,
        &server,
        &room,
        json!({ "earliest_events": [], "latest_events": [last] }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(depths(&body["events"]), (tip - 10..tip).collect::<Vec<_>>());
}

#[tokio::test]
async fn reads_without_a_valid_x_matrix_signature_are_unauthorized() {
    let server = federated_server().await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    join_remote(&server, &room, &fake.user_id("carol")).await;
    let message = send(&alice, &room, "hello").await;
    let body = json!({ "earliest_events": [], "latest_events": [message] });
    let gme = format!("/_matrix/federation/v1/get_missing_events/{}", enc(&room));
    let mut requests: Vec<(&str, String, Option<Value>)> = read_uris(&room, &message)
        .into_iter()
        .map(|uri| ("GET", uri, None))
        .collect();
    requests.push(("POST", gme, Some(body)));
    for (method, uri, body) in requests {
        let bytes = body.as_ref().map(|b| serde_json::to_vec(b).unwrap());
        let (status, answer) = send_raw(&server, method, &uri, bytes.clone(), None).await;
        assert_eq!(
            (status, answer["errcode"].as_str()),
            (401, Some("M_UNAUTHORIZED")),
            "{uri}"
        );
        // Signed for another request.
        let header = fake.sign(
            server.server_name(),
            method,
            "/_matrix/federation/v1/version",
            None,
        );
        let (status, answer) = send_raw(&server, method, &uri, bytes.clone(), Some(header)).await;
        assert_eq!(
            (status, answer["errcode"].as_str()),
            (401, Some("M_UNAUTHORIZED")),
            "{uri}"
        );
        // Signed properly, the same request is answered.
        let header = fake.sign(server.server_name(), method, &uri, body.as_ref());
        let (status, answer) = send_raw(&server, method, &uri, bytes, Some(header)).await;
        assert_eq!(status, 200, "{uri}: {answer}");
    }
}

#[tokio::test]
async fn malformed_reads_get_matrix_errors() {
    let server = federated_server().await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    join_remote(&server, &room, &fake.user_id("carol")).await;
    let message = send(&alice, &room, "hello").await;
    let (room, message) = (enc(&room), enc(&message));
    for uri in [
        format!("/_matrix/federation/v1/state_ids/{room}"),
        format!("/_matrix/federation/v1/state/{room}?event_id=not-an-event-id"),
        format!("/_matrix/federation/v1/backfill/{room}?v={message}"),
        format!("/_matrix/federation/v1/backfill/{room}?v={message}&limit=-1"),
        format!("/_matrix/federation/v1/backfill/{room}?v={message}&limit=many"),
        format!("/_matrix/federation/v1/event_auth/not-a-room/{message}"),
    ] {
        let (status, body) = get(&fake, &server, &uri).await;
        assert_eq!(status, 400, "{uri}: {body}");
        assert!(
            body["errcode"]
                .as_str()
                .is_some_and(|e| e.starts_with("M_")),
            "{uri}: {body}"
        );
    }
    let room_id = alice.create_room(json!({})).await;
    for body in [
        json!({}),
        json!({ "earliest_events": [], "latest_events": "x" }),
        json!([1]),
    ] {
        let (status, answer) = missing(&fake, &server, &room_id, body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            answer["errcode"]
                .as_str()
                .is_some_and(|e| e.starts_with("M_")),
            "{answer}"
        );
    }
}

/// `/timestamp_to_event`: the event nearest a time in either direction, for a server in the
/// room; 404 past the room's last event; 403 for a server with no member.
#[tokio::test]
async fn timestamp_to_event_finds_the_nearest_event_for_a_server_in_the_room() {
    let server = federated_server().await;
    let (fake, outsider) = tokio::join!(FakeServer::start(), FakeServer::start());
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    join_remote(&server, &room, &fake.user_id("carol")).await;
    let mut sent = Vec::new();
    for text in ["one", "two", "three"] {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        sent.push(send(&alice, &room, text).await);
    }
    let stored = stored_events(&server, &room).await;
    let ts = |id: &String| stored[id].pdu["origin_server_ts"].as_i64().unwrap();
    let uri = |ts: i64, dir: &str| {
        format!(
            "/_matrix/federation/v1/timestamp_to_event/{}?ts={ts}&dir={dir}",
            enc(&room)
        )
    };
    let (status, body) = get(&fake, &server, &uri(ts(&sent[1]), "f")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["event_id"], sent[1].as_str());
    assert_eq!(body["origin_server_ts"], ts(&sent[1]));
    let (status, body) = get(&fake, &server, &uri(ts(&sent[1]) - 1, "b")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["event_id"], sent[0].as_str());
    let (status, body) = get(&fake, &server, &uri(ts(&sent[2]) + 60_000, "f")).await;
    assert_eq!((status, &body["errcode"]), (404, &json!("M_NOT_FOUND")));
    let (status, body) = get(&outsider, &server, &uri(ts(&sent[1]), "f")).await;
    assert_eq!((status, &body["errcode"]), (403, &json!("M_FORBIDDEN")));
}
