//! `/sync` and `/messages`: deltas, tokens, long-polling, pagination and history visibility.

use std::time::Instant;

use serde_json::{json, Value};

use crate::support::{
    client::{enc, timeline},
    server_name, user_id, ServerOptions, TestServer,
};

fn bodies(events: &[&Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == "m.room.message")
        .map(|e| e["content"]["body"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn initial_then_incremental_sync_with_remote_echo_only_for_the_sender_device() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let alice_phone = server.client().login("alice", "password").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "name": "Sync" }))
        .await;
    bob.join(&room).await.ok();

    let initial = bob.sync(None, 0, None).await;
    let joined = &initial["rooms"]["join"][&room];
    assert!(joined["timeline"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["type"] == "m.room.create"));
    assert_eq!(joined["summary"]["m.joined_member_count"], 2);
    assert!(initial["next_batch"].is_string());
    for section in ["to_device", "presence", "account_data"] {
        assert!(initial[section]["events"].is_array(), "{section} present");
    }

    let since_bob = initial["next_batch"].as_str().unwrap().to_owned();
    let since_phone = alice_phone.next_batch().await;
    let sent = alice.send_text(&room, "echo-txn", "hello").await.ok();
    let delta = bob.sync(Some(&since_bob), 0, None).await;
    let events = timeline(&delta, &room);
    assert_eq!(bodies(&events), vec!["hello"], "only what is new");
    assert!(
        events[0]["unsigned"].get("transaction_id").is_none(),
        "other users never see the transaction id"
    );
    assert!(events[0]["unsigned"]["age"].is_u64());
    // The summary is left out while unchanged, and comes again when memberships move.
    assert_eq!(
        delta["rooms"]["join"][&room]["summary"],
        json!({}),
        "{delta}"
    );

    let own = alice.sync(None, 0, None).await;
    let mine = timeline(&own, &room)
        .into_iter()
        .find(|e| e["event_id"] == sent["event_id"])
        .unwrap()
        .clone();
    assert_eq!(
        mine["unsigned"]["transaction_id"], "echo-txn",
        "the sending device sees its remote echo"
    );
    let phone = alice_phone.sync(Some(&since_phone), 0, None).await;
    let on_phone = timeline(&phone, &room);
    assert!(
        on_phone[0]["unsigned"].get("transaction_id").is_none(),
        "other devices of the sender do not"
    );

    // Nothing new: an empty, valid response with a usable token.
    let next = delta["next_batch"].as_str().unwrap();
    let quiet = bob.sync(Some(next), 0, None).await;
    assert!(quiet["rooms"]["join"].as_object().unwrap().is_empty());
    assert_eq!(
        bob.sync(Some(next), 0, None).await["next_batch"],
        quiet["next_batch"]
    );

    let carol = server.register("carol").await;
    carol.join(&room).await.ok();
    let joined = bob
        .sync(Some(quiet["next_batch"].as_str().unwrap()), 0, None)
        .await;
    assert_eq!(
        joined["rooms"]["join"][&room]["summary"]["m.joined_member_count"], 3,
        "{joined}"
    );
}

#[tokio::test]
async fn malformed_and_foreign_tokens_get_matrix_errors() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    for bad in ["garbage", "s-1_0", "s999999999_0"] {
        alice
            .get(&format!("/_matrix/client/v3/sync?since={bad}"))
            .await
            .assert_error(400, "M_INVALID_PARAM");
    }
    let room = alice.create_room(json!({})).await;
    alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=b&from=nope",
            enc(&room)
        ))
        .await
        .assert_error(400, "M_INVALID_PARAM");
}

#[tokio::test]
async fn a_limited_timeline_gives_a_prev_batch_that_messages_fills_exactly() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    let since = bob.next_batch().await;
    for n in 0..25 {
        alice
            .send_text(&room, &format!("m{n}"), &format!("message {n}"))
            .await
            .ok();
    }
    let filter = json!({ "room": { "timeline": { "limit": 5 } } }).to_string();
    let delta = bob.sync(Some(&since), 0, Some(&filter)).await;
    let section = &delta["rooms"]["join"][&room]["timeline"];
    assert_eq!(section["limited"], true);
    let seen = bodies(&timeline(&delta, &room));
    assert_eq!(
        seen,
        (20..25).map(|n| format!("message {n}")).collect::<Vec<_>>()
    );

    // Backwards from prev_batch until the previous sync's token: exactly the 20 missing ones.
    let prev_batch = section["prev_batch"].as_str().unwrap();
    let gap = bob
        .page_back(&room, Some(prev_batch), Some(&since), 7)
        .await;
    let missing = bodies(&gap.iter().collect::<Vec<_>>());
    assert_eq!(
        missing,
        (0..20).map(|n| format!("message {n}")).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn messages_pages_backwards_and_forwards_without_gaps_or_duplicates() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    for n in 0..200 {
        alice
            .send_text(&room, &format!("p{n}"), &format!("{n}"))
            .await
            .ok();
    }
    let expected: Vec<String> = (0..200).map(|n| n.to_string()).collect();
    let page_through = |dir: &'static str| {
        let (alice, room) = (alice.clone(), room.clone());
        async move {
            let mut seen = Vec::new();
            let mut from: Option<String> = None;
            loop {
                let mut path = format!(
                    "/_matrix/client/v3/rooms/{}/messages?dir={dir}&limit=30",
                    enc(&room)
                );
                if let Some(from) = &from {
                    path.push_str(&format!("&from={}", enc(from)));
                }
                let page = alice.get(&path).await.ok();
                let chunk: Vec<&Value> = page["chunk"].as_array().unwrap().iter().collect();
                seen.extend(bodies(&chunk));
                match page["end"].as_str() {
                    Some(end) => from = Some(end.to_owned()),
                    None => return seen,
                }
            }
        }
    };
    let mut backwards = page_through("b").await;
    backwards.reverse();
    assert_eq!(backwards, expected);
    assert_eq!(page_through("f").await, expected);
}

#[tokio::test]
async fn long_poll_wakes_on_a_new_event_and_times_out_empty() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    let since = bob.next_batch().await;

    let started = Instant::now();
    let quiet = bob.sync(Some(&since), 300, None).await;
    assert!(
        started.elapsed().as_millis() >= 290,
        "waited for the timeout"
    );
    assert!(quiet["rooms"]["join"].as_object().unwrap().is_empty());

    let since = server.long_poll_token(&bob, &since).await;
    let waiting = {
        let (bob, since) = (bob.clone(), since.clone());
        tokio::spawn(async move {
            let response = bob.sync(Some(&since), 20_000, None).await;
            (response, Instant::now())
        })
    };
    server.wait_until_long_polls_started(&[&bob]).await;
    assert!(
        !waiting.is_finished(),
        "the long-poll answered with nothing new"
    );
    let sent_at = Instant::now();
    alice.send_text(&room, "wake", "wake up").await.ok();
    let (response, woke_at) = waiting.await.unwrap();
    assert_eq!(bodies(&timeline(&response, &room)), vec!["wake up"]);
    let latency = woke_at.duration_since(sent_at).as_millis();
    assert!(latency < 2_000, "long-poll took {latency} ms to wake");
}

#[tokio::test]
async fn long_poll_on_one_process_wakes_for_a_send_through_another() {
    let server = TestServer::start().await;
    let second = server.second_process().await;
    let alice = server.register("alice").await;
    let mut bob = server.register("bob").await;
    bob.base = second.base_url.clone();
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    let since = bob.next_batch().await;
    let since = server.long_poll_token(&bob, &since).await;
    let waiting = {
        let bob = bob.clone();
        tokio::spawn(async move { bob.sync(Some(&since), 20_000, None).await })
    };
    server.wait_until_long_polls_started(&[&bob]).await;
    assert!(
        !waiting.is_finished(),
        "the long-poll answered with nothing new"
    );
    let sent_at = Instant::now();
    alice.send_text(&room, "x", "across processes").await.ok();
    let response = waiting.await.unwrap();
    assert_eq!(
        bodies(&timeline(&response, &room)),
        vec!["across processes"]
    );
    assert!(sent_at.elapsed().as_millis() < 2_000);
}

/// Starts `client`'s long-poll from `since` and waits until it is parked; the handle answers
/// with the response.
async fn parked_long_poll(
    server: &TestServer,
    client: &crate::support::Client,
    since: &str,
) -> tokio::task::JoinHandle<Value> {
    let since = server.long_poll_token(client, since).await;
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { client.sync(Some(&since), 20_000, None).await })
    };
    server.wait_until_long_polls_started(&[client]).await;
    assert!(
        !waiting.is_finished(),
        "the long-poll answered with nothing new"
    );
    waiting
}

/// Each process keeps whom a room's events wake between events. A member who joins after
/// that (here through each process, one of them leaving and joining again) is woken by the
/// room's next event on both: each membership change is announced at its commit and each
/// process applies it, in order, to what it kept. Presence is off: a member's syncs would
/// wake the others with it.
#[tokio::test]
async fn members_who_join_after_the_room_was_woken_are_woken_by_its_next_event() {
    let server =
        TestServer::start_with(ServerOptions::default().env("MYELIN_PRESENCE", "off")).await;
    let second = server.second_process().await;
    let alice = server.register("alice").await;
    let mut alice_there = server.client().login("alice", "password").await;
    alice_there.base = second.base_url.clone();
    let bob = server.register("bob").await;
    let mut carol = server.register("carol").await;
    carol.base = second.base_url.clone();
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;

    // Both processes wake the room's audience (Alice alone) for this message: each has read
    // and kept it before waking her.
    let here = parked_long_poll(&server, &alice, &alice.next_batch().await).await;
    let there = parked_long_poll(&server, &alice_there, &alice_there.next_batch().await).await;
    alice
        .send_text(&room, "first", "before the joins")
        .await
        .ok();
    for woken in [here.await.unwrap(), there.await.unwrap()] {
        assert_eq!(bodies(&timeline(&woken, &room)), vec!["before the joins"]);
    }

    bob.join(&room).await.ok();
    let left = bob
        .post(&format!("/_matrix/client/v3/rooms/{room}/leave"), json!({}))
        .await;
    assert_eq!(left.status, 200);
    bob.join(&room).await.ok();
    carol.join(&room).await.ok();
    let bob_waiting = parked_long_poll(&server, &bob, &bob.next_batch().await).await;
    let carol_waiting = parked_long_poll(&server, &carol, &carol.next_batch().await).await;
    let sent_at = Instant::now();
    alice
        .send_text(&room, "second", "after the joins")
        .await
        .ok();
    for waiting in [bob_waiting, carol_waiting] {
        let response = waiting.await.unwrap();
        assert_eq!(bodies(&timeline(&response, &room)), vec!["after the joins"]);
    }
    let latency = sent_at.elapsed();
    assert!(
        latency.as_millis() < 2_000,
        "the new members woke after {latency:?}"
    );
}

#[tokio::test]
async fn invites_leaves_and_account_data_appear_in_their_sections() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let since = bob.next_batch().await;
    let room = alice
        .create_room(json!({ "name": "Invite only", "invite": [user_id("bob")] }))
        .await;
    let invited = bob.sync(Some(&since), 0, None).await;
    let stripped = invited["rooms"]["invite"][&room]["invite_state"]["events"]
        .as_array()
        .unwrap();
    assert!(stripped
        .iter()
        .any(|e| e["type"] == "m.room.name" && e["content"]["name"] == "Invite only"));
    assert!(stripped
        .iter()
        .any(|e| e["type"] == "m.room.member" && e["state_key"] == user_id("bob")));

    bob.join(&room).await.ok();
    let since = bob
        .sync(Some(invited["next_batch"].as_str().unwrap()), 0, None)
        .await["next_batch"]
        .as_str()
        .unwrap()
        .to_owned();
    alice
        .room_action(&room, "kick", json!({ "user_id": user_id("bob") }))
        .await
        .ok();
    alice.send_text(&room, "after", "after the kick").await.ok();
    let left = bob.sync(Some(&since), 0, None).await;
    let leave_timeline = left["rooms"]["leave"][&room]["timeline"]["events"]
        .as_array()
        .unwrap();
    assert_eq!(
        leave_timeline.last().unwrap()["content"]["membership"],
        "leave"
    );
    assert!(
        !leave_timeline
            .iter()
            .any(|e| e["content"]["body"] == "after the kick"),
        "nothing after the leave"
    );

    bob.put(
        &format!(
            "/_matrix/client/v3/user/{}/account_data/org.example.x",
            enc(&user_id("bob"))
        ),
        json!({ "v": 1 }),
    )
    .await
    .ok();
    let data = bob
        .sync(Some(left["next_batch"].as_str().unwrap()), 0, None)
        .await;
    assert_eq!(data["account_data"]["events"][0]["type"], "org.example.x");
}

/// History visibility for a user who joins late: what they may see of events sent before.
async fn late_joiner_sees(visibility: &str) -> (bool, bool) {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat",
            "initial_state": [{ "type": "m.room.history_visibility", "state_key": "", "content": { "history_visibility": visibility } }] }))
        .await;
    let before = alice.send_text(&room, "early", "before bob").await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Before joining, only world_readable lets bob read.
    let outside = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=b",
            enc(&room)
        ))
        .await;
    let outside_sees = outside.status == 200
        && bodies(
            &outside.body["chunk"]
                .as_array()
                .unwrap()
                .iter()
                .collect::<Vec<_>>(),
        )
        .contains(&"before bob".to_owned());
    bob.join(&room).await.ok();
    let sync = bob.sync(None, 0, None).await;
    let in_sync = bodies(&timeline(&sync, &room)).contains(&"before bob".to_owned());
    let page = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=b",
            enc(&room)
        ))
        .await
        .ok();
    let in_messages = bodies(&page["chunk"].as_array().unwrap().iter().collect::<Vec<_>>())
        .contains(&"before bob".to_owned());
    let by_id = bob.get_event(&room, &before).await.status == 200;
    assert_eq!(
        in_sync, in_messages,
        "{visibility}: /sync and /messages agree"
    );
    assert_eq!(in_sync, by_id, "{visibility}: /sync and /event agree");
    (outside_sees, in_sync)
}

#[tokio::test]
async fn history_visibility_decides_what_late_joiners_see_on_every_read_path() {
    assert_eq!(late_joiner_sees("world_readable").await, (true, true));
    assert_eq!(late_joiner_sees("shared").await, (false, true));
    assert_eq!(late_joiner_sees("invited").await, (false, false));
    assert_eq!(late_joiner_sees("joined").await, (false, false));
}

#[tokio::test]
async fn a_user_who_left_sees_history_up_to_the_leave_and_again_after_rejoining() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat",
            "initial_state": [{ "type": "m.room.history_visibility", "state_key": "", "content": { "history_visibility": "joined" } }] }))
        .await;
    bob.join(&room).await.ok();
    alice.send_text(&room, "1", "while joined").await.ok();
    bob.room_action(&room, "leave", json!({})).await.ok();
    let gone = alice.send_text(&room, "2", "while away").await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let page = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=b&limit=50",
            enc(&room)
        ))
        .await
        .ok();
    let seen = bodies(&page["chunk"].as_array().unwrap().iter().collect::<Vec<_>>());
    assert!(seen.contains(&"while joined".to_owned()));
    assert!(
        !seen.contains(&"while away".to_owned()),
        "no leak of events after the leave"
    );
    bob.join(&room).await.ok();
    alice.send_text(&room, "3", "back again").await.ok();
    let page = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=b&limit=50",
            enc(&room)
        ))
        .await
        .ok();
    let seen = bodies(&page["chunk"].as_array().unwrap().iter().collect::<Vec<_>>());
    assert!(seen.contains(&"back again".to_owned()) && seen.contains(&"while joined".to_owned()));
    assert!(
        !seen.contains(&"while away".to_owned()),
        "joined visibility: the gap stays hidden"
    );
    bob.get_event(&room, &gone)
        .await
        .assert_error(404, "M_NOT_FOUND");
}

#[tokio::test]
async fn ignored_users_disappear_from_sync_and_messages_on_the_next_sync() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let troll = server.register("troll").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    troll.join(&room).await.ok();
    let since = bob.next_batch().await;
    bob.put(
        &format!(
            "/_matrix/client/v3/user/{}/account_data/m.ignored_user_list",
            enc(&user_id("bob"))
        ),
        json!({ "ignored_users": { user_id("troll"): {} } }),
    )
    .await
    .ok();
    troll.send_text(&room, "t", "noise").await.ok();
    alice.send_text(&room, "a", "signal").await.ok();
    let delta = bob.sync(Some(&since), 0, None).await;
    assert_eq!(bodies(&timeline(&delta, &room)), vec!["signal"]);
    let page = bob
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=b",
            enc(&room)
        ))
        .await
        .ok();
    let seen = bodies(&page["chunk"].as_array().unwrap().iter().collect::<Vec<_>>());
    assert!(seen.contains(&"signal".to_owned()) && !seen.contains(&"noise".to_owned()));

    // Invites from an ignored user are hidden too.
    let next = delta["next_batch"].as_str().unwrap().to_owned();
    let private = troll
        .create_room(json!({ "invite": [user_id("bob")] }))
        .await;
    let invites = bob.sync(Some(&next), 0, None).await;
    assert!(invites["rooms"]["invite"].get(&private).is_none());
}

#[tokio::test]
async fn members_at_a_sync_token_shows_the_membership_of_that_moment() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let before_bob = alice.next_batch().await;
    bob.join(&room).await.ok();
    let path = |at: &str| {
        format!(
            "/_matrix/client/v3/rooms/{}/members?membership=join&at={}",
            enc(&room),
            enc(at)
        )
    };
    let then = alice.get(&path(&before_bob)).await.ok();
    assert_eq!(
        then["chunk"].as_array().unwrap().len(),
        1,
        "only alice was joined then"
    );
    let now = alice.next_batch().await;
    assert_eq!(
        alice.get(&path(&now)).await.ok()["chunk"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn receivers_continue_from_their_tokens_across_a_server_restart() {
    let mut server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    let filter = json!({ "room": { "timeline": { "limit": 100 } } }).to_string();
    let since = bob.sync(None, 0, Some(&filter)).await["next_batch"]
        .as_str()
        .unwrap()
        .to_owned();
    for n in 0..10 {
        alice
            .send_text(&room, &format!("a{n}"), &format!("{n}"))
            .await
            .ok();
    }
    let first = bob.sync(Some(&since), 0, Some(&filter)).await;
    let token = first["next_batch"].as_str().unwrap().to_owned();
    let mut received = bodies(&timeline(&first, &room));
    server.restart().await;
    let (mut alice, mut bob) = (alice, bob);
    alice.base = server.base_url.clone();
    bob.base = server.base_url.clone();
    for n in 10..20 {
        alice
            .send_text(&room, &format!("a{n}"), &format!("{n}"))
            .await
            .ok();
    }
    let after = bob.sync(Some(&token), 0, Some(&filter)).await;
    received.extend(bodies(&timeline(&after, &room)));
    assert_eq!(
        received,
        (0..20).map(|n| n.to_string()).collect::<Vec<_>>(),
        "the old token keeps working after a restart"
    );
}

/// The room-change index starts empty after a restart and reads a room whole when first asked
/// about it: a token from before the restart still learns of a join that happened before it
/// (a device-list change found through the membership alone), even after the index kept up
/// past later events of that room for a user not in it.
#[tokio::test]
async fn a_membership_from_before_a_restart_reaches_an_old_token() {
    let mut server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let carol = server.register("carol").await;
    let dave = server.register("dave").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    let since = bob.next_batch().await;
    carol.join(&room).await.ok();
    server.restart().await;
    let (mut alice, mut bob, mut dave) = (alice, bob, dave);
    for user in [&mut alice, &mut bob, &mut dave] {
        user.base = server.base_url.clone();
    }
    // Dave, in no room, starts the index, and it keeps up past a new message in the room.
    let dave_since = dave.next_batch().await;
    alice
        .send_text(&room, "after", "after the restart")
        .await
        .ok();
    dave.sync(Some(&dave_since), 0, None).await;

    let view = bob.sync(Some(&since), 0, None).await;
    assert_eq!(
        view["device_lists"]["changed"],
        json!([carol.user_id.clone()]),
        "{view}"
    );
    let timeline = &view["rooms"]["join"][&room]["timeline"]["events"];
    assert!(
        timeline
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["content"]["body"] == "after the restart"),
        "{view}"
    );
}

#[tokio::test]
async fn sync_filters_select_types_senders_urls_and_fields() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "name": "Filters" }))
        .await;
    bob.join(&room).await.ok();
    let since = bob.next_batch().await;
    alice.send_text(&room, "1", "plain").await.ok();
    let image = format!(
        "/_matrix/client/v3/rooms/{}/send/m.room.message/2",
        enc(&room)
    );
    alice
        .put(
            &image,
            json!({ "msgtype": "m.image", "body": "pic", "url": format!("mxc://{}/x", server_name()) }),
        )
        .await
        .ok();
    bob.send_text(&room, "3", "from bob").await.ok();

    let run = |filter: Value| {
        let (bob, since) = (bob.clone(), since.clone());
        async move { bob.sync(Some(&since), 0, Some(&filter.to_string())).await }
    };
    let with_url = run(json!({ "room": { "timeline": { "contains_url": true } } })).await;
    assert_eq!(bodies(&timeline(&with_url, &room)), vec!["pic"]);
    let not_bob = run(json!({ "room": { "timeline": { "not_senders": [user_id("bob")] } } })).await;
    assert_eq!(bodies(&timeline(&not_bob, &room)), vec!["plain", "pic"]);
    let only_members = run(json!({ "room": { "timeline": { "types": ["m.room.mem*"] } } })).await;
    assert!(
        timeline(&only_members, &room).is_empty()
            || timeline(&only_members, &room)
                .iter()
                .all(|e| e["type"] == "m.room.member")
    );
    let fields = run(json!({ "event_fields": ["type", "content.body"] })).await;
    let first = timeline(&fields, &room)[0].clone();
    assert_eq!(
        first,
        json!({ "type": "m.room.message", "content": { "body": "plain" } })
    );
    let full = bob
        .sync(
            None,
            0,
            Some(&json!({ "room": { "state": { "types": ["m.room.name"] } } }).to_string()),
        )
        .await;
    let state = full["rooms"]["join"][&room]["state"]["events"]
        .as_array()
        .unwrap();
    assert!(
        state.iter().all(|e| e["type"] == "m.room.name"),
        "{state:?}"
    );
}
