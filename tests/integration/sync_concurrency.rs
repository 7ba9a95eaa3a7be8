//! `/sync` completeness under concurrency: many senders, many long-polling receivers, and a
//! server restart in the middle; every receiver gets every message once, in one order.

use std::{collections::HashSet, time::Instant};

use serde_json::{json, Value};

use crate::support::{
    client::{enc, timeline},
    wait_until, Client, TestServer,
};

/// Receives every message of a room after `since` the way a client does: a long-polling sync
/// loop that fills a limited timeline's gap from `prev_batch` with `/messages`.
async fn receive_all(client: Client, room: String, since: String, expected: usize) -> Vec<String> {
    let filter = json!({ "room": { "timeline": { "limit": 20 } } }).to_string();
    let mut since = since;
    let mut received = Vec::new();
    let started = Instant::now();
    while received.len() < expected && started.elapsed().as_secs() < 120 {
        let response = client.sync(Some(&since), 5_000, Some(&filter)).await;
        let section = &response["rooms"]["join"][&room]["timeline"];
        if section["limited"] == true {
            let prev_batch = section["prev_batch"].as_str().unwrap();
            let gap: Vec<String> = client
                .page_back(&room, Some(prev_batch), Some(&since), 50)
                .await
                .iter()
                .filter(|e| e["type"] == "m.room.message")
                .map(|e| e["event_id"].as_str().unwrap().to_owned())
                .collect();
            received.extend(gap);
        }
        for event in timeline(&response, &room) {
            if event["type"] == "m.room.message" {
                received.push(event["event_id"].as_str().unwrap().to_owned());
            }
        }
        since = response["next_batch"].as_str().unwrap().to_owned();
    }
    received
}

#[tokio::test]
async fn ten_senders_and_ten_long_polling_receivers_agree_on_every_message() {
    const SENDERS: usize = 10;
    const MESSAGES: usize = 20;
    let server = TestServer::start().await;
    let owner = server.register("owner").await;
    let room = owner.create_room(json!({ "preset": "public_chat" })).await;
    let receivers = server.register_joined(&room, "receiver", 10).await;
    let senders = server.register_joined(&room, "sender", SENDERS).await;
    let mut receiving = Vec::new();
    for client in &receivers {
        let since = client.next_batch().await;
        let since = server.long_poll_token(client, &since).await;
        receiving.push(tokio::spawn(receive_all(
            client.clone(),
            room.clone(),
            since,
            SENDERS * MESSAGES,
        )));
    }
    // Every receiver is long-polling before the first message is sent.
    server
        .wait_until_long_polls_started(&receivers.iter().collect::<Vec<_>>())
        .await;
    let sending: Vec<_> = senders
        .into_iter()
        .map(|client| {
            let room = room.clone();
            tokio::spawn(async move {
                for n in 0..MESSAGES {
                    client
                        .send_text(&room, &format!("t{n}"), &format!("{n}"))
                        .await
                        .ok();
                }
            })
        })
        .collect();
    for task in sending {
        task.await.unwrap();
    }
    let mut orders = Vec::new();
    for task in receiving {
        let received = task.await.unwrap();
        assert_eq!(
            received.len(),
            SENDERS * MESSAGES,
            "a receiver missed messages"
        );
        assert_eq!(
            received.iter().collect::<HashSet<_>>().len(),
            received.len(),
            "a receiver got duplicates"
        );
        orders.push(received);
    }
    assert!(
        orders.windows(2).all(|w| w[0] == w[1]),
        "receivers disagree on the order"
    );
}

/// A client that survives a server restart: it re-reads the server's address and retries.
#[derive(Clone)]
struct Resilient {
    http: reqwest::Client,
    base: std::sync::Arc<std::sync::RwLock<String>>,
    token: String,
}

impl Resilient {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let started = Instant::now();
        loop {
            let base = self.base.read().unwrap().clone();
            let mut request = self
                .http
                .request(method.clone(), format!("{base}{path}"))
                .bearer_auth(&self.token);
            if let Some(body) = &body {
                request = request.json(body);
            }
            if let Ok(response) = request.send().await {
                if response.status().is_success() {
                    return response.json().await.unwrap();
                }
            }
            assert!(started.elapsed().as_secs() < 60, "{path} kept failing");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test]
async fn receivers_get_everything_exactly_once_across_a_restart_mid_stream() {
    const SENDERS: usize = 10;
    const MESSAGES: usize = 20;
    let mut server = TestServer::start().await;
    let owner = server.register("owner").await;
    let room = owner.create_room(json!({ "preset": "public_chat" })).await;
    let base = std::sync::Arc::new(std::sync::RwLock::new(server.base_url.clone()));
    let mut clients = Vec::new();
    for i in 0..SENDERS * 2 {
        let client = server.register(&format!("user{i}")).await;
        client.join(&room).await.ok();
        clients.push(Resilient {
            http: reqwest::Client::new(),
            base: base.clone(),
            token: client.token.clone().unwrap(),
        });
    }
    let receivers = clients.split_off(SENDERS);
    let filter = enc(&json!({ "room": { "timeline": { "limit": 1000 } } }).to_string());
    let receiving: Vec<_> = receivers
        .into_iter()
        .map(|client| {
            let (room, filter) = (room.clone(), filter.clone());
            tokio::spawn(async move {
                let first = client
                    .call(
                        reqwest::Method::GET,
                        &format!("/_matrix/client/v3/sync?filter={filter}"),
                        None,
                    )
                    .await;
                let mut since = first["next_batch"].as_str().unwrap().to_owned();
                // Messages sent before the first sync finished arrive in its timeline.
                let mut received: Vec<String> = timeline(&first, &room)
                    .into_iter()
                    .filter(|e| e["type"] == "m.room.message")
                    .map(|e| e["event_id"].as_str().unwrap().to_owned())
                    .collect();
                let started = Instant::now();
                while received.len() < SENDERS * MESSAGES {
                    assert!(
                        started.elapsed().as_secs() < 90,
                        "stuck with {} of {} messages",
                        received.len(),
                        SENDERS * MESSAGES
                    );
                    let path = format!(
                        "/_matrix/client/v3/sync?timeout=2000&filter={filter}&since={}",
                        enc(&since)
                    );
                    let response = client.call(reqwest::Method::GET, &path, None).await;
                    assert_ne!(
                        response["rooms"]["join"][&room]["timeline"]["limited"], true,
                        "a gap"
                    );
                    for event in timeline(&response, &room) {
                        if event["type"] == "m.room.message" {
                            received.push(event["event_id"].as_str().unwrap().to_owned());
                        }
                    }
                    since = response["next_batch"].as_str().unwrap().to_owned();
                }
                received
            })
        })
        .collect();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sending: Vec<_> = clients
        .into_iter()
        .map(|client| {
            let (room, sent) = (room.clone(), sent.clone());
            tokio::spawn(async move {
                for n in 0..MESSAGES {
                    let path = format!(
                        "/_matrix/client/v3/rooms/{}/send/m.room.message/t{n}",
                        enc(&room)
                    );
                    client
                        .call(
                            reqwest::Method::PUT,
                            &path,
                            Some(json!({ "msgtype": "m.text", "body": n.to_string() })),
                        )
                        .await;
                    sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            })
        })
        .collect();
    // Restart once every sender is under way (about a quarter of the messages are in).
    wait_until(
        "a quarter of the messages have been sent",
        std::time::Duration::from_secs(30),
        || async { sent.load(std::sync::atomic::Ordering::SeqCst) >= SENDERS * MESSAGES / 4 },
    )
    .await;
    server.restart().await;
    let sent_before_restart = sent.load(std::sync::atomic::Ordering::SeqCst);
    *base.write().unwrap() = server.base_url.clone();
    for task in sending {
        task.await.unwrap();
    }
    assert!(
        sent_before_restart < SENDERS * MESSAGES,
        "every message was sent before the restart finished: nothing was sent across it"
    );
    let expected = server
        .count(&format!("SELECT count(*) AS n FROM events WHERE room_id = '{room}' AND event_type = 'm.room.message'"))
        .await;
    assert_eq!(
        expected as usize,
        SENDERS * MESSAGES,
        "retried sends stayed idempotent across the restart"
    );
    let mut orders = Vec::new();
    for task in receiving {
        let received = task.await.unwrap();
        assert_eq!(
            received.iter().collect::<HashSet<_>>().len(),
            SENDERS * MESSAGES,
            "missed or duplicated"
        );
        orders.push(received);
    }
    assert!(
        orders.windows(2).all(|w| w[0] == w[1]),
        "receivers disagree on the order"
    );
}

/// More long-polls than the pool has connections, then a message: every one wakes with it.
/// (Syncs once deadlocked here: one took the room-index lock and waited for a connection while
/// the others held the connections and waited for the lock.)
#[tokio::test]
async fn more_long_polls_than_pool_connections_all_wake() {
    let server = crate::support::TestServer::start_with(
        crate::support::ServerOptions::default().env("MYELIN_DATABASE_POOL_SIZE", "2"),
    )
    .await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(serde_json::json!({ "preset": "public_chat" }))
        .await;
    bob.join(&room).await.ok();
    // One device per long-poll, so the test can see each of them start.
    let mut devices = Vec::new();
    for _ in 0..12 {
        let device = server.client().login("bob", "password").await;
        let since = device.next_batch().await;
        let since = server.long_poll_token(&device, &since).await;
        devices.push((device, since));
    }
    let polls: Vec<_> = devices
        .iter()
        .map(|(bob, since)| {
            let (bob, since) = (bob.clone(), since.clone());
            let room = room.clone();
            // A poll may also wake for other news (Bob's own presence): poll on until the
            // message is there.
            tokio::spawn(async move {
                let mut since = since;
                loop {
                    let sync = bob.sync(Some(&since), 20_000, None).await;
                    let timeline = crate::support::client::timeline(&sync, &room);
                    if timeline.iter().any(|e| e["content"]["body"] == "wake up") {
                        return;
                    }
                    since = sync["next_batch"].as_str().unwrap().to_owned();
                }
            })
        })
        .collect();
    server
        .wait_until_long_polls_started(&devices.iter().map(|(d, _)| d).collect::<Vec<_>>())
        .await;
    tokio::time::timeout(
        std::time::Duration::from_secs(15),
        alice.send_text(&room, "wake", "wake up"),
    )
    .await
    .expect("the send never returned: the server is stuck")
    .ok();
    for poll in polls {
        tokio::time::timeout(std::time::Duration::from_secs(15), poll)
            .await
            .expect("a long-poll never got the message: the server is stuck")
            .unwrap();
    }
}
