//! Unread counts: push-rule evaluation at write time, counted after the read position.

use serde_json::{json, Value};

use crate::support::{client::enc, room_id, server_name, user_id, Client, TestServer};

async fn send(client: &Client, room: &str, txn: &str, content: Value) -> String {
    let path = format!(
        "/_matrix/client/v3/rooms/{}/send/m.room.message/{}",
        enc(room),
        enc(txn)
    );
    client.put(&path, content).await.ok()["event_id"]
        .as_str()
        .expect("event_id")
        .to_owned()
}

async fn text(client: &Client, room: &str, txn: &str, body: &str) -> String {
    send(
        client,
        room,
        txn,
        json!({ "msgtype": "m.text", "body": body }),
    )
    .await
}

async fn receipt(client: &Client, room: &str, kind: &str, event: &str, thread: Option<&str>) {
    let path = format!(
        "/_matrix/client/v3/rooms/{}/receipt/{kind}/{}",
        enc(room),
        enc(event)
    );
    let body = thread.map_or(json!({}), |t| json!({ "thread_id": t }));
    client.post(&path, body).await.ok();
}

/// `(notification_count, highlight_count, unread_count)` of a room in a fresh initial sync.
async fn counts(client: &Client, room: &str) -> (u64, u64, u64) {
    let sync = client.sync(None, 0, None).await;
    let section = &sync["rooms"]["join"][room];
    (
        section["unread_notifications"]["notification_count"]
            .as_u64()
            .expect("notification_count"),
        section["unread_notifications"]["highlight_count"]
            .as_u64()
            .expect("highlight_count"),
        section["org.matrix.msc2654.unread_count"]
            .as_u64()
            .expect("unread_count"),
    )
}

/// Alice's room with Bob in it.
async fn two_person_room(server: &TestServer) -> (Client, Client, String) {
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    (alice, bob, room)
}

/// An `@room` mention highlights only when its sender has the power the room's levels ask
/// for (`notifications.room`, 50 unless set), as they are when it is sent.
#[tokio::test]
async fn a_room_mention_highlights_by_the_power_levels_of_its_room() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    let mention = json!({
        "msgtype": "m.text",
        "body": "@room look",
        "m.mentions": { "room": true },
    });
    send(&bob, &room, "bob-1", mention.clone()).await;
    assert_eq!(counts(&alice, &room).await, (1, 0, 1), "Bob's power is 0");
    send(&alice, &room, "alice-1", mention.clone()).await;
    assert_eq!(counts(&bob, &room).await, (1, 1, 1), "Alice's power is 100");

    let path = format!(
        "/_matrix/client/v3/rooms/{}/state/m.room.power_levels/",
        enc(&room)
    );
    let mut levels = alice.get(&path).await.ok();
    levels["notifications"] = json!({ "room": 0 });
    alice
        .put_state(&room, "m.room.power_levels", "", levels)
        .await
        .ok();
    send(&bob, &room, "bob-2", mention).await;
    assert_eq!(counts(&alice, &room).await, (2, 1, 2), "anyone may now");
}

#[tokio::test]
async fn messages_count_until_read_and_own_messages_never_count() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    assert_eq!(counts(&bob, &room).await, (0, 0, 0));
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(text(&alice, &room, &format!("t{i}"), &format!("hello {i}")).await);
    }
    text(&bob, &room, "own", "my own words").await;
    assert_eq!(counts(&bob, &room).await, (3, 0, 3));
    assert_eq!(counts(&alice, &room).await, (1, 0, 1), "Bob's message");

    receipt(&bob, &room, "m.read", &ids[1], None).await;
    assert_eq!(counts(&bob, &room).await, (1, 0, 1));
    // Repeating a receipt, or one for an earlier event, changes nothing.
    receipt(&bob, &room, "m.read", &ids[1], None).await;
    receipt(&bob, &room, "m.read", &ids[0], None).await;
    assert_eq!(counts(&bob, &room).await, (1, 0, 1));
    // A private receipt counts as much as a public one.
    receipt(&bob, &room, "m.read.private", &ids[2], None).await;
    assert_eq!(counts(&bob, &room).await, (0, 0, 0));
}

/// The seed's example: read up to 100, 101-103 unread; the receipt for 102 and event 104
/// race; the result is exactly 2 whichever commits first.
#[tokio::test]
async fn a_receipt_racing_a_new_message_leaves_an_exact_count() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    for round in 0..8 {
        let read = text(&alice, &room, &format!("r{round}-100"), "100").await;
        receipt(&bob, &room, "m.read", &read, None).await;
        let mut unread = Vec::new();
        for n in 101..=103 {
            unread.push(text(&alice, &room, &format!("r{round}-{n}"), &n.to_string()).await);
        }
        let txn = format!("r{round}-104");
        let (_, _) = tokio::join!(
            receipt(&bob, &room, "m.read", &unread[1], None),
            text(&alice, &room, &txn, "104"),
        );
        assert_eq!(counts(&bob, &room).await, (2, 0, 2), "round {round}");
    }
}

#[tokio::test]
async fn redacted_messages_stop_counting() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    let first = text(&alice, &room, "1", "one").await;
    text(&alice, &room, "2", "two").await;
    assert_eq!(counts(&bob, &room).await, (2, 0, 2));
    let path = format!(
        "/_matrix/client/v3/rooms/{}/redact/{}/x1",
        enc(&room),
        enc(&first)
    );
    alice.put(&path, json!({})).await.ok();
    assert_eq!(counts(&bob, &room).await, (1, 0, 1));
}

#[tokio::test]
async fn leaving_clears_counts_and_messages_while_away_never_count() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    text(&alice, &room, "1", "before leaving").await;
    assert_eq!(counts(&bob, &room).await, (1, 0, 1));
    bob.room_action(&room, "leave", json!({})).await.ok();
    text(&alice, &room, "2", "while away").await;
    bob.join(&room).await.ok();
    assert_eq!(counts(&bob, &room).await, (0, 0, 0));
    text(&alice, &room, "3", "after rejoining").await;
    assert_eq!(counts(&bob, &room).await, (1, 0, 1));
}

#[tokio::test]
async fn mentions_highlight_and_notices_and_edits_are_not_unread() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    bob.put(
        &format!(
            "/_matrix/client/v3/profile/{}/displayname",
            enc(&user_id("bob"))
        ),
        json!({ "displayname": "Bobby" }),
    )
    .await
    .ok();
    // The spec's default rules dropped the legacy display-name rule (clients send
    // m.mentions); a user rule with contains_display_name still works.
    text(&alice, &room, "0", "hi Bobby, look").await;
    assert_eq!(
        counts(&bob, &room).await,
        (1, 0, 1),
        "no legacy display-name rule"
    );
    let rule = json!({
        "conditions": [{ "kind": "contains_display_name" }],
        "actions": ["notify", { "set_tweak": "highlight" }],
    });
    bob.put("/_matrix/client/v3/pushrules/global/override/name", rule)
        .await
        .ok();
    text(&alice, &room, "1", "hi Bobby, look").await;
    text(&alice, &room, "1b", "Bobbyish is not a word match").await;
    assert_eq!(counts(&bob, &room).await, (3, 1, 3), "display name mention");
    receipt(
        &bob,
        &room,
        "m.read",
        &text(&alice, &room, "r", "x").await,
        None,
    )
    .await;
    let intentional = json!({
        "msgtype": "m.text",
        "body": "ping",
        "m.mentions": { "user_ids": [user_id("bob")] },
    });
    send(&alice, &room, "2", intentional).await;
    assert_eq!(counts(&bob, &room).await, (1, 1, 1), "intentional mention");
    send(
        &alice,
        &room,
        "3",
        json!({ "msgtype": "m.notice", "body": "bot says" }),
    )
    .await;
    assert_eq!(
        counts(&bob, &room).await,
        (1, 1, 1),
        "a notice neither notifies nor counts as unread"
    );
    let edit = json!({
        "msgtype": "m.text",
        "body": "* ping!",
        "m.new_content": { "msgtype": "m.text", "body": "ping!" },
        "m.relates_to": { "rel_type": "m.replace", "event_id": "$whatever" },
    });
    send(&alice, &room, "4", edit).await;
    assert_eq!(
        counts(&bob, &room).await,
        (1, 1, 1),
        "an edit is not a new message"
    );
}

/// A membership change notifies nobody under the default rules, so only members with rules
/// of their own are evaluated for it: a rule that notifies on member events still does.
#[tokio::test]
async fn a_join_notifies_only_members_whose_own_rules_say_so() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    let dave = server.register("dave").await;
    dave.join(&room).await.ok();
    let rule = json!({
        "conditions": [{ "kind": "event_match", "key": "type", "pattern": "m.room.member" }],
        "actions": ["notify"],
    });
    bob.put("/_matrix/client/v3/pushrules/global/override/joins", rule)
        .await
        .ok();
    let carol = server.register("carol").await;
    carol.join(&room).await.ok();
    assert_eq!(counts(&bob, &room).await, (1, 0, 0), "bob's rule notifies");
    assert_eq!(
        counts(&dave, &room).await,
        (0, 0, 0),
        "default rules do not"
    );
    assert_eq!(counts(&alice, &room).await, (0, 0, 0));
}

/// The server-default rules are evaluated once for all the members a message does not
/// mention and one by one for those it does: with three of four members mentioned, sharing
/// any one member's outcome with the others would get somebody's highlight wrong.
#[tokio::test]
async fn a_mention_highlights_exactly_the_members_it_names() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    let mut others = Vec::new();
    for name in ["carol", "dave", "erin"] {
        let member = server.register(name).await;
        member.join(&room).await.ok();
        others.push(member);
    }
    let frank = server.register("frank").await;
    frank.join(&room).await.ok();
    let rule = json!({
        "conditions": [{ "kind": "event_match", "key": "content.body", "pattern": "*deploy*" }],
        "actions": ["notify", { "set_tweak": "highlight" }],
    });
    frank
        .put("/_matrix/client/v3/pushrules/global/override/deploys", rule)
        .await
        .ok();
    let mention = json!({
        "msgtype": "m.text",
        "body": "deploy time, bob carol dave",
        "m.mentions": { "user_ids": [user_id("bob"), user_id("carol"), user_id("dave")] },
    });
    send(&alice, &room, "m", mention).await;
    text(&alice, &room, "plain", "and now nobody").await;
    let [carol, dave, erin] = others.as_slice() else {
        unreachable!()
    };
    for (who, member) in [("bob", &bob), ("carol", carol), ("dave", dave)] {
        assert_eq!(counts(member, &room).await, (2, 1, 2), "{who} is mentioned");
    }
    assert_eq!(counts(erin, &room).await, (2, 0, 2), "erin is not");
    assert_eq!(
        counts(&frank, &room).await,
        (2, 1, 2),
        "frank's own rule highlights"
    );
    assert_eq!(counts(&alice, &room).await, (0, 0, 0), "the sender");
}

#[tokio::test]
async fn a_muted_room_keeps_unread_messages_but_stops_notifying() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    let path = format!("/_matrix/client/v3/pushrules/global/room/{}", enc(&room));
    bob.put(&path, json!({ "actions": [] })).await.ok();
    let rule = bob.get(&path).await.ok();
    assert_eq!(rule["rule_id"], room.as_str());
    text(&alice, &room, "1", "quiet please").await;
    assert_eq!(counts(&bob, &room).await, (0, 0, 1));
    bob.delete(&path, json!({})).await.ok();
    text(&alice, &room, "2", "loud again").await;
    assert_eq!(counts(&bob, &room).await, (1, 0, 2));
}

#[tokio::test]
async fn thread_replies_are_counted_per_thread_when_the_filter_asks() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    let root = text(&alice, &room, "root", "thread root").await;
    let reply = |n: u32| {
        json!({
            "msgtype": "m.text",
            "body": format!("reply {n}"),
            "m.relates_to": { "rel_type": "m.thread", "event_id": root },
        })
    };
    send(&alice, &room, "t1", reply(1)).await;
    let last_reply = send(&alice, &room, "t2", reply(2)).await;
    let filter = json!({ "room": { "timeline": { "unread_thread_notifications": true } } });
    let threaded = bob.sync(None, 0, Some(&filter.to_string())).await;
    let section = &threaded["rooms"]["join"][&room];
    assert_eq!(section["unread_notifications"]["notification_count"], 1);
    assert_eq!(
        section["unread_thread_notifications"][&root]["notification_count"],
        2
    );
    assert_eq!(
        counts(&bob, &room).await,
        (3, 0, 3),
        "unthreaded view sums all"
    );

    // A threaded receipt reads the thread only; a `main` receipt reads the main timeline only.
    receipt(&bob, &room, "m.read", &last_reply, Some(&root)).await;
    assert_eq!(counts(&bob, &room).await, (1, 0, 1));
    receipt(&bob, &room, "m.read", &root, Some("main")).await;
    assert_eq!(counts(&bob, &room).await, (0, 0, 0));
}

/// Asserts that `reader`'s threaded sync view of `room` equals a recount of the stored push
/// actions after each one's read position as defined per action: the latest receipt,
/// unthreaded or of the action's own thread (`main` for the main timeline). Returns the
/// room's unread count.
async fn assert_counts_equal_a_recount(
    server: &TestServer,
    reader: &Client,
    room: &str,
    threads: &[&str],
) -> i64 {
    let filter = json!({ "room": { "timeline": { "unread_thread_notifications": true } } });
    let sync = reader.sync(None, 0, Some(&filter.to_string())).await;
    let section = &sync["rooms"]["join"][room];
    let recount = |thread: &str, column: &str| {
        format!(
            "SELECT COUNT(*) AS n FROM event_push_actions a
             WHERE a.user_nid = (SELECT nid FROM users WHERE user_id = '{user}')
               AND a.room_nid = (SELECT nid FROM rooms WHERE room_id = '{room}')
               AND a.thread_id = '{thread}' AND a.{column}
               AND a.stream_ordering > COALESCE((
                   SELECT MAX(r.event_stream) FROM receipts r
                   WHERE r.room_id = '{room}' AND r.user_id = '{user}'
                     AND r.thread_id IN ('', CASE WHEN a.thread_id = '' THEN 'main'
                                                  ELSE a.thread_id END)), 0)",
            user = reader.user_id
        )
    };
    let main = &section["unread_notifications"];
    assert_eq!(
        main["notification_count"],
        server.count(&recount("", "notify")).await
    );
    assert_eq!(
        main["highlight_count"],
        server.count(&recount("", "highlight")).await
    );
    let mut unread = server.count(&recount("", "unread")).await;
    for thread in threads {
        let notifications = server.count(&recount(thread, "notify")).await;
        let highlights = server.count(&recount(thread, "highlight")).await;
        let expected = match notifications + highlights {
            0 => Value::Null,
            _ => json!({ "notification_count": notifications, "highlight_count": highlights }),
        };
        assert_eq!(
            section["unread_thread_notifications"][*thread], expected,
            "thread {thread}"
        );
        unread += server.count(&recount(thread, "unread")).await;
    }
    assert_eq!(section["org.matrix.msc2654.unread_count"], unread);
    unread
}

#[tokio::test]
async fn counts_equal_a_recount_through_receipts_of_every_kind_and_thread() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    let reply = |root: &str, n: u32| {
        json!({
            "msgtype": "m.text",
            "body": format!("reply {n}"),
            "m.relates_to": { "rel_type": "m.thread", "event_id": root },
        })
    };
    let first = text(&alice, &room, "m1", "one").await;
    let root1 = text(&alice, &room, "root1", "thread one").await;
    let reply1a = send(&alice, &room, "r1a", reply(&root1, 1)).await;
    let root2 = text(&alice, &room, "root2", "thread two").await;
    text(&alice, &room, "m2", "two").await;
    send(&alice, &room, "r1b", reply(&root1, 2)).await;
    send(&alice, &room, "r2a", reply(&root2, 3)).await;
    let mention = json!({
        "msgtype": "m.text",
        "body": "bob?",
        "m.mentions": { "user_ids": [bob.user_id] },
    });
    let mention = send(&alice, &room, "mention", mention).await;
    let reply2b = send(&alice, &room, "r2b", reply(&root2, 4)).await;
    let last = text(&alice, &room, "m3", "three").await;
    let threads = [root1.as_str(), root2.as_str()];
    assert_eq!(
        assert_counts_equal_a_recount(&server, &bob, &room, &threads).await,
        10
    );

    let receipts = [
        // Thread one read partway.
        ("m.read", &reply1a, Some(root1.as_str())),
        // The main timeline, privately, past replies of both threads still unread.
        ("m.read.private", &mention, Some("main")),
        // Unthreaded, behind both.
        ("m.read", &first, None),
        // Thread two to its end.
        ("m.read", &reply2b, Some(root2.as_str())),
        // Unthreaded and private, past thread one's last reply.
        ("m.read.private", &mention, None),
        ("m.read", &last, Some("main")),
        ("m.read", &last, None),
    ];
    let mut left = Vec::new();
    for (kind, event, thread) in receipts {
        receipt(&bob, &room, kind, event, thread).await;
        left.push(assert_counts_equal_a_recount(&server, &bob, &room, &threads).await);
    }
    // What each receipt left unread: six main-timeline messages, two replies in each thread.
    assert_eq!(left, [9, 4, 4, 2, 1, 0, 0]);
}

#[tokio::test]
async fn recomputed_counts_match_the_maintained_ones() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    bob.put(
        &format!(
            "/_matrix/client/v3/profile/{}/displayname",
            enc(&user_id("bob"))
        ),
        json!({ "displayname": "Bobby" }),
    )
    .await
    .ok();
    let first = text(&alice, &room, "1", "hello").await;
    let mention = json!({
        "msgtype": "m.text",
        "body": "Bobby?",
        "m.mentions": { "user_ids": [user_id("bob")] },
    });
    send(&alice, &room, "2", mention).await;
    let redacted = text(&alice, &room, "3", "oops").await;
    alice
        .put(
            &format!(
                "/_matrix/client/v3/rooms/{}/redact/{}/x",
                enc(&room),
                enc(&redacted)
            ),
            json!({}),
        )
        .await
        .ok();
    send(
        &alice,
        &room,
        "4",
        json!({ "msgtype": "m.notice", "body": "notice" }),
    )
    .await;
    receipt(&bob, &room, "m.read", &first, None).await;
    let before = counts(&bob, &room).await;
    assert_eq!(before, (1, 1, 1));

    let check = |fix: bool| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_myelin"));
        command
            .args(["check-unread", &user_id("bob")])
            .env("DATABASE_URL", server.database_url())
            .env("MYELIN_SERVER_NAME", server_name())
            .env("RUST_LOG", "warn");
        if fix {
            command.arg("--fix");
        }
        command.output().expect("run myelin check-unread")
    };
    let clean = check(false);
    assert!(
        clean.status.success(),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );

    let stored = server
        .count("SELECT COUNT(*) AS n FROM event_push_actions")
        .await;
    assert!(stored > 0);
    let mut db = server.db().await;
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(format!(
            "DELETE FROM event_push_actions \
             WHERE user_nid = (SELECT nid FROM users WHERE user_id = '{}')",
            user_id("bob")
        )),
        &mut db,
    )
    .await
    .unwrap();
    assert_eq!(counts(&bob, &room).await, (0, 0, 0));
    let broken = check(false);
    assert!(
        !broken.status.success(),
        "the check must notice missing rows"
    );
    assert!(String::from_utf8_lossy(&broken.stdout).contains("missing"));
    let fixed = check(true);
    assert!(fixed.status.success());
    assert_eq!(counts(&bob, &room).await, before);
    assert_eq!(
        server
            .count("SELECT COUNT(*) AS n FROM event_push_actions")
            .await,
        stored
    );
    assert!(check(false).status.success());
}

#[tokio::test]
async fn notifications_list_newest_first_with_read_flags_and_pages() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    let first = text(&alice, &room, "1", "one").await;
    let mention = json!({
        "msgtype": "m.text",
        "body": "two",
        "m.mentions": { "user_ids": [user_id("bob")] },
    });
    let second = send(&alice, &room, "2", mention).await;
    let third = text(&alice, &room, "3", "three").await;
    text(&bob, &room, "own", "never a notification for its sender").await;
    receipt(&bob, &room, "m.read.private", &first, None).await;

    let all = bob.get("/_matrix/client/v3/notifications").await.ok();
    let listed: Vec<&str> = all["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["event"]["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [third.as_str(), second.as_str(), first.as_str()]);
    let reads: Vec<bool> = all["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["read"].as_bool().unwrap())
        .collect();
    assert_eq!(reads, [false, false, true]);
    assert_eq!(all["notifications"][0]["room_id"], room.as_str());
    assert!(all["notifications"][0]["actions"]
        .as_array()
        .unwrap()
        .contains(&json!("notify")));
    assert_eq!(all["notifications"][0]["event"]["content"]["body"], "three");

    let highlights = bob
        .get("/_matrix/client/v3/notifications?only=highlight")
        .await
        .ok();
    assert_eq!(highlights["notifications"].as_array().unwrap().len(), 1);
    assert_eq!(
        highlights["notifications"][0]["event"]["event_id"],
        second.as_str()
    );

    let page = bob
        .get("/_matrix/client/v3/notifications?limit=2")
        .await
        .ok();
    assert_eq!(page["notifications"].as_array().unwrap().len(), 2);
    let token = page["next_token"].as_str().expect("next_token").to_owned();
    let rest = bob
        .get(&format!(
            "/_matrix/client/v3/notifications?limit=2&from={}",
            enc(&token)
        ))
        .await
        .ok();
    assert_eq!(rest["notifications"].as_array().unwrap().len(), 1);
    assert_eq!(
        rest["notifications"][0]["event"]["event_id"],
        first.as_str()
    );

    // Alice's history has only Bob's message; Bob's private receipt is nowhere in it.
    let theirs = alice.get("/_matrix/client/v3/notifications").await.ok();
    assert_eq!(theirs["notifications"].as_array().unwrap().len(), 1);
    assert!(!theirs.to_string().contains("m.read.private"));
    bob.get("/_matrix/client/v3/notifications?from=nonsense")
        .await
        .assert_error(400, "M_INVALID_PARAM");
}

#[tokio::test]
async fn push_rules_are_ordered_edited_and_synced() {
    let server = TestServer::start().await;
    let bob = server.register("bob").await;
    let since = bob.sync(None, 0, None).await;
    assert_eq!(
        since["account_data"]["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "m.push_rules")
            .count(),
        1,
        "the first sync carries the default rules"
    );
    let since = since["next_batch"].as_str().unwrap().to_owned();
    let rule = |word: &str| json!({ "pattern": word, "actions": ["notify"] });
    bob.put(
        "/_matrix/client/v3/pushrules/global/content/first",
        rule("cake"),
    )
    .await
    .ok();
    bob.put(
        "/_matrix/client/v3/pushrules/global/content/second?before=first",
        rule("pie"),
    )
    .await
    .ok();
    bob.put(
        "/_matrix/client/v3/pushrules/global/content/third?after=nonexistent",
        rule("tea"),
    )
    .await
    .assert_error(404, "M_NOT_FOUND");
    bob.put(
        "/_matrix/client/v3/pushrules/global/override/.m.rule.custom",
        json!({ "conditions": [], "actions": [] }),
    )
    .await
    .assert_error(400, "M_INVALID_PARAM");
    bob.put(
        "/_matrix/client/v3/pushrules/global/override/no_conditions",
        json!({ "actions": [] }),
    )
    .await
    .assert_error(400, "M_BAD_JSON");
    let content = bob.get("/_matrix/client/v3/pushrules/global/").await.ok()["content"].clone();
    let ids: Vec<&str> = content
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rule_id"].as_str().unwrap())
        .filter(|id| !id.starts_with('.'))
        .collect();
    assert_eq!(ids, ["second", "first"]);

    // Server-default rules can be disabled and given other actions, not deleted.
    let master = "/_matrix/client/v3/pushrules/global/override/.m.rule.master";
    bob.put(&format!("{master}/enabled"), json!({ "enabled": true }))
        .await
        .ok();
    assert_eq!(
        bob.get(&format!("{master}/enabled")).await.ok()["enabled"],
        true
    );
    let suppress = "/_matrix/client/v3/pushrules/global/override/.m.rule.suppress_notices";
    bob.put(
        &format!("{suppress}/actions"),
        json!({ "actions": ["notify"] }),
    )
    .await
    .ok();
    assert_eq!(
        bob.get(&format!("{suppress}/actions")).await.ok()["actions"],
        json!(["notify"])
    );
    bob.delete(master, json!({}))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    bob.get(&format!(
        "/_matrix/client/v3/pushrules/global/room/{}",
        enc(&room_id("nope"))
    ))
    .await
    .assert_error(404, "M_NOT_FOUND");

    let next = bob.sync(Some(&since), 0, None).await;
    let synced = next["account_data"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "m.push_rules")
        .expect("changed rules are synced")
        .clone();
    assert!(synced["content"]["global"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["rule_id"] == "first"));
}

/// `(event ID, actions, ts)` of each of a user's notifications, newest first.
async fn notification_actions(client: &Client) -> Vec<(String, Value, i64)> {
    let listed = client.get("/_matrix/client/v3/notifications").await.ok();
    listed["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let event_id = n["event"]["event_id"].as_str().unwrap().to_owned();
            (event_id, n["actions"].clone(), n["ts"].as_i64().unwrap())
        })
        .collect()
}

#[tokio::test]
async fn push_actions_are_stored_by_number_with_implied_actions_and_revert_intact() {
    use diesel_async::SimpleAsyncConnection;
    let server = TestServer::start().await;
    let (alice, bob, direct) = two_person_room(&server).await;
    let carol = server.register("carol").await;
    let group = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&group).await.ok();
    carol.join(&group).await.ok();
    let bell = json!(["notify", { "set_tweak": "sound", "value": "bell" }]);
    bob.put(
        "/_matrix/client/v3/pushrules/global/content/bell",
        json!({ "pattern": "bell", "actions": bell }),
    )
    .await
    .ok();
    let one_to_one = text(&alice, &direct, "d", "hi").await;
    let message = text(&alice, &group, "m", "hello").await;
    let mention = json!({
        "msgtype": "m.text",
        "body": "hello bob",
        "m.mentions": { "user_ids": [user_id("bob")] },
    });
    let mention = send(&alice, &group, "h", mention).await;
    let custom = text(&alice, &group, "b", "ring the bell").await;

    let sound = json!({ "set_tweak": "sound", "value": "default" });
    let expected = [
        (custom, bell),
        (
            mention,
            json!(["notify", sound, { "set_tweak": "highlight" }]),
        ),
        (message, json!(["notify"])),
        (one_to_one, json!(["notify", sound])),
    ];
    let listed = notification_actions(&bob).await;
    let actions: Vec<(String, Value)> = listed
        .iter()
        .map(|(event_id, actions, _)| (event_id.clone(), actions.clone()))
        .collect();
    assert_eq!(actions, expected);
    // Only the custom rule's actions are stored: the others are what their flags imply.
    let stored = |column: &str| {
        format!(
            "SELECT COUNT(*) AS n FROM event_push_actions \
             WHERE user_nid = (SELECT nid FROM users WHERE user_id = '{}') AND actions IS {column}",
            bob.user_id
        )
    };
    assert_eq!(server.count(&stored("NULL")).await, 3);
    assert_eq!(server.count(&stored("NOT NULL")).await, 1);

    // Reverting migration 000040 gives back the text rows with each event's ID, timestamp and
    // actions; applying it again serves the same notifications.
    let mut db = server.db().await;
    db.batch_execute(include_str!(
        "../../migrations/2026-12-05-000040_numeric_push_actions/down.sql"
    ))
    .await
    .expect("down.sql over stored push actions");
    for (event_id, actions, ts) in &listed {
        let row = format!(
            "SELECT COUNT(*) AS n FROM event_push_actions \
             WHERE user_id = '{}' AND event_id = '{event_id}' AND actions = '{actions}' \
               AND ts = {ts} AND notify",
            bob.user_id
        );
        assert_eq!(server.count(&row).await, 1, "{event_id} after down.sql");
    }
    db.batch_execute(include_str!(
        "../../migrations/2026-12-05-000040_numeric_push_actions/up.sql"
    ))
    .await
    .expect("up.sql");
    assert_eq!(notification_actions(&bob).await, listed);
    assert_eq!(server.count(&stored("NOT NULL")).await, 1);
}

#[tokio::test]
async fn a_joined_member_without_an_account_gets_no_push_action_and_sends_go_through() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    // A member row with no account behind it: push actions are keyed by the account's number,
    // so there is nothing to store for it, and the send must not fail for everyone else.
    let copied = server
        .count(&format!(
            "WITH c AS (INSERT INTO room_memberships \
                 (room_id, user_id, membership, event_id, stream_ordering) \
             SELECT room_id, '{}', membership, event_id, stream_ordering FROM room_memberships \
             WHERE room_id = '{room}' AND user_id = '{}' RETURNING 1) \
             SELECT count(*) AS n FROM c",
            user_id("ghost"),
            bob.user_id
        ))
        .await;
    assert_eq!(copied, 1);
    text(&alice, &room, "g", "hello").await;
    assert_eq!(counts(&bob, &room).await, (1, 0, 1));
}
