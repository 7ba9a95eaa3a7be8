//! End-to-end encryption support: keys, claims, cross-signing, to-device, device lists, backup.

use std::collections::HashSet;

use base64::{engine::general_purpose::STANDARD_NO_PAD, Engine};
use ruma::{
    signatures::{sign_json, Ed25519KeyPair},
    CanonicalJsonObject,
};
use serde_json::{json, Value};

use crate::support::{client::enc, room_id, user_id, Client, TestServer};

/// An ed25519 key whose signatures name it `ed25519:{name}` (a device ID, or for cross-signing
/// keys the public key itself).
pub(crate) struct Signer {
    pair: Ed25519KeyPair,
    pub(crate) public: String,
}

impl Signer {
    pub(crate) fn new(name: Option<&str>) -> Signer {
        let document = Ed25519KeyPair::generate();
        let probe = Ed25519KeyPair::from_der(&document, "x".into()).unwrap();
        let public = STANDARD_NO_PAD.encode(probe.public_key());
        let version = name.map_or_else(|| public.clone(), str::to_owned);
        Signer {
            pair: Ed25519KeyPair::from_der(&document, version).unwrap(),
            public,
        }
    }

    pub(crate) fn key_id(&self) -> String {
        format!("ed25519:{}", self.pair.version())
    }

    pub(crate) fn sign(&self, user: &str, value: Value) -> Value {
        let mut object: CanonicalJsonObject = serde_json::from_value(value).unwrap();
        sign_json(user, &self.pair, &mut object).unwrap();
        serde_json::to_value(object).unwrap()
    }
}

pub(crate) fn device_keys(client: &Client, signer: &Signer) -> Value {
    let keys = json!({
        "user_id": client.user_id,
        "device_id": client.device_id,
        "algorithms": ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
        "keys": {
            format!("curve25519:{}", client.device_id): "curvecurvecurvecurvecurvecurvecurvecurve123",
            signer.key_id(): signer.public,
        },
    });
    signer.sign(&client.user_id, keys)
}

pub(crate) fn one_time_keys(client: &Client, signer: &Signer, ids: std::ops::Range<u32>) -> Value {
    let mut keys = serde_json::Map::new();
    for i in ids {
        let key = signer.sign(&client.user_id, json!({ "key": format!("otk{i:040}") }));
        keys.insert(format!("signed_curve25519:AAAA{i}"), key);
    }
    Value::Object(keys)
}

pub(crate) async fn upload(client: &Client, body: Value) -> crate::support::client::Response {
    client.post("/_matrix/client/v3/keys/upload", body).await
}

async fn query(client: &Client, users: &[&str]) -> Value {
    let wanted: serde_json::Map<String, Value> =
        users.iter().map(|u| (u.to_string(), json!([]))).collect();
    client
        .post(
            "/_matrix/client/v3/keys/query",
            json!({ "device_keys": wanted }),
        )
        .await
        .ok()
}

#[tokio::test]
async fn device_keys_are_checked_stored_and_queried() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let signer = Signer::new(Some(&alice.device_id));

    let counts = upload(
        &alice,
        json!({ "device_keys": device_keys(&alice, &signer) }),
    )
    .await
    .ok();
    assert_eq!(counts["one_time_key_counts"]["signed_curve25519"], 0);
    let seen = query(&bob, &[&user_id("alice")]).await;
    let keys = &seen["device_keys"][&user_id("alice")][&alice.device_id];
    assert_eq!(keys["keys"][signer.key_id()], signer.public.as_str());
    assert!(keys["signatures"][&user_id("alice")][signer.key_id()].is_string());

    let counts = upload(
        &alice,
        json!({ "one_time_keys": one_time_keys(&alice, &signer, 0..3) }),
    )
    .await
    .ok();
    assert_eq!(counts["one_time_key_counts"]["signed_curve25519"], 3);
    // The same ID with another key is refused; the same key again is fine.
    let mut clash = one_time_keys(&alice, &signer, 0..1);
    clash["signed_curve25519:AAAA0"]["key"] = json!("different");
    let clash = json!({ "signed_curve25519:AAAA0": signer.sign(&alice.user_id, clash["signed_curve25519:AAAA0"].clone()) });
    upload(&alice, json!({ "one_time_keys": clash }))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    upload(
        &alice,
        json!({ "one_time_keys": one_time_keys(&alice, &signer, 0..1) }),
    )
    .await
    .ok();

    // Someone else's device, or keys not signed by the device, are refused.
    let mut forged = device_keys(&alice, &signer);
    forged["keys"][format!("curve25519:{}", alice.device_id)] = json!("swapped");
    upload(&alice, json!({ "device_keys": forged }))
        .await
        .assert_error(400, "M_INVALID_SIGNATURE");
    let other = Signer::new(Some(&bob.device_id));
    upload(&alice, json!({ "device_keys": device_keys(&bob, &other) }))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    let unsigned_otk = json!({ "signed_curve25519:BAD": { "key": "x", "signatures": { user_id("alice"): { signer.key_id(): "AAAA" } } } });
    upload(&alice, json!({ "one_time_keys": unsigned_otk }))
        .await
        .assert_error(400, "M_INVALID_SIGNATURE");
}

#[tokio::test]
async fn concurrent_claims_never_get_the_same_one_time_key() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let signer = Signer::new(Some(&alice.device_id));
    let fallback = json!({
        "signed_curve25519:FALLBACK": signer.sign(&alice.user_id, json!({ "key": "fallbackkey", "fallback": true })),
    });
    upload(
        &alice,
        json!({
            "device_keys": device_keys(&alice, &signer),
            "one_time_keys": one_time_keys(&alice, &signer, 0..20),
            "fallback_keys": fallback,
        }),
    )
    .await
    .ok();
    let initial = alice.sync(None, 0, None).await;
    assert_eq!(
        initial["device_one_time_keys_count"]["signed_curve25519"],
        20
    );
    assert_eq!(
        initial["device_unused_fallback_key_types"],
        json!(["signed_curve25519"])
    );

    let claim = json!({ "one_time_keys": { user_id("alice"): { alice.device_id.clone(): "signed_curve25519" } } });
    let claims = (0..30).map(|_| {
        let bob = bob.clone();
        let claim = claim.clone();
        tokio::spawn(async move { bob.post("/_matrix/client/v3/keys/claim", claim).await.ok() })
    });
    let mut otks = Vec::new();
    let mut fallbacks = 0;
    for claim in claims {
        let answer = claim.await.unwrap();
        let keys = answer["one_time_keys"][&user_id("alice")][&alice.device_id]
            .as_object()
            .expect("a key for every claim")
            .clone();
        let (id, _) = keys.into_iter().next().unwrap();
        if id == "signed_curve25519:FALLBACK" {
            fallbacks += 1;
        } else {
            otks.push(id);
        }
    }
    let distinct: HashSet<&String> = otks.iter().collect();
    assert_eq!(otks.len(), 20, "every one-time key handed out once");
    assert_eq!(distinct.len(), 20, "no one-time key handed out twice");
    assert_eq!(fallbacks, 10, "the fallback key once they ran out");
    let after = alice.sync(None, 0, None).await;
    assert_eq!(after["device_one_time_keys_count"]["signed_curve25519"], 0);
    assert_eq!(after["device_unused_fallback_key_types"], json!([]));
}

#[tokio::test]
async fn to_device_messages_are_redelivered_until_a_later_sync_acknowledges_them() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let alice_phone = alice.login("alice", "password").await;
    let bob = server.register("bob").await;
    let start = alice.next_batch().await;
    let send = |txn: &str, device: &str| {
        let path = format!("/_matrix/client/v3/sendToDevice/m.test/{txn}");
        let body = json!({ "messages": { user_id("alice"): { device: { "n": txn } } } });
        let bob = bob.clone();
        async move { bob.put(&path, body).await.ok() }
    };
    send("t1", &alice.device_id).await;
    send("t1", &alice.device_id).await; // a retry: delivered once

    let first = alice.sync(Some(&start), 0, None).await;
    let events = first["to_device"]["events"].as_array().unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["sender"], user_id("bob"));
    assert_eq!(events[0]["type"], "m.test");
    assert_eq!(events[0]["content"]["n"], "t1");
    // The response was lost: syncing from the old token again delivers the message again.
    let again = alice.sync(Some(&start), 0, None).await;
    assert_eq!(again["to_device"]["events"].as_array().unwrap().len(), 1);
    // Syncing from the new token acknowledges it: it is gone.
    let next = again["next_batch"].as_str().unwrap();
    let acked = alice.sync(Some(next), 0, None).await;
    assert!(acked["to_device"]["events"].as_array().unwrap().is_empty());
    assert_eq!(
        server
            .count("SELECT COUNT(*) AS n FROM to_device_inbox")
            .await,
        0
    );
    // The phone never saw any of it; `*` reaches both devices.
    let phone = alice_phone.sync(None, 0, None).await;
    assert!(phone["to_device"]["events"].as_array().unwrap().is_empty());
    send("t2", "*").await;
    let phone = alice_phone.sync(None, 0, None).await;
    assert_eq!(phone["to_device"]["events"][0]["content"]["n"], "t2");
    let laptop = alice
        .sync(Some(acked["next_batch"].as_str().unwrap()), 0, None)
        .await;
    assert_eq!(laptop["to_device"]["events"][0]["content"]["n"], "t2");
}

#[tokio::test]
async fn device_list_changes_reach_those_who_share_a_room() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let eve = server.register("eve").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    let bob_since = bob.next_batch().await;
    let eve_since = eve.next_batch().await;

    let signer = Signer::new(Some(&alice.device_id));
    upload(
        &alice,
        json!({ "device_keys": device_keys(&alice, &signer) }),
    )
    .await
    .ok();
    let bob_view = bob.sync(Some(&bob_since), 5_000, None).await;
    assert_eq!(
        bob_view["device_lists"]["changed"],
        json!([user_id("alice")])
    );
    let eve_view = eve.sync(Some(&eve_since), 0, None).await;
    assert_eq!(eve_view["device_lists"]["changed"], json!([]));
    let changes = bob
        .get(&format!(
            "/_matrix/client/v3/keys/changes?from={}&to={}",
            enc(&bob_since),
            enc(bob_view["next_batch"].as_str().unwrap())
        ))
        .await
        .ok();
    assert_eq!(changes["changed"], json!([user_id("alice")]));

    // A new device that is deleted again is a change too; leaving the only shared room is a
    // `left`.
    let bob_since = bob_view["next_batch"].as_str().unwrap().to_owned();
    let phone = alice.login("alice", "password").await;
    phone
        .post("/_matrix/client/v3/logout", json!({}))
        .await
        .ok();
    let bob_view = bob.sync(Some(&bob_since), 5_000, None).await;
    assert_eq!(
        bob_view["device_lists"]["changed"],
        json!([user_id("alice")])
    );
    let bob_since = bob_view["next_batch"].as_str().unwrap().to_owned();
    alice.room_action(&room, "leave", json!({})).await.ok();
    let bob_view = bob.sync(Some(&bob_since), 5_000, None).await;
    assert_eq!(bob_view["device_lists"]["left"], json!([user_id("alice")]));

    // Coming back is a change, though no device changed: found through the membership alone.
    let bob_since = bob_view["next_batch"].as_str().unwrap().to_owned();
    alice.join(&room).await.ok();
    let bob_view = bob.sync(Some(&bob_since), 5_000, None).await;
    assert_eq!(
        bob_view["device_lists"]["changed"],
        json!([user_id("alice")])
    );
    assert_eq!(bob_view["device_lists"]["left"], json!([]));
}

#[tokio::test]
async fn cross_signing_keys_and_signatures() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let device = Signer::new(Some(&alice.device_id));
    upload(
        &alice,
        json!({ "device_keys": device_keys(&alice, &device) }),
    )
    .await
    .ok();
    let master = Signer::new(None);
    let self_signing = Signer::new(None);
    let user_signing = Signer::new(None);
    let key = |signer: &Signer, usage: &str| json!({ "user_id": alice.user_id, "usage": [usage], "keys": { signer.key_id(): signer.public } });
    let body = json!({
        "master_key": key(&master, "master"),
        "self_signing_key": master.sign(&alice.user_id, key(&self_signing, "self_signing")),
        "user_signing_key": master.sign(&alice.user_id, key(&user_signing, "user_signing")),
    });
    alice
        .post(
            "/_matrix/client/v3/keys/device_signing/upload",
            body.clone(),
        )
        .await
        .ok();
    let own = query(&alice, &[&user_id("alice")]).await;
    assert_eq!(
        own["master_keys"][&user_id("alice")]["usage"],
        json!(["master"])
    );
    assert!(own["user_signing_keys"][&user_id("alice")].is_object());
    let theirs = query(&bob, &[&user_id("alice")]).await;
    assert!(theirs["self_signing_keys"][&user_id("alice")].is_object());
    assert!(theirs["user_signing_keys"].get(user_id("alice")).is_none());

    // A self-signing key not signed by the master key is refused.
    let mut bad = body.clone();
    bad["self_signing_key"] = key(&self_signing, "self_signing");
    alice
        .post("/_matrix/client/v3/keys/device_signing/upload", bad)
        .await
        .assert_error(400, "M_INVALID_SIGNATURE");

    // The self-signing key signs the device; a junk signature is reported per key.
    let signed_device = self_signing.sign(&alice.user_id, device_keys(&alice, &device));
    let answer = alice
        .post(
            "/_matrix/client/v3/keys/signatures/upload",
            json!({ user_id("alice"): { alice.device_id.clone(): signed_device } }),
        )
        .await
        .ok();
    assert_eq!(answer["failures"], json!({}));
    let seen = query(&bob, &[&user_id("alice")]).await;
    assert!(
        seen["device_keys"][&user_id("alice")][&alice.device_id]["signatures"][&user_id("alice")]
            [self_signing.key_id()]
        .is_string()
    );
    let mut junk = device_keys(&alice, &device);
    junk["signatures"][&user_id("alice")][self_signing.key_id()] = json!("AAAA");
    let answer = alice
        .post(
            "/_matrix/client/v3/keys/signatures/upload",
            json!({ user_id("alice"): { alice.device_id.clone(): junk } }),
        )
        .await
        .ok();
    assert_eq!(
        answer["failures"][&user_id("alice")][&alice.device_id]["errcode"],
        "M_INVALID_SIGNATURE"
    );

    // Replacing the master key needs the password.
    let new_master = Signer::new(None);
    let replace = json!({ "master_key": key(&new_master, "master") });
    let challenge = alice
        .post(
            "/_matrix/client/v3/keys/device_signing/upload",
            replace.clone(),
        )
        .await;
    assert_eq!(challenge.status.as_u16(), 401);
    let session = challenge.body["session"].as_str().unwrap().to_owned();
    let mut authed = replace.clone();
    authed["auth"] = alice.password_auth("password", Some(&session));
    alice
        .post("/_matrix/client/v3/keys/device_signing/upload", authed)
        .await
        .ok();
    let own = query(&alice, &[&user_id("alice")]).await;
    assert_eq!(
        own["master_keys"][&user_id("alice")]["keys"][new_master.key_id()],
        new_master.public.as_str()
    );
}

#[tokio::test]
async fn key_backup_keeps_the_better_copy_of_each_session() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    alice
        .get("/_matrix/client/v3/room_keys/version")
        .await
        .assert_error(404, "M_NOT_FOUND");
    let version = alice
        .post(
            "/_matrix/client/v3/room_keys/version",
            json!({ "algorithm": "m.megolm_backup.v1.curve25519-aes-sha2", "auth_data": { "public_key": "abc" } }),
        )
        .await
        .ok()["version"]
        .as_str()
        .unwrap()
        .to_owned();
    let put = |index: i64, forwarded: i64, verified: bool, data: &str| {
        let path = format!(
            "/_matrix/client/v3/room_keys/keys/{}/{}?version={version}",
            enc(&room_id("room")),
            "session1"
        );
        let body = json!({
            "first_message_index": index,
            "forwarded_count": forwarded,
            "is_verified": verified,
            "session_data": { "ciphertext": data },
        });
        let alice = alice.clone();
        async move { alice.put(&path, body).await.ok() }
    };
    let stored = || {
        let path = format!(
            "/_matrix/client/v3/room_keys/keys/{}/session1?version={version}",
            enc(&room_id("room"))
        );
        let alice = alice.clone();
        async move { alice.get(&path).await.ok()["session_data"]["ciphertext"].clone() }
    };
    let first = put(5, 1, false, "a").await;
    assert_eq!(first["count"], 1);
    let etag = first["etag"].clone();
    assert_eq!(
        put(10, 0, false, "worse index").await["etag"],
        etag,
        "nothing changed"
    );
    assert_eq!(stored().await, "a");
    put(5, 0, false, "fewer forwards").await;
    assert_eq!(stored().await, "fewer forwards");
    put(2, 0, false, "lower index").await;
    assert_eq!(stored().await, "lower index");
    put(9, 3, true, "verified").await;
    assert_eq!(
        stored().await,
        "verified",
        "a verified key beats an unverified one"
    );
    put(0, 0, false, "unverified").await;
    assert_eq!(stored().await, "verified");

    let all = alice
        .get(&format!(
            "/_matrix/client/v3/room_keys/keys?version={version}"
        ))
        .await
        .ok();
    assert_eq!(
        all["rooms"][&room_id("room")]["sessions"]["session1"]["is_verified"],
        true
    );
    let info = alice.get("/_matrix/client/v3/room_keys/version").await.ok();
    assert_eq!(info["version"], version.as_str());
    assert_eq!(info["count"], 1);

    // A newer version makes uploads to the old one wrong.
    let newer = alice
        .post(
            "/_matrix/client/v3/room_keys/version",
            json!({ "algorithm": "m.megolm_backup.v1.curve25519-aes-sha2", "auth_data": { "public_key": "def" } }),
        )
        .await
        .ok()["version"]
        .as_str()
        .unwrap()
        .to_owned();
    let stale = alice
        .put(
            &format!("/_matrix/client/v3/room_keys/keys?version={version}"),
            json!({ "rooms": {} }),
        )
        .await;
    stale.assert_error(403, "M_WRONG_ROOM_KEYS_VERSION");
    assert_eq!(stale.body["current_version"], newer.as_str());

    let deleted = alice
        .delete(
            &format!("/_matrix/client/v3/room_keys/keys?version={version}"),
            json!({}),
        )
        .await
        .ok();
    assert_eq!(deleted["count"], 0);
    alice
        .delete(
            &format!("/_matrix/client/v3/room_keys/version/{newer}"),
            json!({}),
        )
        .await
        .ok();
    alice
        .get(&format!("/_matrix/client/v3/room_keys/version/{newer}"))
        .await
        .assert_error(404, "M_NOT_FOUND");
}

/// A user's device key and cross-signing keys, uploaded.
pub(crate) struct CrossSigning {
    pub(crate) device: Signer,
    pub(crate) master: Signer,
    self_signing: Signer,
    user_signing: Signer,
}

pub(crate) async fn set_up_cross_signing(client: &Client) -> CrossSigning {
    let keys = CrossSigning {
        device: Signer::new(Some(&client.device_id)),
        master: Signer::new(None),
        self_signing: Signer::new(None),
        user_signing: Signer::new(None),
    };
    upload(
        client,
        json!({ "device_keys": device_keys(client, &keys.device) }),
    )
    .await
    .ok();
    let key = |signer: &Signer, usage: &str| json!({ "user_id": client.user_id, "usage": [usage], "keys": { signer.key_id(): signer.public } });
    let body = json!({
        "master_key": key(&keys.master, "master"),
        "self_signing_key": keys.master.sign(&client.user_id, key(&keys.self_signing, "self_signing")),
        "user_signing_key": keys.master.sign(&client.user_id, key(&keys.user_signing, "user_signing")),
    });
    client
        .post("/_matrix/client/v3/keys/device_signing/upload", body)
        .await
        .ok();
    keys
}

/// `/keys/signatures/upload` takes only what the spec's cross-signing allows; signatures a
/// user-signing key made are shown to their maker only; refused signatures change no one's
/// device list.
#[tokio::test]
async fn cross_signing_signatures_follow_the_rules_and_user_signing_ones_stay_private() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let carol = server.register("carol").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    carol.join(&room).await.ok();
    let a = set_up_cross_signing(&alice).await;
    let b = set_up_cross_signing(&bob).await;
    let seen = query(&alice, &[&alice.user_id, &bob.user_id]).await;
    let master_of = |user: &str| seen["master_keys"][user].clone();
    let self_signing_of = |user: &str| seen["self_signing_keys"][user].clone();
    let sign_up = |signer: &Client, target: &Client, key_id: &str, object: Value| {
        let body = json!({ target.user_id.clone(): { key_id: object } });
        let signer = signer.clone();
        let target = target.user_id.clone();
        let key_id = key_id.to_owned();
        async move {
            let answer = signer
                .post("/_matrix/client/v3/keys/signatures/upload", body)
                .await
                .ok();
            answer["failures"][&target][&key_id]["errcode"].clone()
        }
    };
    let carol_since = carol.next_batch().await;

    // Refused: each valid signature by a key that may not sign that key.
    let refused = [
        // Another user's device, by the user-signing key or a device.
        (
            &bob,
            &alice,
            alice.device_id.clone(),
            b.user_signing
                .sign(&bob.user_id, device_keys(&alice, &a.device)),
        ),
        (
            &bob,
            &alice,
            alice.device_id.clone(),
            b.device.sign(&bob.user_id, device_keys(&alice, &a.device)),
        ),
        // Another user's master key by anything but the user-signing key.
        (
            &bob,
            &alice,
            a.master.public.clone(),
            b.self_signing.sign(&bob.user_id, master_of(&alice.user_id)),
        ),
        (
            &bob,
            &alice,
            a.master.public.clone(),
            b.device.sign(&bob.user_id, master_of(&alice.user_id)),
        ),
        // Another user's self-signing key, even by the user-signing key.
        (
            &bob,
            &alice,
            a.self_signing.public.clone(),
            b.user_signing
                .sign(&bob.user_id, self_signing_of(&alice.user_id)),
        ),
        // One's own device by anything but the self-signing key.
        (
            &alice,
            &alice,
            alice.device_id.clone(),
            a.master
                .sign(&alice.user_id, device_keys(&alice, &a.device)),
        ),
        (
            &alice,
            &alice,
            alice.device_id.clone(),
            a.user_signing
                .sign(&alice.user_id, device_keys(&alice, &a.device)),
        ),
        // One's own master key by the user-signing key.
        (
            &alice,
            &alice,
            a.master.public.clone(),
            a.user_signing
                .sign(&alice.user_id, master_of(&alice.user_id)),
        ),
    ];
    for (i, (signer, target, key_id, object)) in refused.into_iter().enumerate() {
        assert_eq!(
            sign_up(signer, target, &key_id, object).await,
            "M_FORBIDDEN",
            "refused signature {i}"
        );
    }
    let view = carol.sync(Some(&carol_since), 0, None).await;
    assert_eq!(
        view["device_lists"]["changed"],
        json!([]),
        "refused signatures mark no device list changed"
    );
    let seen_by_carol = query(&carol, &[&alice.user_id, &bob.user_id]).await;
    let alice_device = &seen_by_carol["device_keys"][&alice.user_id][&alice.device_id];
    assert!(alice_device["signatures"].get(&bob.user_id).is_none());

    // Accepted: Alice's user-signing key on Bob's master key, her device on her master key,
    // her self-signing key on her device.
    let accepted = [
        (
            &bob,
            b.master.public.clone(),
            a.user_signing.sign(&alice.user_id, master_of(&bob.user_id)),
        ),
        (
            &alice,
            a.master.public.clone(),
            a.device.sign(&alice.user_id, master_of(&alice.user_id)),
        ),
        (
            &alice,
            alice.device_id.clone(),
            a.self_signing
                .sign(&alice.user_id, device_keys(&alice, &a.device)),
        ),
    ];
    for (target, key_id, object) in accepted {
        assert_eq!(sign_up(&alice, target, &key_id, object).await, Value::Null);
    }
    let usk_signature = |view: &Value| {
        view["master_keys"][&bob.user_id]["signatures"][&alice.user_id][a.user_signing.key_id()]
            .clone()
    };
    assert!(usk_signature(&query(&alice, &[&bob.user_id]).await).is_string());
    assert!(usk_signature(&query(&bob, &[&bob.user_id]).await).is_null());
    assert!(usk_signature(&query(&carol, &[&bob.user_id]).await).is_null());
    let own = query(&carol, &[&alice.user_id]).await;
    assert!(
        own["master_keys"][&alice.user_id]["signatures"][&alice.user_id][a.device.key_id()]
            .is_string()
    );
    assert!(
        own["device_keys"][&alice.user_id][&alice.device_id]["signatures"][&alice.user_id]
            [a.self_signing.key_id()]
        .is_string()
    );
}

/// `*` and an explicit device of the same user in one `sendToDevice`: the named device gets
/// its own message, the others the `*` one, each exactly once.
#[tokio::test]
async fn to_device_for_all_devices_and_one_named_device_delivers_one_message_each() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let alice_phone = alice.login("alice", "password").await;
    let bob = server.register("bob").await;
    let (laptop_since, phone_since) = (alice.next_batch().await, alice_phone.next_batch().await);
    let body = json!({ "messages": { alice.user_id.clone(): {
        "*": { "to": "all" },
        alice.device_id.clone(): { "to": "laptop" },
    } } });
    bob.put("/_matrix/client/v3/sendToDevice/m.test/mixed", body)
        .await
        .ok();
    for (device, since, expected) in [
        (&alice, laptop_since, "laptop"),
        (&alice_phone, phone_since, "all"),
    ] {
        let view = device.sync(Some(&since), 0, None).await;
        let events = view["to_device"]["events"].as_array().unwrap();
        let contents: Vec<&Value> = events.iter().map(|e| &e["content"]["to"]).collect();
        assert_eq!(contents, [expected], "{}", device.device_id);
    }
}

/// Membership changes in a room reach `device_lists` and `/keys/changes` only for those joined
/// at the time: a banned user or one who rejected an invite learns nobody's comings and goings
/// there (review finding Q).
#[tokio::test]
async fn device_list_left_ignores_rooms_the_user_was_not_joined_to_at_the_change() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let carol = server.register("carol").await;
    let dave = server.register("dave").await;
    let room = alice
        .create_room(json!({ "preset": "private_chat", "invite": [bob.user_id, dave.user_id] }))
        .await;
    bob.join(&room).await.ok();
    alice
        .room_action(&room, "ban", json!({ "user_id": bob.user_id }))
        .await
        .ok();
    dave.room_action(&room, "leave", json!({})).await.ok();
    let (bob_from, dave_from) = (bob.next_batch().await, dave.next_batch().await);

    alice
        .room_action(&room, "invite", json!({ "user_id": carol.user_id }))
        .await
        .ok();
    carol.join(&room).await.ok();
    carol.room_action(&room, "leave", json!({})).await.ok();

    for (user, from) in [(&bob, bob_from), (&dave, dave_from)] {
        let view = user.sync(Some(&from), 0, None).await;
        assert_eq!(
            view["device_lists"]["changed"],
            json!([]),
            "{}",
            user.user_id
        );
        assert_eq!(view["device_lists"]["left"], json!([]), "{}", user.user_id);
        let changes = user
            .get(&format!(
                "/_matrix/client/v3/keys/changes?from={}&to={}",
                enc(&from),
                enc(view["next_batch"].as_str().unwrap())
            ))
            .await
            .ok();
        assert_eq!(
            changes,
            json!({ "changed": [], "left": [] }),
            "{}",
            user.user_id
        );
    }
}
