//! Sending our events to the other servers in a room (FEDERATION.md §5 "Sending PDUs",
//! invariants 3, 4 and 7): who gets what, in which order, exactly once, through outages of
//! the destination and restarts of the sender. The destinations are [`FakeServer`]s that
//! record the transactions they get; remote members are written into rooms directly
//! (`join_remote`) until federated joins exist.

use std::time::Duration;

use diesel::{
    sql_query,
    sql_types::{Jsonb, Text},
    QueryableByName,
};
use diesel_async::RunQueryDsl;
use serde_json::{json, Value};

use crate::support::{
    federation::{
        federated_options, free_port, join_remote, put_remote_member, FakeServer, SendAnswer,
    },
    wait_until, Client, TestServer,
};

/// A federating server that retries a failed destination within a fraction of a second.
async fn sending_server() -> TestServer {
    TestServer::start_with(fast_retries()).await
}

fn fast_retries() -> crate::support::ServerOptions {
    federated_options(free_port())
        .env("MYELIN_FEDERATION_RETRY_MIN_MS", "100")
        .env("MYELIN_FEDERATION_RETRY_MAX_MS", "400")
}

/// Sends a text message; answers its event ID.
async fn say(client: &Client, room: &str, text: &str) -> String {
    let sent = client.send_text(room, text, text).await.ok();
    sent["event_id"].as_str().unwrap().to_owned()
}

/// The event ID of the current member event of `user` in `room`.
async fn member_event(server: &TestServer, room: &str, user: &str) -> String {
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = Text)]
        event_id: String,
    }
    let mut db = server.db().await;
    let id: Id = sql_query(
        "SELECT event_id FROM room_current_state \
         WHERE room_id = $1 AND event_type = 'm.room.member' AND state_key = $2",
    )
    .bind::<Text, _>(room)
    .bind::<Text, _>(user)
    .get_result(&mut db)
    .await
    .unwrap();
    id.event_id
}

/// The IDs of the stored events the PDUs are, in order. Each PDU must be a stored PDU exactly,
/// signed, without `unsigned`.
async fn event_ids(server: &TestServer, pdus: &[Value]) -> Vec<String> {
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = Text)]
        event_id: String,
    }
    let mut db = server.db().await;
    let mut ids = Vec::new();
    for pdu in pdus {
        assert!(pdu.get("unsigned").is_none(), "{pdu}");
        assert!(pdu["signatures"][server.server_name()].is_object(), "{pdu}");
        let found: Vec<Id> =
            sql_query("SELECT event_id FROM events WHERE pdu - 'unsigned' = $1::jsonb")
                .bind::<Jsonb, _>(pdu)
                .load(&mut db)
                .await
                .unwrap();
        assert_eq!(found.len(), 1, "not a stored PDU: {pdu}");
        ids.push(found.into_iter().next().unwrap().event_id);
    }
    ids
}

/// Waits until the sender has queued every committed event and has nothing left to send.
async fn wait_until_all_sent(server: &TestServer) {
    wait_until(
        "every event is queued and the outbox is empty",
        Duration::from_secs(60),
        || async {
            server
                .count(
                    "SELECT count(*) AS n FROM federation_pdu_cursor \
                     WHERE stream_ordering >= (SELECT persisted FROM myelin_stream_positions() \
                                               WHERE stream = 'events') \
                       AND NOT EXISTS (SELECT 1 FROM federation_outbox)",
                )
                .await
                == 1
        },
    )
    .await;
}

/// Fails unless `start` was less than `limit` ago: the events went when written, not at the
/// sender's next tick.
fn assert_took_less_than(start: std::time::Instant, limit: Duration) {
    let took = start.elapsed();
    assert!(took < limit, "took {took:?}, not less than {limit:?}");
}

/// Waits until `fake` has been delivered at least `n` PDUs; answers them.
async fn wait_for_pdus(fake: &FakeServer, n: usize, within: Duration) -> Vec<Value> {
    wait_until(&format!("{n} PDUs arrive"), within, || async {
        fake.received_pdus().len() >= n
    })
    .await;
    fake.received_pdus()
}

#[tokio::test]
async fn our_events_reach_the_servers_in_the_room_in_order_exactly_once() {
    let server = sending_server().await;
    let (fake, other) = tokio::join!(FakeServer::start(), FakeServer::start());
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let bob = fake.user_id("bob");
    join_remote(&server, &room, &bob).await;
    // A server whose only member left before we said anything: it gets nothing, and the
    // comings and goings of its user (its events) go nowhere either.
    let carol = other.user_id("carol");
    join_remote(&server, &room, &carol).await;
    put_remote_member(&server, &room, &carol, &carol, "leave").await;

    let m1 = say(&alice, &room, "one").await;
    let topic = alice
        .put_state(&room, "m.room.topic", "", json!({ "topic": "federated" }))
        .await
        .ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let m2 = say(&alice, &room, "two").await;
    // The kick leaves the room without a member of bob's server: it still reaches it (the
    // target's server), and nothing after it does.
    alice
        .room_action(&room, "kick", json!({ "user_id": bob }))
        .await
        .ok();
    let kick = member_event(&server, &room, &bob).await;
    let m3 = say(&alice, &room, "three").await;

    wait_until_all_sent(&server).await;
    let received = fake.received_pdus();
    assert_eq!(
        event_ids(&server, &received).await,
        vec![m1, topic, m2, kick],
        "{received:?}"
    );
    assert!(!event_ids(&server, &received).await.contains(&m3));
    assert!(
        other.send_attempts().is_empty(),
        "{:?}",
        other.send_attempts()
    );
    for attempt in fake.send_attempts() {
        assert_eq!(attempt.body["origin"], server.server_name());
        assert!(attempt.body["pdus"].as_array().unwrap().len() <= 50);
    }
}

#[tokio::test]
async fn events_of_other_servers_are_never_sent_on() {
    let server = sending_server().await;
    let (fake, other) = tokio::join!(FakeServer::start(), FakeServer::start());
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let bob = fake.user_id("bob");
    join_remote(&server, &room, &bob).await;
    let m1 = say(&alice, &room, "before").await;
    // Another server's events, in a room where bob's server is: its members come and go and
    // change their display name.
    let carol = other.user_id("carol");
    join_remote(&server, &room, &carol).await;
    put_remote_member(&server, &room, &carol, &carol, "leave").await;
    join_remote(&server, &room, &carol).await;
    let m2 = say(&alice, &room, "after").await;

    wait_until_all_sent(&server).await;
    assert_eq!(
        event_ids(&server, &fake.received_pdus()).await,
        vec![m1, m2.clone()]
    );
    // carol's server gets what we said while it had a member, never its own events back.
    assert_eq!(event_ids(&server, &other.received_pdus()).await, vec![m2]);
}

#[tokio::test]
async fn a_server_that_was_down_gets_everything_in_order_with_the_same_txn_id() {
    let server = sending_server().await;
    let fake = FakeServer::start().await;
    fake.set_send_answer(SendAnswer::Status(500));
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    join_remote(&server, &room, &fake.user_id("bob")).await;

    // More than one transaction's worth (50 PDUs).
    let mut sent = Vec::new();
    for n in 0..70 {
        sent.push(say(&alice, &room, &format!("m{n}")).await);
    }
    wait_until("three attempts failed", Duration::from_secs(30), || async {
        fake.send_attempts().len() >= 3
    })
    .await;
    // Then it cannot be reached at all for a while.
    fake.set_send_answer(SendAnswer::HangUp);
    let failed = fake.send_attempts().len();
    wait_until(
        "two attempts hung up on",
        Duration::from_secs(30),
        || async { fake.send_attempts().len() >= failed + 2 },
    )
    .await;
    fake.set_send_answer(SendAnswer::Accept);

    let received = wait_for_pdus(&fake, sent.len(), Duration::from_secs(60)).await;
    wait_until_all_sent(&server).await;
    assert_eq!(event_ids(&server, &fake.received_pdus()).await, sent);
    assert_eq!(received.len(), sent.len());

    // Every attempt up to the first 200 was the same transaction, resent unchanged.
    let attempts = fake.send_attempts();
    let first = attempts
        .iter()
        .position(|attempt| attempt.delivered())
        .unwrap();
    assert!(first >= 5, "{attempts:?}");
    for attempt in &attempts[..=first] {
        assert_eq!(attempt.txn_id, attempts[0].txn_id);
        assert_eq!(attempt.body, attempts[0].body);
    }
    // Later transactions are new ones.
    let delivered: Vec<&str> = attempts
        .iter()
        .filter(|attempt| attempt.delivered())
        .map(|attempt| attempt.txn_id.as_str())
        .collect();
    let mut distinct = delivered.clone();
    distinct.dedup();
    assert_eq!(distinct, delivered);
}

#[tokio::test]
async fn a_restart_mid_backlog_loses_and_duplicates_nothing() {
    let mut server = sending_server().await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    join_remote(&server, &room, &fake.user_id("bob")).await;

    let mut sent = Vec::new();
    for n in 0..5 {
        sent.push(say(&alice, &room, &format!("up{n}")).await);
    }
    wait_for_pdus(&fake, 5, Duration::from_secs(30)).await;

    // Down: a backlog builds up, then the sender dies (kill -9) in the middle of it.
    fake.set_send_answer(SendAnswer::Status(503));
    for n in 0..30 {
        sent.push(say(&alice, &room, &format!("down{n}")).await);
    }
    wait_until("an attempt failed", Duration::from_secs(30), || async {
        fake.send_attempts().iter().any(|a| !a.delivered())
    })
    .await;
    let in_flight = fake
        .send_attempts()
        .into_iter()
        .find(|a| !a.delivered())
        .unwrap();
    server.kill();
    server.relaunch().await;
    let mut alice = alice;
    alice.base = server.base_url.clone();
    for n in 0..5 {
        sent.push(say(&alice, &room, &format!("after{n}")).await);
    }
    fake.set_send_answer(SendAnswer::Accept);

    wait_for_pdus(&fake, sent.len(), Duration::from_secs(60)).await;
    wait_until_all_sent(&server).await;
    assert_eq!(event_ids(&server, &fake.received_pdus()).await, sent);
    // The transaction in flight at the kill went again, unchanged, after the restart.
    let resent = fake
        .send_attempts()
        .into_iter()
        .find(|a| a.delivered() && a.txn_id == in_flight.txn_id)
        .expect("the transaction in flight is resent");
    assert_eq!(resent.body, in_flight.body);
}

#[tokio::test]
async fn refused_pdus_do_not_hold_up_the_queue() {
    let server = sending_server().await;
    let fake = FakeServer::start().await;
    fake.set_send_answer(SendAnswer::RefusePdus);
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    join_remote(&server, &room, &fake.user_id("bob")).await;
    let m1 = say(&alice, &room, "refused").await;
    wait_for_pdus(&fake, 1, Duration::from_secs(30)).await;
    fake.set_send_answer(SendAnswer::Accept);
    let m2 = say(&alice, &room, "accepted").await;
    wait_until_all_sent(&server).await;
    // Each went once: a refused PDU is an answer, not a failure to retry.
    assert_eq!(
        event_ids(&server, &fake.received_pdus()).await,
        vec![m1, m2]
    );
    assert!(fake.send_attempts().iter().all(|a| a.delivered()));
}

#[tokio::test]
async fn a_long_backlog_keeps_the_newest_and_the_gap_is_served_by_get_missing_events() {
    let server =
        TestServer::start_with(fast_retries().env("MYELIN_FEDERATION_MAX_QUEUED_PDUS", "5")).await;
    let fake = FakeServer::start().await;
    fake.set_send_answer(SendAnswer::Status(500));
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let join = join_remote(&server, &room, &fake.user_id("bob")).await;
    let mut sent = Vec::new();
    for n in 0..15 {
        sent.push(say(&alice, &room, &format!("m{n}")).await);
    }
    wait_until("everything is queued", Duration::from_secs(30), || async {
        server
            .count(
                "SELECT count(*) AS n FROM federation_pdu_cursor \
                     WHERE stream_ordering >= (SELECT persisted FROM myelin_stream_positions() \
                                               WHERE stream = 'events')",
            )
            .await
            == 1
    })
    .await;
    fake.set_send_answer(SendAnswer::Accept);
    wait_until_all_sent(&server).await;

    // What arrived: in order, the newest five last, the dropped ones not at all.
    let received = event_ids(&server, &fake.received_pdus()).await;
    assert!(received.ends_with(&sent[10..]), "{received:?}");
    let positions: Vec<usize> = received
        .iter()
        .map(|id| sent.iter().position(|s| s == id).unwrap())
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    assert!(received.len() < sent.len(), "{received:?}");

    // Each event after a gap leads back to what bob's server has (the event before the gap,
    // or its join), and the gap is served to it. There may be two gaps: a transaction in
    // flight keeps its body through trims, so when it was built after the first drops it
    // delivers a run of older events before the newest five.
    let gaps: Vec<usize> = (0..positions.len())
        .filter(|&i| positions[i] != if i == 0 { 0 } else { positions[i - 1] + 1 })
        .collect();
    assert!(!gaps.is_empty(), "{positions:?}");
    let mut fetched = Vec::new();
    for i in gaps {
        let earliest = if i == 0 { &join } else { &received[i - 1] };
        let (status, body) = fake
            .request(
                &server,
                "POST",
                &format!(
                    "/_matrix/federation/v1/get_missing_events/{}",
                    crate::support::client::enc(&room)
                ),
                Some(json!({
                    "earliest_events": [earliest],
                    "latest_events": [&received[i]],
                    "limit": 20,
                })),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        fetched.extend(event_ids(&server, body["events"].as_array().unwrap()).await);
    }
    let mut all: Vec<&String> = received.iter().chain(&fetched).collect();
    all.sort_by_key(|id| sent.iter().position(|s| s == *id));
    assert_eq!(all, sent.iter().collect::<Vec<_>>());
}

/// The federation sender's leader lock ("myelfeds").
const SENDER_LOCK: i64 = 0x6d79_656c_6665_6473;

#[tokio::test]
async fn a_lagging_sender_sends_each_event_where_its_room_was_at_that_event() {
    let mut server = sending_server().await;
    let (fake, other) = tokio::join!(FakeServer::start(), FakeServer::start());
    let mut alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let bob = fake.user_id("bob");
    join_remote(&server, &room, &bob).await;

    // The sender stands still (the test holds its leader lock) while the room changes.
    server.kill();
    let mut lock = server.db().await;
    sql_query(format!("SELECT pg_advisory_lock({SENDER_LOCK})"))
        .execute(&mut lock)
        .await
        .unwrap();
    server.relaunch().await;
    alice.base = server.base_url.clone();
    let m1 = say(&alice, &room, "bob is here").await;
    put_remote_member(&server, &room, &bob, &bob, "leave").await;
    let carol = other.user_id("carol");
    join_remote(&server, &room, &carol).await;
    let m2 = say(&alice, &room, "carol is here").await;
    assert_eq!(
        server
            .count("SELECT count(*) AS n FROM federation_outbox")
            .await,
        0
    );

    // Now it catches up: each event goes where the room's members were at that event, not
    // where they are now.
    drop(lock);
    wait_until_all_sent(&server).await;
    assert_eq!(event_ids(&server, &fake.received_pdus()).await, vec![m1]);
    assert_eq!(event_ids(&server, &other.received_pdus()).await, vec![m2]);
}

#[tokio::test]
async fn concurrent_writers_lose_nothing_and_events_leave_in_stream_order() {
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = Text)]
        event_id: String,
    }
    let server = sending_server().await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let rooms = [
        alice.create_room(json!({ "preset": "public_chat" })).await,
        alice.create_room(json!({ "preset": "public_chat" })).await,
    ];
    let mut writers = vec![alice];
    for name in ["bea", "cid", "dee"] {
        let writer = server.register(name).await;
        for room in &rooms {
            writer.join(room).await.ok();
        }
        writers.push(writer);
    }
    for room in &rooms {
        join_remote(&server, room, &fake.user_id("bob")).await;
    }

    // Four writers at once, taking stream positions that commit out of order.
    let sent: Vec<String> =
        futures_util::future::join_all(writers.iter().enumerate().map(|(w, writer)| {
            let rooms = &rooms;
            async move {
                let mut ids = Vec::new();
                for n in 0..20 {
                    let room = &rooms[(w + n) % 2];
                    ids.push(say(writer, room, &format!("w{w}n{n}")).await);
                }
                ids
            }
        }))
        .await
        .into_iter()
        .flatten()
        .collect();

    wait_for_pdus(&fake, sent.len(), Duration::from_secs(60)).await;
    wait_until_all_sent(&server).await;
    let mut db = server.db().await;
    let in_stream_order: Vec<String> =
        sql_query("SELECT event_id FROM events WHERE event_id = ANY($1) ORDER BY stream_ordering")
            .bind::<diesel::sql_types::Array<Text>, _>(&sent)
            .load::<Id>(&mut db)
            .await
            .unwrap()
            .into_iter()
            .map(|row| row.event_id)
            .collect();
    assert_eq!(in_stream_order.len(), sent.len());
    assert_eq!(
        event_ids(&server, &fake.received_pdus()).await,
        in_stream_order
    );
}

#[tokio::test]
async fn a_new_event_leaves_at_once_not_at_the_next_tick() {
    let server = sending_server().await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    join_remote(&server, &room, &fake.user_id("bob")).await;
    // Ten messages one after the other, each sent once the one before arrived. Woken by the
    // commit, each takes tens of milliseconds; left to the sender's one-second tick, the ten
    // would take about five seconds.
    let start = std::time::Instant::now();
    for n in 0..10 {
        say(&alice, &room, &format!("m{n}")).await;
        wait_for_pdus(&fake, n + 1, Duration::from_secs(10)).await;
    }
    // Tick-driven, the ten take about five seconds; woken, well under a second on a quiet
    // machine (the margin is for a loaded CI machine).
    assert_took_less_than(start, Duration::from_secs(4));
    // Membership changes wake the sender too (their writer does not read every member), and
    // so does a ban of another server's user who never joined (its server is told).
    let dave = server.register("dave").await;
    let start = std::time::Instant::now();
    for n in 0..5 {
        match n % 2 {
            0 => dave.join(&room).await.ok(),
            _ => dave.room_action(&room, "leave", json!({})).await.ok(),
        };
        wait_for_pdus(&fake, 11 + n, Duration::from_secs(10)).await;
    }
    let other = FakeServer::start().await;
    alice
        .room_action(
            &room,
            "ban",
            json!({ "user_id": other.user_id("eve"), "reason": "spam" }),
        )
        .await
        .ok();
    wait_for_pdus(&other, 1, Duration::from_secs(10)).await;
    assert_took_less_than(start, Duration::from_secs(3));
}

/// In a room no other server is in, events do not wake the federation sender: each wake-up
/// was a pass of its queue, a database transaction per send. Its one-second tick passes over
/// them, and an event after another server's user joined leaves at once again.
#[tokio::test]
async fn events_of_a_room_of_ours_alone_wake_no_federation_pass() {
    let server =
        TestServer::start_with(fast_retries().env("MYELIN_METRICS_LISTEN", "127.0.0.1:0")).await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let passes = || async {
        crate::metrics::scrape(&server)
            .await
            .sum("myelin_federation_queue_passes_total", &[])
    };
    let before = passes().await;
    let start = std::time::Instant::now();
    for n in 0..40 {
        say(&alice, &room, &format!("m{n}")).await;
    }
    wait_until_all_sent(&server).await;
    // Woken by each send, there would be a pass per message at least; on the tick, one a
    // second (and one more for a wake-up the room's creation left).
    let ticks = start.elapsed().as_secs_f64().ceil();
    let passed = passes().await - before;
    assert!(passed <= ticks + 2.0, "{passed} passes in {ticks} s");

    join_remote(&server, &room, &fake.user_id("bob")).await;
    let start = std::time::Instant::now();
    for n in 0..5 {
        say(&alice, &room, &format!("federated {n}")).await;
        wait_for_pdus(&fake, n + 1, Duration::from_secs(10)).await;
    }
    assert_took_less_than(start, Duration::from_secs(3));
}

/// A burst into one room, to a server that answers `/send` before processing it (any server
/// whose `/version` does not name Myelin; Synapse drops a room's backlog past 100): at most a
/// window's worth not yet processed there, more as the destination shows (`/event`) it has
/// stored them; every one in order, exactly once; another room's events pass meanwhile.
#[tokio::test]
async fn a_burst_into_one_room_waits_for_a_server_that_answers_before_processing() {
    let server =
        TestServer::start_with(fast_retries().env("MYELIN_FEDERATION_ROOM_WINDOW", "10")).await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let (busy, quiet) = tokio::join!(
        alice.create_room(json!({ "preset": "public_chat" })),
        alice.create_room(json!({ "preset": "public_chat" })),
    );
    let bob = fake.user_id("bob");
    join_remote(&server, &busy, &bob).await;
    join_remote(&server, &quiet, &bob).await;
    wait_until_all_sent(&server).await;
    let before = fake.received_pdus().len();

    let mut sent = Vec::new();
    for n in 0..30 {
        sent.push(say(&alice, &busy, &format!("burst {n}")).await);
    }
    let aside = say(&alice, &quiet, "meanwhile").await;
    // The quiet room's message passes the busy room's held-back ones.
    wait_until(
        "the quiet room's message arrives",
        Duration::from_secs(10),
        || async {
            event_ids(&server, &fake.received_pdus()[before..])
                .await
                .contains(&aside)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let so_far = event_ids(&server, &fake.received_pdus()[before..]).await;
    assert_eq!(
        so_far.len(),
        11,
        "a window's worth and the quiet room's one: {so_far:?}"
    );

    // The destination "processes" what it got: it serves each event it received.
    wait_until("all 30 arrive", Duration::from_secs(30), || async {
        for pdu in fake.received_pdus() {
            let id = event_ids(&server, std::slice::from_ref(&pdu))
                .await
                .remove(0);
            fake.serve(
                &format!("/_matrix/federation/v1/event/{id}"),
                json!({ "origin": fake.name(), "origin_server_ts": 1, "pdus": [pdu] }),
            );
        }
        fake.received_pdus().len() >= before + 31
    })
    .await;
    let ids = event_ids(&server, &fake.received_pdus()[before..]).await;
    let busy_ids: Vec<&String> = ids.iter().filter(|id| **id != aside).collect();
    assert_eq!(busy_ids, sent.iter().collect::<Vec<_>>());
    for attempt in fake.send_attempts() {
        assert!(attempt.body["pdus"].as_array().unwrap().len() <= 50);
    }
}

/// Another Myelin processes a transaction's PDUs before it answers, so its answers pace the
/// sender: a burst to it is not held to a window.
#[tokio::test]
async fn a_burst_to_another_myelin_is_not_paced() {
    let slow =
        |options: crate::support::ServerOptions| options.env("MYELIN_FEDERATION_ROOM_WINDOW", "1");
    let (a, b) = tokio::join!(
        TestServer::start_with(slow(fast_retries())),
        TestServer::start_with(slow(fast_retries())),
    );
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "room_version": "11" }))
        .await;
    crate::support::federation::join_over_federation(&bob, &a, &room).await;
    for n in 0..80 {
        say(&alice, &room, &format!("burst {n}")).await;
    }
    // With a window of one and no answers to /event, this would take minutes.
    let start = std::time::Instant::now();
    wait_until(
        "bob's server has all 80",
        Duration::from_secs(30),
        || async {
            let page = bob
                .get(&format!(
                    "/_matrix/client/v3/rooms/{}/messages?dir=b&limit=100",
                    crate::support::client::enc(&room)
                ))
                .await;
            page.status == 200
                && page.ok()["chunk"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|e| {
                        e["content"]["body"]
                            .as_str()
                            .is_some_and(|b| b.starts_with("burst"))
                    })
                    .count()
                    == 80
        },
    )
    .await;
    // Paced with a window of one, the 80 would take at least 80 probe intervals (16 s).
    assert!(
        start.elapsed() < Duration::from_secs(14),
        "{:?}",
        start.elapsed()
    );
}
