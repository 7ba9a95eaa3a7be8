//! Backfill: a user who joins a room of another server pages back through its history from
//! before the join (`/messages` asks the resident for it, `/backfill`, with `/state` where the
//! history reaches beyond what this server holds); what comes back is history only, never news
//! in `/sync` and never unread, and visible only as the room's history visibility allows. A
//! server back from an outage fills the gap in what it missed the same ways.

use serde_json::{json, Value};

use crate::support::{
    client::enc,
    federation::{federated_options, free_port, join_over_federation, quick_retries},
    TestServer,
};

fn bodies(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == "m.room.message")
        .filter_map(|e| e["content"]["body"].as_str().map(str::to_owned))
        .collect()
}

/// 150 messages (more than one `/backfill` answers) and a topic change among them: the joiner
/// pages back through all of it, in order, down to the room's creation, with the state of
/// each point (the old topic before the change).
#[tokio::test]
async fn a_joiner_pages_back_through_history_from_before_the_join() {
    let (a, b) = crate::support::federation::pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    for version in ["11", "12"] {
        let room = alice
            .create_room(json!({
                "preset": "public_chat", "room_version": version, "topic": "first topic",
            }))
            .await;
        let mut sent = Vec::new();
        for n in 0..150 {
            if n == 75 {
                alice
                    .put_state(
                        &room,
                        "m.room.topic",
                        "",
                        json!({ "topic": "second topic" }),
                    )
                    .await
                    .ok();
            }
            let body = format!("before the join {n}");
            alice
                .send_text(&room, &format!("m{version}-{n}"), &body)
                .await
                .ok();
            sent.push(body);
        }
        join_over_federation(&bob, &a, &room).await;
        let synced = bob.sync(None, 0, None).await;
        let since = synced["next_batch"].as_str().unwrap().to_owned();

        let history = bob.page_back(&room, None, None, 40).await;
        assert_eq!(
            bodies(&history),
            sent,
            "room {version}: history missing or out of order"
        );
        assert_eq!(
            history[0]["type"], "m.room.create",
            "room {version}: {:?}",
            history[0]
        );
        let topics: Vec<&Value> = history
            .iter()
            .filter(|e| e["type"] == "m.room.topic")
            .map(|e| &e["content"]["topic"])
            .collect();
        assert_eq!(topics, [&json!("first topic"), &json!("second topic")]);

        // Backfilled history is not news: the next sync has nothing new, and nothing is unread.
        let next = bob.sync(Some(&since), 0, None).await;
        let timeline = crate::support::client::timeline(&next, &room);
        assert!(timeline.is_empty(), "room {version}: {next}");
        let unread = &synced["rooms"]["join"][&room]["unread_notifications"]["notification_count"];
        assert_eq!(unread, &json!(0), "room {version}: {synced}");

        // The same pages again come from what is stored now: no change, no duplicates.
        let again = bob.page_back(&room, None, None, 40).await;
        let ids = |events: &[Value]| -> Vec<String> {
            events
                .iter()
                .map(|e| e["event_id"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(ids(&again), ids(&history), "room {version}");
    }
}

/// In a room whose history is visible to members only from their join, the joiner's server
/// backfills the earlier events but its user sees none of them.
#[tokio::test]
async fn backfilled_history_is_shown_only_as_history_visibility_allows() {
    let (a, b) = crate::support::federation::pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    let room = alice
        .create_room(json!({
            "preset": "public_chat", "room_version": "11",
            "initial_state": [{
                "type": "m.room.history_visibility", "state_key": "",
                "content": { "history_visibility": "joined" },
            }],
        }))
        .await;
    for n in 0..5 {
        alice
            .send_text(&room, &format!("secret{n}"), &format!("secret {n}"))
            .await
            .ok();
    }
    join_over_federation(&bob, &a, &room).await;
    alice.send_text(&room, "after", "after the join").await.ok();
    crate::support::wait_until(
        "bob's server has the message sent after the join",
        std::time::Duration::from_secs(30),
        || {
            let (bob, room) = (bob.clone(), room.clone());
            async move {
                let history = bob.page_back(&room, None, None, 50).await;
                bodies(&history).contains(&"after the join".to_owned())
            }
        },
    )
    .await;
    let history = bob.page_back(&room, None, None, 50).await;
    assert_eq!(bodies(&history), ["after the join"], "{history:?}");
    let stored = b
        .count(&format!(
            "SELECT count(*) AS n FROM events WHERE room_id = '{room}' \
             AND event_type = 'm.room.message' AND NOT outlier"
        ))
        .await;
    assert_eq!(
        stored, 6,
        "the earlier messages were backfilled, only hidden"
    );
}

/// A server that was down gets only the newest of what it missed (the sender keeps a bounded
/// backlog, as Synapse's catch-up sends only the newest event per room); it fills the gap by
/// asking for the missing events and ends up with the whole history, in order.
#[tokio::test]
async fn a_server_back_from_an_outage_fills_the_gap_with_get_missing_events() {
    missed_messages_arrive_in_order(15).await;
}

/// A gap wider than `get_missing_events` answers (20): the newest event is taken with the state
/// before it as the sender gives it (`/state`), and what lies between is backfilled.
#[tokio::test]
async fn a_gap_too_wide_for_get_missing_events_is_bridged_by_state_and_backfill() {
    missed_messages_arrive_in_order(45).await;
}

/// Alice sends `missed` messages while Bob's server is down; once it is back, Bob's history
/// holds every one of them, in order.
async fn missed_messages_arrive_in_order(missed: usize) {
    let (a, mut b) = tokio::join!(
        TestServer::start_with(
            quick_retries(federated_options(free_port()))
                .env("MYELIN_FEDERATION_MAX_QUEUED_PDUS", "5")
        ),
        TestServer::start_with(quick_retries(federated_options(free_port()))),
    );
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "room_version": "11" }))
        .await;
    join_over_federation(&bob, &a, &room).await;

    b.kill();
    let mut sent = Vec::new();
    for n in 0..missed {
        let body = format!("while away {n}");
        let answer = alice
            .send_text(&room, &format!("away{n}"), &body)
            .await
            .ok();
        sent.push(answer["event_id"].as_str().unwrap().to_owned());
    }
    crate::support::wait_until(
        "every message is queued for the server that is down",
        std::time::Duration::from_secs(30),
        || async {
            a.count(
                "SELECT count(*) AS n FROM federation_pdu_cursor \
                 WHERE stream_ordering >= (SELECT persisted FROM myelin_stream_positions() \
                                           WHERE stream = 'events')",
            )
            .await
                == 1
        },
    )
    .await;
    b.relaunch().await;
    let mut bob = bob;
    bob.base = b.base_url.clone();
    crate::support::wait_until(
        "bob's server has every message",
        std::time::Duration::from_secs(30),
        || {
            let bob = bob.clone();
            let room = room.clone();
            let sent = sent.clone();
            async move {
                let page = bob
                    .get(&format!(
                        "/_matrix/client/v3/rooms/{}/messages?dir=b&limit=100",
                        enc(&room)
                    ))
                    .await;
                page.status == 200
                    && page.ok()["chunk"].as_array().is_some_and(|c| {
                        sent.iter()
                            .all(|id| c.iter().any(|e| e["event_id"] == id.as_str()))
                    })
            }
        },
    )
    .await;
    let page = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=b&limit=100",
            enc(&room)
        ))
        .await
        .ok();
    let mut seen: Vec<String> = page["chunk"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "m.room.message")
        .map(|e| e["event_id"].as_str().unwrap().to_owned())
        .collect();
    seen.reverse();
    assert_eq!(
        seen, sent,
        "bob's server is missing some of the history, or has it out of order"
    );
}
