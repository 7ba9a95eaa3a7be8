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

/// Device keys of `user`'s `device` as a remote server would publish them (the server does not
/// check remote users' signatures; clients do).
fn remote_device_keys(user: &str, device: &str) -> Value {
    json!({
        "user_id": user,
        "device_id": device,
        "algorithms": ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
        "keys": {
            format!("curve25519:{device}"): format!("curve-{device}"),
            format!("ed25519:{device}"): format!("ed-{device}"),
        },
        "signatures": { user: { format!("ed25519:{device}"): "sig" } },
    })
}

fn master_key(user: &str, public: &str) -> Value {
    json!({ "user_id": user, "usage": ["master"], "keys": { format!("ed25519:{public}"): public } })
}

/// The device IDs a `/keys/query` answer lists for `user`.
fn device_ids(answer: &Value, user: &str) -> Vec<String> {
    let mut ids: Vec<String> = answer["device_keys"][user]
        .as_object()
        .map(|d| d.keys().cloned().collect())
        .unwrap_or_default();
    ids.sort();
    ids
}

/// A remote user who shares a room with a local user has their device list cached: resynced
/// with `GET /user/devices` when first needed, then kept by `m.device_list_update` EDUs that
/// chain from the cached `stream_id` (and `m.signing_key_update`), and resynced again when an
/// EDU's `prev_id` shows updates were missed.
#[tokio::test]
async fn a_tracked_remote_device_list_is_cached_and_kept_by_updates() {
    use diesel_async::RunQueryDsl;

    let server = federated_server().await;
    // The remote server publishes carol's list (C1, stream 5) at GET /user/devices; the
    // document never changes, so what the cache answers beyond it came from EDUs.
    let fake = FakeServer::start_with(|name| {
        let carol = format!("@carol:{name}");
        let list = json!({
            "user_id": carol,
            "stream_id": 5,
            "devices": [{ "device_id": "C1", "keys": remote_device_keys(&carol, "C1"), "device_display_name": "phone" }],
            "master_key": master_key(&carol, "M1"),
        });
        let encoded = carol.replace('@', "%40").replace(':', "%3A");
        let at_kept = carol.replace(':', "%3A");
        [carol.clone(), encoded, at_kept]
            .into_iter()
            .map(|user| (format!("/_matrix/federation/v1/user/devices/{user}"), list.clone()))
            .collect()
    })
    .await;
    let carol = fake.user_id("carol");
    let bob = server.register("bob").await;
    let room = bob.create_room(json!({})).await;
    // Federation 2 will put carol in the room by a federated join; here the membership row
    // stands for it (it is what makes her list tracked).
    diesel::sql_query(format!(
        "INSERT INTO room_memberships (room_id, user_id, membership, event_id, stream_ordering, forgotten)
         VALUES ('{room}', '{carol}', 'join', '$fake', 0, false)"
    ))
    .execute(&mut server.db().await)
    .await
    .unwrap();

    let answer = query(&bob, &carol).await;
    assert_eq!(device_ids(&answer, &carol), vec!["C1"], "{answer}");
    assert_eq!(
        answer["device_keys"][&carol]["C1"]["unsigned"]["device_display_name"],
        "phone"
    );
    assert_eq!(answer["master_keys"][&carol], master_key(&carol, "M1"));
    assert_eq!(
        server
            .count(
                "SELECT count(*) AS n FROM remote_device_lists WHERE stream_id = 5 AND NOT stale"
            )
            .await,
        1
    );

    let send = |txn: &'static str, edus: Vec<Value>| {
        let body = json!({
            "origin": fake.name(),
            "origin_server_ts": 1_700_000_000_000u64,
            "pdus": [],
            "edus": edus,
        });
        let fake = &fake;
        let server = &server;
        async move {
            let uri = format!("/_matrix/federation/v1/send/{txn}");
            let (status, answer) = fake.request(server, "PUT", &uri, Some(body)).await;
            assert_eq!(status, 200, "{answer}");
        }
    };
    let update = |device: &str, stream_id: i64, prev_id: Vec<i64>, deleted: bool| {
        let mut content = json!({
            "user_id": carol, "device_id": device, "stream_id": stream_id,
            "prev_id": prev_id, "deleted": deleted,
        });
        if !deleted {
            content["keys"] = remote_device_keys(&carol, device);
        }
        json!({ "edu_type": "m.device_list_update", "content": content })
    };

    // C2 added (6 follows 5), then C1 deleted (7 follows 6): applied to the cache.
    let since = bob.next_batch().await;
    send("t1", vec![update("C2", 6, vec![5], false)]).await;
    send("t2", vec![update("C1", 7, vec![6], true)]).await;
    let answer = query(&bob, &carol).await;
    assert_eq!(device_ids(&answer, &carol), vec!["C2"], "{answer}");
    let sync = bob.sync(Some(&since), 0, None).await;
    assert!(
        sync["device_lists"]["changed"]
            .as_array()
            .is_some_and(|c| c.iter().any(|u| u == &carol)),
        "{sync}"
    );
    // A replayed (old) update changes nothing.
    send("t3", vec![update("C1", 6, vec![5], false)]).await;
    assert_eq!(device_ids(&query(&bob, &carol).await, &carol), vec!["C2"]);

    // A new master key.
    send(
        "t4",
        vec![json!({ "edu_type": "m.signing_key_update", "content": {
            "user_id": carol, "master_key": master_key(&carol, "M2"),
        } })],
    )
    .await;
    assert_eq!(
        query(&bob, &carol).await["master_keys"][&carol],
        master_key(&carol, "M2")
    );

    // An update whose prev_id we never saw: the list is stale and the next query resyncs it
    // from the server's document (C1 at stream 5, master key M1).
    send("t5", vec![update("C3", 9, vec![8], false)]).await;
    let answer = query(&bob, &carol).await;
    assert_eq!(device_ids(&answer, &carol), vec!["C1"], "{answer}");
    assert_eq!(answer["master_keys"][&carol], master_key(&carol, "M1"));
    assert_eq!(
        server
            .count(
                "SELECT count(*) AS n FROM remote_device_lists WHERE stream_id = 5 AND NOT stale"
            )
            .await,
        1
    );
}

/// An untracked remote user (no shared room) is never answered from a cache: each query asks
/// their server, and EDUs about them are not kept.
#[tokio::test]
async fn an_untracked_remote_user_is_asked_every_time() {
    let (a, b) = pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    set_up_cross_signing(&alice).await;
    let first = query(&bob, &alice.user_id).await;
    assert_eq!(
        device_ids(&first, &alice.user_id),
        vec![alice.device_id.clone()]
    );
    let second_device = a.client().login("alice", "password").await;
    let signer = Signer::new(Some(&second_device.device_id));
    upload(
        &second_device,
        json!({ "device_keys": device_keys(&second_device, &signer) }),
    )
    .await
    .ok();
    let second = query(&bob, &alice.user_id).await;
    let mut expected = vec![alice.device_id.clone(), second_device.device_id.clone()];
    expected.sort();
    assert_eq!(device_ids(&second, &alice.user_id), expected, "{second}");
    assert_eq!(
        b.count("SELECT count(*) AS n FROM remote_device_lists")
            .await,
        0
    );
}
