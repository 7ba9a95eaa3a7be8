//! State groups stored as skip deltas on snapshots: every group reads back as the state it
//! was written for, chains stay short, and a member's old view still reads its own group.

use std::collections::BTreeMap;

use serde_json::json;

use crate::support::{client::enc, Client, TestServer};

const KIND: &str = "org.example.setting";

/// The room's `KIND` state as `GET /state` serves it to `client`: state key -> `n`.
async fn settings(client: &Client, room: &str) -> BTreeMap<String, i64> {
    let state = client
        .get(&format!("/_matrix/client/v3/rooms/{}/state", enc(room)))
        .await
        .ok();
    state
        .as_array()
        .expect("a state array")
        .iter()
        .filter(|event| event["type"] == KIND)
        .map(|event| {
            (
                event["state_key"].as_str().expect("state_key").to_owned(),
                event["content"]["n"].as_i64().expect("n"),
            )
        })
        .collect()
}

#[tokio::test]
async fn every_state_change_reads_back_through_short_chains() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let mut expected = BTreeMap::new();
    let mut seen_by_bob = None;
    // 150 keys that the state grows by, then 150 changes over 23 keys it churns.
    for i in 0..300_i64 {
        let key = if i < 150 {
            format!("grow{i}")
        } else {
            format!("churn{}", (i * 7) % 23)
        };
        let path = format!(
            "/_matrix/client/v3/rooms/{}/state/{KIND}/{}",
            enc(&room),
            enc(&key)
        );
        alice.put(&path, json!({ "n": i })).await.ok();
        expected.insert(key, i);
        assert_eq!(settings(&alice, &room).await, expected, "after change {i}");
        match i {
            100 => {
                bob.join(&room).await.ok();
            }
            200 => {
                bob.post(
                    &format!("/_matrix/client/v3/rooms/{}/leave", enc(&room)),
                    json!({}),
                )
                .await
                .ok();
                seen_by_bob = Some(expected.clone());
            }
            _ => {}
        }
    }
    assert_eq!(
        Some(settings(&bob, &room).await),
        seen_by_bob,
        "bob still reads the state as he left it"
    );
    let room_literal = room.replace('\'', "''");
    let longest = server
        .count(&format!(
            "SELECT max(chain_length)::int8 AS n FROM state_groups WHERE room_id = '{room_literal}'"
        ))
        .await;
    assert!(longest <= 10, "chains of {longest} groups");
    let entries = server
        .count(&format!(
            "SELECT count(*) AS n FROM state_group_entries e \
             JOIN state_groups g USING (state_group) WHERE g.room_id = '{room_literal}'"
        ))
        .await;
    assert!(entries < 3_000, "{entries} entries for about 310 changes");
}
