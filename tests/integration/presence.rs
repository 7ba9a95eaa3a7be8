//! Presence: set, read and synced to those who share a room; offline after silence.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{client::enc, user_id, Client, ServerOptions, TestServer};

pub(crate) fn presence_of<'a>(sync: &'a Value, user: &str) -> Option<&'a Value> {
    sync["presence"]["events"]
        .as_array()?
        .iter()
        .find(|e| e["type"] == "m.presence" && e["sender"] == user)
        .map(|e| &e["content"])
}

/// Long-polls until a sync carries presence for `user` matching `want`.
async fn wait_presence(client: &Client, since: &str, user: &str, want: &str) -> (Value, String) {
    let mut since = since.to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let path = format!(
            "/_matrix/client/v3/sync?timeout=5000&set_presence=offline&since={}",
            enc(&since)
        );
        let sync = client.get(&path).await.ok();
        since = sync["next_batch"].as_str().unwrap().to_owned();
        if let Some(content) = presence_of(&sync, user).filter(|c| c["presence"] == want) {
            return (content.clone(), since);
        }
    }
    panic!("{user} never became {want}");
}

async fn quiet_sync(client: &Client) -> String {
    client
        .get("/_matrix/client/v3/sync?set_presence=offline")
        .await
        .ok()["next_batch"]
        .as_str()
        .unwrap()
        .to_owned()
}

pub(crate) async fn put_presence(client: &Client, body: Value) -> crate::support::client::Response {
    let path = format!(
        "/_matrix/client/v3/presence/{}/status",
        enc(&client.user_id)
    );
    client.put(&path, body).await
}

/// Alice's initial sync (her own presence left as it is), checked to carry Bob's as online.
async fn initial_sync_with_bob_online(alice: &Client) -> Value {
    let initial = alice
        .get("/_matrix/client/v3/sync?set_presence=offline")
        .await
        .ok();
    assert_eq!(
        presence_of(&initial, &user_id("bob")).unwrap()["presence"],
        "online"
    );
    initial
}

/// A server where Alice and Bob share a public room of Alice's and Eve is registered outside it.
async fn alice_and_bob_in_a_room_eve_outside() -> (TestServer, Client, Client, Client, String) {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let eve = server.register("eve").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    (server, alice, bob, eve, room)
}

#[tokio::test]
async fn presence_reaches_those_who_share_a_room_and_no_one_else() {
    let (_server, alice, bob, eve, _room) = alice_and_bob_in_a_room_eve_outside().await;
    let bob_since = quiet_sync(&bob).await;
    let eve_since = quiet_sync(&eve).await;

    put_presence(
        &alice,
        json!({ "presence": "online", "status_msg": "at lunch" }),
    )
    .await
    .ok();
    let (content, _) = wait_presence(&bob, &bob_since, &user_id("alice"), "online").await;
    assert_eq!(content["status_msg"], "at lunch");
    assert_eq!(content["currently_active"], true);
    assert!(content["last_active_ago"].as_u64().unwrap() < 10_000);

    let path = format!(
        "/_matrix/client/v3/presence/{}/status",
        enc(&user_id("alice"))
    );
    let seen = bob.get(&path).await.ok();
    assert_eq!(seen["presence"], "online");
    assert_eq!(seen["status_msg"], "at lunch");
    eve.get(&path).await.assert_error(403, "M_FORBIDDEN");
    let eve_view = eve
        .get(&format!(
            "/_matrix/client/v3/sync?timeout=0&set_presence=offline&since={}",
            enc(&eve_since)
        ))
        .await
        .ok();
    assert!(presence_of(&eve_view, &user_id("alice")).is_none());

    // Only your own presence can be set, and only to a known state.
    let other = format!(
        "/_matrix/client/v3/presence/{}/status",
        enc(&user_id("bob"))
    );
    alice
        .put(&other, json!({ "presence": "online" }))
        .await
        .assert_error(403, "M_FORBIDDEN");
    put_presence(&alice, json!({ "presence": "dancing" }))
        .await
        .assert_error(400, "M_INVALID_PARAM");
}

/// An initial sync matches every user's presence against the set of the syncing user's fellow
/// members; an incremental one probes each change for a shared room. Either way, the members
/// of a room the user is not in stay out.
#[tokio::test]
async fn initial_and_incremental_syncs_carry_presence_of_fellow_members_only() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let eve = server.register("eve").await;
    let carol = server.register("carol").await;
    let shared = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&shared).await.ok();
    let elsewhere = eve.create_room(json!({ "preset": "public_chat" })).await;
    carol.join(&elsewhere).await.ok();
    for client in [&bob, &eve, &carol] {
        put_presence(client, json!({ "presence": "online" }))
            .await
            .ok();
    }

    let initial = initial_sync_with_bob_online(&alice).await;
    for outsider in ["eve", "carol"] {
        assert!(
            presence_of(&initial, &user_id(outsider)).is_none(),
            "{outsider}"
        );
    }

    // The outsiders change first, Bob last: every sync up to the one with Bob's change has
    // seen theirs go by, had it been shared.
    for client in [&eve, &carol, &bob] {
        put_presence(client, json!({ "presence": "unavailable" }))
            .await
            .ok();
    }
    let mut since = initial["next_batch"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "Bob's change never came");
        let path = format!(
            "/_matrix/client/v3/sync?timeout=5000&set_presence=offline&since={}",
            enc(&since)
        );
        let sync = alice.get(&path).await.ok();
        for outsider in ["eve", "carol"] {
            assert!(
                presence_of(&sync, &user_id(outsider)).is_none(),
                "{outsider}"
            );
        }
        since = sync["next_batch"].as_str().unwrap().to_owned();
        if presence_of(&sync, &user_id("bob")).is_some_and(|c| c["presence"] == "unavailable") {
            break;
        }
    }
}

/// An initial sync finds whose presence it carries one of two ways: when the rows with
/// presence are few against the members of the user's rooms (here a room of 62 whose 60
/// other members never had presence) each row is probed for a shared room; otherwise the
/// fellow members are read as one set (the test above). Either way, only theirs.
#[tokio::test]
async fn an_initial_sync_beside_many_silent_members_carries_presence_of_fellow_members_only() {
    let (server, alice, bob, eve, shared) = alice_and_bob_in_a_room_eve_outside().await;
    server.register_joined(&shared, "silent", 60).await;
    eve.create_room(json!({ "preset": "public_chat" })).await;
    for client in [&bob, &eve] {
        put_presence(client, json!({ "presence": "online" }))
            .await
            .ok();
    }
    assert!(server.count("SELECT count(*) AS n FROM presence").await <= 4);

    let initial = initial_sync_with_bob_online(&alice).await;
    assert!(presence_of(&initial, &user_id("eve")).is_none());
}

#[tokio::test]
async fn syncing_keeps_a_user_online_and_silence_takes_them_offline() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    let since = quiet_sync(&alice).await;

    // A sync without set_presence means online.
    bob.sync(None, 0, None).await;
    let (_, since) = wait_presence(&alice, &since, &user_id("bob"), "online").await;

    // Pretend Bob's last sign of life was a minute ago: the sweeper takes him offline.
    let mut db = server.db().await;
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(format!(
            "UPDATE presence SET last_seen_ts = last_seen_ts - 60000 WHERE user_id = '{}'",
            user_id("bob")
        )),
        &mut db,
    )
    .await
    .unwrap();
    let (content, _) = wait_presence(&alice, &since, &user_id("bob"), "offline").await;
    assert!(content.get("currently_active").is_none());
}

#[tokio::test]
async fn presence_can_be_switched_off() {
    let server =
        TestServer::start_with(ServerOptions::default().env("MYELIN_PRESENCE", "off")).await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    put_presence(&alice, json!({ "presence": "online", "status_msg": "hi" }))
        .await
        .ok();
    let path = format!(
        "/_matrix/client/v3/presence/{}/status",
        enc(&user_id("alice"))
    );
    assert_eq!(bob.get(&path).await.ok(), json!({ "presence": "offline" }));
    let sync = bob.sync(None, 0, None).await;
    assert_eq!(sync["presence"]["events"], json!([]));
    assert_eq!(server.count("SELECT COUNT(*) AS n FROM presence").await, 0);
}
