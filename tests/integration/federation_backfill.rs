//! Backfill: a user who joins a room of another server pages back through its history from
//! before the join (`/messages` asks the resident for it, `/backfill`, with `/state` where the
//! history reaches beyond what this server holds); what comes back is history only, never news
//! in `/sync` and never unread, and visible only as the room's history visibility allows.

use serde_json::{json, Value};

use crate::support::federation::join_over_federation;

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
