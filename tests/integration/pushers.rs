//! Pushers: registration and delivery to a push gateway the test runs on loopback.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use crate::support::{user_id, wait_until, Client, ServerOptions, TestServer};

/// A server that may push to gateways on loopback (the tests' gateways live there).
async fn server_reaching_loopback() -> TestServer {
    TestServer::start_with(ServerOptions::default().env("MYELIN_OUTBOUND_ALLOW", "127.0.0.1/32"))
        .await
}

/// How a test gateway behaves.
#[derive(Clone, Copy)]
pub(crate) enum Behaviour {
    /// Answer 500 to the first N requests, then accept.
    FailFirst(usize),
    /// Never answer.
    Hang,
    /// Say the push key is unknown.
    Reject,
    /// Answer `302 Found` pointing at another URL.
    Redirect(&'static str),
    /// Answer 200 with a body of this many MiB (no length: it ends when the connection does).
    Huge(usize),
}

/// A minimal push gateway: records every notification it is sent.
/// A push gateway on loopback that records what it accepts (also used by `scale_out`).
pub(crate) struct Gateway {
    pub(crate) url: String,
    pub(crate) received: Arc<Mutex<Vec<Value>>>,
    requests: Arc<AtomicUsize>,
}

impl Gateway {
    pub(crate) async fn start(behaviour: Behaviour) -> Gateway {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/_matrix/push/v1/notify",
            listener.local_addr().unwrap()
        );
        let received = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(AtomicUsize::new(0));
        let (seen, count) = (received.clone(), requests.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let (seen, count) = (seen.clone(), count.clone());
                tokio::spawn(async move {
                    let body = read_request(&mut socket).await;
                    let n = count.fetch_add(1, Ordering::SeqCst);
                    let (status, answer) = match behaviour {
                        Behaviour::Hang => {
                            tokio::time::sleep(Duration::from_secs(60)).await;
                            return;
                        }
                        Behaviour::FailFirst(failures) if n < failures => {
                            ("500 Internal Server Error", json!({}))
                        }
                        Behaviour::Reject => {
                            let key = body["notification"]["devices"][0]["pushkey"].clone();
                            ("200 OK", json!({ "rejected": [key] }))
                        }
                        Behaviour::FailFirst(_) => {
                            seen.lock().unwrap().push(body);
                            ("200 OK", json!({ "rejected": [] }))
                        }
                        Behaviour::Redirect(to) => {
                            let response = format!(
                                "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                            );
                            let _ = socket.write_all(response.as_bytes()).await;
                            return;
                        }
                        Behaviour::Huge(mib) => {
                            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"rejected\":[\"";
                            let _ = socket.write_all(head.as_bytes()).await;
                            let chunk = vec![b'A'; 1 << 20];
                            for _ in 0..mib {
                                // The server hanging up ends the flood.
                                if socket.write_all(&chunk).await.is_err() {
                                    return;
                                }
                            }
                            let _ = socket.write_all(b"\"]}").await;
                            return;
                        }
                    };
                    let answer = answer.to_string();
                    let response = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                        answer.len()
                    );
                    let _ = socket.write_all(response.as_bytes()).await;
                });
            }
        });
        Gateway {
            url,
            received,
            requests,
        }
    }

    /// Waits until the gateway has been asked `n` times (or fails the test).
    async fn wait_for_requests(&self, n: usize, within: Duration, what: &str) {
        let deadline = Instant::now() + within;
        while self.requests.load(Ordering::SeqCst) < n {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `n` notifications have arrived.
    async fn wait_for(&self, n: usize, within: Duration) -> Vec<Value> {
        let deadline = Instant::now() + within;
        loop {
            let received = self.received.lock().unwrap().clone();
            if received.len() >= n || Instant::now() > deadline {
                return received;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Reads one HTTP request and returns its JSON body.
async fn read_request(socket: &mut tokio::net::TcpStream) -> Value {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = socket.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return Value::Null;
        }
        buffer.extend_from_slice(&chunk[..n]);
        let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < end + 4 + length {
            let n = socket.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            buffer.extend_from_slice(&chunk[..n]);
        }
        return serde_json::from_slice(&buffer[end + 4..]).unwrap_or(Value::Null);
    }
}

fn pusher(url: &str, pushkey: &str) -> Value {
    json!({
        "pushkey": pushkey,
        "kind": "http",
        "app_id": "org.example.app",
        "app_display_name": "Example",
        "device_display_name": "Phone",
        "lang": "en",
        "data": { "url": url, "extra": "kept" },
    })
}

async fn setup(behaviour: Behaviour) -> (TestServer, Gateway, Client, Client, String) {
    let server = server_reaching_loopback().await;
    let gateway = Gateway::start(behaviour).await;
    let (alice, bob, room) = bob_with_pusher(&server, &gateway.url).await;
    (server, gateway, alice, bob, room)
}

/// Alice and Bob in a room, Bob with a pusher to `url`.
async fn bob_with_pusher(server: &TestServer, url: &str) -> (Client, Client, String) {
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    bob.post("/_matrix/client/v3/pushers/set", pusher(url, "key-1"))
        .await
        .ok();
    (alice, bob, room)
}

#[tokio::test]
async fn notifying_events_are_pushed_with_counts_after_the_gateway_recovers() {
    let (_server, gateway, alice, _bob, room) = setup(Behaviour::FailFirst(2)).await;
    let notice = json!({ "msgtype": "m.notice", "body": "not worth a push" });
    alice
        .put(
            &format!(
                "/_matrix/client/v3/rooms/{}/send/m.room.message/n1",
                crate::support::client::enc(&room)
            ),
            notice,
        )
        .await
        .ok();
    let first = alice.send_text(&room, "1", "hello bob").await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let second = alice.send_text(&room, "2", "still there?").await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Two failures cost 1 s + 2 s of backoff; then both arrive, in order.
    let received = gateway.wait_for(2, Duration::from_secs(20)).await;
    assert_eq!(received.len(), 2, "{received:?}");
    assert!(gateway.requests.load(Ordering::SeqCst) >= 4);
    let notification = &received[0]["notification"];
    assert_eq!(notification["event_id"], first.as_str());
    assert_eq!(received[1]["notification"]["event_id"], second.as_str());
    assert_eq!(notification["room_id"], room.as_str());
    assert_eq!(notification["type"], "m.room.message");
    assert_eq!(notification["sender"], user_id("alice"));
    assert_eq!(notification["content"]["body"], "hello bob");
    assert_eq!(notification["counts"]["unread"], 1, "one room with unread");
    let device = &notification["devices"][0];
    assert_eq!(device["pushkey"], "key-1");
    assert_eq!(device["app_id"], "org.example.app");
    assert_eq!(
        device["data"],
        json!({ "extra": "kept" }),
        "url is not echoed"
    );
    // A two-person room rings (`.m.rule.room_one_to_one` sets a sound).
    assert_eq!(device["tweaks"]["sound"], "default");
    assert_eq!(notification["prio"], "high");
    let all = serde_json::to_string(&received).unwrap();
    assert!(!all.contains("not worth a push"), "a notice was pushed");
    assert!(!all.contains("m.read"), "receipts never travel in pushes");
}

/// A notifying event wakes the push sender at its commit rather than at the sender's
/// one-second tick: five pushes, each sent once the last has arrived, take well under the
/// five ticks they would wait for otherwise.
#[tokio::test]
async fn each_notifying_event_is_pushed_without_waiting_for_the_tick() {
    let (_server, gateway, alice, _bob, room) = setup(Behaviour::FailFirst(0)).await;
    alice.send_text(&room, "warm-up", "hello").await.ok();
    gateway.wait_for(1, Duration::from_secs(10)).await;
    let started = Instant::now();
    for n in 1..=5 {
        alice.send_text(&room, &format!("t{n}"), "ring").await.ok();
        let received = gateway.wait_for(n + 1, Duration::from_secs(10)).await;
        assert_eq!(received.len(), n + 1, "{received:?}");
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "five pushes took {took:?}");
}

#[tokio::test]
async fn a_hanging_gateway_never_slows_sending() {
    let (_server, gateway, alice, _bob, room) = setup(Behaviour::Hang).await;
    let started = Instant::now();
    for i in 0..10 {
        alice.send_text(&room, &format!("t{i}"), "hi").await.ok();
    }
    let took = started.elapsed();
    // The gateway is holding a request open the whole time.
    wait_until(
        "the gateway has been sent a notification",
        Duration::from_secs(10),
        || async { gateway.requests.load(Ordering::SeqCst) >= 1 },
    )
    .await;
    assert!(
        took < Duration::from_secs(5),
        "10 sends took {took:?} while the gateway hung"
    );
}

#[tokio::test]
async fn a_rejected_push_key_removes_the_pusher() {
    let (_server, gateway, alice, bob, room) = setup(Behaviour::Reject).await;
    assert_eq!(
        bob.get("/_matrix/client/v3/pushers").await.ok()["pushers"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    alice.send_text(&room, "1", "hello").await.ok();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = bob.get("/_matrix/client/v3/pushers").await.ok()["pushers"]
            .as_array()
            .unwrap()
            .len();
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the rejected pusher stayed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gateway.requests.load(Ordering::SeqCst) >= 1);
}

#[tokio::test]
async fn pushers_are_listed_validated_replaced_and_deleted() {
    let server = TestServer::start().await;
    let bob = server.register("bob").await;
    let carol = server.register("carol").await;
    let url = "https://push.example.org/_matrix/push/v1/notify";
    bob.post("/_matrix/client/v3/pushers/set", pusher(url, "k"))
        .await
        .ok();
    let listed = bob.get("/_matrix/client/v3/pushers").await.ok();
    let one = &listed["pushers"][0];
    assert_eq!(one["pushkey"], "k");
    assert_eq!(one["kind"], "http");
    assert_eq!(one["data"]["url"], url);
    assert_eq!(one["device_display_name"], "Phone");

    // The same key registered by someone else without `append` takes it over.
    carol
        .post("/_matrix/client/v3/pushers/set", pusher(url, "k"))
        .await
        .ok();
    assert!(bob.get("/_matrix/client/v3/pushers").await.ok()["pushers"]
        .as_array()
        .unwrap()
        .is_empty());

    let mut bad = pusher("https://push.example.org/somewhere", "k2");
    bob.post("/_matrix/client/v3/pushers/set", bad.clone())
        .await
        .assert_error(400, "M_INVALID_PARAM");
    bad["data"]["url"] = json!("not a url");
    bob.post("/_matrix/client/v3/pushers/set", bad)
        .await
        .assert_error(400, "M_INVALID_PARAM");
    let mut email = pusher(url, "me@example.org");
    email["kind"] = json!("email");
    bob.post("/_matrix/client/v3/pushers/set", email)
        .await
        .assert_error(400, "M_INVALID_PARAM");

    carol
        .post(
            "/_matrix/client/v3/pushers/set",
            json!({ "pushkey": "k", "app_id": "org.example.app", "kind": null }),
        )
        .await
        .ok();
    assert!(
        carol.get("/_matrix/client/v3/pushers").await.ok()["pushers"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // A pusher goes with the device that made it.
    bob.post("/_matrix/client/v3/pushers/set", pusher(url, "k3"))
        .await
        .ok();
    bob.post("/_matrix/client/v3/logout", json!({})).await.ok();
    assert_eq!(server.count("SELECT COUNT(*) AS n FROM pushers").await, 0);
}

#[tokio::test]
async fn pushers_cannot_reach_loopback_unless_allowed() {
    let server = TestServer::start().await;
    let gateway = Gateway::start(Behaviour::FailFirst(0)).await;
    // A name is accepted, but what it resolves to is checked on connecting: nothing arrives.
    let by_name = gateway.url.replace("127.0.0.1", "localhost");
    let (alice, bob, room) = bob_with_pusher(&server, &by_name).await;
    alice.send_text(&room, "1", "hello").await.ok();
    // An IP literal is refused when the pusher is set.
    bob.post("/_matrix/client/v3/pushers/set", pusher(&gateway.url, "k"))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    for literal in ["[::1]", "[::ffff:127.0.0.1]", "169.254.169.254", "10.0.0.1"] {
        let url = format!("http://{literal}/_matrix/push/v1/notify");
        bob.post("/_matrix/client/v3/pushers/set", pusher(&url, "k"))
            .await
            .assert_error(400, "M_INVALID_PARAM");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        gateway.requests.load(Ordering::SeqCst),
        0,
        "a push reached loopback"
    );
}

#[tokio::test]
async fn a_redirecting_gateway_is_not_followed() {
    let server = server_reaching_loopback().await;
    let target = Gateway::start(Behaviour::FailFirst(0)).await;
    let to: &'static str = Box::leak(target.url.clone().into_boxed_str());
    let redirecting = Gateway::start(Behaviour::Redirect(to)).await;
    let (alice, _bob, room) = bob_with_pusher(&server, &redirecting.url).await;
    alice.send_text(&room, "1", "hello").await.ok();
    // The 302 counts as a failure: retried after 1 s, never followed.
    redirecting
        .wait_for_requests(2, Duration::from_secs(10), "the redirect was not retried")
        .await;
    assert_eq!(
        target.requests.load(Ordering::SeqCst),
        0,
        "the redirect was followed"
    );
}

#[tokio::test]
async fn a_huge_gateway_answer_is_cut_off_and_counts_as_a_failure() {
    let server = server_reaching_loopback().await;
    let gateway = Gateway::start(Behaviour::Huge(256)).await;
    let (alice, bob, room) = bob_with_pusher(&server, &gateway.url).await;
    let before = server.peak_rss_kib();
    alice.send_text(&room, "1", "hello").await.ok();
    gateway
        .wait_for_requests(
            2,
            Duration::from_secs(15),
            "an oversized answer was not retried",
        )
        .await;
    let grown_mib = (server.peak_rss_kib() - before) / 1024;
    assert!(
        grown_mib < 64,
        "the server buffered the answer: +{grown_mib} MiB"
    );
    // Still serving.
    bob.get("/_matrix/client/v3/pushers").await.ok();
}

#[tokio::test]
async fn a_user_has_at_most_100_pushers() {
    let server = TestServer::start().await;
    let bob = server.register("bob").await;
    let url = "https://push.example.org/_matrix/push/v1/notify";
    for i in 0..100 {
        let mut body = pusher(url, &format!("k{i}"));
        body["append"] = json!(true);
        bob.post("/_matrix/client/v3/pushers/set", body).await.ok();
    }
    let mut extra = pusher(url, "k100");
    extra["append"] = json!(true);
    bob.post("/_matrix/client/v3/pushers/set", extra)
        .await
        .assert_error(400, "M_LIMIT_EXCEEDED");
    // Replacing an existing one is still fine.
    bob.post("/_matrix/client/v3/pushers/set", pusher(url, "k7"))
        .await
        .ok();
}

#[tokio::test]
async fn the_badge_counts_rooms_with_unread_notifications_after_each_read_position() {
    let (_server, gateway, alice, bob, first_room) = setup(Behaviour::FailFirst(0)).await;
    let second_room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&second_room).await.ok();
    let event_id = |response: Value| response["event_id"].as_str().unwrap().to_owned();
    // Each push waited for: the badge is counted when the push is sent.
    let within = Duration::from_secs(20);
    let read = event_id(alice.send_text(&first_room, "1", "one").await.ok());
    gateway.wait_for(1, within).await;
    alice.send_text(&second_room, "2", "two").await.ok();
    gateway.wait_for(2, within).await;
    // Bob reads the first room to its end: the next push counts the second room alone.
    bob.post(
        &format!(
            "/_matrix/client/v3/rooms/{}/receipt/m.read/{}",
            crate::support::client::enc(&first_room),
            crate::support::client::enc(&read)
        ),
        json!({}),
    )
    .await
    .ok();
    alice.send_text(&second_room, "3", "three").await.ok();

    let received = gateway.wait_for(3, within).await;
    let badges: Vec<&Value> = received
        .iter()
        .map(|request| &request["notification"]["counts"]["unread"])
        .collect();
    assert_eq!(badges, [&json!(1), &json!(2), &json!(1)], "{received:?}");
}
