//! Rooms: creation, membership, sending, state, redaction, aliases, directory.

use serde_json::json;

use crate::support::{alias, client::enc, server_name, user_id, TestServer};

#[tokio::test]
async fn public_room_with_alias_join_by_alias_exchange_messages_and_moderate() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "room_alias_name": "lobby", "name": "Lobby", "topic": "Chat" }))
        .await;
    assert_eq!(
        bob.join(&alias("lobby")).await.ok()["room_id"],
        room.as_str()
    );
    let hello = bob.send_text(&room, "t1", "hello").await.ok();
    let event = alice
        .get_event(&room, hello["event_id"].as_str().unwrap())
        .await
        .ok();
    assert_eq!(event["content"]["body"], "hello");
    assert_eq!(event["sender"], user_id("bob"));
    assert_eq!(event["room_id"], room.as_str());
    assert!(event["unsigned"]["age"].is_u64());

    alice
        .put_state(&room, "m.room.name", "", json!({ "name": "Renamed" }))
        .await
        .ok();
    alice
        .put_state(&room, "m.room.topic", "", json!({ "topic": "New topic" }))
        .await
        .ok();
    let name = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.name/",
            enc(&room)
        ))
        .await
        .ok();
    assert_eq!(name, json!({ "name": "Renamed" }));
    let full = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.topic?format=event",
            enc(&room)
        ))
        .await
        .ok();
    assert_eq!(full["content"]["topic"], "New topic");
    assert_eq!(full["sender"], user_id("alice"));

    let denied = bob
        .put_state(
            &room,
            "m.room.power_levels",
            "",
            json!({ "users": { user_id("bob"): 100 } }),
        )
        .await;
    denied.assert_error(403, "M_FORBIDDEN");

    alice
        .room_action(
            &room,
            "kick",
            json!({ "user_id": user_id("bob"), "reason": "out" }),
        )
        .await
        .ok();
    bob.send_text(&room, "t2", "still here?")
        .await
        .assert_error(403, "M_FORBIDDEN");
    bob.join(&room).await.ok();
    alice
        .room_action(&room, "ban", json!({ "user_id": user_id("bob") }))
        .await
        .ok();
    bob.join(&alias("lobby"))
        .await
        .assert_error(403, "M_FORBIDDEN");
    alice
        .room_action(&room, "unban", json!({ "user_id": user_id("bob") }))
        .await
        .ok();
    bob.join(&room).await.ok();
}

#[tokio::test]
async fn every_supported_room_version_creates_and_accepts_messages() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    for version in ["10", "11", "12"] {
        let room = alice
            .create_room(json!({ "room_version": version, "name": format!("v{version}") }))
            .await;
        let create = alice
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/state/m.room.create/?format=event",
                enc(&room)
            ))
            .await
            .ok();
        assert_eq!(create["content"]["room_version"], version);
        if version == "12" {
            // Room v12 derives the room ID from the create event's reference hash.
            assert_eq!(
                room[1..],
                create["event_id"].as_str().unwrap()[1..],
                "room v12 id"
            );
        } else {
            assert!(room.ends_with(&format!(":{}", server_name())));
            assert_eq!(
                create["content"]["creator"].as_str().is_some(),
                version == "10"
            );
        }
        let sent = alice
            .send_text(&room, &format!("v{version}"), "hi")
            .await
            .ok();
        let event_id = sent["event_id"].as_str().unwrap();
        assert!(
            event_id.starts_with('$') && !event_id.contains(':'),
            "reference-hash event ID: {event_id}"
        );
        alice.get_event(&room, event_id).await.ok();
    }
    alice
        .post(
            "/_matrix/client/v3/createRoom",
            json!({ "room_version": "1" }),
        )
        .await
        .assert_error(400, "M_UNSUPPORTED_ROOM_VERSION");
}

#[tokio::test]
async fn stored_events_are_signed_hashed_and_chained() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "name": "Chain" })).await;
    let first = alice.send_text(&room, "a", "one").await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let second = alice.send_text(&room, "b", "two").await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let pdu: String = {
        use diesel_async::RunQueryDsl;
        #[derive(diesel::QueryableByName)]
        struct Pdu {
            #[diesel(sql_type = diesel::sql_types::Text)]
            pdu: String,
        }
        let row: Pdu = diesel::sql_query(format!(
            "SELECT pdu::text AS pdu FROM events WHERE event_id = '{second}'"
        ))
        .get_result(&mut server.db().await)
        .await
        .unwrap();
        row.pdu
    };
    let pdu: serde_json::Value = serde_json::from_str(&pdu).unwrap();
    assert_eq!(
        pdu["prev_events"],
        json!([first]),
        "prev_events are the forward extremities"
    );
    assert!(pdu["hashes"]["sha256"].is_string());
    let signature = &pdu["signatures"][server_name()];
    assert!(
        signature
            .as_object()
            .unwrap()
            .keys()
            .all(|k| k.starts_with("ed25519:")),
        "{pdu}"
    );
    assert_eq!(
        pdu["auth_events"].as_array().unwrap().len(),
        2,
        "power levels + sender member in v12: {pdu}"
    );
}

#[tokio::test]
async fn a_failed_request_leaves_nothing_behind() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    alice
        .create_room(json!({ "room_alias_name": "taken" }))
        .await;
    let tables = "SELECT (SELECT count(*) FROM rooms) + (SELECT count(*) FROM events) + (SELECT count(*) FROM state_groups) \
                  + (SELECT count(*) FROM state_group_entries) + (SELECT count(*) FROM room_current_state) AS n";
    let before = server.count(tables).await;
    alice
        .post(
            "/_matrix/client/v3/createRoom",
            json!({ "room_alias_name": "taken", "name": "dup" }),
        )
        .await
        .assert_error(400, "M_ROOM_IN_USE");
    // The last initial-state event is refused by the auth rules (bob lacks the power).
    let refused = alice
        .post(
            "/_matrix/client/v3/createRoom",
            json!({ "initial_state": [{ "type": "m.room.power_levels", "state_key": "", "content": { "users_default": 0, "state_default": 100, "users": {} } },
                                      { "type": "m.room.member", "state_key": user_id("alice"), "content": { "membership": "ban" } }] }),
        )
        .await;
    assert_eq!(refused.status.as_u16() / 100, 4, "{}", refused.body);
    assert_eq!(server.count(tables).await, before, "nothing half-written");
}

#[tokio::test]
async fn members_state_and_joined_rooms_follow_membership() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let carol = server.register("carol").await;
    let room = alice
        .create_room(json!({ "invite": [user_id("bob")], "is_direct": true }))
        .await;
    let members = alice
        .get(&format!("/_matrix/client/v3/rooms/{}/members", enc(&room)))
        .await
        .ok();
    let invite = members["chunk"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["state_key"] == user_id("bob"))
        .unwrap()
        .clone();
    assert_eq!(invite["content"]["membership"], "invite");
    assert_eq!(invite["content"]["is_direct"], true);
    // Not invited: invite-only room refuses.
    carol.join(&room).await.assert_error(403, "M_FORBIDDEN");
    bob.join(&room).await.ok();
    assert_eq!(
        bob.get("/_matrix/client/v3/joined_rooms").await.ok()["joined_rooms"],
        json!([room])
    );
    let joined = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/joined_members",
            enc(&room)
        ))
        .await
        .ok();
    assert_eq!(joined["joined"].as_object().unwrap().len(), 2);
    let only_joined = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/members?membership=join",
            enc(&room)
        ))
        .await
        .ok();
    assert_eq!(only_joined["chunk"].as_array().unwrap().len(), 2);
    carol
        .get(&format!("/_matrix/client/v3/rooms/{}/state", enc(&room)))
        .await
        .assert_error(403, "M_FORBIDDEN");

    // After leaving, bob sees the room as it was when he left, and nothing newer.
    let before_leave = alice.send_text(&room, "x1", "before").await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    bob.room_action(&room, "leave", json!({})).await.ok();
    let after_leave = alice.send_text(&room, "x2", "after").await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    alice
        .put_state(&room, "m.room.name", "", json!({ "name": "Secret" }))
        .await
        .ok();
    bob.get_event(&room, &before_leave).await.ok();
    bob.get_event(&room, &after_leave)
        .await
        .assert_error(404, "M_NOT_FOUND");
    let state = bob
        .get(&format!("/_matrix/client/v3/rooms/{}/state", enc(&room)))
        .await
        .ok();
    assert!(
        !state
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "m.room.name"),
        "no state from after the leave"
    );
    assert_eq!(
        bob.get("/_matrix/client/v3/joined_rooms").await.ok()["joined_rooms"],
        json!([])
    );
    bob.room_action(&room, "forget", json!({})).await.ok();
    alice
        .room_action(&room, "forget", json!({}))
        .await
        .assert_error(400, "M_UNKNOWN");
}

#[tokio::test]
async fn redaction_strips_content_and_needs_power_for_others_events() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    let mine = bob.send_text(&room, "m1", "oops").await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let alices = alice.send_text(&room, "a1", "keep").await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let redact = |event: &str, txn: &str| {
        format!(
            "/_matrix/client/v3/rooms/{}/redact/{}/{txn}",
            enc(&room),
            enc(event)
        )
    };
    bob.put(&redact(&alices, "r0"), json!({}))
        .await
        .assert_error(403, "M_FORBIDDEN");
    let redaction = bob
        .put(&redact(&mine, "r1"), json!({ "reason": "typo" }))
        .await
        .ok();
    for reader in [&alice, &bob] {
        let event = reader.get_event(&room, &mine).await.ok();
        assert_eq!(
            event["content"],
            json!({}),
            "content stripped for every reader"
        );
        assert_eq!(
            event["unsigned"]["redacted_because"]["event_id"],
            redaction["event_id"]
        );
    }
    let redaction_event = alice
        .get_event(&room, redaction["event_id"].as_str().unwrap())
        .await
        .ok();
    assert_eq!(redaction_event["redacts"], mine.as_str());
    // The room admin may redact others' events.
    alice.put(&redact(&mine, "r2"), json!({})).await.ok();
}

#[tokio::test]
async fn aliases_canonical_alias_and_directory() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(
            json!({ "preset": "public_chat", "name": "Gardening club", "visibility": "public" }),
        )
        .await;
    let alias_path = |alias: &str| format!("/_matrix/client/v3/directory/room/{}", enc(alias));
    alice
        .put(&alias_path(&alias("garden")), json!({ "room_id": room }))
        .await
        .ok();
    alice
        .put(&alias_path(&alias("garden")), json!({ "room_id": room }))
        .await
        .assert_error(409, "M_UNKNOWN");
    bob.put(&alias_path(&alias("bobs")), json!({ "room_id": room }))
        .await
        .assert_error(403, "M_FORBIDDEN");
    let resolved = server
        .client()
        .get(&alias_path(&alias("garden")))
        .await
        .ok();
    assert_eq!(resolved["room_id"], room.as_str());
    assert_eq!(resolved["servers"], json!([server_name()]));
    let aliases = alice
        .get(&format!("/_matrix/client/v3/rooms/{}/aliases", enc(&room)))
        .await
        .ok();
    assert_eq!(aliases["aliases"], json!([alias("garden")]));

    alice
        .put_state(
            &room,
            "m.room.canonical_alias",
            "",
            json!({ "alias": alias("nope") }),
        )
        .await
        .assert_error(400, "M_BAD_ALIAS");
    alice
        .put_state(
            &room,
            "m.room.canonical_alias",
            "",
            json!({ "alias": alias("garden") }),
        )
        .await
        .ok();

    let public = server
        .client()
        .get("/_matrix/client/v3/publicRooms")
        .await
        .ok();
    assert_eq!(public["chunk"][0]["room_id"], room.as_str());
    assert_eq!(public["chunk"][0]["canonical_alias"], alias("garden"));
    let found = bob
        .post(
            "/_matrix/client/v3/publicRooms",
            json!({ "filter": { "generic_search_term": "garden" } }),
        )
        .await
        .ok();
    assert_eq!(found["chunk"].as_array().unwrap().len(), 1);
    let none = bob
        .post(
            "/_matrix/client/v3/publicRooms",
            json!({ "filter": { "generic_search_term": "chess" } }),
        )
        .await
        .ok();
    assert_eq!(none["chunk"].as_array().unwrap().len(), 0);
    let visibility = format!("/_matrix/client/v3/directory/list/room/{}", enc(&room));
    assert_eq!(
        server.client().get(&visibility).await.ok()["visibility"],
        "public"
    );
    bob.put(&visibility, json!({ "visibility": "private" }))
        .await
        .assert_error(403, "M_FORBIDDEN");
    alice
        .put(&visibility, json!({ "visibility": "private" }))
        .await
        .ok();
    assert_eq!(
        server
            .client()
            .get("/_matrix/client/v3/publicRooms")
            .await
            .ok()["chunk"],
        json!([])
    );

    bob.delete(&alias_path(&alias("garden")), json!({}))
        .await
        .assert_error(403, "M_FORBIDDEN");
    alice
        .delete(&alias_path(&alias("garden")), json!({}))
        .await
        .ok();
    server
        .client()
        .get(&alias_path(&alias("garden")))
        .await
        .assert_error(404, "M_NOT_FOUND");
}

/// Power to change the canonical alias deletes aliases only while its holder is in the room
/// (review finding R).
#[tokio::test]
async fn a_moderator_who_left_or_was_banned_cannot_delete_aliases() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(json!({
            "preset": "public_chat",
            "power_level_content_override": { "users": { bob.user_id.clone(): 50 } },
        }))
        .await;
    bob.join(&room).await.ok();
    let alias_path = |alias: &str| format!("/_matrix/client/v3/directory/room/{}", enc(alias));
    for name in ["first", "second", "third"] {
        alice
            .put(&alias_path(&alias(name)), json!({ "room_id": room }))
            .await
            .ok();
    }
    // While joined, the power is enough.
    bob.delete(&alias_path(&alias("first")), json!({}))
        .await
        .ok();

    bob.room_action(&room, "leave", json!({})).await.ok();
    bob.delete(&alias_path(&alias("second")), json!({}))
        .await
        .assert_error(403, "M_FORBIDDEN");
    bob.join(&room).await.ok();
    alice
        .room_action(&room, "ban", json!({ "user_id": bob.user_id }))
        .await
        .ok();
    bob.delete(&alias_path(&alias("third")), json!({}))
        .await
        .assert_error(403, "M_FORBIDDEN");
    for name in ["second", "third"] {
        let resolved = server.client().get(&alias_path(&alias(name))).await.ok();
        assert_eq!(resolved["room_id"], room.as_str(), "{name} is still there");
    }
}

#[tokio::test]
async fn user_directory_finds_users_sharing_a_room() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    server.register("hermit").await;
    let room = alice
        .create_room(json!({ "invite": [user_id("bob")] }))
        .await;
    bob.join(&room).await.ok();
    let search = |term: &str| json!({ "search_term": term, "limit": 10 });
    let found = alice
        .post("/_matrix/client/v3/user_directory/search", search("bob"))
        .await
        .ok();
    assert_eq!(found["results"][0]["user_id"], user_id("bob"));
    let hidden = alice
        .post("/_matrix/client/v3/user_directory/search", search("hermit"))
        .await
        .ok();
    assert_eq!(
        hidden["results"],
        json!([]),
        "no shared room, no public room"
    );
}

#[tokio::test]
async fn profile_changes_reach_the_rooms() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    alice
        .put(
            &format!(
                "/_matrix/client/v3/profile/{}/displayname",
                enc(&user_id("alice"))
            ),
            json!({ "displayname": "Alice A." }),
        )
        .await
        .ok();
    let joined = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/joined_members",
            enc(&room)
        ))
        .await
        .ok();
    assert_eq!(
        joined["joined"][&user_id("alice")]["display_name"],
        "Alice A."
    );
    assert_eq!(
        joined["joined"][&user_id("alice")]["avatar_url"],
        json!(null)
    );
    alice
        .put(
            &format!(
                "/_matrix/client/v3/profile/{}/avatar_url",
                enc(&user_id("alice"))
            ),
            json!({ "avatar_url": "mxc://example.org/alice" }),
        )
        .await
        .ok();
    let bob = server.register("bob").await;
    bob.join(&room).await.ok();
    let carol = server.register("carol").await;
    carol.join(&room).await.ok();
    carol
        .post(
            &format!("/_matrix/client/v3/rooms/{}/leave", enc(&room)),
            json!({}),
        )
        .await
        .ok();
    let joined = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/joined_members",
            enc(&room)
        ))
        .await
        .ok();
    assert_eq!(
        joined,
        json!({ "joined": {
            user_id("alice"): { "display_name": "Alice A.", "avatar_url": "mxc://example.org/alice" },
            user_id("bob"): { "display_name": "bob" },
        } }),
        "members who left are not listed"
    );
    carol
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/joined_members",
            enc(&room)
        ))
        .await
        .assert_error(403, "M_FORBIDDEN");
}

#[tokio::test]
async fn shadow_banned_users_get_success_but_nobody_sees_their_events() {
    let server = TestServer::start().await;
    let admin = server.create_admin("admin", "pw").await;
    let alice = server.register("alice").await;
    let troll = server.register("troll").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    troll.join(&room).await.ok();
    admin
        .post(
            &format!(
                "/_synapse/admin/v1/users/{}/shadow_ban",
                enc(&user_id("troll"))
            ),
            json!({}),
        )
        .await
        .ok();
    let events_before = server.count("SELECT count(*) AS n FROM events").await;
    let sent = troll.send_text(&room, "s1", "spam").await.ok();
    let again = troll.send_text(&room, "s1", "spam").await.ok();
    assert_eq!(
        sent["event_id"], again["event_id"],
        "retries stay idempotent"
    );
    alice
        .get_event(&room, sent["event_id"].as_str().unwrap())
        .await
        .assert_error(404, "M_NOT_FOUND");
    assert_eq!(
        server.count("SELECT count(*) AS n FROM events").await,
        events_before
    );
    alice
        .post(
            &format!(
                "/_synapse/admin/v1/users/{}/shadow_ban",
                enc(&user_id("troll"))
            ),
            json!({}),
        )
        .await
        .assert_error(403, "M_FORBIDDEN");
}

#[tokio::test]
async fn upgrading_a_room_tombstones_it_and_carries_state_over() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let old = alice.create_room(json!({ "preset": "public_chat", "room_version": "11", "name": "Old name", "room_alias_name": "up" })).await;
    bob.join(&old).await.ok();
    bob.post(
        &format!("/_matrix/client/v3/rooms/{}/upgrade", enc(&old)),
        json!({ "new_version": "12" }),
    )
    .await
    .assert_error(403, "M_FORBIDDEN");
    let upgraded = alice
        .post(
            &format!("/_matrix/client/v3/rooms/{}/upgrade", enc(&old)),
            json!({ "new_version": "12" }),
        )
        .await
        .ok();
    let new = upgraded["replacement_room"].as_str().unwrap().to_owned();
    let tombstone = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.tombstone/",
            enc(&old)
        ))
        .await
        .ok();
    assert_eq!(tombstone["replacement_room"], new.as_str());
    let create = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.create/",
            enc(&new)
        ))
        .await
        .ok();
    assert_eq!(create["predecessor"]["room_id"], old.as_str());
    assert_eq!(create["room_version"], "12");
    let name = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.name/",
            enc(&new)
        ))
        .await
        .ok();
    assert_eq!(name["name"], "Old name");
    let alias = server
        .client()
        .get(&format!(
            "/_matrix/client/v3/directory/room/{}",
            enc(&alias("up"))
        ))
        .await
        .ok();
    assert_eq!(
        alias["room_id"],
        new.as_str(),
        "aliases move to the new room"
    );
    // The old room is quietened and the others can follow.
    bob.send_text(&old, "late", "still here")
        .await
        .assert_error(403, "M_FORBIDDEN");
    bob.join(&new).await.ok();
    bob.send_text(&new, "moved", "moved over").await.ok();
}

#[tokio::test]
async fn knocking_asks_to_join_and_an_invite_lets_in() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "initial_state": [{ "type": "m.room.join_rules", "state_key": "", "content": { "join_rule": "knock" } }] })).await;
    bob.join(&room).await.assert_error(403, "M_FORBIDDEN");
    bob.post(
        &format!("/_matrix/client/v3/knock/{}", enc(&room)),
        json!({ "reason": "let me in" }),
    )
    .await
    .ok();
    let knocks = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/members?membership=knock",
            enc(&room)
        ))
        .await
        .ok();
    assert_eq!(knocks["chunk"][0]["state_key"], user_id("bob"));
    alice
        .room_action(&room, "invite", json!({ "user_id": user_id("bob") }))
        .await
        .ok();
    bob.join(&room).await.ok();
}

#[tokio::test]
async fn restricted_rooms_admit_members_of_the_allowed_room() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let carol = server.register("carol").await;
    let space = alice.create_room(json!({ "preset": "public_chat" })).await;
    let allow = json!([{ "type": "m.room_membership", "room_id": space }]);
    let room = alice
        .create_room(json!({ "initial_state": [{ "type": "m.room.join_rules", "state_key": "", "content": { "join_rule": "restricted", "allow": allow } }] }))
        .await;
    bob.join(&space).await.ok();
    bob.join(&room).await.ok();
    carol.join(&room).await.assert_error(403, "M_FORBIDDEN");
    let member = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.member/{}",
            enc(&room),
            enc(&user_id("bob"))
        ))
        .await
        .ok();
    assert_eq!(member["join_authorised_via_users_server"], user_id("alice"));
}
