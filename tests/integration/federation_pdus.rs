//! PDUs from other servers: the checks that need no room state (format, signatures, content
//! hash), on the way in through `/send`.

use serde_json::{json, Value};

use crate::support::{
    federation::{federated_options, free_port, FakeServer},
    TestServer,
};

/// `/send` with these PDUs from `fake`; answers the `pdus` result map.
pub(crate) async fn send_pdus(
    fake: &FakeServer,
    server: &TestServer,
    txn: &str,
    pdus: Vec<Value>,
) -> Value {
    let body = json!({
        "origin": fake.name(),
        "origin_server_ts": 1_700_000_000_000u64,
        "pdus": pdus,
        "edus": [],
    });
    let (status, answer) = fake
        .request(
            server,
            "PUT",
            &format!("/_matrix/federation/v1/send/{txn}"),
            Some(body),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    answer["pdus"].clone()
}

#[tokio::test]
async fn pdus_with_bad_signatures_or_format_are_dropped_and_a_bad_hash_is_only_redacted() {
    let server = TestServer::start_with(federated_options(free_port())).await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    for version in ["11", "12"] {
        let room = alice
            .create_room(json!({ "preset": "public_chat", "room_version": version }))
            .await;
        let state = alice
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/state",
                crate::support::client::enc(&room)
            ))
            .await
            .ok();
        let id_of = |kind: &str| {
            state
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["type"] == kind)
                .unwrap()["event_id"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        let mut auth_events = vec![id_of("m.room.power_levels"), id_of("m.room.join_rules")];
        if version == "11" {
            auth_events.push(id_of("m.room.create"));
        }
        let message = |body: &str| {
            json!({
                "room_id": room,
                "sender": fake.user_id("eve"),
                "type": "m.room.message",
                "content": { "msgtype": "m.text", "body": body },
                "origin_server_ts": 1_700_000_000_000u64,
                "depth": 10,
                "prev_events": [id_of("m.room.join_rules")],
                "auth_events": auth_events,
            })
        };
        // Past checks 1 to 3, an event goes on to the room's checks: Eve is not in the room,
        // and a message selects no join rules, so the auth rules reject it.
        let rejected = |answer: &Value, event_id: &str| {
            answer[event_id]["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("Rejected"))
        };

        // Well signed: past checks 1 to 3.
        let (good_id, good) = fake.sign_pdu(message("hello"), version);
        let answer = send_pdus(&fake, &server, &format!("good{version}"), vec![good]).await;
        assert!(rejected(&answer, &good_id), "v{version}: {answer}");

        // Content changed after signing: the hash is wrong, the signed skeleton is not, so the
        // event is kept redacted and keeps its ID.
        let (tampered_id, mut tampered) = fake.sign_pdu(message("original"), version);
        tampered["content"]["body"] = json!("changed in transit");
        let answer = send_pdus(&fake, &server, &format!("hash{version}"), vec![tampered]).await;
        assert!(rejected(&answer, &tampered_id), "v{version}: {answer}");

        // A signed field changed after signing: the signature no longer matches.
        let (_, mut forged) = fake.sign_pdu(message("forged"), version);
        forged["depth"] = json!(11);
        let answer = send_pdus(&fake, &server, &format!("forged{version}"), vec![forged]).await;
        let errors: Vec<&str> = answer
            .as_object()
            .unwrap()
            .values()
            .map(|v| v["error"].as_str().unwrap())
            .collect();
        assert_eq!(errors.len(), 1, "{answer}");
        assert!(errors[0].starts_with("Dropped: bad signatures"), "{answer}");

        // Signed by another server than the sender's: no signature from the sender's server.
        let other = FakeServer::start().await;
        let (_, foreign) = other.sign_pdu(message("not mine"), version);
        let answer = send_pdus(&fake, &server, &format!("foreign{version}"), vec![foreign]).await;
        let error = answer.as_object().unwrap().values().next().unwrap()["error"].clone();
        assert!(
            error
                .as_str()
                .unwrap()
                .starts_with("Dropped: bad signatures"),
            "{answer}"
        );

        // More than 20 prev_events: not a valid event of the room version.
        let mut too_many = message("wide");
        too_many["prev_events"] = json!((0..21)
            .map(|n| format!("$fake{n}aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"))
            .collect::<Vec<_>>());
        let (_, too_many) = fake.sign_pdu(too_many, version);
        let answer = send_pdus(&fake, &server, &format!("wide{version}"), vec![too_many]).await;
        let error = answer.as_object().unwrap().values().next().unwrap()["error"].clone();
        assert!(
            error
                .as_str()
                .unwrap()
                .starts_with("Dropped: invalid event format"),
            "{answer}"
        );
    }
    // Of the other server's events, only the two rejected ones per room were stored (as
    // rejected), the redacted copy among them: the dropped ones left no trace.
    let stored = server
        .count(&format!(
            "SELECT count(*) AS n FROM events WHERE sender = '{}'",
            fake.user_id("eve")
        ))
        .await;
    assert_eq!(stored, 4);
    let redacted_body = server
        .count(&format!(
            "SELECT count(*) AS n FROM events WHERE sender = '{}' AND rejected_reason IS NOT NULL \
             AND pdu->'content' ? 'body'",
            fake.user_id("eve")
        ))
        .await;
    assert_eq!(
        redacted_body, 2,
        "the tampered events are stored without their content"
    );
}

/// A transaction's PDUs of one room are taken together, in one database transaction (a burst
/// costs one commit, not one per event), in order; one whose prev events cannot be had, or
/// which the auth rules reject, holds back none of the others; another room's PDUs in the same
/// transaction are taken too.
#[tokio::test]
async fn a_transactions_pdus_are_taken_in_order_in_one_commit_per_run() {
    use crate::federation_rooms::{auth_for, join_through_handshake, now_ms};
    use crate::support::{client::enc, federation::state_ids};

    let server = TestServer::start_with(federated_options(free_port())).await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let eve = fake.user_id("eve");
    let room = alice
        .create_room(json!({ "preset": "public_chat", "room_version": "11" }))
        .await;
    let other_room = alice
        .create_room(json!({ "preset": "public_chat", "room_version": "12" }))
        .await;
    let (join_id, join_depth) = join_through_handshake(&fake, &server, &room, &eve, "11").await;
    let (other_join, other_depth) =
        join_through_handshake(&fake, &server, &other_room, &eve, "12").await;
    let state = state_ids(&alice, &room).await;
    let auth = auth_for(&state, "11", &eve);
    let other_auth = auth_for(&state_ids(&alice, &other_room).await, "12", &eve);

    let message = |prev: &str, depth: i64, body: &str| {
        fake.sign_pdu(
            json!({
                "room_id": room, "sender": eve, "type": "m.room.message",
                "content": { "msgtype": "m.text", "body": body },
                "origin_server_ts": now_ms(), "depth": depth,
                "prev_events": [prev], "auth_events": auth,
            }),
            "11",
        )
    };
    let mut pdus = Vec::new();
    let mut first_run = Vec::new();
    let mut second_run = Vec::new();
    let mut prev = join_id.clone();
    for n in 1..=5 {
        let (id, pdu) = message(&prev, join_depth + 2 * n, &format!("m{n}"));
        pdus.push(pdu);
        first_run.push(id.clone());
        prev = id;
    }
    // Built on an event nobody can give us: after the first run, before the second (depths
    // leave room for it, as they order a room's PDUs).
    let (gap_id, gap) = message(
        "$NotAnEventAnyoneHasEverSeen0000000000000000",
        join_depth + 11,
        "from nowhere",
    );
    pdus.push(gap);
    for n in 6..=8 {
        let (id, pdu) = message(&prev, join_depth + 2 * n, &format!("m{n}"));
        pdus.push(pdu);
        second_run.push(id.clone());
        prev = id;
    }
    // Eve may not make herself an admin: rejected, and the next message still taken.
    let levels = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.power_levels/",
            enc(&room)
        ))
        .await
        .ok();
    let mut raised = levels.clone();
    raised["users"][&eve] = json!(100);
    let (rejected_id, rejected) = fake.sign_pdu(
        json!({
            "room_id": room, "sender": eve, "type": "m.room.power_levels", "state_key": "",
            "content": raised, "origin_server_ts": now_ms(), "depth": join_depth + 17,
            "prev_events": [prev], "auth_events": auth,
        }),
        "11",
    );
    pdus.push(rejected);
    let (last_id, last) = message(&prev, join_depth + 18, "m9");
    pdus.push(last);
    second_run.push(last_id);
    let (other_id, other) = fake.sign_pdu(
        json!({
            "room_id": other_room, "sender": eve, "type": "m.room.message",
            "content": { "msgtype": "m.text", "body": "elsewhere" },
            "origin_server_ts": now_ms(), "depth": other_depth + 1,
            "prev_events": [other_join], "auth_events": other_auth,
        }),
        "12",
    );
    pdus.push(other);
    // The order on the wire does not matter: each room's PDUs are taken in depth order.
    pdus.reverse();

    let answers = send_pdus(&fake, &server, "burst", pdus).await;
    for id in first_run.iter().chain(&second_run).chain([&other_id]) {
        assert_eq!(answers[id], json!({}), "{id}: {answers}");
    }
    let gap_answer = answers[&gap_id]["error"].as_str().unwrap_or_default();
    assert!(gap_answer.contains("prev_events"), "{answers}");
    let rejected_answer = answers[&rejected_id]["error"].as_str().unwrap_or_default();
    assert!(rejected_answer.starts_with("Rejected"), "{answers}");

    // Alice's history holds m1 to m9 in order, and neither the gap's event nor the rejected one.
    let page = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=f&limit=100",
            enc(&room)
        ))
        .await
        .ok();
    let bodies: Vec<&str> = page["chunk"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["sender"] == eve.as_str() && e["type"] == "m.room.message")
        .map(|e| e["content"]["body"].as_str().unwrap())
        .collect();
    assert_eq!(
        bodies,
        ["m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9"],
        "{page}"
    );

    // Each run was one database transaction: its rows share the inserting transaction's ID.
    let transactions = |ids: &[String]| {
        let list = ids
            .iter()
            .map(|id| format!("'{id}'"))
            .collect::<Vec<_>>()
            .join(",");
        format!("SELECT count(DISTINCT xmin::text) AS n FROM events WHERE event_id IN ({list})")
    };
    assert_eq!(server.count(&transactions(&first_run)).await, 1);
    assert_eq!(server.count(&transactions(&second_run)).await, 1);
}
