//! Sliding sync list filters (MSC4186): which rooms each filter selects, and how a list follows
//! the state changes (a room's name, its encryption) that move rooms in or out of it.

use serde_json::{json, Value};

use crate::{
    sliding_sync::{fresh_window, pos, sss, state_keys, window},
    support::{client::enc, TestServer},
};

#[tokio::test]
async fn filters_select_rooms() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let plain = alice.create_room(json!({ "name": "Plain talk" })).await;
    let encrypted = alice
        .create_room(json!({ "name": "Secret", "initial_state": [{
            "type": "m.room.encryption", "state_key": "",
            "content": { "algorithm": "m.megolm.v1.aes-sha2" } }] }))
        .await;
    let space = alice
        .create_room(json!({ "name": "Space", "creation_content": { "type": "m.space" } }))
        .await;
    alice
        .put_state(
            &space,
            "m.space.child",
            &plain,
            json!({ "via": ["localhost"] }),
        )
        .await
        .ok();
    let dm = bob
        .create_room(json!({ "is_direct": true, "invite": [alice.user_id] }))
        .await;
    alice
        .put(
            &format!(
                "/_matrix/client/v3/user/{}/account_data/m.direct",
                enc(&alice.user_id)
            ),
            json!({ bob.user_id.clone(): [dm] }),
        )
        .await
        .ok();
    let filtered =
        |filters: Value| json!({ "ranges": [[0, 20]], "timeline_limit": 0, "filters": filters });
    let response = sss(
        &alice,
        None,
        0,
        json!({ "lists": {
            "dm": filtered(json!({ "is_dm": true })),
            "encrypted": filtered(json!({ "is_encrypted": true })),
            "invites": filtered(json!({ "is_invite": true })),
            "invited": filtered(json!({ "is_invited": true })),
            "spaces": filtered(json!({ "room_types": ["m.space"] })),
            "untyped": filtered(json!({ "room_types": [null], "is_invite": false })),
            "not_spaces": filtered(json!({ "not_room_types": ["m.space"], "is_invite": false })),
            "children": filtered(json!({ "spaces": [space] })),
            "named": filtered(json!({ "room_name_like": "TALK" })),
        } }),
    )
    .await
    .ok();
    let ids = |name: &str| {
        let mut ids = window(&response, name);
        ids.sort();
        ids
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    assert_eq!(ids("dm"), vec![dm.clone()]);
    assert_eq!(ids("encrypted"), vec![encrypted.clone()]);
    assert_eq!(ids("invites"), vec![dm.clone()]);
    assert_eq!(ids("invited"), vec![dm.clone()]);
    assert_eq!(ids("spaces"), vec![space.clone()]);
    assert_eq!(
        ids("untyped"),
        sorted(vec![plain.clone(), encrypted.clone()])
    );
    assert_eq!(
        ids("not_spaces"),
        sorted(vec![plain.clone(), encrypted.clone()])
    );
    assert_eq!(ids("children"), vec![plain.clone()]);
    assert_eq!(ids("named"), vec![plain.clone()]);
    for name in ["dm", "encrypted", "spaces", "children", "named"] {
        assert_eq!(response["lists"][name]["count"], 1, "{name}");
    }
    // The invite: stripped state ending with the invite itself, no timeline.
    let invite = &response["rooms"][&dm];
    let stripped = invite["invite_state"].as_array().unwrap();
    let own = stripped
        .iter()
        .find(|e| e["type"] == "m.room.member" && e["state_key"] == alice.user_id.as_str())
        .expect("the invite member event");
    assert_eq!(own["sender"], bob.user_id.as_str());
    assert!(invite.get("timeline").is_none());
    // The encrypted room's encryption event comes in its first result when asked for.
    let with_state = sss(
        &alice,
        None,
        0,
        json!({ "lists": { "e": {
            "ranges": [[0, 0]], "timeline_limit": 1,
            "required_state": [["m.room.encryption", ""], ["m.room.create", ""]],
            "filters": { "is_encrypted": true },
        } } }),
    )
    .await
    .ok();
    assert_eq!(
        state_keys(&with_state["rooms"][&encrypted], "m.room.encryption"),
        vec![String::new()]
    );
    // Joining the invite: the room comes again, initial, with its timeline.
    let after_invite = pos(&with_state);
    alice.join(&dm).await.ok();
    let joined = sss(
        &alice,
        Some(&after_invite),
        0,
        json!({ "lists": { "e": {
            "ranges": [[0, 0]], "timeline_limit": 1,
            "required_state": [["m.room.encryption", ""], ["m.room.create", ""]],
            "filters": { "is_encrypted": true },
        } }, "room_subscriptions": { dm.clone(): { "timeline_limit": 5, "required_state": [["m.room.member", "$ME"]] } } }),
    )
    .await
    .ok();
    let dm_result = &joined["rooms"][&dm];
    assert_eq!(dm_result["initial"], true, "{dm_result}");
    assert!(dm_result.get("invite_state").is_none());
    assert_eq!(
        state_keys(dm_result, "m.room.member"),
        vec![alice.user_id.clone()]
    );
    assert_eq!(dm_result["is_dm"], true);
}

/// Filters judge a room by its state now: a room that turns encrypted or is renamed after
/// earlier requests (whose facts the server may keep) moves into and out of the lists.
#[tokio::test]
async fn filters_follow_state_changes_between_requests() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "name": "Lobby" })).await;
    let other = alice.create_room(json!({ "name": "Elsewhere" })).await;
    let lists = json!({ "lists": {
        "encrypted": { "ranges": [[0, 10]], "timeline_limit": 0, "filters": { "is_encrypted": true } },
        "lobby": { "ranges": [[0, 10]], "timeline_limit": 0, "filters": { "room_name_like": "lobby" } },
    } });
    let first = sss(&alice, None, 0, lists.clone()).await.ok();
    assert_eq!(first["lists"]["encrypted"]["count"], 0, "{first}");
    assert_eq!(window(&first, "lobby"), vec![room.clone()]);
    let mut at = pos(&first);
    // Asked again unchanged: the same answer.
    let again = sss(&alice, Some(&at), 0, lists.clone()).await.ok();
    assert_eq!(again["lists"]["encrypted"]["count"], 0, "{again}");
    assert_eq!(again["lists"]["lobby"]["count"], 1, "{again}");
    at = pos(&again);

    alice
        .put_state(
            &room,
            "m.room.encryption",
            "",
            json!({ "algorithm": "m.megolm.v1.aes-sha2" }),
        )
        .await
        .ok();
    alice
        .put_state(&room, "m.room.name", "", json!({ "name": "Hall" }))
        .await
        .ok();
    alice
        .put_state(&other, "m.room.name", "", json!({ "name": "Lobby two" }))
        .await
        .ok();
    let after = sss(&alice, Some(&at), 0, lists.clone()).await.ok();
    assert_eq!(after["lists"]["encrypted"]["count"], 1, "{after}");
    assert_eq!(after["lists"]["lobby"]["count"], 1, "{after}");
    assert_eq!(
        after["rooms"][&other]["initial"], true,
        "entered a window: {after}"
    );
    assert_eq!(
        fresh_window(&alice, lists.clone(), "encrypted").await,
        vec![room.clone()]
    );
    assert_eq!(
        fresh_window(&alice, lists, "lobby").await,
        vec![other.clone()]
    );
}
