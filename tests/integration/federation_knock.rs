//! Knocking across servers: a user of one Myelin knocks on a room of another through
//! `make_knock`/`send_knock`, is invited and joins, or withdraws the knock through
//! `make_leave`/`send_leave`; the resident refuses knocks the room does not take.

use serde_json::{json, Value};

use crate::support::{
    client::{enc, timeline},
    federation::{federated_options, free_port, pair, FakeServer},
    Client, TestServer,
};

/// A room of `alice` that takes knocks, of `version`, named `name`.
async fn knock_room(alice: &Client, version: &str, name: &str) -> String {
    alice
        .create_room(json!({
            "preset": "private_chat", "room_version": version, "name": name,
            "initial_state": [{
                "type": "m.room.join_rules", "state_key": "", "content": { "join_rule": "knock" },
            }],
        }))
        .await
}

/// `POST /knock/{room}?via={via}` as `user`: the status and the answer.
async fn knock(user: &Client, room: &str, via: &str) -> (u16, Value) {
    let answer = user
        .post(
            &format!("/_matrix/client/v3/knock/{}?via={}", enc(room), enc(via)),
            json!({ "reason": "let me in" }),
        )
        .await;
    (answer.status.as_u16(), answer.body)
}

/// `user`'s membership in `room` as `reader` sees it (`None` when there is none).
async fn membership(reader: &Client, room: &str, user: &str) -> Option<String> {
    let member = reader
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.member/{}",
            enc(room),
            enc(user)
        ))
        .await;
    (member.status == 200).then(|| member.ok()["membership"].as_str().unwrap().to_owned())
}

/// Bob of one Myelin knocks on Alice's room on another: the knock shows in Alice's /sync and
/// under Bob's `rooms.knock` with the room's name; Alice invites him (the invite comes over
/// federation) and he joins.
#[tokio::test]
async fn a_user_knocks_on_a_room_of_another_myelin_is_invited_and_joins() {
    let (a, b) = pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    for version in ["11", "12"] {
        let room = knock_room(&alice, version, &format!("Knock {version}")).await;
        let alice_since = alice.next_batch().await;
        let bob_since = bob.next_batch().await;
        let (status, knocked) = knock(&bob, &room, a.server_name()).await;
        assert_eq!(status, 200, "{knocked}");
        assert_eq!(knocked["room_id"], room.as_str());

        // The resident has the knock in the room, and Alice's /sync shows it.
        assert_eq!(
            membership(&alice, &room, &bob.user_id).await.as_deref(),
            Some("knock")
        );
        let synced = alice.sync(Some(&alice_since), 0, None).await;
        assert!(
            timeline(&synced, &room)
                .iter()
                .any(|e| e["type"] == "m.room.member"
                    && e["state_key"] == bob.user_id.as_str()
                    && e["content"]["membership"] == "knock"
                    && e["content"]["reason"] == "let me in"
                    && e["content"]["displayname"].is_string()),
            "{synced}"
        );

        // Bob's /sync has the room under `knock` with what the resident showed him.
        let synced = bob.sync(Some(&bob_since), 0, None).await;
        let events = synced["rooms"]["knock"][&room]["knock_state"]["events"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| panic!("{synced}"));
        assert!(
            events.iter().any(|e| e["type"] == "m.room.name"
                && e["content"]["name"] == format!("Knock {version}")),
            "{synced}"
        );
        assert!(
            events
                .iter()
                .any(|e| e["type"] == "m.room.join_rules" && e["content"]["join_rule"] == "knock"),
            "{synced}"
        );
        assert!(
            events.iter().any(|e| e["type"] == "m.room.member"
                && e["state_key"] == bob.user_id.as_str()
                && e["content"]["membership"] == "knock"),
            "{synced}"
        );
        assert!(synced["rooms"]["join"].get(&room).is_none(), "{synced}");
        let bob_since = synced["next_batch"].as_str().unwrap().to_owned();

        // Alice lets him in: the invite of a knocking user of another server.
        alice
            .post(
                &format!("/_matrix/client/v3/rooms/{}/invite", enc(&room)),
                json!({ "user_id": bob.user_id }),
            )
            .await
            .ok();
        let synced = bob.sync(Some(&bob_since), 5_000, None).await;
        assert!(synced["rooms"]["invite"][&room].is_object(), "{synced}");
        assert!(synced["rooms"]["knock"].get(&room).is_none(), "{synced}");
        bob.post(
            &format!("/_matrix/client/v3/rooms/{}/join", enc(&room)),
            json!({}),
        )
        .await
        .ok();
        assert_eq!(
            membership(&alice, &room, &bob.user_id).await.as_deref(),
            Some("join")
        );
        let synced = bob.sync(None, 0, None).await;
        assert!(synced["rooms"]["join"][&room].is_object(), "{synced}");
        assert!(synced["rooms"]["knock"].get(&room).is_none(), "{synced}");
    }
}

/// A knock on another Myelin's room withdrawn with /leave: the resident learns it through
/// make_leave/send_leave and Bob's /sync moves the room from `knock` to `leave`; Bob can knock
/// again, and a knock Alice refuses (a kick) leaves him out of the room there.
#[tokio::test]
async fn a_knock_on_another_myelin_is_withdrawn_or_refused() {
    let (a, b) = pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    let room = knock_room(&alice, "12", "Door").await;
    let (status, knocked) = knock(&bob, &room, a.server_name()).await;
    assert_eq!(status, 200, "{knocked}");
    let synced = bob.sync(None, 0, None).await;
    assert!(synced["rooms"]["knock"][&room].is_object(), "{synced}");
    let since = synced["next_batch"].as_str().unwrap().to_owned();

    bob.post(
        &format!("/_matrix/client/v3/rooms/{}/leave", enc(&room)),
        json!({ "reason": "never mind" }),
    )
    .await
    .ok();
    // Taken by the resident before the client's /leave answered.
    assert_eq!(
        membership(&alice, &room, &bob.user_id).await.as_deref(),
        Some("leave")
    );
    let synced = bob.sync(Some(&since), 0, None).await;
    assert!(synced["rooms"]["knock"].get(&room).is_none(), "{synced}");
    assert!(synced["rooms"]["leave"][&room].is_object(), "{synced}");
    let synced = bob.sync(None, 0, None).await;
    assert!(synced["rooms"]["knock"].get(&room).is_none(), "{synced}");

    // Knocking again works, and Alice refuses with a kick.
    let (status, knocked) = knock(&bob, &room, a.server_name()).await;
    assert_eq!(status, 200, "{knocked}");
    assert_eq!(
        membership(&alice, &room, &bob.user_id).await.as_deref(),
        Some("knock")
    );
    alice
        .post(
            &format!("/_matrix/client/v3/rooms/{}/kick", enc(&room)),
            json!({ "user_id": bob.user_id, "reason": "not today" }),
        )
        .await
        .ok();
    assert_eq!(
        membership(&alice, &room, &bob.user_id).await.as_deref(),
        Some("leave")
    );
}

/// A knock on a room that does not take knocks is refused (403 `M_FORBIDDEN`) and leaves
/// nothing behind on the knocker's server.
#[tokio::test]
async fn a_knock_on_a_room_of_another_myelin_that_takes_none_is_refused() {
    let (a, b) = pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    for preset in ["public_chat", "private_chat"] {
        let room = alice
            .create_room(json!({ "preset": preset, "room_version": "11" }))
            .await;
        let (status, answer) = knock(&bob, &room, a.server_name()).await;
        assert_eq!(
            (status, answer["errcode"].clone()),
            (403, json!("M_FORBIDDEN")),
            "{preset}: {answer}"
        );
        assert_eq!(membership(&alice, &room, &bob.user_id).await, None);
        let synced = bob.sync(None, 0, None).await;
        assert!(synced["rooms"]["knock"].get(&room).is_none(), "{synced}");
    }
}

/// make_knock and send_knock as the resident, asked by a test server: the room version must be
/// one the knocking server names, the join rule must take knocks, the user must be of the
/// asking server, the room ours and the ACL open; send_knock answers the room state a knocker
/// sees as full PDUs with the create event.
#[tokio::test]
async fn make_knock_and_send_knock_check_like_joins() {
    let server = TestServer::start_with(federated_options(free_port())).await;
    // An IP-literal server name, so that an ACL can shut it out and not the room's own
    // `localhost` (ACLs match hosts without ports).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let fake = FakeServer::serving(listener, &format!("127.0.0.1:{port}"));
    let alice = server.register("alice").await;
    let eve = fake.user_id("eve");
    let room = knock_room(&alice, "12", "Knock here").await;
    let make_knock = |room: &str, user: &str, versions: &str| {
        format!(
            "/_matrix/federation/v1/make_knock/{}/{}?{versions}",
            enc(room),
            enc(user)
        )
    };

    let (status, answer) = fake
        .request(
            &server,
            "GET",
            &make_knock(&room, &eve, "ver=10&ver=11"),
            None,
        )
        .await;
    assert_eq!(
        (status, &answer["errcode"], &answer["room_version"]),
        (400, &json!("M_INCOMPATIBLE_ROOM_VERSION"), &json!("12")),
        "{answer}"
    );
    let (status, answer) = fake
        .request(
            &server,
            "GET",
            &make_knock(&room, &alice.user_id, "ver=12"),
            None,
        )
        .await;
    assert_eq!(
        (status, &answer["errcode"]),
        (403, &json!("M_FORBIDDEN")),
        "{answer}"
    );
    let unknown = format!("!nowhere:{}", server.server_name());
    let (status, answer) = fake
        .request(&server, "GET", &make_knock(&unknown, &eve, "ver=12"), None)
        .await;
    assert_eq!(
        (status, &answer["errcode"]),
        (404, &json!("M_NOT_FOUND")),
        "{answer}"
    );
    let public = alice
        .create_room(json!({ "preset": "public_chat", "room_version": "12" }))
        .await;
    let (status, answer) = fake
        .request(&server, "GET", &make_knock(&public, &eve, "ver=12"), None)
        .await;
    assert_eq!(
        (status, &answer["errcode"]),
        (403, &json!("M_FORBIDDEN")),
        "{answer}"
    );

    let (status, made) = fake
        .request(
            &server,
            "GET",
            &make_knock(&room, &eve, "ver=11&ver=12"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["room_version"], "12");
    assert_eq!(made["event"]["content"]["membership"], "knock");
    assert_eq!(made["event"]["state_key"], eve.as_str());
    let mut template = made["event"].clone();
    template["origin_server_ts"] = json!(now_ms());
    let (event_id, signed) = fake.sign_pdu(template, "12");
    let send_knock = |event_id: &str| {
        format!(
            "/_matrix/federation/v1/send_knock/{}/{}",
            enc(&room),
            enc(event_id)
        )
    };
    // The path's event ID must be the event's.
    let (status, answer) = fake
        .request(&server, "PUT", &send_knock("$other"), Some(signed.clone()))
        .await;
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = fake
        .request(&server, "PUT", &send_knock(&event_id), Some(signed))
        .await;
    assert_eq!(status, 200, "{answer}");
    let state = answer["knock_room_state"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"));
    let create = state
        .iter()
        .find(|e| e["type"] == "m.room.create")
        .unwrap_or_else(|| panic!("no create event: {answer}"));
    assert!(create["signatures"].is_object(), "a full PDU: {create}");
    assert!(
        state
            .iter()
            .any(|e| e["type"] == "m.room.name" && e["content"]["name"] == "Knock here"),
        "{answer}"
    );
    assert_eq!(
        membership(&alice, &room, &eve).await.as_deref(),
        Some("knock")
    );

    // The room's server ACL shuts the server out.
    alice
        .put(
            &format!(
                "/_matrix/client/v3/rooms/{}/state/m.room.server_acl/",
                enc(&room)
            ),
            json!({ "allow": ["*"], "allow_ip_literals": false }),
        )
        .await
        .ok();
    let (status, answer) = fake
        .request(&server, "GET", &make_knock(&room, &eve, "ver=12"), None)
        .await;
    assert_eq!(
        (status, &answer["errcode"]),
        (403, &json!("M_FORBIDDEN")),
        "{answer}"
    );
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}
