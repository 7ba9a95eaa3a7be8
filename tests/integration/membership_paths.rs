//! Membership, whichever endpoint writes it: `/state` member events and `createRoom`'s
//! `initial_state` get the same checks as the membership endpoints, and so does a
//! shadow-banned user's every visible write.

use serde_json::json;

use crate::support::{client::enc, TestServer};

#[tokio::test]
async fn a_restricted_room_cannot_be_joined_by_writing_ones_own_member_event() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let mallory = server.register("mallory").await;
    let space = alice
        .create_room(json!({ "preset": "private_chat", "creation_content": { "type": "m.space" } }))
        .await;
    let room = alice
        .create_room(json!({
            "preset": "private_chat",
            "initial_state": [{
                "type": "m.room.join_rules", "state_key": "",
                "content": { "join_rule": "restricted",
                             "allow": [{ "type": "m.room_membership", "room_id": space }] },
            }],
        }))
        .await;
    mallory.join(&room).await.assert_error(403, "M_FORBIDDEN");
    mallory
        .put_state(
            &room,
            "m.room.member",
            &mallory.user_id,
            json!({ "membership": "join", "join_authorised_via_users_server": alice.user_id }),
        )
        .await
        .assert_error(403, "M_FORBIDDEN");
    let members = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/joined_members",
            enc(&room)
        ))
        .await
        .ok();
    assert!(members["joined"].get(&mallory.user_id).is_none());

    // A member of the space joins through /state too, authorised by the server.
    let carol = server.register("carol").await;
    alice
        .room_action(&space, "invite", json!({ "user_id": carol.user_id }))
        .await
        .ok();
    carol.join(&space).await.ok();
    carol
        .put_state(
            &room,
            "m.room.member",
            &carol.user_id,
            json!({ "membership": "join", "join_authorised_via_users_server": "@nobody:example.org" }),
        )
        .await
        .ok();
    let member = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.member/{}",
            enc(&room),
            enc(&carol.user_id)
        ))
        .await
        .ok();
    assert_eq!(member["membership"], "join");
    assert_eq!(member["join_authorised_via_users_server"], alice.user_id);
}

#[tokio::test]
async fn invites_through_state_and_initial_state_are_checked() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "private_chat" })).await;
    let nobody = alice.user_id.replace("@alice", "@nobody");
    alice
        .put_state(
            &room,
            "m.room.member",
            &nobody,
            json!({ "membership": "invite" }),
        )
        .await
        .assert_error(404, "M_NOT_FOUND");
    let bob = server.register("bob").await;
    alice
        .post(
            "/_matrix/client/v3/createRoom",
            json!({ "initial_state": [{ "type": "m.room.member", "state_key": bob.user_id,
                                        "content": { "membership": "invite" } }] }),
        )
        .await
        .assert_error(400, "M_INVALID_PARAM");
    let sync = bob.sync(None, 0, None).await;
    assert!(sync["rooms"]["invite"]
        .as_object()
        .is_none_or(|rooms| rooms.is_empty()));
}

#[tokio::test]
async fn a_shadow_banned_user_cannot_reach_others_through_any_write() {
    let server = TestServer::start().await;
    let admin = server.create_admin("admin", "pw").await;
    let alice = server.register("alice").await;
    let troll = server.register("troll").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    troll.join(&room).await.ok();
    let message = alice.send_text(&room, "a1", "hello").await.ok();
    let since = alice.next_batch().await;
    admin
        .post(
            &format!(
                "/_synapse/admin/v1/users/{}/shadow_ban",
                enc(&troll.user_id)
            ),
            json!({}),
        )
        .await
        .ok();
    // A fresh login: the shadow ban is known from the token lookup on.
    let troll = server.client().login("troll", "password").await;

    troll
        .put_state(
            &room,
            "m.room.member",
            &troll.user_id,
            json!({ "membership": "join", "displayname": "BUY CHEAP PILLS" }),
        )
        .await
        .ok();
    troll
        .put(
            &format!(
                "/_matrix/client/v3/rooms/{}/typing/{}",
                enc(&room),
                enc(&troll.user_id)
            ),
            json!({ "typing": true, "timeout": 30000 }),
        )
        .await
        .ok();
    troll
        .post(
            &format!(
                "/_matrix/client/v3/rooms/{}/receipt/m.read/{}",
                enc(&room),
                enc(message["event_id"].as_str().unwrap())
            ),
            json!({}),
        )
        .await
        .ok();
    troll
        .put(
            "/_matrix/client/v3/sendToDevice/m.test/t1",
            json!({ "messages": { alice.user_id.clone(): { "*": { "spam": true } } } }),
        )
        .await
        .ok();
    troll
        .put(
            &format!("/_matrix/client/v3/presence/{}/status", enc(&troll.user_id)),
            json!({ "presence": "online", "status_msg": "BUY CHEAP PILLS" }),
        )
        .await
        .ok();
    // Leaving stays real.
    troll.room_action(&room, "leave", json!({})).await.ok();

    let seen = alice.sync(Some(&since), 0, None).await.to_string();
    assert!(!seen.contains("BUY CHEAP PILLS"), "{seen}");
    assert!(!seen.contains("\"spam\""), "{seen}");
    assert!(
        !seen.contains("m.typing\",\"content\":{\"user_ids\":[\"@troll"),
        "{seen}"
    );
    assert!(
        !seen.contains(&format!("\"{}\":{{\"ts\"", troll.user_id)),
        "{seen}"
    );
    let members = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/joined_members",
            enc(&room)
        ))
        .await
        .ok();
    assert!(members["joined"].get(&troll.user_id).is_none(), "{members}");
}

#[tokio::test]
async fn concurrent_identical_creates_by_one_user_make_distinct_rooms() {
    let server = TestServer::start().await;
    let bot = server.register("bot").await;
    let mut rooms = std::collections::HashSet::new();
    for _ in 0..4 {
        let creates = (0..25).map(|_| {
            bot.post(
                "/_matrix/client/v3/createRoom",
                json!({ "room_version": "12" }),
            )
        });
        for response in futures_util::future::join_all(creates).await {
            rooms.insert(response.ok()["room_id"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(rooms.len(), 100);
}

#[tokio::test]
async fn an_upgrade_carries_bans_over_and_survives_an_upgrader_without_power_level_rights() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let mod_ = server.register("moderator").await;
    let mallory = server.register("mallory").await;
    let room = alice
        .create_room(json!({
            "preset": "public_chat",
            "room_version": "11",
            "power_level_content_override": {
                "users": { alice.user_id.clone(): 100, mod_.user_id.clone(): 60 },
                "events": { "m.room.tombstone": 60, "m.room.power_levels": 100 },
            },
        }))
        .await;
    mod_.join(&room).await.ok();
    mallory.join(&room).await.ok();
    alice
        .room_action(
            &room,
            "ban",
            json!({ "user_id": mallory.user_id, "reason": "spam" }),
        )
        .await
        .ok();
    // The moderator may tombstone but not change power levels.
    let upgraded = mod_
        .post(
            &format!("/_matrix/client/v3/rooms/{}/upgrade", enc(&room)),
            json!({ "new_version": "12" }),
        )
        .await
        .ok();
    let new = upgraded["replacement_room"].as_str().unwrap().to_owned();
    mallory.join(&new).await.assert_error(403, "M_FORBIDDEN");
    let ban = mod_
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.member/{}",
            enc(&new),
            enc(&mallory.user_id)
        ))
        .await
        .ok();
    assert_eq!(ban["membership"], "ban");
    assert_eq!(ban["reason"], "spam");
}

/// Member counts (every sync's room summary, push rules' `room_member_count`, the directory)
/// are rows kept by triggers as memberships change, not counts of the members: whichever path
/// writes a membership, and a purge that deletes them, they stay equal to a recount.
#[tokio::test]
async fn member_counts_stay_equal_to_a_recount_through_every_membership_change() {
    let server = TestServer::start().await;
    let admin = server.create_admin("admin", "admin-password").await;
    let alice = server.register("alice").await;
    let [bob, carol, dave, eve, frank] =
        ["bob", "carol", "dave", "eve", "frank"].map(|name| server.register(name));
    let (bob, carol, dave, eve, frank) = tokio::join!(bob, carol, dave, eve, frank);
    let room = alice
        .create_room(
            json!({ "preset": "public_chat", "visibility": "public", "invite": [dave.user_id] }),
        )
        .await;
    let action =
        |name: &'static str, user: &str| alice.room_action(&room, name, json!({ "user_id": user }));
    bob.join(&room).await.ok();
    carol.join(&room).await.ok();
    action("kick", &carol.user_id).await.ok();
    dave.room_action(&room, "leave", json!({})).await.ok();
    action("ban", &eve.user_id).await.ok();
    action("unban", &eve.user_id).await.ok();
    action("ban", &eve.user_id).await.ok();
    action("invite", &frank.user_id).await.ok();
    alice
        .put_state(
            &room,
            "m.room.member",
            &bob.user_id,
            json!({ "membership": "join", "displayname": "Bob B." }),
        )
        .await
        .assert_error(403, "M_FORBIDDEN");
    bob.put_state(
        &room,
        "m.room.member",
        &bob.user_id,
        json!({ "membership": "join", "displayname": "Bob B." }),
    )
    .await
    .ok();

    let recount_differs = "SELECT count(*) AS n FROM \
        (SELECT room_id, membership, count(*) AS members FROM room_memberships GROUP BY 1, 2) r \
        FULL JOIN (SELECT * FROM room_member_counts WHERE members <> 0) c USING (room_id, membership) \
        WHERE r.members IS DISTINCT FROM c.members";
    assert_eq!(server.count(recount_differs).await, 0);
    let summary = &bob.sync(None, 0, None).await["rooms"]["join"][&room]["summary"];
    assert_eq!(summary["m.joined_member_count"], 2, "{summary}");
    assert_eq!(summary["m.invited_member_count"], 1, "{summary}");
    let directory = bob.get("/_matrix/client/v3/publicRooms").await.ok();
    assert_eq!(
        directory["chunk"][0]["num_joined_members"], 2,
        "{directory}"
    );

    admin
        .delete(
            &format!("/_synapse/admin/v1/rooms/{}", enc(&room)),
            json!({}),
        )
        .await
        .ok();
    assert_eq!(server.count(recount_differs).await, 0);
    assert_eq!(
        server
            .count("SELECT count(*) AS n FROM room_member_counts WHERE members <> 0")
            .await,
        0
    );
}

/// `/joined_members` gives each joined member's profile from their member event, and a
/// member event whose profile fields are not strings (any client may write one) neither
/// breaks the list for everyone nor reaches it.
#[tokio::test]
async fn joined_members_lists_string_profiles_and_survives_others() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let mallory = server.register("mallory").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    mallory.join(&room).await.ok();
    let own_member = |user: &str| {
        format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.member/{}",
            enc(&room),
            enc(user)
        )
    };
    alice
        .put(
            &own_member(&alice.user_id),
            json!({ "membership": "join", "displayname": "Alice", "avatar_url": "mxc://x/a" }),
        )
        .await
        .ok();
    mallory
        .put(
            &own_member(&mallory.user_id),
            json!({ "membership": "join", "displayname": 42, "avatar_url": { "not": "a url" } }),
        )
        .await
        .ok();
    let path = format!("/_matrix/client/v3/rooms/{}/joined_members", enc(&room));
    let listed = alice.get(&path).await.ok();
    assert_eq!(
        listed,
        json!({ "joined": {
            alice.user_id.clone(): { "display_name": "Alice", "avatar_url": "mxc://x/a" },
            mallory.user_id.clone(): {},
        } })
    );
}
