//! Sliding sync extensions' deltas, and connections across a restart and two processes.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{
    e2ee::{device_keys, one_time_keys, upload, Signer},
    sliding_sync::{list, messages, pos, sss},
    support::{client::enc, TestServer},
};

fn encryption_body(since: Option<&str>) -> Value {
    let mut to_device = json!({ "enabled": true });
    if let Some(since) = since {
        to_device["since"] = json!(since);
    }
    json!({ "conn_id": "encryption", "extensions": { "to_device": to_device, "e2ee": { "enabled": true } } })
}

#[tokio::test]
async fn to_device_and_e2ee() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    let send = |n: usize| {
        let bob = bob.clone();
        let alice_user = alice.user_id.clone();
        let device = alice.device_id.clone();
        async move {
            bob.put(
                &format!("/_matrix/client/v3/sendToDevice/m.test/txn{n}"),
                json!({ "messages": { alice_user: { device: { "n": n } } } }),
            )
            .await
            .ok();
        }
    };
    for n in 0..3 {
        send(n).await;
    }
    let first = sss(&alice, None, 0, encryption_body(None)).await.ok();
    let to_device = &first["extensions"]["to_device"];
    assert_eq!(to_device["events"].as_array().unwrap().len(), 3, "{first}");
    let since = to_device["next_batch"].as_str().unwrap().to_owned();
    let e2ee = &first["extensions"]["e2ee"];
    assert_eq!(e2ee["device_one_time_keys_count"]["signed_curve25519"], 0);
    assert_eq!(e2ee["device_unused_fallback_key_types"], json!([]));
    assert!(
        e2ee.get("device_lists").is_none(),
        "no device lists without pos"
    );
    assert!(first["lists"].as_object().unwrap().is_empty());

    // Not acknowledged (same since): delivered again; acknowledged: gone.
    let again = sss(&alice, Some(&pos(&first)), 0, encryption_body(None))
        .await
        .ok();
    assert_eq!(
        again["extensions"]["to_device"]["events"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    let acked = sss(&alice, Some(&pos(&again)), 0, encryption_body(Some(&since)))
        .await
        .ok();
    assert!(acked["extensions"]["to_device"]["events"]
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(
        acked["extensions"]["to_device"]["next_batch"],
        since.as_str()
    );
    // `limit` pages them.
    for n in 3..6 {
        send(n).await;
    }
    let mut paged = encryption_body(Some(&since));
    paged["extensions"]["to_device"]["limit"] = json!(2);
    let page = sss(&alice, Some(&pos(&acked)), 0, paged.clone()).await.ok();
    let ns = |r: &Value| -> Vec<i64> {
        r["extensions"]["to_device"]["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["content"]["n"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(ns(&page), vec![3, 4]);
    paged["extensions"]["to_device"]["since"] =
        page["extensions"]["to_device"]["next_batch"].clone();
    let rest = sss(&alice, Some(&pos(&page)), 0, paged).await.ok();
    assert_eq!(ns(&rest), vec![5]);
    let since = rest["extensions"]["to_device"]["next_batch"]
        .as_str()
        .unwrap()
        .to_owned();
    let acked = rest;
    // A since ahead of the server comes back unchanged.
    let ahead = sss(
        &alice,
        Some(&pos(&acked)),
        0,
        encryption_body(Some("99999999")),
    )
    .await
    .ok();
    assert_eq!(ahead["extensions"]["to_device"]["next_batch"], "99999999");
    assert!(ahead["extensions"]["to_device"]["events"]
        .as_array()
        .unwrap()
        .is_empty());

    // A long-poll wakes for a to-device message.
    let waiting = {
        let alice = alice.clone();
        let pos = pos(&acked);
        let since = since.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let response = sss(&alice, Some(&pos), 10_000, encryption_body(Some(&since)))
                .await
                .ok();
            (response, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    send(10).await;
    let (woken, took) = waiting.await.unwrap();
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(
        woken["extensions"]["to_device"]["events"][0]["content"]["n"],
        10
    );

    // Bob's new device: a device-list change for Alice, who shares a room with him.
    let bob_phone = server.client().login("bob", "password").await;
    let signer = Signer::new(Some(&bob_phone.device_id));
    upload(
        &bob_phone,
        json!({ "device_keys": device_keys(&bob_phone, &signer) }),
    )
    .await
    .ok();
    // Alice's one-time keys are counted.
    let alice_signer = Signer::new(Some(&alice.device_id));
    upload(
        &alice,
        json!({ "one_time_keys": one_time_keys(&alice, &alice_signer, 0..3) }),
    )
    .await
    .ok();
    let changed = sss(&alice, Some(&pos(&woken)), 0, encryption_body(Some(&since)))
        .await
        .ok();
    let changed_users = changed["extensions"]["e2ee"]["device_lists"]["changed"]
        .as_array()
        .unwrap()
        .clone();
    assert!(changed_users.contains(&json!(bob.user_id)), "{changed}");
    // Bob leaves the only room they shared: he is `left`.
    bob.room_action(&room, "leave", json!({})).await.ok();
    let left = sss(
        &alice,
        Some(&pos(&changed)),
        0,
        encryption_body(Some(&since)),
    )
    .await
    .ok();
    assert_eq!(
        left["extensions"]["e2ee"]["device_lists"]["left"],
        json!([bob.user_id]),
        "{left}"
    );
    // A connection without lists or subscriptions keeps no state.
    {
        use diesel_async::RunQueryDsl;
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let mut db = server.db().await;
        let count: Count = diesel::sql_query("SELECT count(*) AS n FROM sliding_sync_connections")
            .get_result(&mut db)
            .await
            .unwrap();
        assert_eq!(count.n, 0);
    }
    assert_eq!(
        changed["extensions"]["e2ee"]["device_one_time_keys_count"]["signed_curve25519"],
        3
    );
}

#[tokio::test]
async fn account_data_receipts_and_typing() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let outside = alice.create_room(json!({})).await;
    bob.join(&room).await.ok();
    let event = bob.send_text(&room, "m", "read me").await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    alice
        .put(
            &format!(
                "/_matrix/client/v3/user/{}/rooms/{}/account_data/org.example.room",
                enc(&alice.user_id),
                enc(&room)
            ),
            json!({ "x": 1 }),
        )
        .await
        .ok();
    // Only the newest room (`room`, where Bob wrote last) is in the window.
    let body = |lists: Value| {
        let mut body = list(0, 1, json!([]));
        body["extensions"] = json!({
            "account_data": { "enabled": true, "lists": lists.clone() },
            "receipts": { "enabled": true },
            "typing": { "enabled": true },
        });
        body
    };
    let first = sss(&alice, None, 0, body(json!(["all"]))).await.ok();
    let ext = &first["extensions"];
    let global: Vec<&str> = ext["account_data"]["global"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert!(global.contains(&"m.push_rules"), "{ext}");
    assert_eq!(
        ext["account_data"]["rooms"][&room][0]["type"],
        "org.example.room"
    );
    assert!(
        ext["receipts"]["rooms"].as_object().unwrap().is_empty()
            || ext["receipts"]["rooms"].get(&room).is_some()
    );
    assert!(ext["typing"]["rooms"].as_object().unwrap().is_empty());

    // Deltas: only what changed.
    alice
        .put(
            &format!(
                "/_matrix/client/v3/user/{}/account_data/org.example.global",
                enc(&alice.user_id)
            ),
            json!({ "y": 2 }),
        )
        .await
        .ok();
    bob.post(
        &format!(
            "/_matrix/client/v3/rooms/{}/receipt/m.read/{}",
            enc(&room),
            enc(&event)
        ),
        json!({}),
    )
    .await
    .ok();
    bob.put(
        &format!(
            "/_matrix/client/v3/rooms/{}/typing/{}",
            enc(&room),
            enc(&bob.user_id)
        ),
        json!({ "typing": true, "timeout": 30000 }),
    )
    .await
    .ok();
    // Typing reaches each process's memory through PostgreSQL's notification, the sender's
    // own included, a moment after the PUT is answered: the same request is asked again
    // until it shows.
    let deadline = Instant::now() + Duration::from_secs(10);
    let delta = loop {
        let delta = sss(&alice, Some(&pos(&first)), 0, body(json!(["all"])))
            .await
            .ok();
        if !delta["extensions"]["typing"]["rooms"][&room].is_null() || Instant::now() > deadline {
            break delta;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let ext = &delta["extensions"];
    let global: Vec<&str> = ext["account_data"]["global"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(global, vec!["org.example.global"], "{ext}");
    assert!(ext["account_data"]["rooms"].as_object().unwrap().is_empty());
    assert!(
        ext["receipts"]["rooms"][&room]["content"][&event]["m.read"]
            .get(&bob.user_id)
            .is_some(),
        "{ext}"
    );
    assert_eq!(
        ext["typing"]["rooms"][&room]["content"]["user_ids"],
        json!([bob.user_id])
    );

    // Scoped to no list: room account data is not sent.
    alice
        .put(
            &format!(
                "/_matrix/client/v3/user/{}/rooms/{}/account_data/org.example.room",
                enc(&alice.user_id),
                enc(&room)
            ),
            json!({ "x": 2 }),
        )
        .await
        .ok();
    let scoped = sss(&alice, Some(&pos(&delta)), 0, body(json!([])))
        .await
        .ok();
    assert!(scoped["extensions"]["account_data"]["rooms"]
        .as_object()
        .unwrap()
        .is_empty());

    // Room account data that changed while a room (sent before) was out of the window
    // comes when the room is back in it.
    let mut grown = body(json!(["all"]));
    grown["lists"]["all"]["ranges"] = json!([[0, 1]]);
    let both = sss(&alice, Some(&pos(&scoped)), 0, grown.clone())
        .await
        .ok();
    assert_eq!(both["rooms"][&outside]["initial"], true);
    let scoped = sss(&alice, Some(&pos(&both)), 0, body(json!(["all"])))
        .await
        .ok();
    alice
        .put(
            &format!(
                "/_matrix/client/v3/user/{}/rooms/{}/account_data/org.example.room",
                enc(&alice.user_id),
                enc(&outside)
            ),
            json!({ "outside": true }),
        )
        .await
        .ok();
    let unchanged = sss(&alice, Some(&pos(&scoped)), 0, body(json!(["all"])))
        .await
        .ok();
    assert!(unchanged["extensions"]["account_data"]["rooms"]
        .get(&outside)
        .is_none());
    let entered = sss(&alice, Some(&pos(&unchanged)), 0, grown).await.ok();
    assert_eq!(
        entered["extensions"]["account_data"]["rooms"][&outside][0]["content"],
        json!({ "outside": true }),
        "{entered}"
    );
}

#[tokio::test]
async fn a_connection_survives_a_restart_and_serves_from_two_processes() {
    let mut server = TestServer::start().await;
    let mut alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = bob.create_room(json!({ "preset": "public_chat" })).await;
    alice.join(&room).await.ok();
    let body = list(9, 10, json!([["m.room.member", "$ME"]]));
    let first = sss(&alice, None, 0, body.clone()).await.ok();
    assert_eq!(first["rooms"][&room]["initial"], true);
    bob.send_text(&room, "before", "before restart").await.ok();
    let mut bob = bob;
    server.restart().await;
    alice.base = server.base_url.clone();
    bob.base = server.base_url.clone();
    let after = sss(&alice, Some(&pos(&first)), 0, body.clone()).await.ok();
    let result = &after["rooms"][&room];
    assert!(
        result.get("initial").is_none(),
        "a delta after the restart: {result}"
    );
    assert_eq!(messages(result), vec!["before restart"]);

    // Two processes serving one connection alternately: every message exactly once.
    let second = server.second_process().await;
    let mut via_second = alice.clone();
    via_second.base = second.base_url.clone();
    let mut current = pos(&after);
    let mut seen = Vec::new();
    for n in 0..10 {
        bob.send_text(&room, &format!("n{n}"), &format!("n{n}"))
            .await
            .ok();
        let client = if n % 2 == 0 { &via_second } else { &alice };
        let response = sss(client, Some(&current), 0, body.clone()).await.ok();
        seen.extend(messages(&response["rooms"][&room]));
        current = pos(&response);
    }
    let expected: Vec<String> = (0..10).map(|n| format!("n{n}")).collect();
    assert_eq!(seen, expected);
}
