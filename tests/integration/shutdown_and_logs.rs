//! Graceful shutdown (SIGTERM answers parked long-polls at once and loses no send) and the
//! log formats (plain text off a terminal, JSON lines, no tokens or query strings).

use std::{
    io::Read,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::{
    metrics::scrape,
    sliding_sync::{pos, sss},
    support::{
        client::timeline, spawn_server_capturing_log, wait_until, Client, ServerOptions, TestDb,
        TestServer,
    },
};

/// The bodies of the `m.room.message` events in a sync's timeline of `room`.
fn bodies(sync: &Value, room: &str) -> Vec<String> {
    timeline(sync, room)
        .iter()
        .filter(|e| e["type"] == "m.room.message")
        .filter_map(|e| e["content"]["body"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn sigterm_answers_parked_long_polls_at_once_and_loses_no_send() {
    let mut server = TestServer::start_with(
        ServerOptions::default().env("MYELIN_METRICS_LISTEN", "127.0.0.1:0"),
    )
    .await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({})).await;
    let next_batch_of = |sync: Value| sync["next_batch"].as_str().unwrap().to_owned();
    let token = next_batch_of(alice.sync(None, 0, None).await);
    // Bob, in no room with alice, parks a long-poll that nothing will wake but the shutdown.
    let bob_since = next_batch_of(bob.sync(None, 0, None).await);
    let bob_since = server.long_poll_token(&bob, &bob_since).await;
    let parked = {
        let bob = bob.clone();
        let since = bob_since.clone();
        tokio::spawn(async move {
            let response = bob
                .get(&format!(
                    "/_matrix/client/v3/sync?since={since}&timeout=60000"
                ))
                .await;
            (response, Instant::now())
        })
    };
    server.wait_until_long_polls_started(&[&bob]).await;
    // And a sliding sync of his, parked too.
    let lists = json!({ "lists": { "all": { "ranges": [[0, 10]], "timeline_limit": 1 } } });
    let first = sss(&bob, None, 0, lists.clone()).await.ok();
    let sliding = {
        let bob = bob.clone();
        let pos = pos(&first);
        tokio::spawn(async move {
            let response = sss(&bob, Some(&pos), 60_000, lists).await;
            (response, Instant::now())
        })
    };
    wait_until("both syncs are parked", Duration::from_secs(20), || async {
        scrape(&server).await.sum("myelin_sync_long_polls", &[]) == 2.0
    })
    .await;

    // A send answered just before the signal, and one racing it.
    alice.send_text(&room, "before", "before").await.ok();
    let racing = {
        let alice = alice.clone();
        let room = room.clone();
        tokio::spawn(async move {
            let url = format!(
                "{}/_matrix/client/v3/rooms/{}/send/m.room.message/racing",
                alice.base,
                crate::support::client::enc(&room)
            );
            // The connection may be refused or cut once the server stops: no answer.
            reqwest::Client::new()
                .put(url)
                .bearer_auth(alice.token.as_deref().unwrap())
                .json(&json!({ "msgtype": "m.text", "body": "racing" }))
                .send()
                .await
                .ok()
                .map(|r| r.status().as_u16())
        })
    };
    tokio::time::sleep(Duration::from_millis(5)).await;
    let signalled = Instant::now();
    server.terminate();

    let (response, answered) = parked.await.unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    let next_batch = response.body["next_batch"]
        .as_str()
        .expect("a next_batch")
        .to_owned();
    assert!(
        answered - signalled < Duration::from_millis(1500),
        "the parked sync took {:?} to answer",
        answered - signalled
    );
    let (response, answered) = sliding.await.unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    assert!(response.body["pos"].is_string(), "{}", response.body);
    assert!(
        answered - signalled < Duration::from_millis(1500),
        "the parked sliding sync took {:?} to answer",
        answered - signalled
    );
    let status = server
        .wait_for_exit(Duration::from_secs(12))
        .await
        .expect("the server exits after SIGTERM");
    assert!(status.success(), "exit status {status}");
    let racing = racing.await.unwrap();

    // Nothing lost: after a restart, a sync from the earlier token holds both messages once
    // (the racing send retried with its transaction ID if it never got its answer).
    server.relaunch().await;
    let mut alice_again = alice.clone();
    alice_again.base = server.base_url.clone();
    let mut bob_again = bob.clone();
    bob_again.base = server.base_url.clone();
    if racing != Some(200) {
        alice_again.send_text(&room, "racing", "racing").await.ok();
    }
    let synced = alice_again.sync(Some(&token), 0, None).await;
    let mut seen = bodies(&synced, &room);
    seen.sort();
    assert_eq!(seen, ["before", "racing"], "{synced}");
    // The token the shutdown handed out is valid on the restarted server.
    bob_again.sync(Some(&next_batch), 0, None).await;
}

/// Runs the server on `db` with `env`, makes a request carrying a token in the query string,
/// stops it with SIGTERM and returns everything it wrote to stderr.
async fn stderr_of_a_run(db: &TestDb, env: &[(&str, &str)]) -> String {
    let options = env.iter().fold(
        ServerOptions::default().env("RUST_LOG", "info"),
        |o, (k, v)| o.env(k, v),
    );
    let (mut child, base) = spawn_server_capturing_log(db, &options).await;
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let client = Client::new(&base);
    client
        .get("/_matrix/client/v3/account/whoami?access_token=SECRETTOKEN42&user_id=%40x%3Ay")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");
    client
        .post(
            "/_matrix/client/v3/login",
            json!({ "type": "m.login.password", "password": "SECRETPASSWORD" }),
        )
        .await;
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: kill has no memory-safety preconditions; the pid is our own child's.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit status {status}");
    reader.join().unwrap()
}

#[tokio::test]
async fn logs_are_plain_text_or_json_lines_without_secrets() {
    let db = TestDb::new().await;
    let text = stderr_of_a_run(&db, &[]).await;
    assert!(
        !text.contains('\u{1b}'),
        "colour codes off a terminal: {text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("served") && l.contains("/_matrix/client/v3/account/whoami")),
        "no request line: {text}"
    );
    assert!(text.contains("shutting down"), "{text}");

    let json_log = stderr_of_a_run(&db, &[("MYELIN_LOG_FORMAT", "json")]).await;
    for secret in ["SECRETTOKEN42", "SECRETPASSWORD", "access_token", "%40x"] {
        for log in [&text, &json_log] {
            assert!(!log.contains(secret), "{secret} in the log: {log}");
        }
    }
    let records: Vec<Value> = json_log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    let request = records
        .iter()
        .find(|r| r["span"]["route"] == "/_matrix/client/v3/account/whoami")
        .unwrap_or_else(|| panic!("no request record: {json_log}"));
    assert_eq!(request["message"], "served");
    assert_eq!(request["status"], 401);
    assert_eq!(request["level"], "INFO");
    assert_eq!(request["span"]["method"], "GET");
    assert!(request["timestamp"].is_string());
    assert!(request["latency_ms"].is_string());
}
