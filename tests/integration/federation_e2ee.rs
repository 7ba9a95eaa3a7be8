//! E2EE across servers: `/keys/query` and `/keys/claim` for users of another server, and the
//! federation endpoints that answer them.

use serde_json::{json, Value};

use crate::{
    e2ee::{device_keys, one_time_keys, set_up_cross_signing, upload, Signer},
    support::{
        federation::{federated_server, pair, FakeServer},
        Client,
    },
};

async fn query(client: &Client, user: &str) -> Value {
    client
        .post(
            "/_matrix/client/v3/keys/query",
            json!({ "device_keys": { user: [] } }),
        )
        .await
        .ok()
}

async fn claim(client: &Client, user: &str, device: &str) -> Value {
    client
        .post(
            "/_matrix/client/v3/keys/claim",
            json!({ "one_time_keys": { user: { device: "signed_curve25519" } } }),
        )
        .await
        .ok()
}

/// The single key a claim returned for `user`'s `device`: `(key ID, key)`.
fn claimed(answer: &Value, user: &str, device: &str) -> Option<(String, Value)> {
    let keys = answer["one_time_keys"][user][device].as_object()?;
    assert_eq!(keys.len(), 1, "{answer}");
    keys.iter()
        .next()
        .map(|(id, key)| (id.clone(), key.clone()))
}

#[tokio::test]
async fn keys_are_queried_and_claimed_across_servers_both_ways() {
    let (a, b) = pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;

    // Alice (A): device keys, two one-time keys, a fallback key, cross-signing keys.
    let cross = set_up_cross_signing(&alice).await;
    let fallback = cross.device.sign(
        &alice.user_id,
        json!({ "key": "fallback0000", "fallback": true }),
    );
    upload(
        &alice,
        json!({
            "one_time_keys": one_time_keys(&alice, &cross.device, 0..2),
            "fallback_keys": { "signed_curve25519:FB": fallback },
        }),
    )
    .await
    .ok();

    let seen = query(&bob, &alice.user_id).await;
    let device = &seen["device_keys"][&alice.user_id][&alice.device_id];
    assert_eq!(device["user_id"], alice.user_id, "{seen}");
    assert_eq!(
        device["keys"][format!("ed25519:{}", alice.device_id)],
        cross.device.public.as_str()
    );
    assert_eq!(
        seen["master_keys"][&alice.user_id]["keys"][cross.master.key_id()],
        cross.master.public.as_str(),
        "{seen}"
    );
    assert!(
        seen["self_signing_keys"][&alice.user_id].is_object(),
        "{seen}"
    );
    // The user-signing key never leaves its server.
    assert!(
        seen["user_signing_keys"].get(&alice.user_id).is_none(),
        "{seen}"
    );
    assert_eq!(seen["failures"], json!({}));

    // Two different one-time keys, then the fallback key.
    let first = claimed(
        &claim(&bob, &alice.user_id, &alice.device_id).await,
        &alice.user_id,
        &alice.device_id,
    )
    .unwrap();
    let second = claimed(
        &claim(&bob, &alice.user_id, &alice.device_id).await,
        &alice.user_id,
        &alice.device_id,
    )
    .unwrap();
    assert_ne!(first.0, second.0);
    assert!(first.0.starts_with("signed_curve25519:AAAA"));
    let third = claimed(
        &claim(&bob, &alice.user_id, &alice.device_id).await,
        &alice.user_id,
        &alice.device_id,
    )
    .unwrap();
    assert_eq!(third.0, "signed_curve25519:FB");

    // And the other way round.
    let signer = Signer::new(Some(&bob.device_id));
    upload(
        &bob,
        json!({
            "device_keys": device_keys(&bob, &signer),
            "one_time_keys": one_time_keys(&bob, &signer, 0..1),
        }),
    )
    .await
    .ok();
    let seen = query(&alice, &bob.user_id).await;
    assert_eq!(
        seen["device_keys"][&bob.user_id][&bob.device_id]["device_id"],
        bob.device_id
    );
    let key = claimed(
        &claim(&alice, &bob.user_id, &bob.device_id).await,
        &bob.user_id,
        &bob.device_id,
    );
    assert!(key.is_some());
}

#[tokio::test]
async fn an_unreachable_server_is_named_in_failures() {
    let server = federated_server().await;
    let alice = server.register("alice").await;
    let nobody = "@nobody:localhost:1";
    let seen = query(&alice, nobody).await;
    assert!(seen["failures"]["localhost:1"].is_object(), "{seen}");
    assert!(
        seen["device_keys"]
            .get(nobody)
            .is_none_or(|d| d == &json!({})),
        "{seen}"
    );
    let claimed = claim(&alice, nobody, "DEV").await;
    assert!(claimed["failures"]["localhost:1"].is_object(), "{claimed}");
}

#[tokio::test]
async fn federation_key_endpoints_answer_for_local_users_only() {
    let server = federated_server().await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let cross = set_up_cross_signing(&alice).await;
    upload(
        &alice,
        json!({ "one_time_keys": one_time_keys(&alice, &cross.device, 0..1) }),
    )
    .await
    .ok();
    let stranger = fake.user_id("stranger");

    let (status, answer) = fake
        .request(
            &server,
            "POST",
            "/_matrix/federation/v1/user/keys/query",
            Some(json!({ "device_keys": { &alice.user_id: [], &stranger: [] } })),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["device_keys"][&alice.user_id][&alice.device_id].is_object());
    assert!(answer["master_keys"][&alice.user_id].is_object());
    assert!(answer.get("user_signing_keys").is_none(), "{answer}");
    assert!(answer["device_keys"].get(&stranger).is_none(), "{answer}");

    let devices = |user: &str| {
        format!(
            "/_matrix/federation/v1/user/devices/{}",
            user.replace('@', "%40").replace(':', "%3A")
        )
    };
    let (status, answer) = fake
        .request(&server, "GET", &devices(&alice.user_id), None)
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["user_id"], alice.user_id);
    assert_eq!(answer["devices"][0]["device_id"], alice.device_id);
    assert!(answer["stream_id"].as_i64().unwrap() > 0, "{answer}");
    assert!(answer["self_signing_key"].is_object());
    let (status, answer) = fake
        .request(&server, "GET", &devices(&stranger), None)
        .await;
    assert_eq!(
        (status, answer["errcode"].as_str()),
        (404, Some("M_NOT_FOUND"))
    );

    let (status, answer) = fake
        .request(
            &server,
            "POST",
            "/_matrix/federation/v1/user/keys/claim",
            Some(json!({ "one_time_keys": {
                &alice.user_id: { &alice.device_id: "signed_curve25519" },
                &stranger: { "DEV": "signed_curve25519" },
            } })),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["one_time_keys"][&alice.user_id][&alice.device_id].is_object(),
        "{answer}"
    );
    assert!(answer["one_time_keys"].get(&stranger).is_none(), "{answer}");
}
