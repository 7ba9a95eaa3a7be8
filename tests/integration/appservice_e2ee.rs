//! What appservices that encrypt for their users are sent: to-device messages for their
//! users' devices (MSC2409/MSC4203), device-list changes and key counts (MSC3202).

use std::{collections::BTreeMap, time::Duration};

use serde_json::{json, Value};

use crate::{
    appservices::{as_user, register_ghost, server_with},
    e2ee::{device_keys, one_time_keys, Signer},
    support::{
        appservice::{FakeAppservice, FakeRegistration},
        client::enc,
        server_name, user_id, wait_until, Client, ServerOptions, TestServer,
    },
};

/// The ghost's device the tests create.
const GHOST_DEVICE: &str = "GHOSTDEV";

/// The first body each transaction ID was acknowledged with (a resent ID counts once, as the
/// appservice deduplicates by ID), in ID order.
fn acknowledged(fake: &FakeAppservice) -> BTreeMap<u64, Value> {
    let mut bodies = BTreeMap::new();
    for (txn_id, body, status) in fake.transactions() {
        if status == 200 {
            bodies.entry(txn_id).or_insert(body);
        }
    }
    bodies
}

/// Every to-device message acknowledged, in order.
fn to_device_delivered(fake: &FakeAppservice) -> Vec<Value> {
    acknowledged(fake)
        .into_values()
        .flat_map(|body| {
            body["de.sorunome.msc2409.to_device"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

/// Registers `echo_ghost` and gives it the device [`GHOST_DEVICE`] (MSC4190); a client that
/// acts as that device through the appservice.
async fn ghost_with_device(fake: &FakeAppservice, server: &TestServer) -> Client {
    let appservice = fake.client(server);
    register_ghost(&appservice, "echo_ghost").await;
    let ghost = user_id("echo_ghost");
    let created = appservice
        .put(
            &as_user(
                &format!("/_matrix/client/v3/devices/{GHOST_DEVICE}"),
                &ghost,
            ),
            json!({}),
        )
        .await;
    assert_eq!(created.status.as_u16(), 201, "{}", created.body);
    let mut client = fake.client(server);
    client.user_id = ghost;
    client.device_id = GHOST_DEVICE.to_owned();
    client
}

/// `path` as the ghost's device.
fn as_ghost(path: &str, ghost: &Client) -> String {
    format!(
        "{}&device_id={}",
        as_user(path, &ghost.user_id),
        enc(&ghost.device_id)
    )
}

async fn send_to_device(sender: &Client, txn_id: &str, messages: Value) {
    sender
        .put(
            &format!("/_matrix/client/v3/sendToDevice/m.test/{txn_id}"),
            json!({ "messages": messages }),
        )
        .await
        .ok();
}

#[tokio::test]
async fn to_device_messages_for_its_users_reach_the_appservice_once() {
    let fake = FakeAppservice::start(server_name()).await;
    let mut server = server_with(&fake).await;
    let ghost = ghost_with_device(&fake, &server).await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    send_to_device(
        &alice,
        "t1",
        json!({
            &ghost.user_id: { GHOST_DEVICE: { "n": 1 } },
            &bob.user_id: { &bob.device_id: { "n": 2 } },
        }),
    )
    .await;
    wait_until(
        "the message reaches the appservice",
        Duration::from_secs(20),
        || async { !to_device_delivered(&fake).is_empty() },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Only the ghost's message, once, with its recipient.
    assert_eq!(
        to_device_delivered(&fake),
        [json!({
            "to_user_id": ghost.user_id,
            "to_device_id": GHOST_DEVICE,
            "type": "m.test",
            "sender": alice.user_id,
            "content": { "n": 1 },
        })]
    );
    // The appservice got a copy: the device still finds it with /sync, and so does Bob's.
    let synced = ghost
        .get(&as_ghost("/_matrix/client/v3/sync?timeout=0", &ghost))
        .await
        .ok();
    assert_eq!(
        synced["to_device"]["events"][0]["content"]["n"], 1,
        "{synced}"
    );
    let synced = bob.sync(None, 0, None).await;
    assert_eq!(
        synced["to_device"]["events"][0]["content"]["n"], 2,
        "{synced}"
    );
    // A restart sends nothing again; the next message goes once.
    server.kill();
    server.relaunch().await;
    let alice = server.client().login("alice", "password").await;
    send_to_device(
        &alice,
        "t2",
        json!({ &ghost.user_id: { GHOST_DEVICE: { "n": 3 } } }),
    )
    .await;
    wait_until(
        "the second message reaches the appservice",
        Duration::from_secs(30),
        || async { to_device_delivered(&fake).len() >= 2 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let numbers: Vec<Value> = to_device_delivered(&fake)
        .iter()
        .map(|m| m["content"]["n"].clone())
        .collect();
    assert_eq!(numbers, [json!(1), json!(3)]);
}

#[tokio::test]
async fn to_device_messages_wait_for_a_failing_appservice() {
    let fake = FakeAppservice::start(server_name()).await;
    let server = server_with(&fake).await;
    let ghost = ghost_with_device(&fake, &server).await;
    let alice = server.register("alice").await;
    fake.answer(503);
    send_to_device(
        &alice,
        "t1",
        json!({ &ghost.user_id: { GHOST_DEVICE: { "n": 1 } } }),
    )
    .await;
    wait_until("a transaction fails", Duration::from_secs(20), || async {
        fake.transactions()
            .iter()
            .any(|(_, _, status)| *status == 503)
    })
    .await;
    // Sent while the appservice is backed off: unlike typing, it is not dropped.
    send_to_device(
        &alice,
        "t2",
        json!({ &ghost.user_id: { GHOST_DEVICE: { "n": 2 } } }),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    fake.answer(200);
    fake.client(&server)
        .post("/_matrix/client/v1/appservice/echo/ping", json!({}))
        .await
        .ok();
    wait_until("both messages arrive", Duration::from_secs(30), || async {
        to_device_delivered(&fake).len() >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let numbers: Vec<Value> = to_device_delivered(&fake)
        .iter()
        .map(|m| m["content"]["n"].clone())
        .collect();
    assert_eq!(numbers, [json!(1), json!(2)]);
}

#[tokio::test]
async fn device_lists_and_key_counts_reach_an_msc3202_appservice_only() {
    let encrypting = FakeAppservice::start_with(
        server_name(),
        FakeRegistration {
            extra: "org.matrix.msc3202: true",
            ..FakeRegistration::default()
        },
    )
    .await;
    // Another appservice interested in the same users, without the flag.
    let plain = FakeAppservice::start_with(
        server_name(),
        FakeRegistration {
            id: "plain",
            exclusive: false,
            ..FakeRegistration::default()
        },
    )
    .await;
    let server = TestServer::start_with(FakeAppservice::options_for(
        &[&encrypting, &plain],
        ServerOptions::default(),
    ))
    .await;
    let ghost = ghost_with_device(&encrypting, &server).await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    encrypting
        .client(&server)
        .post(
            &as_user(
                &format!("/_matrix/client/v3/join/{}", enc(&room)),
                &ghost.user_id,
            ),
            json!({}),
        )
        .await
        .ok();
    // The ghost's device uploads its keys: a device-list change of one of its users.
    let signer = Signer::new(Some(GHOST_DEVICE));
    let fallback = signer.sign(
        &ghost.user_id,
        json!({ "key": "fallbackfallbackfallbackfallback", "fallback": true }),
    );
    ghost
        .post(
            &as_ghost("/_matrix/client/v3/keys/upload", &ghost),
            json!({
                "device_keys": device_keys(&ghost, &signer),
                "one_time_keys": one_time_keys(&ghost, &signer, 0..3),
                "fallback_keys": { "signed_curve25519:FB1": fallback },
            }),
        )
        .await
        .ok();
    // Bob, who shares no room with its users, changes his keys; then Alice, who does.
    let bob = server.register("bob").await;
    let bob_signer = Signer::new(Some(&bob.device_id));
    bob.post(
        "/_matrix/client/v3/keys/upload",
        json!({ "device_keys": device_keys(&bob, &bob_signer) }),
    )
    .await
    .ok();
    let alice_signer = Signer::new(Some(&alice.device_id));
    alice
        .post(
            "/_matrix/client/v3/keys/upload",
            json!({ "device_keys": device_keys(&alice, &alice_signer) }),
        )
        .await
        .ok();
    let changed = |fake: &FakeAppservice| -> Vec<String> {
        acknowledged(fake)
            .values()
            .flat_map(|body| {
                body["org.matrix.msc3202.device_lists"]["changed"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|user| user.as_str().map(str::to_owned))
            .collect()
    };
    wait_until(
        "both changes reach the appservice",
        Duration::from_secs(20),
        || async {
            let changed = changed(&encrypting);
            changed.contains(&ghost.user_id) && changed.contains(&alice.user_id)
        },
    )
    .await;
    assert!(!changed(&encrypting).contains(&bob.user_id));
    // The counts of the ghost's device after its upload.
    let counted = || {
        acknowledged(&encrypting).into_values().find(|body| {
            body["org.matrix.msc3202.device_one_time_keys_count"][&ghost.user_id][GHOST_DEVICE]
                ["signed_curve25519"]
                == 3
        })
    };
    wait_until(
        "the ghost's key counts reach the appservice",
        Duration::from_secs(20),
        || async { counted().is_some() },
    )
    .await;
    let body = counted().unwrap();
    assert_eq!(
        body["org.matrix.msc3202.device_one_time_key_counts"],
        body["org.matrix.msc3202.device_one_time_keys_count"]
    );
    assert_eq!(
        body["org.matrix.msc3202.device_unused_fallback_key_types"][&ghost.user_id][GHOST_DEVICE],
        json!(["signed_curve25519"])
    );
    // The other appservice is sent the room's events but none of this.
    alice.send_text(&room, "m1", "after the keys").await.ok();
    wait_until(
        "the message reaches the other appservice",
        Duration::from_secs(20),
        || async {
            acknowledged(&plain).values().any(|body| {
                body["events"].as_array().is_some_and(|events| {
                    events
                        .iter()
                        .any(|e| e["content"]["body"] == "after the keys")
                })
            })
        },
    )
    .await;
    for body in acknowledged(&plain).values() {
        let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
        assert!(
            keys.iter()
                .all(|key| !key.starts_with("org.matrix.msc3202")),
            "{body}"
        );
    }
}
