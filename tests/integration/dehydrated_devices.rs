//! Dehydrated devices (MSC3814): stored with their keys, replaced, deleted, and read for the
//! to-device messages that arrived for them.

use serde_json::{json, Value};

use crate::{
    e2ee::{device_keys, one_time_keys, Signer},
    support::{Client, TestServer},
};

const DEHYDRATED: &str = "/_matrix/client/unstable/org.matrix.msc3814.v1/dehydrated_device";

/// A client acting as the dehydrated device `device_id` of `client`'s user.
fn as_device(client: &Client, device_id: &str) -> Client {
    let mut device = client.clone();
    device.device_id = device_id.to_owned();
    device
}

fn put_body(client: &Client, device_id: &str) -> Value {
    let device = as_device(client, device_id);
    let signer = Signer::new(Some(device_id));
    json!({
        "device_id": device_id,
        "device_data": { "algorithm": "org.matrix.msc3814.v2", "device_pickle": "pickled" },
        "initial_device_display_name": "Dehydrated device",
        "device_keys": device_keys(&device, &signer),
        "one_time_keys": one_time_keys(&device, &signer, 0..2),
    })
}

async fn send_to_device(sender: &Client, user: &str, device: &str, txn: &str, n: u32) {
    sender
        .put(
            &format!("/_matrix/client/v3/sendToDevice/m.room_key/{txn}"),
            json!({ "messages": { user: { device: { "n": n } } } }),
        )
        .await
        .ok();
}

#[tokio::test]
async fn a_dehydrated_device_is_stored_with_its_keys_and_replaced_by_the_next() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let versions = server.client().get("/_matrix/client/versions").await.ok();
    assert_eq!(versions["unstable_features"]["org.matrix.msc3814"], true);
    alice.get(DEHYDRATED).await.assert_error(404, "M_NOT_FOUND");
    alice
        .delete(DEHYDRATED, json!({}))
        .await
        .assert_error(404, "M_NOT_FOUND");

    let stored = alice.put(DEHYDRATED, put_body(&alice, "DEHYD1")).await.ok();
    assert_eq!(stored["device_id"], "DEHYD1");
    let got = alice.get(DEHYDRATED).await.ok();
    assert_eq!(got["device_id"], "DEHYD1");
    assert_eq!(got["device_data"]["algorithm"], "org.matrix.msc3814.v2");
    // Others find its keys and claim its one-time keys like any device's.
    let bob = server.register("bob").await;
    let queried = bob
        .post(
            "/_matrix/client/v3/keys/query",
            json!({ "device_keys": { &alice.user_id: [] } }),
        )
        .await
        .ok();
    assert!(queried["device_keys"][&alice.user_id]["DEHYD1"].is_object());
    let claimed = bob
        .post(
            "/_matrix/client/v3/keys/claim",
            json!({ "one_time_keys": { &alice.user_id: { "DEHYD1": "signed_curve25519" } } }),
        )
        .await
        .ok();
    assert!(claimed["one_time_keys"][&alice.user_id]["DEHYD1"].is_object());

    // A new one replaces it; the old device is gone with its keys.
    alice.put(DEHYDRATED, put_body(&alice, "DEHYD2")).await.ok();
    assert_eq!(alice.get(DEHYDRATED).await.ok()["device_id"], "DEHYD2");
    let devices = alice.get("/_matrix/client/v3/devices").await.ok();
    let ids: Vec<&str> = devices["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["device_id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"DEHYD2") && !ids.contains(&"DEHYD1"),
        "{ids:?}"
    );

    let deleted = alice.delete(DEHYDRATED, json!({})).await.ok();
    assert_eq!(deleted["device_id"], "DEHYD2");
    alice.get(DEHYDRATED).await.assert_error(404, "M_NOT_FOUND");
    assert_eq!(
        server
            .count("SELECT count(*) AS n FROM devices WHERE device_id IN ('DEHYD1', 'DEHYD2')")
            .await,
        0
    );
}

#[tokio::test]
async fn bad_dehydrated_devices_get_matrix_errors() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let mut no_keys = put_body(&alice, "D1");
    no_keys.as_object_mut().unwrap().remove("device_keys");
    alice
        .put(DEHYDRATED, no_keys)
        .await
        .assert_error(400, "M_BAD_JSON");
    let mut no_algorithm = put_body(&alice, "D1");
    no_algorithm["device_data"] = json!({ "pickle": "x" });
    alice
        .put(DEHYDRATED, no_algorithm)
        .await
        .assert_error(400, "M_BAD_JSON");
    alice
        .put(DEHYDRATED, json!({ "device_data": { "algorithm": "a" } }))
        .await
        .assert_error(400, "M_BAD_JSON");
    // Keys signed by another device are refused, and nothing is left behind.
    let mut forged = put_body(&alice, "D1");
    forged["device_keys"] = put_body(&alice, "D2")["device_keys"].clone();
    alice
        .put(DEHYDRATED, forged)
        .await
        .assert_error(400, "M_INVALID_PARAM");
    // A device the user logged in with cannot become the dehydrated one.
    let mut taken = put_body(&alice, &alice.device_id.clone());
    taken["device_id"] = alice.device_id.clone().into();
    alice
        .put(DEHYDRATED, taken)
        .await
        .assert_error(400, "M_INVALID_PARAM");
    alice.get(DEHYDRATED).await.assert_error(404, "M_NOT_FOUND");
    assert_eq!(
        server
            .count("SELECT count(*) AS n FROM devices WHERE device_id = 'D1'")
            .await,
        0
    );
    server
        .client()
        .get(DEHYDRATED)
        .await
        .assert_error(401, "M_MISSING_TOKEN");
}

#[tokio::test]
async fn to_device_messages_for_the_dehydrated_device_are_read_in_batches() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let events = format!("{DEHYDRATED}/DEHYD/events");
    // No dehydrated device yet: nothing to read.
    alice
        .post(&events, json!({}))
        .await
        .assert_error(403, "M_FORBIDDEN");
    alice.put(DEHYDRATED, put_body(&alice, "DEHYD")).await.ok();
    alice
        .post(&format!("{DEHYDRATED}/OTHER/events"), json!({}))
        .await
        .assert_error(403, "M_FORBIDDEN");
    for n in 0..3 {
        send_to_device(&bob, &alice.user_id, "DEHYD", &format!("t{n}"), n).await;
    }
    let first = alice.post(&events, json!({})).await.ok();
    let got: Vec<&Value> = first["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["content"]["n"])
        .collect();
    assert_eq!(got, [&json!(0), &json!(1), &json!(2)]);
    assert_eq!(first["events"][0]["sender"], bob.user_id.as_str());
    assert_eq!(first["events"][0]["type"], "m.room_key");
    let next = first["next_batch"].as_str().unwrap().to_owned();
    // Nothing new after the token; the GET form agrees and omits next_batch when done.
    let again = alice
        .post(&events, json!({ "next_batch": next }))
        .await
        .ok();
    assert_eq!(again["events"], json!([]));
    let got = alice.get(&format!("{events}?from={next}")).await.ok();
    assert_eq!(got["events"], json!([]));
    assert!(got.get("next_batch").is_none());
    send_to_device(&bob, &alice.user_id, "DEHYD", "t9", 9).await;
    let later = alice
        .post(&events, json!({ "next_batch": next }))
        .await
        .ok();
    assert_eq!(later["events"][0]["content"]["n"], 9);
    for bad in ["x1", "d", "d-1", "dabc"] {
        alice
            .post(&events, json!({ "next_batch": bad }))
            .await
            .assert_error(400, "M_INVALID_PARAM");
    }
}
