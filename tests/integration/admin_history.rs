//! The admin API's history purge (`purge_history`, `purge_history_status`) and moving a shut
//! down room's members to a new room (`new_room_user_id`).

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{client::enc, wait_until, Client, TestServer};

/// The bodies of the room's `m.room.message` events, oldest first, as `/messages` serves them.
async fn bodies(client: &Client, room: &str) -> Vec<String> {
    let events = client.page_back(room, None, None, 10).await;
    events
        .iter()
        .filter(|e| e["type"] == "m.room.message")
        .map(|e| e["content"]["body"].as_str().unwrap().to_owned())
        .collect()
}

async fn send(client: &Client, room: &str, text: &str) -> String {
    let sent = client.send_text(room, text, text).await.ok();
    sent["event_id"].as_str().unwrap().to_owned()
}

/// Waits until the purge ends and returns its status.
pub(crate) async fn finished(admin: &Client, purge: &Value) -> Value {
    let path = format!(
        "/_synapse/admin/v1/purge_history_status/{}",
        purge["purge_id"].as_str().expect("a purge_id")
    );
    wait_until("the purge ends", Duration::from_secs(20), || {
        let (admin, path) = (admin.clone(), path.clone());
        async move { admin.get(&path).await.ok()["status"] != "active" }
    })
    .await;
    admin.get(&path).await.ok()
}

#[tokio::test]
async fn purged_history_is_gone_and_the_room_keeps_working() {
    let server = TestServer::start().await;
    let admin = server.create_admin("root", "rootpassword").await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(json!({ "name": "Long history", "preset": "public_chat" }))
        .await;
    for text in ["old1", "old2", "old3"] {
        send(&alice, &room, text).await;
    }
    let cut = send(&alice, &room, "kept1").await;
    send(&alice, &room, "kept2").await;
    let since = alice.next_batch().await;

    let purge_path = format!("/_synapse/admin/v1/purge_history/{}", enc(&room));
    bob.post(&purge_path, json!({ "purge_up_to_event_id": cut }))
        .await
        .assert_error(403, "M_FORBIDDEN");
    admin
        .post(&purge_path, json!({}))
        .await
        .assert_error(400, "M_BAD_JSON");
    let purge = admin
        .post(
            &format!("{purge_path}/{}", enc(&cut)),
            json!({ "delete_local_events": true }),
        )
        .await
        .ok();
    assert_eq!(
        finished(&admin, &purge).await,
        json!({ "status": "complete" })
    );

    // The old messages are deleted; the point and what follows stay, and so does the state.
    assert_eq!(bodies(&alice, &room).await, ["kept1", "kept2"]);
    let old = server
        .count(&format!(
            "SELECT count(*) AS n FROM events WHERE room_id = '{room}' \
             AND pdu->'content'->>'body' LIKE 'old%'"
        ))
        .await;
    assert_eq!(old, 0);
    let name = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.name/",
            enc(&room)
        ))
        .await
        .ok();
    assert_eq!(name["name"], "Long history");

    // Joining, sending, syncing and paging all still work.
    bob.join(&room).await.ok();
    send(&bob, &room, "after").await;
    let incremental = alice.sync(Some(&since), 0, None).await;
    let timeline = &incremental["rooms"]["join"][&room]["timeline"]["events"];
    assert!(
        timeline
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["content"]["body"] == "after"),
        "{incremental}"
    );
    assert_eq!(bodies(&bob, &room).await, ["kept1", "kept2", "after"]);

    admin
        .get("/_synapse/admin/v1/purge_history_status/unknown")
        .await
        .assert_error(404, "M_NOT_FOUND");
    bob.get(&format!(
        "/_synapse/admin/v1/purge_history_status/{}",
        purge["purge_id"].as_str().unwrap()
    ))
    .await
    .assert_error(403, "M_FORBIDDEN");
}

#[tokio::test]
async fn a_purge_by_time_keeps_local_events_stored_but_serves_them_no_more() {
    let server = TestServer::start().await;
    let admin = server.create_admin("root", "rootpassword").await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    send(&alice, &room, "early1").await;
    send(&alice, &room, "early2").await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    tokio::time::sleep(Duration::from_millis(20)).await;
    send(&alice, &room, "late").await;

    let purge_path = format!("/_synapse/admin/v1/purge_history/{}", enc(&room));
    let purge = admin
        .post(&purge_path, json!({ "purge_up_to_ts": now }))
        .await
        .ok();
    let status = finished(&admin, &purge).await;
    assert_eq!(status["status"], "complete", "{status}");
    // The last event before the time (early2) stays; earlier local events are kept in the
    // database (they may be the only copies) but no client is served them.
    assert_eq!(bodies(&alice, &room).await, ["early2", "late"]);
    let stored = server
        .count(&format!(
            "SELECT count(*) AS n FROM events WHERE room_id = '{room}' \
             AND pdu->'content'->>'body' = 'early1'"
        ))
        .await;
    assert_eq!(stored, 1);
    send(&alice, &room, "later").await;
    assert_eq!(bodies(&alice, &room).await, ["early2", "late", "later"]);

    let other = alice.create_room(json!({})).await;
    let foreign = send(&alice, &other, "elsewhere").await;
    admin
        .post(&purge_path, json!({ "purge_up_to_event_id": foreign }))
        .await
        .assert_error(400, "M_UNKNOWN");
    admin
        .post(&purge_path, json!({ "purge_up_to_ts": 1 }))
        .await
        .assert_error(404, "M_NOT_FOUND");
    admin
        .post(&purge_path, json!({ "purge_up_to_ts": "soon" }))
        .await
        .assert_error(400, "M_BAD_JSON");
}

#[tokio::test]
async fn deleting_a_room_with_new_room_user_id_moves_its_members_and_aliases() {
    let server = TestServer::start().await;
    let admin = server.create_admin("root", "rootpassword").await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let carol = server.register("carol").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "room_alias_name": "bad" }))
        .await;
    bob.join(&room).await.ok();
    alice
        .room_action(&room, "invite", json!({ "user_id": carol.user_id }))
        .await
        .ok();
    let path = format!("/_synapse/admin/v1/rooms/{}", enc(&room));
    admin
        .delete(
            &path,
            json!({ "new_room_user_id": "@mod:elsewhere.example" }),
        )
        .await
        .assert_error(400, "M_UNKNOWN");

    // The new room's creator need not have an account, as in Synapse.
    let moderator = server.user_id("moderator");
    let result = admin
        .delete(
            &path,
            json!({
                "new_room_user_id": moderator,
                "room_name": "Moved",
                "message": "This room was shut down.",
                "block": true,
            }),
        )
        .await
        .ok();
    let new_room = result["new_room_id"]
        .as_str()
        .expect("a new room")
        .to_owned();
    let mut kicked: Vec<&str> = result["kicked_users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_str().unwrap())
        .collect();
    kicked.sort();
    assert_eq!(kicked, [&alice.user_id, &bob.user_id, &carol.user_id]);
    let alias = format!("#bad:{}", server.server_name());
    assert_eq!(result["local_aliases"], json!([alias]));

    // Joined members are now in the new room (and only there); the invitee is in neither.
    for client in [&alice, &bob] {
        let joined = client.get("/_matrix/client/v3/joined_rooms").await.ok();
        assert_eq!(
            joined["joined_rooms"],
            json!([new_room]),
            "{}",
            client.user_id
        );
    }
    let joined = carol.get("/_matrix/client/v3/joined_rooms").await.ok();
    assert_eq!(joined["joined_rooms"], json!([]));
    // The new room has its name, the message from its creator, and members cannot speak.
    let events = alice.page_back(&new_room, None, None, 50).await;
    let message = events
        .iter()
        .find(|e| e["type"] == "m.room.message")
        .expect("the message");
    assert_eq!(message["sender"], moderator.as_str());
    assert_eq!(message["content"]["body"], "This room was shut down.");
    let name = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.name/",
            enc(&new_room)
        ))
        .await
        .ok();
    assert_eq!(name["name"], "Moved");
    alice
        .send_text(&new_room, "t1", "hello?")
        .await
        .assert_error(403, "M_FORBIDDEN");
    // The alias follows the members.
    let resolved = alice
        .get(&format!(
            "/_matrix/client/v3/directory/room/{}",
            enc(&alias)
        ))
        .await
        .ok();
    assert_eq!(resolved["room_id"], new_room.as_str());
}
