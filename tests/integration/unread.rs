//! Unread counts: push-rule evaluation at write time, counted after the read position.

use serde_json::{json, Value};

use crate::support::{client::enc, server_name, user_id, Client, TestServer};

pub(crate) async fn send(client: &Client, room: &str, txn: &str, content: Value) -> String {
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

pub(crate) async fn text(client: &Client, room: &str, txn: &str, body: &str) -> String {
    send(
        client,
        room,
        txn,
        json!({ "msgtype": "m.text", "body": body }),
    )
    .await
}

pub(crate) async fn receipt(
    client: &Client,
    room: &str,
    kind: &str,
    event: &str,
    thread: Option<&str>,
) {
    let path = format!(
        "/_matrix/client/v3/rooms/{}/receipt/{kind}/{}",
        enc(room),
        enc(event)
    );
    let body = thread.map_or(json!({}), |t| json!({ "thread_id": t }));
    client.post(&path, body).await.ok();
}

/// `(notification_count, highlight_count, unread_count)` of a room in a fresh initial sync.
pub(crate) async fn counts(client: &Client, room: &str) -> (u64, u64, u64) {
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
pub(crate) async fn two_person_room(server: &TestServer) -> (Client, Client, String) {
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

/// The default rules are evaluated once for the members an event does not name, and their
/// rows stored as that one outcome: each member must still count every message in its
/// thread, and read up to their own receipt.
#[tokio::test]
async fn members_on_the_default_rules_each_count_the_one_evaluation() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    let mut members = vec![bob];
    for name in ["carol", "dave"] {
        let member = server.register(name).await;
        member.join(&room).await.ok();
        members.push(member);
    }
    let root = text(&alice, &room, "root", "a thread").await;
    let reply = json!({
        "msgtype": "m.text",
        "body": "in it",
        "m.relates_to": { "rel_type": "m.thread", "event_id": root },
    });
    send(&alice, &room, "reply", reply).await;
    let notice = json!({ "msgtype": "m.notice", "body": "a bot says" });
    send(&alice, &room, "notice", notice).await;
    let last = text(&alice, &room, "last", "plain").await;
    let by_thread = json!({ "room": { "timeline": { "unread_thread_notifications": true } } });
    for member in &members {
        let who = &member.user_id;
        assert_eq!(counts(member, &room).await, (3, 0, 3), "{who}");
        let sync = member.sync(None, 0, Some(&by_thread.to_string())).await;
        let section = &sync["rooms"]["join"][room.as_str()];
        assert_eq!(
            section["unread_notifications"]["notification_count"], 2,
            "{who}"
        );
        assert_eq!(
            section["unread_thread_notifications"][root.as_str()]["notification_count"],
            1,
            "{who}"
        );
    }
    let [bob, carol, dave] = members.as_slice() else {
        unreachable!()
    };
    receipt(carol, &room, "m.read", &last, None).await;
    assert_eq!(counts(carol, &room).await, (0, 0, 0));
    assert_eq!(counts(bob, &room).await, (3, 0, 3));
    assert_eq!(counts(dave, &room).await, (3, 0, 3));
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

/// More messages than a count reads before it is kept as the member's summary
/// (`storage::push::SUMMARY_AFTER`).
const PAST_SUMMARY: usize = myelin::storage::push::SUMMARY_AFTER as usize + 20;

/// Runs statements on the server's database (to stand in for a sync that raced a change).
async fn sql(server: &TestServer, statements: &str) {
    diesel_async::SimpleAsyncConnection::batch_execute(&mut server.db().await, statements)
        .await
        .unwrap();
}

/// The condition naming `client`'s summary of `room`.
fn summary_of(client: &Client, room: &str) -> String {
    format!(
        "user_nid = (SELECT nid FROM users WHERE user_id = '{}') \
         AND room_nid = (SELECT nid FROM rooms WHERE room_id = '{room}')",
        client.user_id
    )
}

/// Alice's messages `from..to`, their event IDs.
async fn messages(alice: &Client, room: &str, range: std::ops::Range<usize>) -> Vec<String> {
    let mut ids = Vec::new();
    for i in range {
        ids.push(text(alice, room, &format!("t{i}"), &format!("message {i}")).await);
    }
    ids
}

/// A count that read many push actions is kept, and the next counts start from it: what
/// arrived since is added and what was read since taken off. A redaction or a history purge
/// takes push actions away, so the counts kept before either no longer hold. (Each kept count
/// is made wrong on purpose first, to tell a count started from it from a recount.)
#[tokio::test]
async fn a_kept_count_is_the_next_ones_start_until_push_actions_are_taken_away() {
    let server = TestServer::start().await;
    let admin = server.create_admin("root", "rootpassword").await;
    let (alice, bob, room) = two_person_room(&server).await;
    let n = PAST_SUMMARY as u64;
    let mut ids = messages(&alice, &room, 0..PAST_SUMMARY).await;
    assert_eq!(counts(&bob, &room).await, (n, 0, n));
    let kept = |unread: u64| {
        format!(
            "SELECT COUNT(*) AS n FROM unread_count_summaries WHERE {} AND unread = {unread}",
            summary_of(&bob, &room)
        )
    };
    assert_eq!(server.count(&kept(n)).await, 1, "the count was not kept");
    let skew = format!(
        "UPDATE unread_count_summaries SET unread = unread + 1000 WHERE {}",
        summary_of(&bob, &room)
    );
    sql(&server, &skew).await;
    assert_eq!(counts(&bob, &room).await, (n, 0, n + 1000));
    ids.extend(messages(&alice, &room, PAST_SUMMARY..PAST_SUMMARY + 3).await);
    assert_eq!(counts(&bob, &room).await, (n + 3, 0, n + 1003));
    receipt(&bob, &room, "m.read", &ids[9], None).await;
    assert_eq!(counts(&bob, &room).await, (n - 7, 0, n + 993));

    let redact = format!(
        "/_matrix/client/v3/rooms/{}/redact/{}/x1",
        enc(&room),
        enc(&ids[20])
    );
    alice.put(&redact, json!({})).await.ok();
    assert_eq!(counts(&bob, &room).await, (n - 8, 0, n - 8));
    assert_counts_equal_a_recount(&server, &bob, &room, &[]).await;

    // Kept again (the recount read more than enough), then a purge of the oldest ten unread.
    assert_eq!(server.count(&kept(n - 8)).await, 1);
    sql(&server, &skew).await;
    let purge = admin
        .post(
            &format!(
                "/_synapse/admin/v1/purge_history/{}/{}",
                enc(&room),
                enc(&ids[20])
            ),
            json!({ "delete_local_events": true }),
        )
        .await
        .ok();
    assert_eq!(
        crate::admin_history::finished(&admin, &purge).await,
        json!({ "status": "complete" })
    );
    let left = assert_counts_equal_a_recount(&server, &bob, &room, &[]).await;
    assert_eq!(left as u64, n - 8 - 10);
}

/// A member's counts are kept while they are joined; leaving deletes them with the push
/// actions, and a count a sync kept from before the leave (racing it) is not where the counts
/// start after the member joins again.
#[tokio::test]
async fn a_count_kept_before_leaving_is_not_the_start_after_joining_again() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    let n = PAST_SUMMARY as u64;
    messages(&alice, &room, 0..PAST_SUMMARY).await;
    assert_eq!(counts(&bob, &room).await, (n, 0, n));
    let summary = summary_of(&bob, &room);
    sql(
        &server,
        &format!("CREATE TABLE raced AS SELECT * FROM unread_count_summaries WHERE {summary}"),
    )
    .await;
    assert_eq!(server.count("SELECT COUNT(*) AS n FROM raced").await, 1);
    bob.room_action(&room, "leave", json!({})).await.ok();
    let left = format!("SELECT COUNT(*) AS n FROM unread_count_summaries WHERE {summary}");
    assert_eq!(server.count(&left).await, 0, "the count outlived the leave");
    sql(
        &server,
        "INSERT INTO unread_count_summaries SELECT * FROM raced",
    )
    .await;
    bob.join(&room).await.ok();
    messages(&alice, &room, PAST_SUMMARY..PAST_SUMMARY + 2).await;
    assert_eq!(counts(&bob, &room).await, (2, 0, 2));
}

/// Counts as of a position before the kept count's own are counted afresh (the kept count
/// holds actions past that position), and leave the kept count as it was.
#[tokio::test]
async fn counts_as_of_an_earlier_position_than_the_kept_count() {
    let server = TestServer::start().await;
    let (alice, bob, room) = two_person_room(&server).await;
    let n = PAST_SUMMARY as u64;
    let ids = messages(&alice, &room, 0..PAST_SUMMARY).await;
    assert_eq!(counts(&bob, &room).await, (n, 0, n));
    let position =
        |event: &str| format!("SELECT stream_ordering AS n FROM events WHERE event_id = '{event}'");
    let counted_to = format!(
        "SELECT counted_to AS n FROM unread_count_summaries WHERE {}",
        summary_of(&bob, &room)
    );
    let kept_to = server.count(&counted_to).await;
    assert_eq!(kept_to, server.count(&position(&ids[ids.len() - 1])).await);

    let earlier = server.count(&position(&ids[29])).await;
    let rows = myelin::storage::push::get_unread_counts(
        &server.db().await,
        &bob.user_id,
        std::slice::from_ref(&room),
        earlier,
    )
    .await
    .unwrap();
    let main: Vec<_> = rows
        .iter()
        .map(|c| (c.thread_id.as_str(), c.notifications, c.unread))
        .collect();
    assert_eq!(main, [("", 30, 30)]);
    assert_eq!(server.count(&counted_to).await, kept_to);
}
