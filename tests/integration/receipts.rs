//! Read receipts and read markers, delivered through `/sync`'s ephemeral section.

use serde_json::{json, Value};

use crate::support::{client::enc, user_id, Client, TestServer};

fn receipts(sync: &Value, room: &str) -> Vec<Value> {
    sync["rooms"]["join"][room]["ephemeral"]["events"]
        .as_array()
        .map(|events| {
            events
                .iter()
                .filter(|e| e["type"] == "m.receipt")
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// Sends a text message; its event ID.
async fn send(client: &Client, room: &str, txn: &str, text: &str) -> String {
    client.send_text(room, txn, text).await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The user's `m.fully_read` marker in a room.
async fn fully_read(client: &Client, localpart: &str, room: &str) -> Value {
    client
        .get(&format!(
            "/_matrix/client/v3/user/{}/rooms/{}/account_data/m.fully_read",
            enc(&user_id(localpart)),
            enc(room)
        ))
        .await
        .ok()
}

async fn receipt(
    client: &Client,
    room: &str,
    kind: &str,
    event: &str,
) -> crate::support::client::Response {
    let path = format!(
        "/_matrix/client/v3/rooms/{}/receipt/{kind}/{}",
        enc(room),
        enc(event)
    );
    client.post(&path, json!({})).await
}

#[tokio::test]
async fn public_receipts_reach_members_and_private_ones_only_their_owner() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    let first = send(&alice, &room, "1", "one").await;
    let second = send(&alice, &room, "2", "two").await;
    let alice_since = alice.next_batch().await;
    let bob_since = bob.next_batch().await;

    receipt(&bob, &room, "m.read.private", &first).await.ok();
    let alice_view = alice.sync(Some(&alice_since), 0, None).await;
    assert!(
        receipts(&alice_view, &room).is_empty(),
        "a private receipt leaked to another user"
    );
    let bob_view = bob.sync(Some(&bob_since), 0, None).await;
    let own = receipts(&bob_view, &room);
    assert!(own[0]["content"][&first]["m.read.private"][&user_id("bob")]["ts"].is_u64());

    receipt(&bob, &room, "m.read", &second).await.ok();
    let alice_next = alice
        .sync(Some(alice_view["next_batch"].as_str().unwrap()), 0, None)
        .await;
    let public = receipts(&alice_next, &room);
    assert!(
        public[0]["content"][&second]["m.read"][&user_id("bob")].is_object(),
        "{public:?}"
    );
    assert!(
        public[0]["content"].get(&first).is_none(),
        "only what changed since the token"
    );

    // A receipt for an earlier event does not move the read position back.
    receipt(&bob, &room, "m.read", &first).await.ok();
    let after = alice
        .sync(Some(alice_next["next_batch"].as_str().unwrap()), 0, None)
        .await;
    assert!(
        receipts(&after, &room).is_empty(),
        "the read position moved back"
    );
}

#[tokio::test]
async fn read_markers_set_fully_read_and_receipts() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    let event = send(&alice, &room, "1", "one").await;
    let since = alice.next_batch().await;
    let path = format!("/_matrix/client/v3/rooms/{}/read_markers", enc(&room));
    alice
        .post(
            &path,
            json!({ "m.fully_read": event, "m.read.private": event }),
        )
        .await
        .ok();
    let sync = alice.sync(Some(&since), 0, None).await;
    let data = sync["rooms"]["join"][&room]["account_data"]["events"]
        .as_array()
        .unwrap();
    assert!(data
        .iter()
        .any(|e| e["type"] == "m.fully_read" && e["content"]["event_id"] == event.as_str()));
    assert_eq!(receipts(&sync, &room).len(), 1);
    let marker = fully_read(&alice, "alice", &room).await;
    assert_eq!(marker["event_id"], event.as_str());
}

/// `/read_markers` checks every event before it writes: a request naming an event the user
/// cannot mark moves neither its fully-read marker nor its receipt.
#[tokio::test]
async fn read_markers_naming_an_unknown_event_change_nothing() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    let first = send(&alice, &room, "1", "one").await;
    let second = send(&alice, &room, "2", "two").await;
    let path = format!("/_matrix/client/v3/rooms/{}/read_markers", enc(&room));
    alice
        .post(&path, json!({ "m.fully_read": first, "m.read": first }))
        .await
        .ok();
    for body in [
        json!({ "m.fully_read": second, "m.read": "$unknown" }),
        json!({ "m.fully_read": "$unknown", "m.read": second }),
        json!({ "m.fully_read": second, "m.read.private": "$unknown" }),
    ] {
        alice
            .post(&path, body)
            .await
            .assert_error(404, "M_NOT_FOUND");
    }
    let marker = fully_read(&alice, "alice", &room).await;
    assert_eq!(marker["event_id"], first.as_str());
    let sync = alice.sync(None, 0, None).await;
    let read = receipts(&sync, &room);
    assert_eq!(read.len(), 1, "{read:?}");
    assert!(
        read[0]["content"][&first]["m.read"][user_id("alice")].is_object(),
        "{read:?}"
    );
    assert!(read[0]["content"].get(&second).is_none(), "{read:?}");
}

#[tokio::test]
async fn bad_receipts_get_matrix_errors() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let outsider = server.register("outsider").await;
    let room = alice.create_room(json!({})).await;
    let event = send(&alice, &room, "1", "one").await;
    receipt(&alice, &room, "m.read", "$unknown")
        .await
        .assert_error(404, "M_NOT_FOUND");
    receipt(&outsider, &room, "m.read", &event)
        .await
        .assert_error(403, "M_FORBIDDEN");
    let bad_type = receipt(&alice, &room, "m.bogus", &event).await;
    assert_eq!(bad_type.status, 400, "{}", bad_type.body);
}

/// Two first receipts racing (no row to lock yet) never leave the receipt on the older event.
#[tokio::test]
async fn racing_first_receipts_never_leave_the_older_event() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let mut rooms = Vec::new();
    for i in 0..16 {
        let room = alice.create_room(json!({ "preset": "public_chat" })).await;
        bob.join(&room).await.ok();
        let mut events = Vec::new();
        for n in 0..2 {
            let sent = alice.send_text(&room, &format!("{i}-{n}"), "x").await.ok();
            events.push(sent["event_id"].as_str().unwrap().to_owned());
        }
        rooms.push((room, events));
    }
    let kinds = ["m.read", "m.read.private"];
    let races = rooms.iter().flat_map(|(room, events)| {
        kinds.map(|kind| {
            let bob = &bob;
            async move {
                // The newer one first, so the older one usually commits second.
                let (newer, older) = tokio::join!(
                    receipt(bob, room, kind, &events[1]),
                    receipt(bob, room, kind, &events[0]),
                );
                newer.ok();
                older.ok();
            }
        })
    });
    futures_util::future::join_all(races).await;
    let view = bob.sync(None, 0, None).await;
    for (room, events) in &rooms {
        let room_receipts = receipts(&view, room);
        for kind in kinds {
            let read: Vec<&String> = room_receipts
                .iter()
                .flat_map(|r| r["content"].as_object().unwrap().iter())
                .filter(|(_, by)| by[kind].get(bob.user_id.as_str()).is_some())
                .map(|(event, _)| event)
                .collect();
            assert_eq!(read, [&events[1]], "{kind} in {room}");
        }
    }
}
