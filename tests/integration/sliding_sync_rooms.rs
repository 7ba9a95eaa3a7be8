//! Sliding sync room results: bump stamps, names, avatars and heroes, ignored inviters,
//! subscriptions, the merged MSC's request forms, resent requests, every message once under
//! concurrent senders, rooms left and rejoined, and a timeline for every room of a big window.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::{
    sliding_sync::{fresh_window, list, messages, pos, sss, window},
    support::{client::enc, TestServer},
};

#[tokio::test]
async fn bump_stamp_moves_on_messages_only() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "name": "bumps" })).await;
    let message = alice.send_text(&room, "m1", "first").await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let body = list(9, 5, json!([]));
    let first = sss(&alice, None, 0, body.clone()).await.ok();
    let stamp = first["rooms"][&room]["bump_stamp"].as_u64().unwrap();
    assert!(stamp > 0);
    // A reaction and a topic change are sent, but do not bump.
    alice
        .put(
            &format!("/_matrix/client/v3/rooms/{}/send/m.reaction/r1", enc(&room)),
            json!({ "m.relates_to": { "rel_type": "m.annotation", "event_id": message, "key": "👍" } }),
        )
        .await
        .ok();
    alice
        .put_state(&room, "m.room.topic", "", json!({ "topic": "t" }))
        .await
        .ok();
    let quiet = sss(&alice, Some(&pos(&first)), 0, body.clone()).await.ok();
    let result = &quiet["rooms"][&room];
    assert_eq!(result["timeline"].as_array().unwrap().len(), 2, "{result}");
    assert_eq!(result["bump_stamp"].as_u64().unwrap(), stamp);
    alice.send_text(&room, "m2", "second").await.ok();
    let bumped = sss(&alice, Some(&pos(&quiet)), 0, body).await.ok();
    assert!(bumped["rooms"][&room]["bump_stamp"].as_u64().unwrap() > stamp);
}

#[tokio::test]
async fn names_avatars_and_heroes() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let dm = bob
        .create_room(json!({ "preset": "trusted_private_chat", "invite": [alice.user_id] }))
        .await;
    alice.join(&dm).await.ok();
    let body = list(9, 1, json!([["m.room.name", ""], ["m.room.avatar", ""]]));
    let first = sss(&alice, None, 0, body.clone()).await.ok();
    let result = &first["rooms"][&dm];
    assert!(result.get("name").is_none(), "{result}");
    assert_eq!(
        result["heroes"],
        json!([{ "user_id": bob.user_id, "displayname": "bob" }])
    );
    assert_eq!(result["joined_count"], 2);
    assert_eq!(result["invited_count"], 0);

    bob.put_state(
        &dm,
        "m.room.avatar",
        "",
        json!({ "url": "mxc://localhost/abc" }),
    )
    .await
    .ok();
    let with_avatar = sss(&alice, Some(&pos(&first)), 0, body.clone()).await.ok();
    let result = &with_avatar["rooms"][&dm];
    assert_eq!(result["avatar"], "mxc://localhost/abc", "{result}");
    assert!(result.get("heroes").is_none(), "no membership change");
    bob.put_state(&dm, "m.room.avatar", "", json!({}))
        .await
        .ok();
    bob.put_state(&dm, "m.room.name", "", json!({ "name": "Named now" }))
        .await
        .ok();
    let removed = sss(&alice, Some(&pos(&with_avatar)), 0, body).await.ok();
    let result = &removed["rooms"][&dm];
    assert_eq!(result["avatar"], Value::Null, "{result}");
    assert!(result.as_object().unwrap().contains_key("avatar"));
    assert_eq!(result["name"], "Named now");
}

#[tokio::test]
async fn ignored_inviters_and_unknown_subscriptions() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let carol = server.register("carol").await;
    let mine = alice.create_room(json!({})).await;
    let strangers = carol.create_room(json!({})).await;
    alice
        .put(
            &format!(
                "/_matrix/client/v3/user/{}/account_data/m.ignored_user_list",
                enc(&alice.user_id)
            ),
            json!({ "ignored_users": { carol.user_id.clone(): {} } }),
        )
        .await
        .ok();
    let invite = carol
        .create_room(json!({ "invite": [alice.user_id] }))
        .await;
    let mut body = list(9, 1, json!([]));
    body["room_subscriptions"] = json!({ strangers.clone(): { "timeline_limit": 5 } });
    let response = sss(&alice, None, 0, body).await.ok();
    assert_eq!(response["lists"]["all"]["count"], 1, "{response}");
    assert!(response["rooms"].get(&mine).is_some());
    assert!(
        response["rooms"].get(&invite).is_none(),
        "an ignored user's invite"
    );
    assert!(
        response["rooms"].get(&strangers).is_none(),
        "never a member"
    );
}

#[tokio::test]
async fn merged_msc_forms_mean_the_same() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "name": "forms" }))
        .await;
    bob.join(&room).await.ok();
    bob.send_text(&room, "b", "from bob").await.ok();
    let invite = bob.create_room(json!({ "invite": [alice.user_id] })).await;
    let legacy = sss(
        &alice,
        None,
        0,
        json!({ "lists": {
            "joined": { "ranges": [[0, 9]], "timeline_limit": 1, "filters": { "is_invite": false },
                "required_state": [["m.room.name", ""], ["m.room.member", "$LAZY"], ["m.room.member", "$ME"]] },
            "invites": { "ranges": [[0, 9]], "timeline_limit": 1, "filters": { "is_invite": true } },
        } }),
    )
    .await
    .ok();
    let merged = alice
        .post(
            "/_matrix/client/v4/sync",
            json!({ "timeout": 0, "lists": {
                "joined": { "range": [0, 9], "timeline_limit": 1, "filters": { "is_invited": false },
                    "required_state": { "include": [{ "type": "m.room.name", "state_key": "" },
                        { "type": "m.room.member", "state_key": "$ME" }], "lazy_members": true } },
                "invites": { "range": [0, 9], "timeline_limit": 1, "filters": { "is_invited": true } },
            } }),
        )
        .await
        .ok();
    for response in [&legacy, &merged] {
        assert_eq!(response["lists"]["joined"]["count"], 1, "{response}");
        assert_eq!(response["lists"]["invites"]["count"], 1);
        assert!(response["rooms"][&invite]["invite_state"].is_array());
    }
    let state = |response: &Value| {
        let mut keys: Vec<(String, String)> = response["rooms"][&room]["required_state"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap().to_owned(),
                    e["state_key"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        keys.sort();
        keys
    };
    assert_eq!(state(&legacy), state(&merged));
    assert_eq!(state(&legacy).len(), 3, "name, alice, bob");
    // `exclude` narrows `include`: every state event but members, lazy members still sent.
    let narrowed = alice
        .post(
            "/_matrix/client/v4/sync",
            json!({ "timeout": 0, "conn_id": "narrowed", "room_subscriptions": { room.clone(): { "timeline_limit": 1,
                "required_state": { "include": [{ "type": "*" }],
                    "exclude": [{ "type": "m.room.member" }, { "type": "m.room.join_rules", "state_key": "" }],
                    "lazy_members": true } } } }),
        )
        .await
        .ok();
    let kinds: Vec<(String, String)> = state(&narrowed);
    assert!(
        kinds.contains(&("m.room.name".into(), String::new())),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("m.room.create".into(), String::new())),
        "{kinds:?}"
    );
    assert!(
        !kinds.iter().any(|(t, _)| t == "m.room.join_rules"),
        "{kinds:?}"
    );
    let members: Vec<&String> = kinds
        .iter()
        .filter(|(t, _)| t == "m.room.member")
        .map(|(_, k)| k)
        .collect();
    assert_eq!(members, vec![&bob.user_id], "only the timeline's sender");
    // `pos` in the body works too.
    let next = alice
        .post(
            "/_matrix/client/v4/sync",
            json!({ "pos": pos(&merged), "lists": { "joined": { "range": [0, 9], "timeline_limit": 1 } } }),
        )
        .await
        .ok();
    assert!(next["rooms"].as_object().unwrap().is_empty(), "{next}");
}

#[tokio::test]
async fn a_resent_request_with_another_subscription_is_honoured() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let shown = alice.create_room(json!({ "name": "shown" })).await;
    let other = alice.create_room(json!({ "name": "other" })).await;
    alice.send_text(&shown, "s", "newest").await.ok();
    let body = list(0, 1, json!([]));
    let first = sss(&alice, None, 0, body.clone()).await.ok();
    assert!(first["rooms"].get(&other).is_none());
    let at = pos(&first);
    let plain = sss(&alice, Some(&at), 0, body.clone()).await.ok();
    assert!(plain["rooms"].as_object().unwrap().is_empty());
    // The client cancels and resends from the same pos with a subscription.
    let mut subscribed = body.clone();
    subscribed["room_subscriptions"] = json!({ other.clone(): { "timeline_limit": 5 } });
    let resent = sss(&alice, Some(&at), 0, subscribed.clone()).await.ok();
    assert_eq!(resent["rooms"][&other]["initial"], true, "{resent}");
    // Replaying that pos gives the same rooms again.
    let replay = sss(&alice, Some(&at), 0, subscribed.clone()).await.ok();
    let ids = |response: &Value| -> Vec<String> {
        response["rooms"][&other]["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["event_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids(&replay), ids(&resent));
    assert_eq!(replay["rooms"][&other]["initial"], true);
    // Going on from it: nothing new, and a dropped subscription is not sent any more.
    let on = sss(&alice, Some(&pos(&replay)), 0, subscribed).await.ok();
    assert!(on["rooms"].as_object().unwrap().is_empty(), "{on}");
    alice.send_text(&other, "o", "unseen").await.ok();
    alice.send_text(&shown, "s2", "on top again").await.ok();
    let dropped = sss(&alice, Some(&pos(&on)), 0, body).await.ok();
    assert!(dropped["rooms"].get(&other).is_none(), "{dropped}");
}

#[tokio::test]
async fn every_message_once_under_concurrent_senders() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let mut rooms = Vec::new();
    let mut senders = Vec::new();
    for n in 0..3 {
        let sender = server.register(&format!("sender{n}")).await;
        let room = sender.create_room(json!({ "preset": "public_chat" })).await;
        alice.join(&room).await.ok();
        rooms.push(room);
        senders.push(sender);
    }
    for sender in &senders {
        for room in &rooms {
            sender.join(room).await.ok();
        }
    }
    let body = list(9, 200, json!([]));
    let first = sss(&alice, None, 0, body.clone()).await.ok();
    let per_sender = 40;
    let tasks: Vec<_> = senders
        .into_iter()
        .enumerate()
        .map(|(n, sender)| {
            let rooms = rooms.clone();
            tokio::spawn(async move {
                for i in 0..per_sender {
                    let room = &rooms[(n + i) % rooms.len()];
                    sender
                        .send_text(room, &format!("t{i}"), &format!("{n}-{i}"))
                        .await
                        .ok();
                }
            })
        })
        .collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut at = pos(&first);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while seen.len() < 3 * per_sender && std::time::Instant::now() < deadline {
        let response = sss(&alice, Some(&at), 2000, body.clone()).await.ok();
        for room in &rooms {
            let result = &response["rooms"][room];
            assert_ne!(result["limited"], true, "a limit of 200 is never reached");
            for message in messages(result) {
                *seen.entry(message).or_default() += 1;
            }
        }
        at = pos(&response);
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(seen.len(), 3 * per_sender, "every message arrived");
    assert!(seen.values().all(|n| *n == 1), "exactly once: {seen:?}");
}

#[tokio::test]
async fn a_long_poll_answering_after_its_replacement_does_not_expire_the_connection() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let second = alice.create_room(json!({ "name": "second" })).await;
    let first_room = alice.create_room(json!({ "name": "first" })).await;
    let first = sss(&alice, None, 0, list(0, 1, json!([]))).await.ok();
    assert!(first["rooms"].get(&first_room).is_some());
    let base = sss(&alice, Some(&pos(&first)), 0, list(0, 1, json!([])))
        .await
        .ok();
    let at = pos(&base);
    // A long-poll the client will give up on...
    let abandoned = {
        let alice = alice.clone();
        let at = at.clone();
        tokio::spawn(async move { sss(&alice, Some(&at), 5000, list(0, 1, json!([]))).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    // ...replaced by a request from the same pos with a bigger window...
    let kept = sss(&alice, Some(&at), 0, list(1, 1, json!([]))).await.ok();
    assert_eq!(kept["rooms"][&second]["initial"], true);
    // ...and the abandoned one then answers too, with a version of its own.
    alice
        .send_text(&second, "m", "wakes the old one")
        .await
        .ok();
    let late = abandoned.await.unwrap().ok();
    assert!(late["rooms"].get(&second).is_some(), "{late}");
    assert_ne!(pos(&late), pos(&kept));
    // The client goes on from the response it kept.
    let next = sss(&alice, Some(&pos(&kept)), 0, list(1, 1, json!([])))
        .await
        .ok();
    assert_eq!(
        messages(&next["rooms"][&second]),
        vec!["wakes the old one"],
        "{next}"
    );
    // The abandoned version is gone.
    sss(&alice, Some(&pos(&late)), 0, list(1, 1, json!([])))
        .await
        .assert_error(400, "M_UNKNOWN_POS");
}

#[tokio::test]
async fn knocks_and_rejected_invites() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let knockable = bob
        .create_room(json!({ "initial_state": [{ "type": "m.room.join_rules", "state_key": "", "content": { "join_rule": "knock" } }] }))
        .await;
    let invited = bob.create_room(json!({ "invite": [alice.user_id] })).await;
    alice
        .post(
            &format!("/_matrix/client/v3/knock/{}", enc(&knockable)),
            json!({}),
        )
        .await
        .ok();
    let body = list(9, 1, json!([["m.room.member", "$ME"]]));
    let first = sss(&alice, None, 0, body.clone()).await.ok();
    assert_eq!(first["lists"]["all"]["count"], 2);
    let knock = first["rooms"][&knockable]["invite_state"]
        .as_array()
        .unwrap_or_else(|| panic!("knock as invite_state: {first}"))
        .iter()
        .find(|e| e["type"] == "m.room.member" && e["state_key"] == alice.user_id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(knock["content"]["membership"], "knock");
    assert!(first["rooms"][&invited]["invite_state"].is_array());

    alice.room_action(&invited, "leave", json!({})).await.ok();
    let rejected = sss(&alice, Some(&pos(&first)), 0, body.clone()).await.ok();
    let result = &rejected["rooms"][&invited];
    assert!(result.get("invite_state").is_none(), "{result}");
    let own = result["required_state"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["state_key"] == alice.user_id.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("own leave: {result}"));
    assert_eq!(own["content"]["membership"], "leave");
    let after = sss(&alice, Some(&pos(&rejected)), 0, body).await.ok();
    assert_eq!(after["lists"]["all"]["count"], 1, "{after}");
}

#[tokio::test]
async fn leaving_kicks_and_rejoining() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let left = bob.create_room(json!({ "preset": "public_chat" })).await;
    let kicked = bob.create_room(json!({ "preset": "public_chat" })).await;
    alice.join(&left).await.ok();
    alice.join(&kicked).await.ok();
    let body = list(9, 3, json!([["m.room.member", "$ME"]]));
    let first = sss(&alice, None, 0, body.clone()).await.ok();
    assert_eq!(first["lists"]["all"]["count"], 2);
    alice.room_action(&left, "leave", json!({})).await.ok();
    bob.room_action(&kicked, "kick", json!({ "user_id": alice.user_id }))
        .await
        .ok();
    let after = sss(&alice, Some(&pos(&first)), 0, body.clone()).await.ok();
    for room in [&left, &kicked] {
        let result = &after["rooms"][room];
        let own = result["required_state"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["state_key"] == alice.user_id.as_str())
            .unwrap_or_else(|| panic!("own member in {result}"));
        assert_eq!(own["content"]["membership"], "leave");
        assert!(result["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "m.room.member" && e["state_key"] == alice.user_id.as_str()));
    }
    assert_eq!(
        after["lists"]["all"]["count"], 2,
        "the leave is listed once"
    );
    let later = sss(&alice, Some(&pos(&after)), 0, body.clone()).await.ok();
    assert_eq!(later["lists"]["all"]["count"], 1, "the kick stays listed");
    assert_eq!(
        fresh_window(&alice, body.clone(), "all").await,
        vec![kicked.clone()]
    );
    alice.join(&left).await.ok();
    let rejoined = sss(&alice, Some(&pos(&later)), 0, body).await.ok();
    assert_eq!(rejoined["rooms"][&left]["initial"], true, "{rejoined}");
}

/// Rooms are built in batches of 32 whose newest events, relations and transaction IDs are
/// read together: over two lists with different timeline limits, every room of either batch
/// gets its own newest events up to its own list's limit, the remote echo of its own
/// messages and only its own events' relations.
#[tokio::test]
async fn every_room_of_a_big_window_gets_its_own_timeline() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    // More rooms than one batch (32), with zero to three messages each.
    let rooms = alice.rooms_with_messages(34).await;
    // An edit of the newest room's message (the first room of the first window).
    let edited = &rooms[33];
    let original = alice.send_text(edited, "original", "original").await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!(
        "/_matrix/client/v3/rooms/{}/send/m.room.message/edit",
        enc(edited)
    );
    let edit = alice
        .put(
            &path,
            json!({
                "msgtype": "m.text",
                "body": "* edited",
                "m.new_content": { "msgtype": "m.text", "body": "edited" },
                "m.relates_to": { "rel_type": "m.replace", "event_id": original },
            }),
        )
        .await
        .ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();

    let lists = json!({ "lists": {
        "newer": { "ranges": [[0, 16]], "timeline_limit": 2, "required_state": [] },
        "older": { "ranges": [[17, 33]], "timeline_limit": 5, "required_state": [] },
    } });
    let response = sss(&alice, None, 0, lists).await.ok();
    let results = response["rooms"].as_object().unwrap();
    assert_eq!(results.len(), rooms.len());
    let (newer, older) = (window(&response, "newer"), window(&response, "older"));
    assert_eq!((newer.len(), older.len()), (17, 17));
    assert_eq!(newer[0], *edited);
    for (room, limit) in newer
        .iter()
        .map(|room| (room, 2))
        .chain(older.iter().map(|room| (room, 5)))
    {
        let result = &results[room];
        let history = alice.page_back(room, None, None, 50).await;
        let ids = |events: &[Value]| -> Vec<String> {
            events
                .iter()
                .map(|e| e["event_id"].as_str().unwrap().to_owned())
                .collect()
        };
        let timeline = result["timeline"].as_array().unwrap();
        assert_eq!(
            ids(timeline),
            ids(&history[history.len() - limit..]),
            "{room}"
        );
        assert_eq!(result["limited"], history.len() > limit, "{room}");
        for event in timeline {
            let echo = &event["unsigned"]["transaction_id"];
            match event["type"] == "m.room.message" {
                true => assert!(echo.is_string(), "{event}"),
                false => assert!(echo.is_null(), "{event}"),
            }
            let relations = &event["unsigned"]["m.relations"];
            match event["event_id"] == original.as_str() {
                true => assert_eq!(relations["m.replace"]["event_id"], edit.as_str()),
                false => assert!(relations.is_null(), "{event}"),
            }
        }
    }
}
