//! Typing notifications: delivered in `ephemeral`, expiring by themselves, never stored.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{client::enc, user_id, Client, TestServer};

pub(crate) async fn set_typing(client: &Client, room: &str, typing: bool, timeout: u64) -> u16 {
    let path = format!(
        "/_matrix/client/v3/rooms/{}/typing/{}",
        enc(room),
        enc(&client.user_id)
    );
    client
        .put(&path, json!({ "typing": typing, "timeout": timeout }))
        .await
        .status
        .as_u16()
}

/// The typing users of a room in a sync response, if it carries an `m.typing`.
pub(crate) fn typing_users(sync: &Value, room: &str) -> Option<Vec<String>> {
    sync["rooms"]["join"][room]["ephemeral"]["events"]
        .as_array()?
        .iter()
        .find(|e| e["type"] == "m.typing")
        .map(|e| {
            e["content"]["user_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|u| u.as_str().unwrap().to_owned())
                .collect()
        })
}

/// Long-polls until a sync carries `m.typing` for the room; returns it and the next token.
async fn next_typing(client: &Client, room: &str, since: &str) -> (Vec<String>, String) {
    let mut since = since.to_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let sync = client.sync(Some(&since), 5_000, None).await;
        since = sync["next_batch"].as_str().unwrap().to_owned();
        if let Some(users) = typing_users(&sync, room) {
            return (users, since);
        }
    }
    panic!("no m.typing arrived");
}

#[tokio::test]
async fn typing_reaches_members_and_ends_by_itself() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    let since = bob.next_batch().await;
    let events_before = server.count("SELECT COUNT(*) AS n FROM events").await;

    // Three seconds: long enough that the renewal below lands within the timeout even on a
    // loaded machine (with one second it sometimes came after the expiry, which is news).
    assert_eq!(set_typing(&alice, &room, true, 3_000).await, 200);
    let started = Instant::now();
    let (users, since) = next_typing(&bob, &room, &since).await;
    assert_eq!(users, [user_id("alice")]);
    // A renewal within the timeout is not news.
    assert_eq!(set_typing(&alice, &room, true, 3_000).await, 200);

    let (users, since) = next_typing(&bob, &room, &since).await;
    assert!(users.is_empty(), "typing should have expired: {users:?}");
    let lasted = started.elapsed();
    assert!(
        lasted >= Duration::from_millis(2_900) && lasted < Duration::from_secs(8),
        "typing ended after {lasted:?}"
    );

    // Stopping explicitly is delivered too, and the whole affair left nothing in the database.
    set_typing(&alice, &room, true, 30_000).await;
    let (users, since) = next_typing(&bob, &room, &since).await;
    assert_eq!(users, [user_id("alice")]);
    set_typing(&alice, &room, false, 0).await;
    let (users, _) = next_typing(&bob, &room, &since).await;
    assert!(users.is_empty());
    assert_eq!(
        server.count("SELECT COUNT(*) AS n FROM events").await,
        events_before
    );
    // An initial sync shows nobody typing, and no typing in any timeline.
    let initial = bob.sync(None, 0, None).await;
    assert_eq!(typing_users(&initial, &room), None);
    assert!(!initial
        .to_string()
        .contains("\"type\":\"m.typing\",\"sender\""));
}

#[tokio::test]
async fn typing_is_refused_outside_the_room_and_for_someone_else() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let eve = server.register("eve").await;
    let room = alice.create_room(json!({ "preset": "private_chat" })).await;
    assert_eq!(set_typing(&eve, &room, true, 1_000).await, 403);
    let path = format!(
        "/_matrix/client/v3/rooms/{}/typing/{}",
        enc(&room),
        enc(&user_id("alice"))
    );
    eve.put(&path, json!({ "typing": true, "timeout": 1000 }))
        .await
        .assert_error(403, "M_FORBIDDEN");
    alice
        .put(
            &format!(
                "/_matrix/client/v3/rooms/{}/typing/{}",
                enc(&room),
                enc(&alice.user_id)
            ),
            json!({ "typing": true }),
        )
        .await
        .assert_error(400, "M_BAD_JSON");
}

#[tokio::test]
async fn typing_set_through_one_process_reaches_a_sync_on_another() {
    let server = TestServer::start().await;
    let second = server.second_process().await;
    let alice = server.register("alice").await;
    let mut bob = server.register("bob").await;
    bob.base = second.base_url.clone();
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    let since = bob.next_batch().await;
    set_typing(&alice, &room, true, 10_000).await;
    let (users, _) = next_typing(&bob, &room, &since).await;
    assert_eq!(users, [user_id("alice")]);
}
