//! Application services: registration files, identity assertion, exclusive namespaces,
//! timestamp massaging, the ping, and transactions delivered exactly once in order, through
//! an outage, a kill -9 and a second server process.

use std::{collections::HashSet, process::Command, time::Duration};

use serde_json::{json, Value};

use crate::support::{
    appservice::FakeAppservice, client::enc, server_name, user_id, wait_until, Client,
    ServerOptions, TestServer,
};

/// A server with the fake appservice registered.
pub(crate) async fn server_with(appservice: &FakeAppservice) -> TestServer {
    TestServer::start_with(appservice.options(ServerOptions::default())).await
}

/// `path` with `?user_id=` (and `&device_id=`) appended.
pub(crate) fn as_user(path: &str, user: &str) -> String {
    let separator = if path.contains('?') { '&' } else { '?' };
    format!("{path}{separator}user_id={}", enc(user))
}

/// Registers a ghost through the appservice.
pub(crate) async fn register_ghost(appservice: &Client, localpart: &str) -> Value {
    appservice
        .post(
            &as_user("/_matrix/client/v3/register", &user_id(localpart)),
            json!({ "type": "m.login.application_service", "username": localpart, "inhibit_login": true }),
        )
        .await
        .ok()
}

#[test]
fn a_bad_registration_file_stops_the_start_with_one_line_naming_it() {
    let dir = std::env::temp_dir();
    let good = dir.join(format!("myelin-as-good-{}.yaml", std::process::id()));
    let bad = dir.join(format!("myelin-as-bad-{}.yaml", std::process::id()));
    let yaml = "id: a\nurl: null\nas_token: t1\nhs_token: h1\nsender_localpart: bot\n";
    std::fs::write(&good, yaml).unwrap();
    std::fs::write(&bad, yaml.replace("t1", "t2").replace("h1", "h2")).unwrap();
    let run = |files: String| {
        Command::new(env!("CARGO_BIN_EXE_myelin"))
            .arg("serve")
            .env_clear()
            .env("MYELIN_APPSERVICES", files)
            .output()
            .unwrap()
    };
    // The same id twice.
    let output = run(format!("{},{}", good.display(), bad.display()));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&bad.display().to_string()), "{stderr}");
    assert!(stderr.contains("id 'a' is used twice"), "{stderr}");
    // Not a registration at all.
    std::fs::write(&bad, "id: [unclosed").unwrap();
    let output = run(bad.display().to_string());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("MYELIN_APPSERVICES") && stderr.contains(&bad.display().to_string()));
    let _ = std::fs::remove_file(good);
    let _ = std::fs::remove_file(bad);
}

#[tokio::test]
async fn exclusive_namespaces_refuse_ordinary_users_and_aliases() {
    let fake = FakeAppservice::start(server_name()).await;
    let server = server_with(&fake).await;
    let refused = server
        .client()
        .post(
            "/_matrix/client/v3/register",
            json!({ "username": "echo_mallory", "password": "pw", "auth": { "type": "m.login.dummy" } }),
        )
        .await;
    refused.assert_error(400, "M_EXCLUSIVE");
    server
        .client()
        .get("/_matrix/client/v3/register/available?username=echo_mallory")
        .await
        .assert_error(400, "M_EXCLUSIVE");
    let alice = server.register("alice").await;
    alice
        .post(
            "/_matrix/client/v3/createRoom",
            json!({ "room_alias_name": "echo_room" }),
        )
        .await
        .assert_error(400, "M_EXCLUSIVE");
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let alias = format!("#echo_room:{}", server_name());
    alice
        .put(
            &format!("/_matrix/client/v3/directory/room/{}", enc(&alias)),
            json!({ "room_id": room }),
        )
        .await
        .assert_error(400, "M_EXCLUSIVE");
    // The appservice itself may (its bot is in the room).
    let appservice = fake.client(&server);
    appservice.join(&room).await.ok();
    appservice
        .put(
            &format!("/_matrix/client/v3/directory/room/{}", enc(&alias)),
            json!({ "room_id": room }),
        )
        .await
        .ok();
}

#[tokio::test]
async fn the_appservice_acts_only_as_registered_users_of_its_namespace() {
    let fake = FakeAppservice::start(server_name()).await;
    let server = server_with(&fake).await;
    let appservice = fake.client(&server);
    let whoami = "/_matrix/client/v3/account/whoami";
    // Its own user exists from the start; no device unless one is asserted.
    let me = appservice.get(whoami).await.ok();
    assert_eq!(me["user_id"], user_id("echobot"));
    assert!(me.get("device_id").is_none(), "{me}");
    // An ordinary user is outside its namespace.
    server.register("alice").await;
    appservice
        .get(&as_user(whoami, &user_id("alice")))
        .await
        .assert_error(403, "M_FORBIDDEN");
    // A user of its namespace it has not registered.
    appservice
        .get(&as_user(whoami, &user_id("echo_ghost")))
        .await
        .assert_error(403, "M_FORBIDDEN");
    // ... which /register accepts, whatever `?user_id=` says.
    let registered = register_ghost(&appservice, "echo_ghost").await;
    assert_eq!(registered["user_id"], user_id("echo_ghost"));
    assert!(registered.get("access_token").is_none(), "{registered}");
    register_ghost_again_is_in_use(&appservice).await;
    let ghost = appservice
        .get(&as_user(whoami, &user_id("echo_ghost")))
        .await
        .ok();
    assert_eq!(ghost["user_id"], user_id("echo_ghost"));
    // Outside its namespace, /register refuses.
    appservice
        .post(
            "/_matrix/client/v3/register",
            json!({ "type": "m.login.application_service", "username": "bob", "inhibit_login": true }),
        )
        .await
        .assert_error(400, "M_EXCLUSIVE");
    // An unknown device; then one created through MSC4190 (201, then 200).
    let with_device = |device: &str| {
        format!(
            "{}&device_id={device}",
            as_user(whoami, &user_id("echo_ghost"))
        )
    };
    appservice
        .get(&with_device("NOPE"))
        .await
        .assert_error(400, "M_UNKNOWN_DEVICE");
    let device_path = as_user("/_matrix/client/v3/devices/BRIDGE1", &user_id("echo_ghost"));
    let created = appservice
        .put(&device_path, json!({ "display_name": "bridge" }))
        .await;
    assert_eq!(created.status.as_u16(), 201, "{}", created.body);
    appservice.put(&device_path, json!({})).await.ok();
    let on_device = appservice.get(&with_device("BRIDGE1")).await.ok();
    assert_eq!(on_device["device_id"], "BRIDGE1");
    // A plain user's token does not become an appservice's.
    let alice = server.client().login("alice", "password").await;
    let plain = alice
        .get(&as_user(whoami, &user_id("echo_ghost")))
        .await
        .ok();
    assert_eq!(plain["user_id"], user_id("alice"));
}

async fn register_ghost_again_is_in_use(appservice: &Client) {
    appservice
        .post(
            "/_matrix/client/v3/register",
            json!({ "type": "m.login.application_service", "username": "echo_ghost", "inhibit_login": true }),
        )
        .await
        .assert_error(400, "M_USER_IN_USE");
}

#[tokio::test]
async fn the_appservice_login_type_is_advertised_and_works() {
    let fake = FakeAppservice::start(server_name()).await;
    let server = server_with(&fake).await;
    let flows = server.client().get("/_matrix/client/v3/login").await.ok();
    assert!(
        flows["flows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["type"] == "m.login.application_service"),
        "{flows}"
    );
    let appservice = fake.client(&server);
    register_ghost(&appservice, "echo_ghost").await;
    let login = |user: String| json!({ "type": "m.login.application_service", "identifier": { "type": "m.id.user", "user": user } });
    let session = appservice
        .post("/_matrix/client/v3/login", login(user_id("echo_ghost")))
        .await
        .ok();
    let ghost = server.client().with_session(&session);
    let me = ghost.get("/_matrix/client/v3/account/whoami").await.ok();
    assert_eq!(me["user_id"], user_id("echo_ghost"));
    assert_eq!(me["device_id"], session["device_id"]);
    server.register("alice").await;
    appservice
        .post("/_matrix/client/v3/login", login(user_id("alice")))
        .await
        .assert_error(400, "M_EXCLUSIVE");
    appservice
        .post("/_matrix/client/v3/login", login(user_id("echo_nobody")))
        .await
        .assert_error(403, "M_FORBIDDEN");
    server
        .client()
        .post("/_matrix/client/v3/login", login(user_id("echo_ghost")))
        .await
        .assert_error(401, "M_MISSING_TOKEN");
}

#[tokio::test]
async fn ts_is_honoured_for_appservices_only() {
    let fake = FakeAppservice::start(server_name()).await;
    let server = server_with(&fake).await;
    let appservice = fake.client(&server);
    let (alice, room) = room_with_ghost(&server, &fake).await;
    let send = |client: &Client, user: Option<&str>, txn: &str| {
        let mut path = format!(
            "/_matrix/client/v3/rooms/{}/send/m.room.message/{txn}?ts=1000000",
            enc(&room)
        );
        if let Some(user) = user {
            path = as_user(&path, user);
        }
        let client = client.clone();
        let body = json!({ "msgtype": "m.text", "body": txn });
        async move {
            client.put(&path, body).await.ok()["event_id"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let ghosts = send(&appservice, Some(&user_id("echo_ghost")), "g1").await;
    let alices = send(&alice, None, "a1").await;
    let ts = |event_id: String| {
        let alice = alice.clone();
        let room = room.clone();
        async move {
            alice.get_event(&room, &event_id).await.ok()["origin_server_ts"]
                .as_i64()
                .unwrap()
        }
    };
    assert_eq!(ts(ghosts).await, 1_000_000);
    assert!(ts(alices).await > 1_700_000_000_000);
    // State too, in a room of the ghost's own.
    let ghost_room = appservice
        .post(
            &as_user("/_matrix/client/v3/createRoom", &user_id("echo_ghost")),
            json!({}),
        )
        .await
        .ok()["room_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let state_path = format!(
        "/_matrix/client/v3/rooms/{}/state/m.bridge/x",
        enc(&ghost_room)
    );
    let put = format!("{state_path}?ts=2000000");
    appservice
        .put(&as_user(&put, &user_id("echo_ghost")), json!({ "n": 1 }))
        .await
        .ok();
    let get = format!("{state_path}?format=event");
    let event = appservice
        .get(&as_user(&get, &user_id("echo_ghost")))
        .await
        .ok();
    assert_eq!(event["origin_server_ts"], 2_000_000, "{event}");
}

#[tokio::test]
async fn ping_reports_the_round_trip_and_its_errors() {
    let fake = FakeAppservice::start(server_name()).await;
    let server = server_with(&fake).await;
    let appservice = fake.client(&server);
    let ping = "/_matrix/client/v1/appservice/echo/ping";
    let answer = appservice
        .post(ping, json!({ "transaction_id": "t1" }))
        .await
        .ok();
    assert!(answer["duration_ms"].as_u64().is_some(), "{answer}");
    let pinged = fake
        .received()
        .into_iter()
        .find(|r| r.path == "/_matrix/app/v1/ping")
        .expect("the appservice was pinged");
    assert_eq!(pinged.body["transaction_id"], "t1");
    assert_eq!(pinged.authorization, format!("Bearer {}", fake.hs_token));
    appservice
        .post("/_matrix/client/v1/appservice/other/ping", json!({}))
        .await
        .assert_error(403, "M_FORBIDDEN");
    let alice = server.register("alice").await;
    alice
        .post(ping, json!({}))
        .await
        .assert_error(403, "M_FORBIDDEN");
    fake.answer(500);
    let failed = appservice.post(ping, json!({})).await;
    failed.assert_error(502, "M_BAD_STATUS");
    assert_eq!(failed.body["status"], 500);
}

/// Message bodies of delivered events, in delivery order.
fn delivered_bodies(fake: &FakeAppservice) -> Vec<String> {
    fake.delivered_events()
        .iter()
        .filter(|e| e["type"] == "m.room.message")
        .filter_map(|e| e["content"]["body"].as_str().map(str::to_owned))
        .collect()
}

/// Alice's room with the appservice's ghost in it.
async fn room_with_ghost(server: &TestServer, fake: &FakeAppservice) -> (Client, String) {
    let appservice = fake.client(server);
    register_ghost(&appservice, "echo_ghost").await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    appservice
        .post(
            &as_user(
                &format!("/_matrix/client/v3/join/{}", enc(&room)),
                &user_id("echo_ghost"),
            ),
            json!({}),
        )
        .await
        .ok();
    (alice, room)
}

/// Every transaction answered 200 had at most 100 events, and a transaction ID sent more than
/// once was sent with the same body each time; the IDs only grow.
fn check_transactions(fake: &FakeAppservice) {
    let transactions = fake.transactions();
    let mut bodies = std::collections::HashMap::new();
    let mut last = 0;
    for (txn_id, body, _) in &transactions {
        assert!(body["events"].as_array().unwrap().len() <= 100);
        if let Some(earlier) = bodies.insert(*txn_id, body.clone()) {
            assert_eq!(
                &earlier, body,
                "transaction {txn_id} was resent with other content"
            );
        } else {
            assert!(
                *txn_id > last,
                "transaction IDs must grow: {txn_id} after {last}"
            );
            last = *txn_id;
        }
    }
    assert!(transactions.iter().all(|(_, b, _)| b["events"].is_array()));
}

#[tokio::test]
async fn an_outage_delivers_every_event_exactly_once_in_order_in_batches_of_100() {
    let fake = FakeAppservice::start(server_name()).await;
    let server = server_with(&fake).await;
    let (alice, room) = room_with_ghost(&server, &fake).await;
    wait_until("the join is delivered", Duration::from_secs(20), || async {
        fake.delivered_events()
            .iter()
            .any(|e| e["type"] == "m.room.member")
    })
    .await;
    fake.answer(503);
    let sent: Vec<String> = (0..250).map(|n| format!("m{n}")).collect();
    for body in &sent {
        alice.send_text(&room, body, body).await.ok();
    }
    wait_until("a transaction fails", Duration::from_secs(20), || async {
        fake.transactions()
            .iter()
            .any(|(_, _, status)| *status == 503)
    })
    .await;
    fake.answer(200);
    // The ping ends the backoff at once.
    fake.client(&server)
        .post("/_matrix/client/v1/appservice/echo/ping", json!({}))
        .await
        .ok();
    wait_until("all 250 arrive", Duration::from_secs(60), || async {
        delivered_bodies(&fake).len() >= 250
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(delivered_bodies(&fake), sent);
    check_transactions(&fake);
    let authorization = &fake.received()[0].authorization;
    assert_eq!(authorization, &format!("Bearer {}", fake.hs_token));
    let delivered = fake
        .transactions()
        .into_iter()
        .filter(|(_, _, status)| *status == 200)
        .count();
    assert!(
        delivered >= 3,
        "250 events need three transactions at least"
    );
}

#[tokio::test]
async fn a_kill_between_storing_and_acknowledging_resends_the_same_transaction() {
    let fake = FakeAppservice::start(server_name()).await;
    let mut server = server_with(&fake).await;
    let (alice, room) = room_with_ghost(&server, &fake).await;
    wait_until("the join is delivered", Duration::from_secs(20), || async {
        fake.delivered_events()
            .iter()
            .any(|e| e["type"] == "m.room.member")
    })
    .await;
    // Whatever else the set-up left (ephemeral data goes in transactions of its own) must
    // have gone too: a transaction of it failing first would hold the messages' back.
    wait_until(
        "the set-up's transactions are sent",
        Duration::from_secs(20),
        || async {
            let before = fake.transactions().len();
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            fake.transactions().len() == before
        },
    )
    .await;
    fake.answer(503);
    for n in 0..5 {
        alice
            .send_text(&room, &format!("k{n}"), &format!("k{n}"))
            .await
            .ok();
    }
    wait_until(
        "a transaction with the messages fails",
        Duration::from_secs(20),
        || async {
            fake.transactions()
                .iter()
                .any(|(_, body, status)| *status == 503 && body.to_string().contains("\"k0\""))
        },
    )
    .await;
    let (failed_id, failed_body, _) = fake
        .transactions()
        .into_iter()
        .find(|(_, body, status)| *status == 503 && body.to_string().contains("\"k0\""))
        .unwrap();
    server.kill();
    fake.answer(200);
    server.relaunch().await;
    fake.client(&server)
        .post("/_matrix/client/v1/appservice/echo/ping", json!({}))
        .await
        .ok();
    wait_until(
        "the stored transaction is resent",
        Duration::from_secs(30),
        || async {
            fake.transactions()
                .iter()
                .any(|(id, _, status)| *id == failed_id && *status == 200)
        },
    )
    .await;
    let resent = fake
        .transactions()
        .into_iter()
        .find(|(id, _, status)| *id == failed_id && *status == 200)
        .unwrap();
    assert_eq!(resent.1, failed_body);
    // After the restart, IDs go on growing.
    let alice = server.client().login("alice", "password").await;
    alice.send_text(&room, "after", "after").await.ok();
    wait_until(
        "the next message arrives",
        Duration::from_secs(20),
        || async { delivered_bodies(&fake).contains(&"after".to_owned()) },
    )
    .await;
    check_transactions(&fake);
    assert_eq!(
        delivered_bodies(&fake),
        ["k0", "k1", "k2", "k3", "k4", "after"].map(str::to_owned)
    );
}

#[tokio::test]
async fn two_processes_push_every_event_once() {
    let fake = FakeAppservice::start(server_name()).await;
    let server = server_with(&fake).await;
    let second = server.second_process().await;
    let (alice, room) = room_with_ghost(&server, &fake).await;
    let mut other = Client::new(&second.base_url);
    other = other.login("alice", "password").await;
    let mut sent = Vec::new();
    for n in 0..40 {
        let client = if n % 2 == 0 { &alice } else { &other };
        let body = format!("p{n}");
        client.send_text(&room, &body, &body).await.ok();
        sent.push(body);
    }
    wait_until("all 40 arrive", Duration::from_secs(30), || async {
        delivered_bodies(&fake).len() >= 40
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = fake.delivered_events();
    let ids: Vec<&str> = events
        .iter()
        .filter_map(|e| e["event_id"].as_str())
        .collect();
    let unique: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(ids.len(), unique.len(), "an event was pushed twice");
    assert_eq!(delivered_bodies(&fake), sent);
}

#[tokio::test]
async fn invites_to_the_bot_typing_and_receipts_reach_the_appservice() {
    let fake = FakeAppservice::start(server_name()).await;
    let server = server_with(&fake).await;
    let alice = server.register("alice").await;
    let room = alice
        .create_room(json!({ "invite": [user_id("echobot")] }))
        .await;
    wait_until(
        "the bot's invite is delivered",
        Duration::from_secs(20),
        || async {
            fake.delivered_events().iter().any(|e| {
                e["type"] == "m.room.member"
                    && e["state_key"] == user_id("echobot")
                    && e["content"]["membership"] == "invite"
            })
        },
    )
    .await;
    fake.client(&server)
        .post(
            &format!("/_matrix/client/v3/join/{}", enc(&room)),
            json!({}),
        )
        .await
        .ok();
    alice
        .put(
            &format!(
                "/_matrix/client/v3/rooms/{}/typing/{}",
                enc(&room),
                enc(&alice.user_id)
            ),
            json!({ "typing": true, "timeout": 10000 }),
        )
        .await
        .ok();
    wait_until("typing is delivered", Duration::from_secs(20), || async {
        ephemeral_seen(&fake, |e| {
            e["type"] == "m.typing"
                && e["room_id"] == room.as_str()
                && e["content"]["user_ids"][0] == alice.user_id.as_str()
        })
    })
    .await;
    let sent = alice.send_text(&room, "r1", "read me").await.ok();
    let event_id = sent["event_id"].as_str().unwrap();
    alice
        .post(
            &format!(
                "/_matrix/client/v3/rooms/{}/receipt/m.read/{}",
                enc(&room),
                enc(event_id)
            ),
            json!({}),
        )
        .await
        .ok();
    wait_until(
        "the receipt is delivered",
        Duration::from_secs(20),
        || async {
            ephemeral_seen(&fake, |e| {
                e["type"] == "m.receipt"
                    && e["room_id"] == room.as_str()
                    && e["content"][event_id]["m.read"][&alice.user_id]["ts"].is_i64()
            })
        },
    )
    .await;
}

/// Whether a transaction carried an ephemeral event that `matches`.
fn ephemeral_seen(fake: &FakeAppservice, matches: impl Fn(&Value) -> bool) -> bool {
    fake.transactions().iter().any(|(_, body, _)| {
        body["ephemeral"]
            .as_array()
            .is_some_and(|events| events.iter().any(&matches))
    })
}

#[tokio::test]
async fn unknown_names_in_a_namespace_are_asked_of_the_appservice() {
    let fake = FakeAppservice::start(server_name()).await;
    let server = server_with(&fake).await;
    let alice = server.register("alice").await;
    let alias = format!("#echo_new:{}", server_name());
    alice
        .get(&format!(
            "/_matrix/client/v3/directory/room/{}",
            enc(&alias)
        ))
        .await
        .assert_error(404, "M_NOT_FOUND");
    alice
        .get(&format!(
            "/_matrix/client/v3/profile/{}",
            enc(&user_id("echo_new"))
        ))
        .await
        .assert_error(404, "M_NOT_FOUND");
    alice
        .get(&format!(
            "/_matrix/client/v3/profile/{}",
            enc(&user_id("nobody"))
        ))
        .await
        .assert_error(404, "M_NOT_FOUND");
    let queries: Vec<String> = fake
        .received()
        .into_iter()
        .filter(|r| r.method == "GET")
        .inspect(|r| assert_eq!(r.authorization, format!("Bearer {}", fake.hs_token)))
        .map(|r| r.path)
        .collect();
    assert_eq!(
        queries,
        [
            format!("/_matrix/app/v1/rooms/{}", enc(&alias)),
            format!("/_matrix/app/v1/users/{}", enc(&user_id("echo_new"))),
        ]
    );
}
