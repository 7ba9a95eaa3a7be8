//! Rooms across servers when servers die: killed (SIGKILL) in the middle of a burst, either
//! side, every message arrives once and in order after the restart; a partition in which both
//! sides change the room's state converges to one state once it heals.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{
    client::enc,
    federation::{join_over_federation, quick_pair, state_ids},
    wait_until, Client, TestServer,
};

/// Messages in each burst.
const BURST: usize = 200;

/// The bodies of the messages in `client`'s history of the room, oldest first.
async fn history(client: &Client, room: &str) -> Vec<String> {
    client
        .page_back(room, None, None, 100)
        .await
        .iter()
        .filter(|e| e["type"] == "m.room.message")
        .filter_map(|e| e["content"]["body"].as_str().map(str::to_owned))
        .collect()
}

/// Waits until `client`'s history of the room holds `expected` (in any order and with
/// anything else), then answers that history.
async fn wait_for_history(client: &Client, room: &str, expected: &[String]) -> Vec<String> {
    wait_until("every message has arrived", Duration::from_secs(60), || {
        let (client, room) = (client.clone(), room.to_owned());
        let expected = expected.to_vec();
        async move {
            let seen = history(&client, &room).await;
            expected.iter().all(|body| seen.contains(body))
        }
    })
    .await;
    history(client, room).await
}

/// A room of Alice's on `a` that Bob of `b` has joined.
async fn shared_room(a: &TestServer, b: &TestServer) -> (Client, Client, String) {
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "room_version": "12" }))
        .await;
    join_over_federation(&bob, a, &room).await;
    (alice, bob, room)
}

/// The receiving server is killed a third of the way through a burst and comes back two
/// thirds of the way through: it ends up with every message once, in the order sent.
#[tokio::test]
async fn a_receiver_killed_during_a_burst_gets_every_message_once_in_order() {
    let (a, mut b) = quick_pair().await;
    let (alice, mut bob, room) = shared_room(&a, &b).await;
    let mut sent = Vec::new();
    for n in 0..BURST {
        if n == BURST / 3 {
            b.kill();
        }
        if n == 2 * BURST / 3 {
            b.relaunch().await;
            bob.base = b.base_url.clone();
        }
        let body = format!("burst {n}");
        alice.send_text(&room, &format!("t{n}"), &body).await.ok();
        sent.push(body);
    }
    let seen = wait_for_history(&bob, &room, &sent).await;
    assert_eq!(
        seen, sent,
        "the receiver's history differs from what was sent"
    );
}

/// The sending server is killed halfway through a burst, with events still queued for the
/// other server, and restarted: what it committed reaches the other server once, in order.
#[tokio::test]
async fn a_sender_killed_during_a_burst_delivers_every_message_once_in_order() {
    let (mut a, b) = quick_pair().await;
    let (mut alice, bob, room) = shared_room(&a, &b).await;
    let mut sent = Vec::new();
    for n in 0..BURST {
        if n == BURST / 2 {
            a.kill();
            a.relaunch().await;
            alice.base = a.base_url.clone();
        }
        let body = format!("burst {n}");
        alice.send_text(&room, &format!("t{n}"), &body).await.ok();
        sent.push(body);
    }
    let seen = wait_for_history(&bob, &room, &sent).await;
    assert_eq!(
        seen, sent,
        "the receiver's history differs from what was sent"
    );
    assert_eq!(
        history(&alice, &room).await,
        sent,
        "the sender's own history"
    );
}

/// A partition: each side changes the topic and the power levels while the other is away (one
/// down, then the other). Once both are up, each takes the other's changes, the room's history
/// forks and is resolved, and both servers have the same state; a message after that is seen
/// on both sides.
#[tokio::test]
async fn both_sides_of_a_partition_change_the_state_and_converge() {
    let (mut a, mut b) = quick_pair().await;
    let (mut alice, mut bob, room) = shared_room(&a, &b).await;
    // Bob may change the state too.
    let levels_path = format!(
        "/_matrix/client/v3/rooms/{}/state/m.room.power_levels/",
        enc(&room)
    );
    let mut levels: Value = alice.get(&levels_path).await.ok();
    levels["users"][&bob.user_id] = json!(100);
    alice.put(&levels_path, levels.clone()).await.ok();
    wait_until(
        "bob's server has bob's new power level",
        Duration::from_secs(30),
        || {
            let (bob, path, user) = (bob.clone(), levels_path.clone(), bob.user_id.clone());
            async move { bob.get(&path).await.ok()["users"][&user] == json!(100) }
        },
    )
    .await;

    // Alice's side changes while Bob's is down...
    b.kill();
    alice
        .put_state(&room, "m.room.topic", "", json!({ "topic": "from alice" }))
        .await
        .ok();
    levels["events_default"] = json!(10);
    alice.put(&levels_path, levels.clone()).await.ok();
    // ... then Bob's while Alice's is down.
    a.kill();
    b.relaunch().await;
    bob.base = b.base_url.clone();
    bob.put_state(&room, "m.room.topic", "", json!({ "topic": "from bob" }))
        .await
        .ok();
    let mut bobs_levels: Value = bob.get(&levels_path).await.ok();
    bobs_levels["state_default"] = json!(60);
    bob.put(&levels_path, bobs_levels).await.ok();
    a.relaunch().await;
    alice.base = a.base_url.clone();

    wait_until(
        "both servers have the same room state",
        Duration::from_secs(60),
        || {
            let (alice, bob, room) = (alice.clone(), bob.clone(), room.clone());
            async move {
                let (mut ours, mut theirs) =
                    tokio::join!(state_ids(&alice, &room), state_ids(&bob, &room));
                ours.sort();
                theirs.sort();
                ours == theirs
            }
        },
    )
    .await;
    // Each side's changes reached the other: both forks are in both histories.
    for client in [&alice, &bob] {
        let events = client.page_back(&room, None, None, 100).await;
        let topics: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "m.room.topic")
            .map(|e| &e["content"]["topic"])
            .collect();
        assert!(topics.contains(&&json!("from alice")), "{topics:?}");
        assert!(topics.contains(&&json!("from bob")), "{topics:?}");
    }
    // The room goes on: a message after the merge reaches the other side.
    alice
        .send_text(&room, "after", "after the partition")
        .await
        .ok();
    wait_for_history(&bob, &room, &["after the partition".to_owned()]).await;
}
