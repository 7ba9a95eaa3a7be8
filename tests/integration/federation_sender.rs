//! Federation transactions: the durable sender (to-device messages across servers, through a
//! kill -9 of the receiver) and `PUT /_matrix/federation/v1/send/{txnId}` (limits, origin
//! checks, idempotency, EDU checks).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{
    federation::{federated_options, federated_server, free_port, join_remote, pair, FakeServer},
    wait_until, Client, TestServer,
};

/// Syncs `client` from `since` until at least `want` to-device events of type `event_type`
/// arrived (panics after `within`); answers them and the next token.
async fn to_device_events(
    client: &Client,
    since: Option<String>,
    event_type: &str,
    want: usize,
    within: Duration,
) -> (Vec<Value>, String) {
    let deadline = Instant::now() + within;
    let mut since = since;
    let mut events = Vec::new();
    loop {
        let synced = client.sync(since.as_deref(), 1000, None).await;
        events.extend(
            synced["to_device"]["events"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["type"] == event_type)
                .cloned(),
        );
        since = Some(synced["next_batch"].as_str().unwrap().to_owned());
        if events.len() >= want {
            return (events, since.unwrap());
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {want} {event_type} messages arrived within {within:?}",
            events.len()
        );
    }
}

/// `PUT /sendToDevice` of one message to one device.
async fn send_to_device(from: &Client, txn: &str, event_type: &str, to: &Client, content: Value) {
    from.put(
        &format!("/_matrix/client/v3/sendToDevice/{event_type}/{txn}"),
        json!({ "messages": { &to.user_id: { &to.device_id: content } } }),
    )
    .await
    .ok();
}

/// Waits until `server` has nothing queued for other servers.
async fn wait_until_outbox_empty(server: &TestServer) {
    wait_until(
        "the federation outbox is empty",
        Duration::from_secs(60),
        || async {
            server
                .count("SELECT count(*) AS n FROM federation_outbox")
                .await
                == 0
        },
    )
    .await;
}

#[tokio::test]
async fn to_device_messages_cross_servers_both_ways() {
    let (a, b) = pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;

    send_to_device(
        &alice,
        "t1",
        "m.test.hello",
        &bob,
        json!({ "from": "alice" }),
    )
    .await;
    let (events, _) =
        to_device_events(&bob, None, "m.test.hello", 1, Duration::from_secs(30)).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["sender"], a.user_id("alice"));
    assert_eq!(events[0]["content"], json!({ "from": "alice" }));

    // The reverse, to all of alice's devices.
    bob.put(
        "/_matrix/client/v3/sendToDevice/m.test.reply/t1",
        json!({ "messages": { &alice.user_id: { "*": { "from": "bob" } } } }),
    )
    .await
    .ok();
    let (events, _) =
        to_device_events(&alice, None, "m.test.reply", 1, Duration::from_secs(30)).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["sender"], b.user_id("bob"));
    assert_eq!(events[0]["content"], json!({ "from": "bob" }));

    // A retried request (same txnId) queues nothing twice.
    send_to_device(
        &alice,
        "t1",
        "m.test.hello",
        &bob,
        json!({ "from": "alice" }),
    )
    .await;
    wait_until_outbox_empty(&a).await;
    let synced = bob.sync(None, 0, None).await;
    let hellos = synced["to_device"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "m.test.hello")
        .count();
    assert_eq!(hellos, 1, "{synced}");
}

#[tokio::test]
async fn to_device_messages_survive_a_kill_of_the_receiver_and_arrive_exactly_once() {
    // The sender retries quickly so the test does not wait out a long backoff.
    let sender_options = federated_options(free_port())
        .env("MYELIN_FEDERATION_RETRY_MIN_MS", "100")
        .env("MYELIN_FEDERATION_RETRY_MAX_MS", "400");
    let (a, mut b) = tokio::join!(
        TestServer::start_with(sender_options),
        TestServer::start_with(federated_options(free_port())),
    );
    let alice = a.register("alice").await;
    let mut bob = b.register("bob").await;

    const TOTAL: u64 = 200;
    for seq in 0..TOTAL {
        if seq == 60 {
            // Some were delivered, some are queued or in flight: the receiver dies.
            b.kill();
        }
        send_to_device(
            &alice,
            &format!("txn{seq}"),
            "m.test.seq",
            &bob,
            json!({ "seq": seq }),
        )
        .await;
    }
    assert!(
        a.count("SELECT count(*) AS n FROM federation_outbox").await > 0,
        "messages are queued while the receiver is down"
    );
    // Back on the same database and federation port (the port is part of its name).
    b.relaunch().await;
    bob.base = b.base_url.clone();

    let (events, since) = to_device_events(
        &bob,
        None,
        "m.test.seq",
        TOTAL as usize,
        Duration::from_secs(120),
    )
    .await;
    wait_until_outbox_empty(&a).await;
    // Nothing more arrives once the sender has nothing left: no duplicates.
    let (late, _) = to_device_events(&bob, Some(since), "m.test.seq", 0, Duration::ZERO).await;
    let mut seqs: Vec<u64> = events
        .iter()
        .chain(&late)
        .map(|e| {
            assert_eq!(e["sender"], a.user_id("alice"));
            e["content"]["seq"].as_u64().unwrap()
        })
        .collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..TOTAL).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_backed_off_server_gets_its_messages_as_soon_as_it_contacts_us() {
    // A first retry 30 s to 2 min after a failure: far beyond this test's wait, unless the
    // backoff ends when the destination shows up.
    let sender_options = federated_options(free_port())
        .env("MYELIN_FEDERATION_RETRY_MIN_MS", "60000")
        .env("MYELIN_FEDERATION_RETRY_MAX_MS", "120000");
    let (a, mut b) = tokio::join!(
        TestServer::start_with(sender_options),
        TestServer::start_with(federated_options(free_port())),
    );
    let alice = a.register("alice").await;
    let mut bob = b.register("bob").await;
    b.kill();
    send_to_device(&alice, "t1", "m.test.late", &bob, json!({ "n": 1 })).await;
    wait_until(
        "the sender has failed once and backed off",
        Duration::from_secs(30),
        || async {
            a.count("SELECT count(*) AS n FROM federation_destinations WHERE failures > 0")
                .await
                == 1
        },
    )
    .await;
    b.relaunch().await;
    bob.base = b.base_url.clone();
    // bob writes to alice: B's transaction authenticates at A, which ends B's backoff.
    bob.put(
        "/_matrix/client/v3/sendToDevice/m.test.ping/t1",
        json!({ "messages": { &alice.user_id: { &alice.device_id: {} } } }),
    )
    .await
    .ok();
    let (events, _) = to_device_events(&bob, None, "m.test.late", 1, Duration::from_secs(20)).await;
    assert_eq!(events[0]["content"], json!({ "n": 1 }));
}

#[tokio::test]
async fn with_federation_off_nothing_is_queued_for_other_servers() {
    let server =
        TestServer::start_with(federated_options(free_port()).env("MYELIN_FEDERATION", "off"))
            .await;
    let alice = server.register("alice").await;
    let remote = "@bob:remote.example.org";
    // Nor our events, in a room with a member on another server.
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    join_remote(&server, &room, remote).await;
    alice.send_text(&room, "t1", "local only").await.ok();
    alice
        .put(
            "/_matrix/client/v3/sendToDevice/m.test/t1",
            json!({ "messages": { remote: { "*": {} }, &alice.user_id: { "*": { "own": 1 } } } }),
        )
        .await
        .ok();
    // The local part is delivered; nothing waits for the other server.
    let (events, _) = to_device_events(&alice, None, "m.test", 1, Duration::ZERO).await;
    assert_eq!(events[0]["content"], json!({ "own": 1 }));
    // Longer than the sender's tick, were it running.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        server
            .count("SELECT count(*) AS n FROM federation_outbox")
            .await,
        0
    );
}

/// A `/send` body from `fake` with the given EDUs.
fn txn_body(fake: &FakeServer, pdus: Vec<Value>, edus: Vec<Value>) -> Value {
    json!({
        "origin": fake.name(),
        "origin_server_ts": 1_700_000_000_000u64,
        "pdus": pdus,
        "edus": edus,
    })
}

/// An `m.direct_to_device` EDU from `sender` to one device.
fn to_device_edu(sender: &str, message_id: &str, to: &Client, content: Value) -> Value {
    json!({
        "edu_type": "m.direct_to_device",
        "content": {
            "sender": sender,
            "type": "m.test.fed",
            "message_id": message_id,
            "messages": { &to.user_id: { &to.device_id: content } },
        },
    })
}

/// The contents of the `m.test.fed` messages a device has now.
async fn fed_messages(client: &Client) -> Vec<Value> {
    let synced = client.sync(None, 0, None).await;
    synced["to_device"]["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["type"] == "m.test.fed")
        .map(|e| e["content"].clone())
        .collect()
}

#[tokio::test]
async fn send_replayed_and_concurrent_applies_once_with_the_same_answer() {
    let server = TestServer::start_with(federated_options(free_port())).await;
    let fake = FakeServer::start().await;
    let bob = server.register("bob").await;
    let eve = fake.user_id("eve");

    // One PDU (refused until rooms across servers exist) shows the answer is stored.
    let pdu = json!({
        "room_id": "!nowhere:example.org",
        "sender": eve,
        "type": "m.room.message",
        "content": { "body": "hi" },
        "origin_server_ts": 1,
        "depth": 1,
        "prev_events": [],
        "auth_events": [],
        "hashes": { "sha256": "abc" },
        "signatures": {},
    });
    let body = txn_body(
        &fake,
        vec![pdu],
        vec![to_device_edu(&eve, "m1", &bob, json!({ "n": 1 }))],
    );
    let first = fake
        .request(
            &server,
            "PUT",
            "/_matrix/federation/v1/send/txn1",
            Some(body.clone()),
        )
        .await;
    assert_eq!(first.0, 200, "{first:?}");
    let pdus = first.1["pdus"].as_object().unwrap();
    assert_eq!(pdus.len(), 1, "{first:?}");
    assert!(pdus.values().all(|v| v["error"].is_string()), "{first:?}");
    let again = fake
        .request(
            &server,
            "PUT",
            "/_matrix/federation/v1/send/txn1",
            Some(body),
        )
        .await;
    assert_eq!(again, first);

    // Five copies of one transaction at once.
    let body = txn_body(
        &fake,
        vec![],
        vec![to_device_edu(&eve, "m2", &bob, json!({ "n": 2 }))],
    );
    let answers = futures_util::future::join_all((0..5).map(|_| {
        fake.request(
            &server,
            "PUT",
            "/_matrix/federation/v1/send/txn2",
            Some(body.clone()),
        )
    }))
    .await;
    for answer in &answers {
        assert_eq!(answer, &(200, json!({ "pdus": {} })));
    }

    // The same message ID again in a new transaction is not delivered again.
    let body = txn_body(
        &fake,
        vec![],
        vec![to_device_edu(&eve, "m2", &bob, json!({ "n": 2 }))],
    );
    let third = fake
        .request(
            &server,
            "PUT",
            "/_matrix/federation/v1/send/txn3",
            Some(body),
        )
        .await;
    assert_eq!(third.0, 200, "{third:?}");

    let mut got = fed_messages(&bob).await;
    got.sort_by_key(|c| c["n"].as_u64());
    assert_eq!(got, vec![json!({ "n": 1 }), json!({ "n": 2 })]);
}

#[tokio::test]
async fn send_refuses_too_many_pdus_or_edus_and_a_foreign_origin() {
    let server = TestServer::start_with(federated_options(free_port())).await;
    let fake = FakeServer::start().await;
    let bob = server.register("bob").await;
    let eve = fake.user_id("eve");
    let good = to_device_edu(&eve, "m1", &bob, json!({ "n": 1 }));

    let pdus = vec![json!({ "type": "m.room.message" }); 51];
    let (status, answer) = fake
        .request(
            &server,
            "PUT",
            "/_matrix/federation/v1/send/big1",
            Some(txn_body(&fake, pdus, vec![good.clone()])),
        )
        .await;
    assert_eq!(
        (status, answer["errcode"].as_str()),
        (400, Some("M_TOO_LARGE"))
    );

    let edus = vec![good.clone(); 101];
    let (status, answer) = fake
        .request(
            &server,
            "PUT",
            "/_matrix/federation/v1/send/big2",
            Some(txn_body(&fake, vec![], edus)),
        )
        .await;
    assert_eq!(
        (status, answer["errcode"].as_str()),
        (400, Some("M_TOO_LARGE"))
    );

    let mut body = txn_body(&fake, vec![], vec![good.clone()]);
    body["origin"] = json!("someone-else.example.org");
    let (status, answer) = fake
        .request(
            &server,
            "PUT",
            "/_matrix/federation/v1/send/other",
            Some(body),
        )
        .await;
    assert_eq!(
        (status, answer["errcode"].as_str()),
        (403, Some("M_FORBIDDEN"))
    );
    assert!(answer["error"].is_string());

    // Nothing of a refused transaction was applied or remembered: the same txnId, now
    // valid, is applied.
    assert!(fed_messages(&bob).await.is_empty());
    let (status, _) = fake
        .request(
            &server,
            "PUT",
            "/_matrix/federation/v1/send/other",
            Some(txn_body(&fake, vec![], vec![good])),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(fed_messages(&bob).await, vec![json!({ "n": 1 })]);
}

#[tokio::test]
async fn send_drops_bad_edus_and_applies_the_good_ones() {
    let server = TestServer::start_with(federated_options(free_port())).await;
    let fake = FakeServer::start().await;
    let bob = server.register("bob").await;
    let eve = fake.user_id("eve");

    // A sender on another server (here: the receiver itself) is not the origin's to claim.
    let forged = to_device_edu(
        &server.user_id("mallory"),
        "f1",
        &bob,
        json!({ "forged": 1 }),
    );
    let (status, answer) = fake
        .request(
            &server,
            "PUT",
            "/_matrix/federation/v1/send/forged",
            Some(txn_body(&fake, vec![], vec![forged])),
        )
        .await;
    assert_eq!((status, answer), (200, json!({ "pdus": {} })));
    assert!(fed_messages(&bob).await.is_empty());

    let malformed = vec![
        json!(42),
        json!({ "edu_type": "m.direct_to_device" }),
        json!({ "edu_type": "m.direct_to_device", "content": { "sender": eve, "messages": "x" } }),
        json!({ "edu_type": "m.typing", "content": { "room_id": "!r:example.org", "user_id": eve, "typing": true } }),
        json!({ "edu_type": "m.receipt", "content": { "!r:example.org": "not receipts" } }),
        json!({ "edu_type": "m.presence", "content": { "push": [{ "user_id": server.user_id("bob"), "presence": "online" }] } }),
        json!({ "edu_type": "m.device_list_update", "content": { "user_id": server.user_id("bob"), "device_id": "X", "stream_id": 1 } }),
        json!({ "edu_type": "m.unknown", "content": {} }),
        to_device_edu(&eve, "good", &bob, json!({ "good": true })),
    ];
    let (status, answer) = fake
        .request(
            &server,
            "PUT",
            "/_matrix/federation/v1/send/mixed",
            Some(txn_body(&fake, vec![], malformed)),
        )
        .await;
    assert_eq!((status, answer), (200, json!({ "pdus": {} })));
    assert_eq!(fed_messages(&bob).await, vec![json!({ "good": true })]);
}

/// How many sessions of `server`'s database hold the federation sender's leader lock
/// (`pg_locks` shows a bigint advisory key as its high and low halves).
async fn federation_leaders(server: &TestServer) -> i64 {
    server
        .count(
            "SELECT count(*) AS n FROM pg_locks
             WHERE locktype = 'advisory' AND granted AND objsubid = 1
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND ((classid::bigint << 32) | objid::bigint) = 7888447738564928627",
        )
        .await
}

#[tokio::test]
async fn one_process_of_a_scale_out_sends_and_another_takes_over_when_it_dies() {
    let mut a = federated_server().await;
    let b = federated_server().await;
    wait_until("A's sender leads", Duration::from_secs(20), || async {
        federation_leaders(&a).await == 1
    })
    .await;
    // A second process on A's database, without the federation listener the first one holds.
    let port: u16 = a.server_name().rsplit_once(':').unwrap().1.parse().unwrap();
    let second = a
        .second_process_with(
            federated_options(port)
                .without("MYELIN_FEDERATION_LISTEN")
                .without("MYELIN_TLS_CERT")
                .without("MYELIN_TLS_KEY"),
        )
        .await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    // The second process tried for the lock as it started; give it a moment to have failed.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(federation_leaders(&a).await, 1, "two processes lead");

    for i in 0..5 {
        send_to_device(
            &alice,
            &format!("first{i}"),
            "m.test.scale",
            &bob,
            json!({ "n": i }),
        )
        .await;
    }
    let (events, since) =
        to_device_events(&bob, None, "m.test.scale", 5, Duration::from_secs(30)).await;
    assert_eq!(events.len(), 5);

    // The leading process dies; the other one takes the lock and sends what it is given.
    a.kill();
    wait_until(
        "the second process leads",
        Duration::from_secs(20),
        || async { federation_leaders(&a).await == 1 },
    )
    .await;
    let alice_there = Client::new(&second.base_url)
        .login(&alice.user_id, "password")
        .await;
    for i in 5..10 {
        send_to_device(
            &alice_there,
            &format!("then{i}"),
            "m.test.scale",
            &bob,
            json!({ "n": i }),
        )
        .await;
    }
    let (events, _) = to_device_events(
        &bob,
        Some(since),
        "m.test.scale",
        5,
        Duration::from_secs(30),
    )
    .await;
    let numbers: Vec<_> = events
        .iter()
        .map(|e| e["content"]["n"].as_i64().unwrap())
        .collect();
    assert_eq!(numbers, (5..10).collect::<Vec<_>>());
}
