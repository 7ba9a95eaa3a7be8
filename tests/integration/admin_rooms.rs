//! The Synapse-compatible admin API for rooms and media: the room list with search, orders
//! and paging, details, members, state, deleting (and blocking) a room, and quarantine.

use std::time::Duration;

use serde_json::{json, Value};

use crate::{
    media::upload,
    sliding_sync::{list, pos, sss},
    support::{client::enc, wait_until, TestServer},
};

fn room_ids(list: &Value) -> Vec<String> {
    list["rooms"]
        .as_array()
        .expect("a rooms list")
        .iter()
        .map(|r| r["room_id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn room_lists_search_order_page_and_show_details_members_and_state() {
    let server = TestServer::start().await;
    let admin = server.create_admin("root", "rootpassword").await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let alpha = alice
        .create_room(
            json!({ "name": "Alpha", "room_alias_name": "first", "preset": "public_chat" }),
        )
        .await;
    let beta = alice
        .create_room(json!({ "name": "Beta", "preset": "public_chat", "visibility": "public" }))
        .await;
    bob.join(&beta).await.ok();
    let gamma = alice
        .create_room(json!({
            "name": "Gamma",
            "initial_state": [{
                "type": "m.room.encryption", "state_key": "",
                "content": { "algorithm": "m.megolm.v1.aes-sha2" },
            }],
        }))
        .await;
    let list = |query: &str| {
        let admin = admin.clone();
        let query = query.to_owned();
        async move {
            admin
                .get(&format!("/_synapse/admin/v1/rooms{query}"))
                .await
                .ok()
        }
    };

    let all = list("").await;
    assert_eq!(room_ids(&all), [alpha.clone(), beta.clone(), gamma.clone()]);
    assert_eq!(all["total_rooms"], 3);
    assert_eq!(all["offset"], 0);
    assert!(all.get("next_batch").is_none() && all.get("prev_batch").is_none());
    let entry = &all["rooms"][1];
    assert_eq!(entry["name"], "Beta");
    assert_eq!(entry["joined_members"], 2);
    assert_eq!(entry["joined_local_members"], 2);
    assert_eq!(entry["creator"], alice.user_id.as_str());
    assert_eq!(entry["public"], true);
    assert_eq!(entry["join_rules"], "public");
    assert_eq!(entry["federatable"], true);
    assert_eq!(entry["encryption"], Value::Null);
    assert!(entry["version"].is_string());
    assert!(entry["state_events"].as_i64().unwrap() >= 5);
    for key in [
        "canonical_alias",
        "guest_access",
        "history_visibility",
        "room_type",
    ] {
        assert!(entry.get(key).is_some(), "{key} missing: {entry}");
    }
    assert_eq!(
        all["rooms"][0]["canonical_alias"],
        format!("#first:{}", server.server_name())
    );
    assert_eq!(all["rooms"][2]["encryption"], "m.megolm.v1.aes-sha2");

    // Search in names, in aliases' localparts, and by whole room ID.
    assert_eq!(room_ids(&list("?search_term=bET").await), [beta.as_str()]);
    assert_eq!(room_ids(&list("?search_term=irs").await), [alpha.as_str()]);
    assert_eq!(
        room_ids(&list(&format!("?search_term={}", enc(&gamma))).await),
        [gamma.as_str()]
    );
    assert_eq!(list("?search_term=nothing").await["total_rooms"], 0);

    // Member counts read largest first; `dir=b` reverses.
    assert_eq!(room_ids(&list("?order_by=joined_members").await)[0], beta);
    assert_eq!(
        room_ids(&list("?order_by=joined_members&dir=b").await)[2],
        beta
    );
    assert_eq!(
        room_ids(&list("?dir=b").await),
        [gamma.clone(), beta.clone(), alpha.clone()]
    );
    assert_eq!(room_ids(&list("?public_rooms=true").await), [beta.as_str()]);

    // Paging.
    let first = list("?limit=1").await;
    assert_eq!(room_ids(&first), [alpha.as_str()]);
    assert_eq!(first["next_batch"], 1);
    assert!(first.get("prev_batch").is_none());
    let middle = list("?limit=1&from=1").await;
    assert_eq!(room_ids(&middle), [beta.as_str()]);
    assert_eq!(
        (middle["prev_batch"].clone(), middle["next_batch"].clone()),
        (json!(0), json!(2))
    );
    admin
        .get("/_synapse/admin/v1/rooms?order_by=colour")
        .await
        .assert_error(400, "M_INVALID_PARAM");

    // One room, its members and its state, though the admin is in none of them. Room IDs
    // come raw or encoded.
    let details = admin
        .get(&format!("/_synapse/admin/v1/rooms/{beta}"))
        .await
        .ok();
    assert_eq!(details["room_id"], beta.as_str());
    assert_eq!(details["joined_local_devices"], 2);
    for key in [
        "topic",
        "avatar",
        "forgotten",
        "tombstoned",
        "replacement_room",
    ] {
        assert!(details.get(key).is_some(), "{key} missing: {details}");
    }
    let members = admin
        .get(&format!("/_synapse/admin/v1/rooms/{}/members", enc(&beta)))
        .await
        .ok();
    assert_eq!(members["total"], 2);
    let mut joined: Vec<&str> = members["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    joined.sort_unstable();
    assert_eq!(joined, [alice.user_id.as_str(), bob.user_id.as_str()]);
    let state = admin
        .get(&format!("/_synapse/admin/v1/rooms/{}/state", enc(&beta)))
        .await
        .ok();
    let state = state["state"].as_array().unwrap();
    let name = state
        .iter()
        .find(|e| e["type"] == "m.room.name")
        .expect("the name event");
    assert_eq!(name["content"]["name"], "Beta");
    assert!(name["event_id"].is_string() && name["sender"].is_string());
    assert!(state.iter().any(|e| e["type"] == "m.room.create"));

    let unknown = format!("!nothing:{}", server.server_name());
    for path in ["", "/members", "/state"] {
        admin
            .get(&format!("/_synapse/admin/v1/rooms/{}{path}", enc(&unknown)))
            .await
            .assert_error(404, "M_NOT_FOUND");
    }
    admin
        .get("/_synapse/admin/v1/rooms/not-a-room")
        .await
        .assert_error(400, "M_INVALID_PARAM");
}

#[tokio::test]
async fn deleting_a_room_with_block_makes_local_members_leave_and_keeps_everyone_out() {
    let server = TestServer::start().await;
    let admin = server.create_admin("root", "rootpassword").await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let carol = server.register("carol").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "room_alias_name": "doomed" }))
        .await;
    bob.join(&room).await.ok();
    alice
        .room_action(&room, "invite", json!({ "user_id": carol.user_id }))
        .await
        .ok();

    // v2 runs in the background; the status endpoints follow it to the end.
    let started = admin
        .delete(
            &format!("/_synapse/admin/v2/rooms/{room}"),
            json!({ "block": true, "purge": false }),
        )
        .await
        .ok();
    let delete_id = started["delete_id"].as_str().unwrap().to_owned();
    let status_path = format!("/_synapse/admin/v2/rooms/delete_status/{delete_id}");
    wait_until(
        "the room deletion completes",
        Duration::from_secs(20),
        || {
            let admin = admin.clone();
            let path = status_path.clone();
            async move { admin.get(&path).await.ok()["status"] == "complete" }
        },
    )
    .await;
    let status = admin.get(&status_path).await.ok();
    assert_eq!(status["room_id"], room.as_str());
    let mut kicked: Vec<String> = status["shutdown_room"]["kicked_users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_str().unwrap().to_owned())
        .collect();
    kicked.sort();
    assert_eq!(
        kicked,
        [
            alice.user_id.clone(),
            bob.user_id.clone(),
            carol.user_id.clone()
        ]
    );
    assert_eq!(status["shutdown_room"]["failed_to_kick_users"], json!([]));
    assert_eq!(
        status["shutdown_room"]["local_aliases"],
        json!([format!("#doomed:{}", server.server_name())])
    );
    let by_room = admin
        .get(&format!(
            "/_synapse/admin/v2/rooms/{}/delete_status",
            enc(&room)
        ))
        .await
        .ok();
    assert_eq!(by_room["results"][0]["delete_id"], delete_id.as_str());

    // Everyone left through ordinary member events.
    for client in [&alice, &bob] {
        let joined = client.get("/_matrix/client/v3/joined_rooms").await.ok();
        assert_eq!(joined["joined_rooms"], json!([]), "{}", client.user_id);
        let member = client
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/state/m.room.member/{}",
                enc(&room),
                enc(&client.user_id)
            ))
            .await;
        // A user who left sees the state as it was when they left: their own leave.
        assert_eq!(member.ok()["membership"], "leave", "{}", client.user_id);
    }
    assert_eq!(
        admin
            .get(&format!("/_synapse/admin/v1/rooms/{}/members", enc(&room)))
            .await
            .ok()["total"],
        0
    );

    // Blocked: nobody may join, knock or be invited.
    bob.join(&room).await.assert_error(403, "M_FORBIDDEN");
    let block = format!("/_synapse/admin/v1/rooms/{}/block", enc(&room));
    assert_eq!(
        admin.get(&block).await.ok(),
        json!({ "block": true, "user_id": admin.user_id })
    );
    admin.put(&block, json!({ "block": false })).await.ok();
    assert_eq!(admin.get(&block).await.ok(), json!({ "block": false }));

    // A block keeps joiners out of a live room too, until lifted.
    let other = alice.create_room(json!({ "preset": "public_chat" })).await;
    let other_block = format!("/_synapse/admin/v1/rooms/{}/block", enc(&other));
    admin.put(&other_block, json!({ "block": true })).await.ok();
    bob.join(&other).await.assert_error(403, "M_FORBIDDEN");
    alice
        .room_action(&other, "invite", json!({ "user_id": carol.user_id }))
        .await
        .assert_error(403, "M_FORBIDDEN");
    admin
        .put(&other_block, json!({ "block": false }))
        .await
        .ok();
    bob.join(&other).await.ok();
    // Bob's syncs from before the purge go on afterwards.
    let body = list(9, 3, json!([["m.room.member", "$ME"]]));
    let sliding = sss(&bob, None, 0, body.clone()).await.ok();
    assert_eq!(sliding["lists"]["all"]["count"], 1);
    let since = bob.next_batch().await;

    // v1 answers when done, with the same result; `purge` (the default) then deletes the
    // room, and the server goes on sending and syncing in the rooms that remain.
    let result = admin
        .delete(
            &format!("/_synapse/admin/v1/rooms/{}", enc(&other)),
            json!({}),
        )
        .await
        .ok();
    let mut kicked = result["kicked_users"].as_array().unwrap().clone();
    kicked.sort_by_key(|u| u.as_str().unwrap().to_owned());
    assert_eq!(kicked, [json!(alice.user_id), json!(bob.user_id)]);
    assert_eq!(result["new_room_id"], Value::Null);
    admin
        .get(&format!("/_synapse/admin/v1/rooms/{}", enc(&other)))
        .await
        .assert_error(404, "M_NOT_FOUND");
    let left = server
        .count(&format!(
            "SELECT count(*) AS n FROM events WHERE room_id = '{other}'"
        ))
        .await;
    assert_eq!(left, 0);
    assert_eq!(
        admin.get("/_synapse/admin/v1/rooms").await.ok()["total_rooms"],
        1
    );
    let third = alice.create_room(json!({})).await;
    alice.send_text(&third, "t1", "still here").await.ok();
    let sync = alice.sync(None, 0, None).await;
    assert!(sync["rooms"]["join"].get(&other).is_none());
    assert!(sync["rooms"]["join"].get(&third).is_some());
    let incremental = bob.sync(Some(&since), 0, None).await;
    assert!(incremental["next_batch"].is_string(), "{incremental}");
    let after = sss(&bob, Some(&pos(&sliding)), 0, body.clone()).await.ok();
    assert_eq!(after["lists"]["all"]["count"], 0, "{after}");
    let fresh = sss(&bob, None, 0, body).await.ok();
    assert_eq!(fresh["lists"]["all"]["count"], 0, "{fresh}");
    admin
        .get("/_synapse/admin/v2/rooms/delete_status/unknown")
        .await
        .assert_error(404, "M_NOT_FOUND");
    // A room may be blocked before the server knows it.
    let elsewhere = format!("!future:{}", server.server_name());
    admin
        .put(
            &format!("/_synapse/admin/v1/rooms/{}/block", enc(&elsewhere)),
            json!({ "block": true }),
        )
        .await
        .ok();
}

#[tokio::test]
async fn quarantined_media_is_refused_everywhere_until_released_and_deleted_media_is_gone() {
    let server = TestServer::start().await;
    let admin = server.create_admin("root", "rootpassword").await;
    let alice = server.register("alice").await;
    let uploaded = upload(&alice, b"private notes".to_vec(), "text/plain", "notes.txt").await;
    let path = uploaded["content_uri"]
        .as_str()
        .unwrap()
        .strip_prefix("mxc://")
        .unwrap()
        .to_owned();
    let download = format!("/_matrix/client/v1/media/download/{path}");
    let fetch = || {
        let alice = alice.clone();
        let download = download.clone();
        async move { alice.get(&download).await }
    };
    assert_eq!(fetch().await.status.as_u16(), 200);

    // The room's media, as the room Media tab lists it.
    let room = alice.create_room(json!({})).await;
    let uri = uploaded["content_uri"].as_str().unwrap();
    alice
        .put(
            &format!(
                "/_matrix/client/v3/rooms/{}/send/m.room.message/m1",
                enc(&room)
            ),
            json!({ "msgtype": "m.file", "body": "notes.txt", "url": uri }),
        )
        .await
        .ok();
    alice
        .put(
            &format!(
                "/_matrix/client/v3/rooms/{}/send/m.room.message/m2",
                enc(&room)
            ),
            json!({ "msgtype": "m.image", "body": "x", "url": "mxc://elsewhere.example/abc" }),
        )
        .await
        .ok();
    let in_room = admin
        .get(&format!("/_synapse/admin/v1/room/{}/media", enc(&room)))
        .await
        .ok();
    assert_eq!(
        in_room,
        json!({ "local": [uri], "remote": ["mxc://elsewhere.example/abc"] })
    );

    admin
        .post(
            &format!("/_synapse/admin/v1/media/quarantine/{path}"),
            json!({}),
        )
        .await
        .ok();
    fetch().await.assert_error(404, "M_NOT_FOUND");
    admin.get(&download).await.assert_error(404, "M_NOT_FOUND");
    let media_list = admin
        .get(&format!(
            "/_synapse/admin/v1/users/{}/media",
            enc(&alice.user_id)
        ))
        .await
        .ok();
    assert_eq!(media_list["total"], 1);
    let item = &media_list["media"][0];
    assert_eq!(item["quarantined_by"], admin.user_id.as_str());
    assert_eq!(item["upload_name"], "notes.txt");
    assert_eq!(item["media_length"], 13);
    assert_eq!(item["media_type"], "text/plain");

    admin
        .post(
            &format!("/_synapse/admin/v1/media/unquarantine/{path}"),
            json!({}),
        )
        .await
        .ok();
    assert_eq!(fetch().await.status.as_u16(), 200);

    let deleted = admin
        .delete(&format!("/_synapse/admin/v1/media/{path}"), json!({}))
        .await
        .ok();
    let media_id = path.rsplit('/').next().unwrap();
    assert_eq!(deleted, json!({ "deleted_media": [media_id], "total": 1 }));
    fetch().await.assert_error(404, "M_NOT_FOUND");
    admin
        .delete(&format!("/_synapse/admin/v1/media/{path}"), json!({}))
        .await
        .assert_error(404, "M_NOT_FOUND");
    admin
        .post(
            "/_synapse/admin/v1/media/quarantine/elsewhere.example/abc",
            json!({}),
        )
        .await
        .assert_error(400, "M_INVALID_PARAM");
}
