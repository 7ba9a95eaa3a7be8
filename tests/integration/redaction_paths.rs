//! Redactions, whichever endpoint they come through: one permission check, and a redacted
//! event's content is gone from every way of serving it.

use serde_json::{json, Value};

use crate::support::{client::enc, Client, TestServer};

async fn public_room_with_member(server: &TestServer) -> (Client, Client, String) {
    let alice = server.register("alice").await;
    let mallory = server.register("mallory").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    mallory.join(&room).await.ok();
    (alice, mallory, room)
}

async fn send_text(client: &Client, room: &str, txn: &str, body: &str) -> String {
    client.send_text(room, txn, body).await.ok()["event_id"]
        .as_str()
        .expect("event_id")
        .to_owned()
}

fn redaction_path(room: &str, kind: &str, txn: &str) -> String {
    format!("/_matrix/client/v3/rooms/{}/send/{kind}/{txn}", enc(room))
}

#[tokio::test]
async fn a_redaction_sent_through_send_needs_the_same_power_as_redact() {
    let server = TestServer::start().await;
    let (alice, mallory, room) = public_room_with_member(&server).await;
    let announcement = send_text(&alice, &room, "a1", "announcement from the room admin").await;

    let redact = format!(
        "/_matrix/client/v3/rooms/{}/redact/{}/r1",
        enc(&room),
        enc(&announcement)
    );
    mallory
        .put(&redact, json!({}))
        .await
        .assert_error(403, "M_FORBIDDEN");
    mallory
        .put(
            &redaction_path(&room, "m.room.redaction", "x1"),
            json!({ "redacts": announcement, "reason": "gone" }),
        )
        .await
        .assert_error(403, "M_FORBIDDEN");
    // Nor as state.
    mallory
        .put_state(
            &room,
            "m.room.redaction",
            "",
            json!({ "redacts": announcement }),
        )
        .await
        .assert_error(400, "M_INVALID_PARAM");

    let event = alice.get_event(&room, &announcement).await.ok();
    assert_eq!(event["content"]["body"], "announcement from the room admin");
    let page = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=b&limit=5",
            enc(&room)
        ))
        .await
        .ok();
    assert!(
        page["chunk"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["type"] != "m.room.redaction"),
        "a refused redaction was stored: {page}"
    );
}

#[tokio::test]
async fn a_redaction_sent_through_send_takes_effect_on_the_server() {
    let server = TestServer::start().await;
    let (alice, mallory, room) = public_room_with_member(&server).await;
    let own = send_text(&mallory, &room, "m1", "my own mistake").await;
    let by_admin = send_text(&mallory, &room, "m2", "spam").await;

    // Its sender may redact through /send; so may a moderator.
    for (client, target, txn) in [(&mallory, &own, "x1"), (&alice, &by_admin, "x2")] {
        let redaction = client
            .put(
                &redaction_path(&room, "m.room.redaction", txn),
                json!({ "redacts": target }),
            )
            .await
            .ok();
        let served = alice.get_event(&room, target).await.ok();
        assert_eq!(served["content"], json!({}), "{served}");
        assert_eq!(
            served["unsigned"]["redacted_because"]["event_id"],
            redaction["event_id"]
        );
    }
}

#[tokio::test]
async fn redact_and_send_keep_separate_transaction_ids() {
    let server = TestServer::start().await;
    let (alice, _mallory, room) = public_room_with_member(&server).await;
    let message = send_text(&alice, &room, "same-txn", "to be redacted").await;
    let redaction = alice
        .put(
            &format!(
                "/_matrix/client/v3/rooms/{}/redact/{}/same-txn",
                enc(&room),
                enc(&message)
            ),
            json!({}),
        )
        .await
        .ok();
    assert_ne!(redaction["event_id"], Value::from(message.clone()));
    let served = alice.get_event(&room, &message).await.ok();
    assert_eq!(served["content"], json!({}));
}

#[tokio::test]
async fn federation_format_serves_redacted_events_pruned() {
    let server = TestServer::start().await;
    let (alice, bob, room) = public_room_with_member(&server).await;
    let secret = send_text(&bob, &room, "b1", "my password is hunter2").await;
    bob.put(
        &format!(
            "/_matrix/client/v3/rooms/{}/redact/{}/r1",
            enc(&room),
            enc(&secret)
        ),
        json!({ "reason": "oops" }),
    )
    .await
    .ok();
    let late = server.register("late").await;
    late.join(&room).await.ok();

    let filter = json!({ "event_format": "federation", "room": { "timeline": { "limit": 50 } } })
        .to_string();
    for reader in [&alice, &late] {
        let sync = reader.sync(None, 0, Some(&filter)).await;
        let text = sync.to_string();
        assert!(!text.contains("hunter2"), "redacted content served: {text}");
        let events = sync["rooms"]["join"][&room]["timeline"]["events"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let pdu = events
            .iter()
            .find(|e| e["type"] == "m.room.message" && e["sender"] == bob.user_id)
            .expect("the redacted event is still in the timeline");
        assert_eq!(pdu["content"], json!({}));
        assert!(pdu["signatures"].is_object(), "still a signed PDU: {pdu}");
    }
}

#[tokio::test]
async fn a_redacted_room_name_is_gone_from_the_directory_and_invites() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "visibility": "public" }))
        .await;
    let name = alice
        .put_state(&room, "m.room.name", "", json!({ "name": "Secret plans" }))
        .await
        .ok();
    alice
        .put(
            &format!(
                "/_matrix/client/v3/rooms/{}/redact/{}/r1",
                enc(&room),
                enc(name["event_id"].as_str().unwrap())
            ),
            json!({}),
        )
        .await
        .ok();
    alice
        .room_action(&room, "invite", json!({ "user_id": bob.user_id }))
        .await
        .ok();
    let directory = alice.get("/_matrix/client/v3/publicRooms").await.ok();
    assert!(!directory.to_string().contains("Secret"), "{directory}");
    let invite = bob.sync(None, 0, None).await;
    assert!(
        invite["rooms"]["invite"][&room].is_object(),
        "the invite arrives: {invite}"
    );
    assert!(!invite.to_string().contains("Secret"), "{invite}");
}
