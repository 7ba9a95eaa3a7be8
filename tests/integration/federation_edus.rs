//! EDUs of shared rooms across servers: typing, read receipts, presence and device-list
//! updates go to the servers that share the room (or a room with the user) and show in their
//! users' `/sync`; private receipts never leave; a server the room's ACL denies is not heard.

use std::time::Duration;

use serde_json::{json, Value};

use crate::{
    e2ee::{device_keys, upload, Signer},
    presence::{presence_of, put_presence},
    support::{
        client::{enc, timeline},
        federation::{join_remote, pair, put_remote_member, FakeServer},
        wait_until, Client, TestServer,
    },
    typing::{set_typing, typing_users},
};

/// How long an EDU may take to cross (the sender is woken at commit; retries back off).
const CROSSING: Duration = Duration::from_secs(15);

/// Two federating servers, Alice on the first, Bob on the second, and a room of Alice's that
/// Bob joined over federation.
async fn shared_room() -> (TestServer, TestServer, Client, Client, String) {
    let (a, b) = pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "room_version": "12" }))
        .await;
    let joined = bob
        .post(
            &format!(
                "/_matrix/client/v3/join/{}?via={}",
                enc(&room),
                enc(a.server_name())
            ),
            json!({}),
        )
        .await
        .ok();
    assert_eq!(joined["room_id"], room.as_str());
    // Alice's server has Bob's join before anything is sent his way.
    wait_until("Alice's server has Bob joined", CROSSING, || async {
        let members = alice
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/joined_members",
                enc(&room)
            ))
            .await
            .ok();
        members["joined"][&bob.user_id].is_object()
    })
    .await;
    (a, b, alice, bob, room)
}

/// Sends a message and answers its event ID.
async fn send(client: &Client, room: &str, text: &str) -> String {
    let sent = client.send_text(room, text, text).await.ok();
    sent["event_id"].as_str().unwrap().to_owned()
}

/// Waits until `client`'s server serves the event in the room's timeline.
async fn wait_for_event(client: &Client, room: &str, event_id: &str) {
    wait_until("the event reached the other server", CROSSING, || async {
        let sync = client.sync(None, 0, None).await;
        timeline(&sync, room)
            .iter()
            .any(|e| e["event_id"] == event_id)
    })
    .await;
}

/// The users with an `m.read` receipt on `event_id` in a sync's room, with the receipts.
fn readers(sync: &Value, room: &str, event_id: &str) -> Vec<(String, Value)> {
    sync["rooms"]["join"][room]["ephemeral"]["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["type"] == "m.receipt")
        .filter_map(|e| e["content"][event_id]["m.read"].as_object())
        .flat_map(|by_user| by_user.iter().map(|(u, r)| (u.clone(), r.clone())))
        .collect()
}

async fn set_receipt(client: &Client, room: &str, kind: &str, event_id: &str, body: Value) {
    client
        .post(
            &format!(
                "/_matrix/client/v3/rooms/{}/receipt/{kind}/{}",
                enc(room),
                enc(event_id)
            ),
            body,
        )
        .await
        .ok();
}

#[tokio::test]
async fn typing_and_read_receipts_cross_between_two_myelins() {
    let (_a, _b, alice, bob, room) = shared_room().await;

    // Typing both ways, start and stop.
    for (typist, watcher) in [(&alice, &bob), (&bob, &alice)] {
        assert_eq!(set_typing(typist, &room, true, 30_000).await, 200);
        wait_until(
            "the other server shows the user typing",
            CROSSING,
            || async {
                let sync = watcher.sync(None, 0, None).await;
                typing_users(&sync, &room).is_some_and(|users| users.contains(&typist.user_id))
            },
        )
        .await;
        assert_eq!(set_typing(typist, &room, false, 0).await, 200);
        wait_until(
            "the other server shows the typing stopped",
            CROSSING,
            || async {
                let sync = watcher.sync(None, 0, None).await;
                !typing_users(&sync, &room).is_some_and(|users| users.contains(&typist.user_id))
            },
        )
        .await;
    }

    // Bob's message reaches Alice; her public receipt on it (threaded on the main timeline)
    // reaches Bob with its thread.
    let first = send(&bob, &room, "one").await;
    wait_for_event(&alice, &room, &first).await;
    set_receipt(
        &alice,
        &room,
        "m.read",
        &first,
        json!({ "thread_id": "main" }),
    )
    .await;
    wait_until("Bob sees Alice's receipt", CROSSING, || async {
        let sync = bob.sync(None, 0, None).await;
        readers(&sync, &room, &first)
            .iter()
            .any(|(user, r)| user == &alice.user_id && r["thread_id"] == "main")
    })
    .await;
    // And Bob's the other way (unthreaded).
    set_receipt(&bob, &room, "m.read", &first, json!({})).await;
    wait_until("Alice sees Bob's receipt", CROSSING, || async {
        let sync = alice.sync(None, 0, None).await;
        readers(&sync, &room, &first)
            .iter()
            .any(|(user, r)| user == &bob.user_id && r.get("thread_id").is_none())
    })
    .await;

    // A private receipt never reaches Bob's server: a public one sent after it arrives (the
    // outbox keeps order), and Bob's server holds no other receipt of Alice's.
    let second = send(&bob, &room, "two").await;
    let third = send(&bob, &room, "three").await;
    wait_for_event(&alice, &room, &third).await;
    set_receipt(&alice, &room, "m.read.private", &second, json!({})).await;
    set_receipt(&alice, &room, "m.read", &third, json!({})).await;
    wait_until(
        "Bob sees Alice's later public receipt",
        CROSSING,
        || async {
            let sync = bob.sync(None, 0, None).await;
            readers(&sync, &room, &third)
                .iter()
                .any(|(user, _)| user == &alice.user_id)
        },
    )
    .await;
    let sync = bob.sync(None, 0, None).await;
    assert!(readers(&sync, &room, &second).is_empty(), "{sync}");
}

#[tokio::test]
async fn presence_crosses_to_users_sharing_a_room() {
    let (_a, _b, alice, bob, _room) = shared_room().await;
    put_presence(
        &alice,
        json!({ "presence": "unavailable", "status_msg": "far away" }),
    )
    .await
    .ok();
    wait_until("Bob sees Alice's presence", CROSSING, || async {
        let sync = bob
            .get("/_matrix/client/v3/sync?set_presence=offline")
            .await
            .ok();
        presence_of(&sync, &alice.user_id)
            .is_some_and(|p| p["presence"] == "unavailable" && p["status_msg"] == "far away")
    })
    .await;
    let seen = bob
        .get(&format!(
            "/_matrix/client/v3/presence/{}/status",
            enc(&alice.user_id)
        ))
        .await
        .ok();
    assert_eq!(seen["presence"], "unavailable", "{seen}");
    assert_eq!(seen["status_msg"], "far away", "{seen}");
}

#[tokio::test]
async fn a_remote_users_new_device_keys_and_leaving_show_in_device_lists() {
    let (_a, _b, alice, bob, room) = shared_room().await;
    let start = alice.sync(None, 0, None).await;
    let since = start["next_batch"].as_str().unwrap().to_owned();

    let signer = Signer::new(Some(&bob.device_id));
    upload(&bob, json!({ "device_keys": device_keys(&bob, &signer) }))
        .await
        .ok();
    wait_until(
        "Bob is in Alice's device_lists.changed",
        CROSSING,
        || async {
            let sync = alice.sync(Some(&since), 0, None).await;
            sync["device_lists"]["changed"]
                .as_array()
                .is_some_and(|users| users.iter().any(|u| u == bob.user_id.as_str()))
        },
    )
    .await;
    // The update carried the keys: Alice's server answers them from its cache.
    let answer = alice
        .post(
            "/_matrix/client/v3/keys/query",
            json!({ "device_keys": { &bob.user_id: [] } }),
        )
        .await
        .ok();
    assert_eq!(
        answer["device_keys"][&bob.user_id][&bob.device_id]["device_id"],
        bob.device_id.as_str(),
        "{answer}"
    );

    // Bob leaves their only shared room: he is in Alice's device_lists.left.
    let since = alice.next_batch().await;
    bob.room_action(&room, "leave", json!({})).await.ok();
    wait_until("Bob is in Alice's device_lists.left", CROSSING, || async {
        let sync = alice.sync(Some(&since), 0, None).await;
        sync["device_lists"]["left"]
            .as_array()
            .is_some_and(|users| users.iter().any(|u| u == bob.user_id.as_str()))
    })
    .await;
}

/// `/send` with EDUs only from `fake`.
async fn send_edus(fake: &FakeServer, server: &TestServer, txn: &str, edus: Value) {
    let body = json!({
        "origin": fake.name(),
        "origin_server_ts": 1_700_000_000_000u64,
        "pdus": [],
        "edus": edus,
    });
    let (status, answer) = fake
        .request(
            server,
            "PUT",
            &format!("/_matrix/federation/v1/send/{txn}"),
            Some(body),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test]
async fn typing_and_receipts_of_a_server_the_acl_denies_are_dropped() {
    let server = crate::support::federation::federated_server().await;
    // An IP-literal name: ACLs match hosts without ports, and this host is not `localhost`.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let fake = FakeServer::serving(listener, &format!("127.0.0.1:{port}"));
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let carol = fake.user_id("carol");
    let dave = fake.user_id("dave");
    join_remote(&server, &room, &carol).await;
    join_remote(&server, &room, &dave).await;
    let message = send(&alice, &room, "hello").await;
    let typing = |user: &str| json!({ "edu_type": "m.typing", "content": { "room_id": room, "user_id": user, "typing": true } });
    let receipt = |user: &str| {
        json!({ "edu_type": "m.receipt", "content": { &room: { "m.read": { user: {
            "event_ids": [message], "data": { "ts": 1_700_000_000_000u64 } } } } } })
    };

    // Allowed: Carol is shown typing, her receipt is kept; a receipt of another server's
    // user, or a private one, is not.
    send_edus(
        &fake,
        &server,
        "t1",
        json!([
            typing(&carol),
            receipt(&carol),
            receipt("@mallory:elsewhere.example"),
            { "edu_type": "m.receipt", "content": { &room: { "m.read.private": { &dave: {
                "event_ids": [message], "data": {} } } } } },
        ]),
    )
    .await;
    wait_until("Carol is shown typing", CROSSING, || async {
        let sync = alice.sync(None, 0, None).await;
        typing_users(&sync, &room).is_some_and(|users| users == [carol.clone()])
    })
    .await;
    let sync = alice.sync(None, 0, None).await;
    let read: Vec<String> = readers(&sync, &room, &message)
        .into_iter()
        .map(|(user, _)| user)
        .collect();
    assert_eq!(read, std::slice::from_ref(&carol), "{sync}");

    // Denied by the ACL: Dave's typing and receipt are dropped.
    alice
        .put_state(
            &room,
            "m.room.server_acl",
            "",
            json!({ "allow": ["*"], "deny": ["127.0.0.?"] }),
        )
        .await
        .ok();
    send_edus(&fake, &server, "t2", json!([typing(&dave), receipt(&dave)])).await;
    // Receipts are stored before `/send` answers; typing reaches every process through a
    // notification at commit, which takes a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sync = alice.sync(None, 0, None).await;
    assert!(
        typing_users(&sync, &room).is_none_or(|users| !users.contains(&dave)),
        "{sync}"
    );
    assert!(
        !readers(&sync, &room, &message)
            .iter()
            .any(|(user, _)| user == &dave),
        "{sync}"
    );
}

/// What Alice's server sends another server in her room: typing and public receipts, never
/// private ones.
#[tokio::test]
async fn only_public_receipts_leave_the_server() {
    let server = crate::support::federation::federated_server().await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    join_remote(&server, &room, &fake.user_id("carol")).await;
    let first = send(&alice, &room, "one").await;
    let second = send(&alice, &room, "two").await;
    set_receipt(&alice, &room, "m.read.private", &second, json!({})).await;
    set_receipt(&alice, &room, "m.read", &first, json!({})).await;
    assert_eq!(set_typing(&alice, &room, true, 30_000).await, 200);

    let edus = || delivered_edus(&fake);
    wait_until("the fake server got the typing", CROSSING, || async {
        edus().iter().any(|edu| edu["edu_type"] == "m.typing")
    })
    .await;
    let edus = edus();
    let typing: Vec<&Value> = edus
        .iter()
        .filter(|e| e["edu_type"] == "m.typing")
        .collect();
    assert_eq!(
        typing[0]["content"],
        json!({ "room_id": room, "user_id": alice.user_id, "typing": true })
    );
    let receipts: Vec<&Value> = edus
        .iter()
        .filter(|e| e["edu_type"] == "m.receipt")
        .collect();
    assert_eq!(receipts.len(), 1, "{edus:?}");
    let read = &receipts[0]["content"][&room]["m.read"][&alice.user_id];
    assert_eq!(read["event_ids"], json!([first]), "{edus:?}");
    assert!(read["data"]["ts"].is_u64(), "{edus:?}");
    assert!(
        !serde_json::to_string(&edus)
            .unwrap()
            .contains("m.read.private"),
        "{edus:?}"
    );
}

/// The EDUs of the transactions `fake` accepted.
fn delivered_edus(fake: &FakeServer) -> Vec<Value> {
    fake.send_attempts()
        .iter()
        .filter(|attempt| attempt.delivered())
        .flat_map(|attempt| attempt.body["edus"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// Whether `fake` accepted an EDU of type `edu_type`.
fn got_edu(fake: &FakeServer, edu_type: &str) -> bool {
    delivered_edus(fake)
        .iter()
        .any(|edu| edu["edu_type"] == edu_type)
}

/// Typing goes to every server with a joined member in the room, however many members each
/// has, and presence to every server sharing any room with the user; a server whose only
/// member of the room left hears the room's typing no more.
#[tokio::test]
async fn typing_and_presence_reach_every_server_with_a_member_and_no_other() {
    let server = crate::support::federation::federated_server().await;
    let fakes = [
        FakeServer::start().await,
        FakeServer::start().await,
        FakeServer::start().await,
    ];
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    for name in ["carol", "dave", "erin"] {
        join_remote(&server, &room, &fakes[0].user_id(name)).await;
    }
    for name in ["frank", "grace"] {
        join_remote(&server, &room, &fakes[1].user_id(name)).await;
    }
    let gone = fakes[2].user_id("heidi");
    join_remote(&server, &room, &gone).await;
    put_remote_member(&server, &room, &gone, &gone, "leave").await;
    // The third server still shares another room with Alice.
    let other_room = alice.create_room(json!({ "preset": "public_chat" })).await;
    join_remote(&server, &other_room, &fakes[2].user_id("ivan")).await;

    assert_eq!(set_typing(&alice, &room, true, 30_000).await, 200);
    put_presence(&alice, json!({ "presence": "online" }))
        .await
        .ok();
    wait_until(
        "every sharing server got the presence",
        CROSSING,
        || async { fakes.iter().all(|fake| got_edu(fake, "m.presence")) },
    )
    .await;
    wait_until(
        "both servers in the room got the typing",
        CROSSING,
        || async { fakes[..2].iter().all(|fake| got_edu(fake, "m.typing")) },
    )
    .await;
    // Queued in the transaction that queued the others: by now delivered or still waiting.
    assert!(!got_edu(&fakes[2], "m.typing"));
    let waiting = server
        .count(&format!(
            "SELECT count(*) AS n FROM federation_outbox \
             WHERE destination = '{}' AND edu_type = 'm.typing'",
            fakes[2].name()
        ))
        .await;
    assert_eq!(waiting, 0);
}

/// A local user's new device keys and cross-signing keys go to a server sharing a room with
/// them as `m.device_list_update` (chained by `prev_id`) and `m.signing_key_update` (never
/// the user-signing key).
#[tokio::test]
async fn device_and_signing_key_updates_reach_servers_sharing_a_room() {
    let server = crate::support::federation::federated_server().await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    join_remote(&server, &room, &fake.user_id("carol")).await;
    let cross = crate::e2ee::set_up_cross_signing(&alice).await;

    let edus = || delivered_edus(&fake);
    wait_until("the fake server got the signing keys", CROSSING, || async {
        edus()
            .iter()
            .any(|edu| edu["edu_type"] == "m.signing_key_update")
    })
    .await;
    let edus = edus();
    let device: Vec<&Value> = edus
        .iter()
        .filter(|e| e["edu_type"] == "m.device_list_update")
        .map(|e| &e["content"])
        .collect();
    assert_eq!(device.len(), 1, "{edus:?}");
    assert_eq!(device[0]["user_id"], alice.user_id.as_str());
    assert_eq!(device[0]["device_id"], alice.device_id.as_str());
    assert_eq!(device[0]["deleted"], false);
    assert!(device[0]["stream_id"].is_i64(), "{edus:?}");
    assert_eq!(
        device[0]["keys"]["keys"][cross.device.key_id()],
        cross.device.public.as_str()
    );
    let signing = edus
        .iter()
        .find(|e| e["edu_type"] == "m.signing_key_update")
        .unwrap();
    assert_eq!(signing["content"]["user_id"], alice.user_id.as_str());
    assert_eq!(
        signing["content"]["master_key"]["keys"][cross.master.key_id()],
        cross.master.public.as_str()
    );
    assert!(
        signing["content"]["self_signing_key"].is_object(),
        "{signing}"
    );
    assert!(
        signing["content"].get("user_signing_key").is_none(),
        "{signing}"
    );

    // Deleting the device is a later update, chained to the user's previous change (the
    // cross-signing upload is one too: a receiver that missed it resyncs).
    let first_stream = device[0]["stream_id"].as_i64().unwrap();
    alice
        .post("/_matrix/client/v3/logout", json!({}))
        .await
        .ok();
    wait_until("the fake server got the deletion", CROSSING, || async {
        fake.send_attempts().iter().any(|attempt| {
            attempt.body["edus"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["edu_type"] == "m.device_list_update" && e["content"]["deleted"] == true)
        })
    })
    .await;
    let deleted: Vec<Value> = fake
        .send_attempts()
        .iter()
        .flat_map(|attempt| attempt.body["edus"].as_array().cloned().unwrap_or_default())
        .filter(|e| e["edu_type"] == "m.device_list_update" && e["content"]["deleted"] == true)
        .collect();
    let content = &deleted[0]["content"];
    let prev = content["prev_id"].as_array().unwrap();
    assert!(
        prev.len() == 1 && prev[0].as_i64().unwrap() >= first_stream,
        "{content}"
    );
    assert!(content["stream_id"].as_i64().unwrap() > first_stream);
    assert!(content.get("keys").is_none(), "{content}");
}
