//! Delayed events (MSC4140): scheduled through `/send` and `/state`, restarted, cancelled or
//! sent early by delay ID, sent by a durable timer that survives a restart and sends each event
//! once however many processes share the database.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{client::enc, wait_until, Client, ServerOptions, TestServer};

const DELAYED: &str = "/_matrix/client/unstable/org.matrix.msc4140/delayed_events";

fn with_delays() -> ServerOptions {
    ServerOptions::default().env("MYELIN_MAX_EVENT_DELAY_MS", "60000")
}

async fn start() -> TestServer {
    TestServer::start_with(with_delays()).await
}

/// A room whose members may all set state (so others can race a delayed state event).
async fn open_room(owner: &Client, others: &[&Client]) -> String {
    let room = owner
        .create_room(json!({
            "preset": "public_chat",
            "power_level_content_override": { "state_default": 0 },
        }))
        .await;
    for other in others {
        other.join(&room).await.ok();
    }
    room
}

fn state_path(room: &str, kind: &str, key: &str) -> String {
    format!(
        "/_matrix/client/v3/rooms/{}/state/{kind}/{}",
        enc(room),
        enc(key)
    )
}

async fn delayed_state(
    client: &Client,
    room: &str,
    kind: &str,
    key: &str,
    delay: &str,
    content: Value,
) -> crate::support::client::Response {
    let path = format!(
        "{}?org.matrix.msc4140.delay={delay}",
        state_path(room, kind, key)
    );
    client.put(&path, content).await
}

async fn schedule_state(
    client: &Client,
    room: &str,
    key: &str,
    delay_ms: u64,
    body: &str,
) -> String {
    let answer = delayed_state(
        client,
        room,
        "org.example.call.member",
        key,
        &delay_ms.to_string(),
        json!({ "body": body }),
    )
    .await
    .ok();
    answer["delay_id"].as_str().expect("a delay_id").to_owned()
}

/// The current `org.example.call.member` state's `body` under `key`, if set.
async fn current_body(client: &Client, room: &str, key: &str) -> Option<String> {
    let response = client
        .get(&state_path(room, "org.example.call.member", key))
        .await;
    (response.status == 200).then(|| response.body["body"].as_str().unwrap_or("").to_owned())
}

async fn action(client: &Client, delay_id: &str, action: &str) -> crate::support::client::Response {
    client
        .post(
            &format!("{DELAYED}/{delay_id}"),
            json!({ "action": action }),
        )
        .await
}

async fn scheduled_ids(client: &Client) -> Vec<String> {
    let listed = client.get(DELAYED).await.ok();
    listed["delayed_events"]
        .as_array()
        .expect("delayed_events")
        .iter()
        .map(|e| e["delay_id"].as_str().unwrap().to_owned())
        .collect()
}

async fn status_of(server: &TestServer, delay_id: &str, status: &str) -> i64 {
    server
        .count(&format!(
            "SELECT count(*) AS n FROM delayed_events WHERE delay_id = '{delay_id}' AND status = '{status}'"
        ))
        .await
}

#[tokio::test]
async fn delayed_events_are_refused_unless_a_maximum_delay_is_configured() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    let versions = server.client().get("/_matrix/client/versions").await.ok();
    assert_eq!(versions["unstable_features"]["org.matrix.msc4140"], false);
    delayed_state(
        &alice,
        &room,
        "org.example.call.member",
        "",
        "1000",
        json!({}),
    )
    .await
    .assert_error(403, "M_FORBIDDEN");
    // Without the parameter, a send is an ordinary one.
    alice.send_text(&room, "t1", "now").await.ok();
}

#[tokio::test]
async fn bad_and_too_long_delays_get_matrix_errors() {
    let server = start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    let versions = server.client().get("/_matrix/client/versions").await.ok();
    assert_eq!(versions["unstable_features"]["org.matrix.msc4140"], true);
    let caps = alice.get("/_matrix/client/v3/capabilities").await.ok();
    assert_eq!(
        caps["capabilities"]["org.matrix.msc4140.delayed_events"]["max_delay_ms"],
        60000
    );
    for bad in ["abc", "-5", "1.5", ""] {
        delayed_state(&alice, &room, "org.example.call.member", "", bad, json!({}))
            .await
            .assert_error(400, "M_INVALID_PARAM");
    }
    delayed_state(
        &alice,
        &room,
        "org.example.call.member",
        "",
        "60001",
        json!({}),
    )
    .await
    .assert_error(400, "ORG.MATRIX.MSC4140_DELAY_TOO_LARGE");
    let send = format!(
        "/_matrix/client/v3/rooms/{}/send/m.room.message/t1?org.matrix.msc4140.delay=99999999999999999999",
        enc(&room)
    );
    alice
        .put(&send, json!({ "body": "x" }))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    let unknown = format!("!nowhere:{}", server.server_name());
    delayed_state(
        &alice,
        &unknown,
        "org.example.call.member",
        "",
        "1000",
        json!({}),
    )
    .await
    .assert_error(404, "M_NOT_FOUND");
    delayed_state(
        &alice,
        &room,
        "m.room.member",
        "not-a-user",
        "1000",
        json!({}),
    )
    .await
    .assert_error(400, "M_BAD_JSON");
    let array = format!(
        "/_matrix/client/v3/rooms/{}/send/m.room.message/t2?org.matrix.msc4140.delay=10",
        enc(&room)
    );
    alice
        .put(&array, json!([1, 2]))
        .await
        .assert_error(400, "M_BAD_JSON");
    // Nothing was scheduled by the refused requests.
    assert!(scheduled_ids(&alice).await.is_empty());
}

#[tokio::test]
async fn a_delayed_state_event_fires_after_its_delay_and_is_listed_until_then() {
    let server = start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = open_room(&alice, &[&bob]).await;
    let key = alice.user_id.clone();
    let delay_id = schedule_state(&alice, &room, &key, 1500, "left").await;

    let listed = alice.get(DELAYED).await.ok();
    let item = &listed["delayed_events"][0];
    assert_eq!(item["delay_id"], delay_id.as_str());
    assert_eq!(item["room_id"], room.as_str());
    assert_eq!(item["type"], "org.example.call.member");
    assert_eq!(item["state_key"], key.as_str());
    assert_eq!(item["delay_ms"], 1500);
    assert_eq!(item["content"], json!({ "body": "left" }));
    assert!(item["delayed_since_ts"].as_i64().unwrap() > 0);
    let one = alice.get(&format!("{DELAYED}/{delay_id}")).await.ok();
    assert_eq!(one["delay_id"], delay_id.as_str());
    // Another user neither lists it nor looks it up.
    assert!(scheduled_ids(&bob).await.is_empty());
    bob.get(&format!("{DELAYED}/{delay_id}"))
        .await
        .assert_error(404, "M_NOT_FOUND");
    assert_eq!(current_body(&alice, &room, &key).await, None);

    wait_until(
        "the delayed state is set",
        Duration::from_secs(15),
        || async { current_body(&bob, &room, &key).await.as_deref() == Some("left") },
    )
    .await;
    assert!(scheduled_ids(&alice).await.is_empty());
    assert_eq!(status_of(&server, &delay_id, "sent").await, 1);
    // Once sent, it can no longer be managed.
    action(&alice, &delay_id, "cancel")
        .await
        .assert_error(404, "M_NOT_FOUND");
}

#[tokio::test]
async fn a_cancelled_delayed_event_never_fires_and_unknown_ids_are_not_found() {
    let server = start().await;
    let alice = server.register("alice").await;
    let room = open_room(&alice, &[]).await;
    let delay_id = schedule_state(&alice, &room, "k", 400, "never").await;
    action(&alice, &delay_id, "cancel").await.ok();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(current_body(&alice, &room, "k").await, None);
    assert_eq!(status_of(&server, &delay_id, "cancelled").await, 1);
    for verb in ["cancel", "restart", "send"] {
        action(&alice, &delay_id, verb)
            .await
            .assert_error(404, "M_NOT_FOUND");
        action(&alice, "myd_unknown", verb)
            .await
            .assert_error(404, "M_NOT_FOUND");
        alice
            .post(&format!("{DELAYED}/myd_unknown/{verb}"), json!({}))
            .await
            .assert_error(404, "M_NOT_FOUND");
    }
    alice
        .get(&format!("{DELAYED}/myd_unknown"))
        .await
        .assert_error(404, "M_NOT_FOUND");
}

#[tokio::test]
async fn management_requests_with_a_bad_action_get_matrix_errors() {
    let server = start().await;
    let alice = server.register("alice").await;
    let room = open_room(&alice, &[]).await;
    let delay_id = schedule_state(&alice, &room, "k", 60000, "x").await;
    let path = format!("{DELAYED}/{delay_id}");
    alice
        .post(&path, json!({}))
        .await
        .assert_error(400, "M_MISSING_PARAM");
    alice
        .post(&path, json!({ "action": "explode" }))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    alice
        .post(&path, json!({ "action": 3 }))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    alice
        .raw(reqwest::Method::POST, &path, b"not json".to_vec())
        .await
        .assert_error(400, "M_NOT_JSON");
    // A token, when sent, must be valid.
    let mut stranger = server.client();
    stranger.token = Some("nonsense".into());
    stranger
        .post(&path, json!({ "action": "restart" }))
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");
    // The listing needs a token.
    server
        .client()
        .get(DELAYED)
        .await
        .assert_error(401, "M_MISSING_TOKEN");
    assert_eq!(scheduled_ids(&alice).await, [delay_id]);
}

#[tokio::test]
async fn restart_pushes_the_send_time_back_and_the_delay_id_alone_authorises_it() {
    let server = start().await;
    let alice = server.register("alice").await;
    let room = open_room(&alice, &[]).await;
    let delay_id = schedule_state(&alice, &room, "k", 2000, "late").await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // An SFU holding only the delay ID keeps the timer running (no token needed).
    server
        .client()
        .post(&format!("{DELAYED}/{delay_id}/restart"), json!({}))
        .await
        .ok();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // 2.4 s after scheduling, past the first deadline: not sent.
    assert_eq!(current_body(&alice, &room, "k").await, None);
    wait_until(
        "the restarted event is sent",
        Duration::from_secs(15),
        || async { current_body(&alice, &room, "k").await.as_deref() == Some("late") },
    )
    .await;
}

#[tokio::test]
async fn the_send_action_sends_a_delayed_message_at_once() {
    let server = start().await;
    let alice = server.register("alice").await;
    let room = open_room(&alice, &[]).await;
    let path = format!(
        "/_matrix/client/v3/rooms/{}/send/m.room.message/t1?org.matrix.msc4140.delay=60000",
        enc(&room)
    );
    let delay_id = alice
        .put(&path, json!({ "msgtype": "m.text", "body": "early" }))
        .await
        .ok()["delay_id"]
        .as_str()
        .unwrap()
        .to_owned();
    action(&alice, &delay_id, "send").await.ok();
    let messages = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=b&limit=5",
            enc(&room)
        ))
        .await
        .ok();
    let bodies: Vec<&Value> = messages["chunk"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "m.room.message")
        .map(|e| &e["content"]["body"])
        .collect();
    assert_eq!(bodies, [&json!("early")]);
    assert!(scheduled_ids(&alice).await.is_empty());
    action(&alice, &delay_id, "send")
        .await
        .assert_error(404, "M_NOT_FOUND");
}

#[tokio::test]
async fn someone_elses_state_cancels_a_delayed_state_event_but_the_owners_does_not() {
    let server = start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = open_room(&alice, &[&bob]).await;
    let mine = schedule_state(&alice, &room, "shared", 1000, "alice delayed").await;
    // The owner's own update of the same state leaves it scheduled.
    alice
        .put_state(
            &room,
            "org.example.call.member",
            "shared",
            json!({ "body": "alice now" }),
        )
        .await
        .ok();
    assert_eq!(scheduled_ids(&alice).await, std::slice::from_ref(&mine));
    // Someone else's cancels it.
    bob.put_state(
        &room,
        "org.example.call.member",
        "shared",
        json!({ "body": "bob" }),
    )
    .await
    .ok();
    assert!(scheduled_ids(&alice).await.is_empty());
    assert_eq!(status_of(&server, &mine, "cancelled").await, 1);
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert_eq!(
        current_body(&alice, &room, "shared").await.as_deref(),
        Some("bob")
    );
}

#[tokio::test]
async fn a_delayed_event_whose_owner_lost_the_right_to_send_it_fails() {
    let server = start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = open_room(&alice, &[&bob]).await;
    let by_timer = schedule_state(&bob, &room, "b", 500, "too late").await;
    let by_action = schedule_state(&bob, &room, "c", 60000, "too late").await;
    bob.room_action(&room, "leave", json!({})).await.ok();
    action(&bob, &by_action, "send")
        .await
        .assert_error(403, "M_FORBIDDEN");
    assert_eq!(status_of(&server, &by_action, "failed").await, 1);
    wait_until(
        "the timed event has failed",
        Duration::from_secs(15),
        || async { status_of(&server, &by_timer, "failed").await == 1 },
    )
    .await;
    assert_eq!(current_body(&alice, &room, "b").await, None);
    assert_eq!(current_body(&alice, &room, "c").await, None);
}

#[tokio::test]
async fn a_delayed_event_fires_after_a_server_restart_and_a_cancelled_one_still_does_not() {
    let mut server = start().await;
    let alice = server.register("alice").await;
    let room = open_room(&alice, &[]).await;
    let fires = schedule_state(&alice, &room, "fires", 1500, "after restart").await;
    let cancelled = schedule_state(&alice, &room, "cancelled", 1500, "never").await;
    action(&alice, &cancelled, "cancel").await.ok();
    server.kill();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    server.relaunch().await;
    let mut alice = alice.clone();
    alice.base = server.base_url.clone();
    wait_until(
        "the delayed state is set after the restart",
        Duration::from_secs(20),
        || async { current_body(&alice, &room, "fires").await.as_deref() == Some("after restart") },
    )
    .await;
    assert_eq!(status_of(&server, &fires, "sent").await, 1);
    assert_eq!(current_body(&alice, &room, "cancelled").await, None);
}

#[tokio::test]
async fn two_processes_on_one_database_send_each_delayed_event_exactly_once() {
    let server = start().await;
    let second = server.second_process_with(with_delays()).await;
    let alice = server.register("alice").await;
    let mut via_second = alice.clone();
    via_second.base = second.base_url.clone();
    let room = open_room(&alice, &[]).await;
    const EACH: usize = 10;
    for i in 0..EACH {
        for (client, name) in [(&alice, "first"), (&via_second, "second")] {
            let path = format!(
                "/_matrix/client/v3/rooms/{}/send/org.example.ping/{name}{i}?org.matrix.msc4140.delay=300",
                enc(&room)
            );
            client.put(&path, json!({ "n": i, "via": name })).await.ok();
        }
    }
    let sql = format!(
        "SELECT count(*) AS n FROM events WHERE room_id = '{room}' AND event_type = 'org.example.ping'"
    );
    wait_until(
        "every delayed event is sent",
        Duration::from_secs(20),
        || async {
            server
                .count("SELECT count(*) AS n FROM delayed_events WHERE status <> 'sent'")
                .await
                == 0
        },
    )
    .await;
    // Give a second sender the chance to (wrongly) send again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(server.count(&sql).await, 2 * EACH as i64);
    assert_eq!(
        server
            .count("SELECT count(DISTINCT event_id) AS n FROM delayed_events WHERE status = 'sent'")
            .await,
        2 * EACH as i64
    );
}

#[tokio::test]
async fn deactivating_an_account_cancels_its_delayed_events() {
    let server = start().await;
    let alice = server.register("alice").await;
    let room = open_room(&alice, &[]).await;
    let delay_id = schedule_state(&alice, &room, "k", 60000, "never").await;
    alice
        .post(
            "/_matrix/client/v3/account/deactivate",
            json!({ "auth": alice.password_auth("password", None) }),
        )
        .await
        .ok();
    assert_eq!(status_of(&server, &delay_id, "cancelled").await, 1);
    // The delay ID no longer sends anything.
    server
        .client()
        .post(&format!("{DELAYED}/{delay_id}/send"), json!({}))
        .await
        .assert_error(404, "M_NOT_FOUND");
}

#[tokio::test]
async fn a_send_action_racing_the_timer_sends_the_event_once() {
    let server = start().await;
    let second = server.second_process_with(with_delays()).await;
    let alice = server.register("alice").await;
    let room = open_room(&alice, &[]).await;
    let mut ids = Vec::new();
    for i in 0..10 {
        let path = format!(
            "/_matrix/client/v3/rooms/{}/send/org.example.race/t{i}?org.matrix.msc4140.delay=200",
            enc(&room)
        );
        ids.push(
            alice.put(&path, json!({ "n": i })).await.ok()["delay_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    // Both processes press "send" on every one while the timer fires them.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let presses = ids.iter().flat_map(|id| {
        [server.base_url.clone(), second.base_url.clone()]
            .into_iter()
            .map(move |base| {
                let id = id.clone();
                async move {
                    let response = Client::new(&base)
                        .post(&format!("{DELAYED}/{id}/send"), json!({}))
                        .await;
                    assert!(
                        response.status == 200 || response.status == 404,
                        "{}: {}",
                        response.status,
                        response.body
                    );
                }
            })
    });
    futures_util::future::join_all(presses).await;
    wait_until(
        "every delayed event is sent",
        Duration::from_secs(20),
        || async {
            server
                .count("SELECT count(*) AS n FROM delayed_events WHERE status <> 'sent'")
                .await
                == 0
        },
    )
    .await;
    let sql = format!(
        "SELECT count(*) AS n FROM events WHERE room_id = '{room}' AND event_type = 'org.example.race'"
    );
    assert_eq!(server.count(&sql).await, 10);
}

#[tokio::test]
async fn a_retried_delayed_send_gets_the_same_delay_id() {
    let server = start().await;
    let alice = server.register("alice").await;
    let room = open_room(&alice, &[]).await;
    let path = format!(
        "/_matrix/client/v3/rooms/{}/send/m.room.message/same?org.matrix.msc4140.delay=60000",
        enc(&room)
    );
    let body = json!({ "msgtype": "m.text", "body": "once" });
    let tries = (0..5).map(|_| alice.put(&path, body.clone()));
    let ids: std::collections::BTreeSet<String> = futures_util::future::join_all(tries)
        .await
        .into_iter()
        .map(|r| r.ok()["delay_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(scheduled_ids(&alice).await.len(), 1);
    // Another device's transaction of the same name is another request.
    let other = server.client().login("alice", "password").await;
    let mut other = other.clone();
    other.base = alice.base.clone();
    let id = other.put(&path, body).await.ok()["delay_id"].clone();
    assert!(!ids.contains(id.as_str().unwrap()));
}
