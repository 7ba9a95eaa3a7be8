//! The write path's invariants: no skipped or duplicated events under concurrency, one order
//! per room (also across server processes), and transaction-ID idempotency that survives
//! races and restarts.

use std::{
    collections::HashSet,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use diesel_async::RunQueryDsl;
use serde_json::json;

use crate::support::{Client, TestServer};

const SENDERS: usize = 20;
const MESSAGES: usize = 50;

#[derive(diesel::QueryableByName, Debug, Clone)]
struct StreamRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    event_id: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    stream_ordering: i64,
}

#[derive(diesel::QueryableByName)]
struct PduRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    event_id: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    depth: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    prev_events: String,
}

/// Pages the event stream the way a sync reader does: "everything after the last position I
/// saw, up to the persisted-up-to position", until `done` is set and nothing newer exists.
/// Returns what it saw, in order.
async fn read_stream(server: &TestServer, start: i64, done: Arc<AtomicBool>) -> Vec<StreamRow> {
    let mut conn = server.db().await;
    let mut seen = Vec::new();
    let mut since = start;
    loop {
        let finished = AtomicBool::load(&done, Ordering::SeqCst);
        // The persisted-up-to position first, then the rows in a later statement (a later
        // snapshot): everything at or below it was committed before that snapshot.
        let persisted: PositionRow = diesel::sql_query(
            "SELECT persisted AS n FROM myelin_stream_positions() WHERE stream = 'events'",
        )
        .get_result(&mut conn)
        .await
        .unwrap();
        let page: Vec<StreamRow> = diesel::sql_query(format!(
            "SELECT event_id, stream_ordering FROM events WHERE stream_ordering > {since} \
             AND stream_ordering <= {} ORDER BY stream_ordering LIMIT 100",
            persisted.n
        ))
        .load(&mut conn)
        .await
        .unwrap();
        if page.is_empty() && finished {
            return seen;
        }
        if let Some(last) = page.last() {
            since = last.stream_ordering;
        }
        seen.extend(page);
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

async fn max_position(server: &TestServer) -> i64 {
    server
        .count("SELECT COALESCE(MAX(stream_ordering), 0) AS n FROM events")
        .await
}

/// Checks that a room's events form one chain: each event's only prev_event is the one before.
async fn assert_linear_room(server: &TestServer, room_id: &str) {
    let rows: Vec<PduRow> = diesel::sql_query(format!(
        "SELECT event_id, depth, (pdu->'prev_events')::text AS prev_events FROM events \
         WHERE room_id = '{room_id}' ORDER BY stream_ordering"
    ))
    .load(&mut server.db().await)
    .await
    .unwrap();
    for pair in rows.windows(2) {
        assert_eq!(pair[1].depth, pair[0].depth + 1, "depth grows by one");
        let prev: Vec<String> = serde_json::from_str(&pair[1].prev_events).unwrap();
        assert_eq!(
            prev,
            vec![pair[0].event_id.clone()],
            "prev_events is the previous event"
        );
    }
}

async fn concurrent_senders(one_room: bool) {
    let server = TestServer::start().await;
    let owner = server.register("owner").await;
    let shared = owner.create_room(json!({ "preset": "public_chat" })).await;
    let mut senders: Vec<(Client, String)> = Vec::new();
    for i in 0..SENDERS {
        let client = server.register(&format!("sender{i}")).await;
        let room = if one_room {
            shared.clone()
        } else {
            client.create_room(json!({})).await
        };
        if one_room {
            client.join(&room).await.ok();
        }
        senders.push((client, room));
    }

    let start = max_position(&server).await;
    let done = Arc::new(AtomicBool::new(false));
    let server = Arc::new(server);
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (server, done) = (server.clone(), done.clone());
            tokio::spawn(async move { read_stream(&server, start, done).await })
        })
        .collect();
    let tasks: Vec<_> = senders
        .into_iter()
        .map(|(client, room)| {
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for n in 0..MESSAGES {
                    let sent = client
                        .send_text(&room, &format!("txn{n}"), &format!("message {n}"))
                        .await
                        .ok();
                    ids.push(sent["event_id"].as_str().unwrap().to_owned());
                }
                ids
            })
        })
        .collect();
    let mut sent = HashSet::new();
    for task in tasks {
        for id in task.await.unwrap() {
            assert!(sent.insert(id), "an event ID was handed out twice");
        }
    }
    assert_eq!(sent.len(), SENDERS * MESSAGES);
    done.store(true, Ordering::SeqCst);

    let truth: Vec<StreamRow> = diesel::sql_query(format!(
        "SELECT event_id, stream_ordering FROM events WHERE stream_ordering > {start} ORDER BY stream_ordering"
    ))
    .load(&mut server.db().await)
    .await
    .unwrap();
    let truth_ids: Vec<&str> = truth.iter().map(|r| r.event_id.as_str()).collect();
    for reader in readers {
        let seen = reader.await.unwrap();
        let seen_ids: Vec<&str> = seen.iter().map(|r| r.event_id.as_str()).collect();
        assert_eq!(
            seen_ids.len(),
            truth_ids.len(),
            "a reader missed or repeated events"
        );
        assert_eq!(
            seen_ids, truth_ids,
            "every reader sees every event exactly once, in one order"
        );
    }
    assert!(sent.iter().all(|id| truth_ids.contains(&id.as_str())));
    if one_room {
        assert_linear_room(&server, &shared).await;
    }
}

#[tokio::test]
async fn twenty_concurrent_senders_into_one_room_lose_and_duplicate_nothing() {
    concurrent_senders(true).await;
}

#[tokio::test]
async fn twenty_concurrent_senders_into_twenty_rooms_lose_and_duplicate_nothing() {
    concurrent_senders(false).await;
}

#[tokio::test]
async fn two_server_processes_keep_one_order_per_room() {
    let server = TestServer::start().await;
    let second = server.second_process().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    let mut via_second = alice.clone();
    via_second.base = second.base_url.clone();
    let a = {
        let (client, room) = (alice.clone(), room.clone());
        tokio::spawn(async move {
            for n in 0..40 {
                client
                    .send_text(&room, &format!("a{n}"), "first process")
                    .await
                    .ok();
            }
        })
    };
    let b = {
        let room = room.clone();
        tokio::spawn(async move {
            for n in 0..40 {
                via_second
                    .send_text(&room, &format!("b{n}"), "second process")
                    .await
                    .ok();
            }
        })
    };
    a.await.unwrap();
    b.await.unwrap();
    assert_eq!(server.count(&format!("SELECT count(*) AS n FROM events WHERE room_id = '{room}' AND event_type = 'm.room.message'")).await, 80);
    assert_linear_room(&server, &room).await;
}

#[tokio::test]
async fn transaction_ids_are_idempotent_across_races_devices_and_restarts() {
    let mut server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    let count = format!("SELECT count(*) AS n FROM events WHERE room_id = '{room}' AND event_type = 'm.room.message'");

    let first = alice.send_text(&room, "same", "once").await.ok();
    let retry = alice.send_text(&room, "same", "once").await.ok();
    assert_eq!(first["event_id"], retry["event_id"]);

    // Ten racing retries of a new transaction create one event.
    let racers: Vec<_> = (0..10)
        .map(|_| {
            let (client, room) = (alice.clone(), room.clone());
            tokio::spawn(async move {
                client.send_text(&room, "race", "raced").await.ok()["event_id"].clone()
            })
        })
        .collect();
    let mut ids = HashSet::new();
    for racer in racers {
        ids.insert(racer.await.unwrap().as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 1, "racing retries got different events: {ids:?}");
    assert_eq!(server.count(&count).await, 2);

    // Another device with the same transaction ID sends a new event.
    let phone = server.client().login("alice", "password").await;
    let other = phone.send_text(&room, "same", "once").await.ok();
    assert_ne!(other["event_id"], first["event_id"]);
    assert_eq!(server.count(&count).await, 3);

    // After a restart the old transaction still maps to the same event.
    server.restart().await;
    let mut alice = alice;
    alice.base = server.base_url.clone();
    let after_restart = alice.send_text(&room, "same", "once").await.ok();
    assert_eq!(after_restart["event_id"], first["event_id"]);
    assert_eq!(server.count(&count).await, 3);
}

/// createRoom and upgrades store many events in one transaction at provisional positions and
/// take their real ones in one step before commit: none may be left provisional, and the
/// room's events must keep their order.
#[tokio::test]
async fn multi_event_transactions_leave_their_events_in_order_at_real_positions() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "name": "n", "topic": "t",
                             "invite": [bob.user_id], "room_version": "11" }))
        .await;
    bob.join(&room).await.ok();
    alice
        .send_text(&room, "m1", "before the upgrade")
        .await
        .ok();
    let upgraded = alice
        .post(
            &format!(
                "/_matrix/client/v3/rooms/{}/upgrade",
                crate::support::client::enc(&room)
            ),
            json!({ "new_version": "12" }),
        )
        .await
        .ok();
    let new_room = upgraded["replacement_room"].as_str().unwrap();
    for table in [
        "events",
        "room_memberships",
        "event_push_actions",
        "event_relations",
    ] {
        let left = server
            .count(&format!(
                "SELECT count(*) AS n FROM {table} WHERE stream_ordering < 0"
            ))
            .await;
        assert_eq!(left, 0, "provisional positions left in {table}");
    }
    let highest = server
        .count("SELECT max(stream_ordering) AS n FROM events")
        .await;
    let counter = server
        .count("SELECT persisted AS n FROM myelin_stream_positions() WHERE stream = 'events'")
        .await;
    assert_eq!(highest, counter);
    // Depth grows with position in both rooms: the events kept the order they were written in.
    for room_id in [room.as_str(), new_room] {
        let out_of_order = server
            .count(&format!(
                "SELECT count(*) AS n FROM (SELECT depth - lag(depth) OVER (ORDER BY stream_ordering) AS step \
                 FROM events WHERE room_id = '{room_id}') s WHERE step <= 0"
            ))
            .await;
        assert_eq!(out_of_order, 0, "{room_id}");
    }
    // Bob, still in the old room, is told about the tombstone by /sync.
    let sync = bob.sync(None, 0, None).await;
    let timeline = crate::support::client::timeline(&sync, &room);
    assert!(
        timeline.iter().any(|e| e["type"] == "m.room.tombstone"),
        "{sync}"
    );
}

/// Readers never pass a position some transaction has taken and not committed: a message
/// committed above it waits, and `/sync` hands it out (without being woken again) once that
/// transaction is gone, here by rolling back.
#[tokio::test]
async fn a_position_taken_and_not_committed_holds_sync_back_until_its_transaction_ends() {
    use diesel_async::SimpleAsyncConnection;
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    let since = alice.next_batch().await;

    // Another writer takes a position and stays in its transaction.
    let mut writer = server.db().await;
    writer.batch_execute("BEGIN").await.unwrap();
    let held: PositionRow =
        diesel::sql_query("SELECT (myelin_take_positions('events', 1))[1] AS n")
            .get_result(&mut writer)
            .await
            .unwrap();
    let sent = alice
        .send_text(&room, "t1", "after the held one")
        .await
        .ok();
    let event_id = sent["event_id"].as_str().unwrap().to_owned();
    let stored = server
        .count(&format!(
            "SELECT stream_ordering AS n FROM events WHERE event_id = '{event_id}'"
        ))
        .await;
    assert!(stored > held.n, "the message is above the held position");

    let now = alice.sync(Some(&since), 0, None).await;
    assert!(
        crate::support::client::timeline(&now, &room).is_empty(),
        "a message above an uncommitted position was handed out: {now}"
    );
    let events_position: i64 = now["next_batch"].as_str().unwrap()[1..]
        .split('_')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(events_position < held.n, "{now}");

    // A long poll started now is not woken by anything else: it must find the message itself
    // once the holder is gone.
    let waiting = {
        let (alice, since) = (alice.clone(), since.clone());
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            (
                alice.sync(Some(&since), 20_000, None).await,
                started.elapsed(),
            )
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the long poll returned while held back"
    );
    writer.batch_execute("ROLLBACK").await.unwrap();
    let (after, waited) = waiting.await.unwrap();
    let timeline = crate::support::client::timeline(&after, &room);
    assert!(
        timeline.iter().any(|e| e["event_id"] == event_id.as_str()),
        "{after}"
    );
    assert!(
        waited < std::time::Duration::from_secs(5),
        "the message waited {waited:?} for the long poll's timeout"
    );
}

#[derive(diesel::QueryableByName)]
struct PositionRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}
