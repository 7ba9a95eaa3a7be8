//! Notifications and push rules: the notifications list, the push-rule API and what it syncs,
//! and the push actions stored for each event.

use serde_json::{json, Value};

use crate::{
    support::{client::enc, room_id, user_id, Client, TestServer},
    unread::{counts, receipt, send, text, two_person_room},
};

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
