//! The message rate limit (Synapse's `rc_message`): every event a user's client sends counts,
//! a burst is followed by 429 `M_LIMIT_EXCEEDED` with `retry_after_ms`, and admins, users with
//! an `override_ratelimit` of 0 and appservice users registered unlimited are never refused.

use serde_json::json;

use crate::support::{
    appservice::FakeAppservice, client::enc, server_name, user_id, Client, ServerOptions,
    TestServer,
};

/// Limits on, with a burst of 5 that refills only once a minute or so.
fn limited() -> ServerOptions {
    ServerOptions::default()
        .env("MYELIN_RATE_LIMITS", "on")
        .env("MYELIN_RATE_LIMIT_MESSAGE_PER_SECOND", "0.02")
        .env("MYELIN_RATE_LIMIT_MESSAGE_BURST", "5")
}

async fn send(client: &Client, room: &str, txn: &str) -> crate::support::client::Response {
    client.send_text(room, txn, txn).await
}

#[tokio::test]
async fn sends_state_redactions_and_joins_share_one_burst_then_429() {
    let server = TestServer::start_with(limited()).await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    // Creating a room is not a message.
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let first = send(&alice, &room, "m1").await.ok();
    send(&alice, &room, "m2").await.ok();
    alice
        .put_state(&room, "m.room.topic", "", json!({ "topic": "limits" }))
        .await
        .ok();
    let redact = format!(
        "/_matrix/client/v3/rooms/{}/redact/{}/r1",
        enc(&room),
        enc(first["event_id"].as_str().unwrap())
    );
    alice.put(&redact, json!({})).await.ok();
    alice
        .room_action(&room, "invite", json!({ "user_id": bob.user_id }))
        .await
        .ok();
    // Five events: the sixth is refused, and says when to come back.
    let refused = send(&alice, &room, "m3").await;
    refused.assert_error(429, "M_LIMIT_EXCEEDED");
    assert!(
        refused.body["retry_after_ms"].as_u64().unwrap() > 0,
        "{}",
        refused.body
    );
    // A retry of a stored transaction is not a new message: it gets its event back.
    assert_eq!(send(&alice, &room, "m1").await.ok(), first);
    // Nothing refused was stored; another user's bucket is their own.
    let messages = alice.page_back(&room, None, None, 50).await;
    assert!(!messages.iter().any(|e| e["content"]["body"] == "m3"));
    bob.join(&room).await.ok();
    send(&bob, &room, "b1").await.ok();
}

#[tokio::test]
async fn admins_and_users_with_a_zero_override_are_not_limited() {
    let server = TestServer::start_with(limited()).await;
    let admin = server.create_admin("root", "rootpassword").await;
    let alice = server.register("alice").await;
    let room = admin.create_room(json!({ "preset": "public_chat" })).await;
    for i in 0..12 {
        send(&admin, &room, &format!("a{i}")).await.ok();
    }
    alice.join(&room).await.ok();
    for i in 0..4 {
        send(&alice, &room, &format!("x{i}")).await.ok();
    }
    send(&alice, &room, "x4")
        .await
        .assert_error(429, "M_LIMIT_EXCEEDED");

    let path = format!(
        "/_synapse/admin/v1/users/{}/override_ratelimit",
        enc(&alice.user_id)
    );
    admin
        .post(&path, json!({ "messages_per_second": 0, "burst_count": 0 }))
        .await
        .ok();
    for i in 5..20 {
        send(&alice, &room, &format!("x{i}")).await.ok();
    }
    // An override with a rate uses that rate and burst instead of the server's.
    admin
        .post(&path, json!({ "messages_per_second": 1, "burst_count": 2 }))
        .await
        .ok();
    // Long enough for that bucket to fill up to its burst.
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let mut accepted = 0;
    for i in 20..30 {
        if send(&alice, &room, &format!("x{i}")).await.status == 200 {
            accepted += 1;
        }
    }
    assert!(
        (2..=5).contains(&accepted),
        "{accepted} sends passed a burst of 2 at 1 per second"
    );
    // Without the override the server's limit applies again.
    admin.delete(&path, json!({})).await.ok();
    send(&alice, &room, "x30")
        .await
        .assert_error(429, "M_LIMIT_EXCEEDED");
}

#[tokio::test]
async fn an_appservice_registered_unlimited_sends_as_its_users_without_limit() {
    let fake = FakeAppservice::start(server_name()).await;
    let server = TestServer::start_with(fake.options(limited())).await;
    let appservice = fake.client(&server);
    let as_user = |path: &str, user: &str| format!("{path}?user_id={}", enc(user));
    let ghost = user_id("echo_flood");
    appservice
        .post(
            &as_user("/_matrix/client/v3/register", &ghost),
            json!({ "type": "m.login.application_service", "username": "echo_flood", "inhibit_login": true }),
        )
        .await
        .ok();
    // Its users (the registration says `rate_limited: false`) and its own user alike.
    for user in [ghost, user_id("echobot")] {
        let room = appservice
            .post(&as_user("/_matrix/client/v3/createRoom", &user), json!({}))
            .await
            .ok()["room_id"]
            .as_str()
            .unwrap()
            .to_owned();
        for i in 0..12 {
            let path = format!(
                "/_matrix/client/v3/rooms/{}/send/m.room.message/t{i}",
                enc(&room)
            );
            appservice
                .put(
                    &as_user(&path, &user),
                    json!({ "msgtype": "m.text", "body": "hi" }),
                )
                .await
                .ok();
        }
    }
}
