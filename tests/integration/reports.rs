//! Reports of events, rooms and users (`/rooms/{id}/report/{eventId}`, `/rooms/{id}/report`,
//! `/users/{id}/report`), and the admin API's event reports.

use serde_json::{json, Value};

use crate::support::{client::enc, server_name, Client, TestServer};

fn report_path(room: &str, event: &str) -> String {
    format!(
        "/_matrix/client/v3/rooms/{}/report/{}",
        enc(room),
        enc(event)
    )
}

async fn send(client: &Client, room: &str, txn: &str, text: &str) -> String {
    client.send_text(room, txn, text).await.ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn event_reports_are_stored_for_admins_and_listed_by_the_admin_api() {
    let server = TestServer::start().await;
    let admin = server.create_admin("admin", "adminpassword").await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "name": "Reported room" }))
        .await;
    bob.join(&room).await.ok();
    let first = send(&alice, &room, "t1", "rude").await;
    let second = send(&alice, &room, "t2", "ruder").await;

    bob.post(
        &report_path(&room, &first),
        json!({ "reason": "rude", "score": -100 }),
    )
    .await
    .ok();
    bob.post(&report_path(&room, &second), json!({})).await.ok();
    // The legacy r0 path too.
    bob.post(
        &format!(
            "/_matrix/client/r0/rooms/{}/report/{}",
            enc(&room),
            enc(&second)
        ),
        json!({ "reason": "again" }),
    )
    .await
    .ok();

    let list = admin.get("/_synapse/admin/v1/event_reports").await.ok();
    assert_eq!(list["total"], 3);
    let reports = list["event_reports"].as_array().unwrap();
    assert_eq!(reports.len(), 3);
    assert!(list.get("next_token").is_none(), "{list}");
    // Newest first.
    assert_eq!(reports[0]["reason"], "again");
    let oldest = &reports[2];
    assert_eq!(oldest["event_id"], first);
    assert_eq!(oldest["room_id"], room);
    assert_eq!(oldest["user_id"], bob.user_id);
    assert_eq!(oldest["sender"], alice.user_id);
    assert_eq!(oldest["reason"], "rude");
    assert_eq!(oldest["score"], -100);
    assert_eq!(oldest["name"], "Reported room");
    assert!(oldest["received_ts"].is_i64());

    let page = admin
        .get("/_synapse/admin/v1/event_reports?limit=2&dir=f")
        .await
        .ok();
    assert_eq!(page["event_reports"].as_array().unwrap().len(), 2);
    assert_eq!(page["event_reports"][0]["event_id"], first);
    assert_eq!(page["next_token"], 2);
    let rest = admin
        .get("/_synapse/admin/v1/event_reports?limit=2&dir=f&from=2")
        .await
        .ok();
    assert_eq!(rest["event_reports"].as_array().unwrap().len(), 1);
    assert!(rest.get("next_token").is_none());
    let by_user = admin
        .get(&format!(
            "/_synapse/admin/v1/event_reports?user_id={}",
            enc(&alice.user_id)
        ))
        .await
        .ok();
    assert_eq!(by_user["total"], 0);
    let by_sender = admin
        .get(&format!(
            "/_synapse/admin/v1/event_reports?event_sender_user_id={}",
            enc(&alice.user_id)
        ))
        .await
        .ok();
    assert_eq!(by_sender["total"], 3);
    let by_other_sender = admin
        .get(&format!(
            "/_synapse/admin/v1/event_reports?event_sender_user_id={}",
            enc(&bob.user_id)
        ))
        .await
        .ok();
    assert_eq!(by_other_sender["total"], 0);
    let by_room = admin
        .get(&format!(
            "/_synapse/admin/v1/event_reports?room_id={}",
            enc(&room)
        ))
        .await
        .ok();
    assert_eq!(by_room["total"], 3);

    let id = oldest["id"].as_i64().unwrap();
    let one = admin
        .get(&format!("/_synapse/admin/v1/event_reports/{id}"))
        .await
        .ok();
    assert_eq!(
        one["event_json"]["event_id"].as_str().map(str::to_owned),
        None
    );
    assert_eq!(one["event_json"]["content"]["body"], "rude");
    admin
        .delete(&format!("/_synapse/admin/v1/event_reports/{id}"), json!({}))
        .await
        .ok();
    admin
        .get(&format!("/_synapse/admin/v1/event_reports/{id}"))
        .await
        .assert_error(404, "M_NOT_FOUND");
    admin
        .delete(&format!("/_synapse/admin/v1/event_reports/{id}"), json!({}))
        .await
        .assert_error(404, "M_NOT_FOUND");
    admin
        .get("/_synapse/admin/v1/event_reports/x")
        .await
        .assert_error(400, "M_INVALID_PARAM");
    for query in ["from=-1", "limit=-1", "dir=sideways", "from=x"] {
        admin
            .get(&format!("/_synapse/admin/v1/event_reports?{query}"))
            .await
            .assert_error(400, "M_INVALID_PARAM");
    }

    // Admins only.
    bob.get("/_synapse/admin/v1/event_reports")
        .await
        .assert_error(403, "M_FORBIDDEN");
    bob.get(&format!("/_synapse/admin/v1/event_reports/{id}"))
        .await
        .assert_error(403, "M_FORBIDDEN");
    bob.delete("/_synapse/admin/v1/event_reports/1", json!({}))
        .await
        .assert_error(403, "M_FORBIDDEN");
}

#[tokio::test]
async fn event_reports_refuse_bad_input_and_events_the_reporter_may_not_see() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "private_chat", "invite": [bob.user_id] }))
        .await;
    bob.join(&room).await.ok();
    let event = send(&alice, &room, "t1", "hello").await;

    let bad: [(Value, u16, &str); 5] = [
        (json!({ "reason": 5 }), 400, "M_BAD_JSON"),
        (json!({ "score": "high" }), 400, "M_BAD_JSON"),
        (json!({ "score": 1.5 }), 400, "M_BAD_JSON"),
        (json!({ "score": 5 }), 400, "M_INVALID_PARAM"),
        (json!({ "reason": "x".repeat(1001) }), 400, "M_BAD_JSON"),
    ];
    for (body, status, errcode) in bad {
        bob.post(&report_path(&room, &event), body.clone())
            .await
            .assert_error(status, errcode);
    }
    bob.post(
        &report_path(&room, &event),
        json!({ "reason": "x".repeat(1000) }),
    )
    .await
    .ok();
    bob.post(&report_path("not-a-room", &event), json!({}))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    bob.post(&report_path(&room, "not-an-event"), json!({}))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    server
        .client()
        .post(&report_path(&room, &event), json!({}))
        .await
        .assert_error(401, "M_MISSING_TOKEN");

    // An unknown event, an event of another room, an event in a room the reporter is not
    // in, and a redacted event: all the same 404.
    let unknown = bob.post(&report_path(&room, "$nothing"), json!({})).await;
    unknown.assert_error(404, "M_NOT_FOUND");
    let other_room = alice.create_room(json!({ "preset": "private_chat" })).await;
    let hidden = send(&alice, &other_room, "t2", "SECRET").await;
    for (room_id, event_id) in [(&room, &hidden), (&other_room, &hidden)] {
        let response = bob.post(&report_path(room_id, event_id), json!({})).await;
        response.assert_error(404, "M_NOT_FOUND");
        assert_eq!(response.body, unknown.body);
    }
    let redacted = send(&alice, &room, "t3", "oops").await;
    alice
        .put(
            &format!(
                "/_matrix/client/v3/rooms/{}/redact/{}/r1",
                enc(&room),
                enc(&redacted)
            ),
            json!({}),
        )
        .await
        .ok();
    bob.post(&report_path(&room, &redacted), json!({}))
        .await
        .assert_error(404, "M_NOT_FOUND");
    // Once Bob has left, he may no longer report the room's events.
    bob.room_action(&room, "leave", json!({})).await.ok();
    bob.post(&report_path(&room, &event), json!({}))
        .await
        .assert_error(404, "M_NOT_FOUND");
    assert_eq!(
        server
            .count("SELECT count(*) AS n FROM event_reports")
            .await,
        1
    );
}

#[tokio::test]
async fn rooms_and_users_are_reported() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "private_chat" })).await;

    // Bob need not be in the room.
    bob.post(
        &format!("/_matrix/client/v3/rooms/{}/report", enc(&room)),
        json!({ "reason": "spam" }),
    )
    .await
    .ok();
    bob.post(
        &format!(
            "/_matrix/client/v3/rooms/{}/report",
            enc(&format!("!nowhere:{}", server_name()))
        ),
        json!({ "reason": "spam" }),
    )
    .await
    .assert_error(404, "M_NOT_FOUND");
    bob.post(
        &format!("/_matrix/client/v3/rooms/{}/report", enc(&room)),
        json!({ "reason": "x".repeat(1001) }),
    )
    .await
    .assert_error(400, "M_BAD_JSON");
    bob.post(
        &format!("/_matrix/client/v3/rooms/{}/report", enc(&room)),
        json!({ "reason": 7 }),
    )
    .await
    .assert_error(400, "M_BAD_JSON");

    let report_user = |user: &str| format!("/_matrix/client/v3/users/{}/report", enc(user));
    bob.post(&report_user(&alice.user_id), json!({ "reason": "abuse" }))
        .await
        .ok();
    // Unknown and remote users get the same 200, and nothing is stored for them.
    bob.post(
        &report_user(&format!("@ghost:{}", server_name())),
        json!({ "reason": "abuse" }),
    )
    .await
    .ok();
    bob.post(
        &report_user("@someone:elsewhere.example"),
        json!({ "reason": "abuse" }),
    )
    .await
    .ok();
    bob.post(&report_user("not-a-user"), json!({ "reason": "abuse" }))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    bob.post(&report_user(&alice.user_id), json!({}))
        .await
        .assert_error(400, "M_BAD_JSON");
    bob.post(
        &report_user(&alice.user_id),
        json!({ "reason": "x".repeat(1001) }),
    )
    .await
    .assert_error(400, "M_BAD_JSON");

    assert_eq!(
        server.count("SELECT count(*) AS n FROM room_reports").await,
        1
    );
    assert_eq!(
        server.count("SELECT count(*) AS n FROM user_reports").await,
        1
    );
}
