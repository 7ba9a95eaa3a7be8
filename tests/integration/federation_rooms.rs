//! Rooms across servers, with Myelin as the resident: a user of another server joins through
//! `make_join`/`send_join`, talks through `/send`, and the room's checks reject what the auth
//! rules forbid and soft-fail what the current state forbids.

use serde_json::{json, Value};

use crate::support::{
    client::{enc, timeline},
    federation::{federated_options, free_port, join_over_federation, state_ids, FakeServer},
    TestServer,
};

pub(crate) fn id_of(state: &[(String, String, String)], kind: &str, key: &str) -> String {
    state
        .iter()
        .find(|(t, k, _)| t == kind && k == key)
        .unwrap_or_else(|| panic!("no {kind}/{key} in {state:?}"))
        .2
        .clone()
}

/// The auth events an event of `sender` selects in `version` (no create event in v12).
pub(crate) fn auth_for(
    state: &[(String, String, String)],
    version: &str,
    sender: &str,
) -> Vec<String> {
    let mut auth = vec![
        id_of(state, "m.room.power_levels", ""),
        id_of(state, "m.room.member", sender),
    ];
    if version != "12" {
        auth.push(id_of(state, "m.room.create", ""));
    }
    auth
}

/// `/send` with one PDU from `fake`; answers that PDU's result.
async fn send_one(fake: &FakeServer, server: &TestServer, txn: &str, pdu: Value) -> Value {
    let body = json!({
        "origin": fake.name(),
        "origin_server_ts": 1_700_000_000_000u64,
        "pdus": [pdu],
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
    let results = answer["pdus"].as_object().unwrap();
    assert_eq!(results.len(), 1, "{answer}");
    results.values().next().unwrap().clone()
}

/// Joins `user` of `fake` to `room` through make_join and send_join; answers the join's
/// event ID and depth.
pub(crate) async fn join_through_handshake(
    fake: &FakeServer,
    server: &TestServer,
    room: &str,
    user: &str,
    version: &str,
) -> (String, i64) {
    let (status, made) = fake
        .request(
            server,
            "GET",
            &format!(
                "/_matrix/federation/v1/make_join/{}/{}?ver=10&ver=11&ver=12",
                enc(room),
                enc(user)
            ),
            None,
        )
        .await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["room_version"], version);
    let mut template = made["event"].clone();
    assert_eq!(template["type"], "m.room.member");
    assert_eq!(template["state_key"], user);
    template["origin_server_ts"] = json!(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64);
    let depth = template["depth"].as_i64().unwrap();
    let (event_id, signed) = fake.sign_pdu(template, version);
    let (status, joined) = fake
        .request(
            server,
            "PUT",
            &format!(
                "/_matrix/federation/v2/send_join/{}/{}",
                enc(room),
                enc(&event_id)
            ),
            Some(signed),
        )
        .await;
    assert_eq!(status, 200, "{joined}");
    let state = joined["state"].as_array().unwrap();
    assert!(
        state.iter().any(|e| e["type"] == "m.room.create"),
        "{joined}"
    );
    assert!(
        !state.iter().any(|e| e["state_key"] == user),
        "the state is the state before the join: {joined}"
    );
    assert!(
        !joined["auth_chain"].as_array().unwrap().is_empty(),
        "{joined}"
    );
    (event_id, depth)
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test]
async fn a_remote_user_joins_talks_and_is_checked_against_the_room_state() {
    let server = TestServer::start_with(federated_options(free_port())).await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let eve = fake.user_id("eve");
    for version in ["11", "12"] {
        let room = alice
            .create_room(json!({ "preset": "public_chat", "room_version": version }))
            .await;
        let since = alice.next_batch().await;

        // Join through the handshake; Alice sees Eve join.
        let (join_id, join_depth) =
            join_through_handshake(&fake, &server, &room, &eve, version).await;
        let members = alice
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/joined_members",
                enc(&room)
            ))
            .await
            .ok();
        assert!(members["joined"][&eve].is_object(), "{members}");

        // A message through /send reaches Alice's /sync.
        let state = state_ids(&alice, &room).await;
        let (message_id, message) = fake.sign_pdu(
            json!({
                "room_id": room, "sender": eve, "type": "m.room.message",
                "content": { "msgtype": "m.text", "body": "hello from afar" },
                "origin_server_ts": now_ms(), "depth": join_depth + 1,
                "prev_events": [join_id], "auth_events": auth_for(&state, version, &eve),
            }),
            version,
        );
        assert_eq!(
            send_one(&fake, &server, &format!("m{version}"), message).await,
            json!({})
        );
        let synced = alice.sync(Some(&since), 0, None).await;
        let events = timeline(&synced, &room);
        assert!(
            events.iter().any(|e| e["event_id"] == message_id.as_str()
                && e["content"]["body"] == "hello from afar"),
            "{synced}"
        );

        // Eve may not raise her own power: rejected, and the state is unchanged.
        let mut levels = alice
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/state/m.room.power_levels/",
                enc(&room)
            ))
            .await
            .ok();
        levels["users"][&eve] = json!(100);
        let (power_id, power) = fake.sign_pdu(
            json!({
                "room_id": room, "sender": eve, "type": "m.room.power_levels", "state_key": "",
                "content": levels, "origin_server_ts": now_ms(), "depth": join_depth + 2,
                "prev_events": [message_id], "auth_events": auth_for(&state, version, &eve),
            }),
            version,
        );
        let answer = send_one(&fake, &server, &format!("p{version}"), power).await;
        assert!(
            answer["error"].as_str().unwrap().starts_with("Rejected"),
            "{answer}"
        );
        let now = alice
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/state/m.room.power_levels/",
                enc(&room)
            ))
            .await
            .ok();
        assert!(now["users"].get(&eve).is_none(), "{now}");
        let event = alice
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/event/{}",
                enc(&room),
                enc(&power_id)
            ))
            .await;
        assert_eq!(event.status, 404, "a rejected event is served");

        // Banned, Eve sends a message built on the state before the ban: it passes the auth
        // rules at its place in the DAG but not the room's current state, so it is soft-failed
        // and no client sees it.
        let ban_since = alice.next_batch().await;
        alice
            .post(
                &format!("/_matrix/client/v3/rooms/{}/ban", enc(&room)),
                json!({ "user_id": eve, "reason": "spam" }),
            )
            .await
            .ok();
        let (evading_id, evading) = fake.sign_pdu(
            json!({
                "room_id": room, "sender": eve, "type": "m.room.message",
                "content": { "msgtype": "m.text", "body": "I am still here" },
                "origin_server_ts": now_ms(), "depth": join_depth + 2,
                "prev_events": [message_id], "auth_events": auth_for(&state, version, &eve),
            }),
            version,
        );
        assert_eq!(
            send_one(&fake, &server, &format!("e{version}"), evading).await,
            json!({})
        );
        let soft_failed = server
            .count(&format!(
                "SELECT count(*) AS n FROM events WHERE event_id = '{evading_id}' AND soft_failed"
            ))
            .await;
        assert_eq!(soft_failed, 1);
        let synced = alice.sync(Some(&ban_since), 0, None).await;
        assert!(
            !timeline(&synced, &room)
                .iter()
                .any(|e| e["event_id"] == evading_id.as_str()),
            "{synced}"
        );
        let page = alice
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/messages?dir=b&limit=50",
                enc(&room)
            ))
            .await
            .ok();
        assert!(
            !page["chunk"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["event_id"] == evading_id.as_str() || e["event_id"] == power_id.as_str()),
            "{page}"
        );
        // The room goes on from Alice's side, on top of her ban, not of the evading event.
        let after = alice
            .send_text(&room, &format!("after{version}"), "after")
            .await
            .ok();
        let prev = server
            .count(&format!(
                "SELECT count(*) AS n FROM events WHERE event_id = '{}' \
                 AND pdu->'prev_events' @> jsonb_build_array('{evading_id}')",
                after["event_id"].as_str().unwrap()
            ))
            .await;
        assert_eq!(prev, 0, "a soft-failed event became a prev event");
    }
}

#[tokio::test]
async fn make_join_refuses_what_the_room_would_refuse() {
    let server = TestServer::start_with(federated_options(free_port())).await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let eve = fake.user_id("eve");
    let public = alice
        .create_room(json!({ "preset": "public_chat", "room_version": "11" }))
        .await;
    let private = alice
        .create_room(json!({ "preset": "private_chat", "room_version": "11" }))
        .await;
    let make_join = |room: &str, user: &str, ver: &str| {
        format!(
            "/_matrix/federation/v1/make_join/{}/{}?{ver}",
            enc(room),
            enc(user)
        )
    };
    let (status, answer) = fake
        .request(&server, "GET", &make_join(&public, &eve, "ver=10"), None)
        .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["errcode"], "M_INCOMPATIBLE_ROOM_VERSION");
    assert_eq!(answer["room_version"], "11");

    let (status, answer) = fake
        .request(&server, "GET", &make_join(&private, &eve, "ver=11"), None)
        .await;
    assert_eq!(
        (status, answer["errcode"].clone()),
        (403, json!("M_FORBIDDEN")),
        "{answer}"
    );

    let someone_else = format!("@mallory:{}", server.server_name());
    let (status, answer) = fake
        .request(
            &server,
            "GET",
            &make_join(&public, &someone_else, "ver=11"),
            None,
        )
        .await;
    assert_eq!(
        (status, answer["errcode"].clone()),
        (403, json!("M_FORBIDDEN")),
        "{answer}"
    );

    let (status, answer) = fake
        .request(
            &server,
            "GET",
            &make_join("!unknown:elsewhere.example", &eve, "ver=11"),
            None,
        )
        .await;
    assert_eq!(
        (status, answer["errcode"].clone()),
        (404, json!("M_NOT_FOUND")),
        "{answer}"
    );
}

/// A user of another server leaves one of our rooms through make_leave/send_leave; someone
/// who is not in the room gets no template.
#[tokio::test]
async fn a_remote_user_leaves_through_make_leave_and_send_leave() {
    let server = TestServer::start_with(federated_options(free_port())).await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let eve = fake.user_id("eve");
    let room = alice
        .create_room(json!({ "preset": "public_chat", "room_version": "12" }))
        .await;
    let make_leave = |user: &str| {
        format!(
            "/_matrix/federation/v1/make_leave/{}/{}",
            enc(&room),
            enc(user)
        )
    };
    let (status, answer) = fake.request(&server, "GET", &make_leave(&eve), None).await;
    assert_eq!(
        (status, answer["errcode"].clone()),
        (403, json!("M_FORBIDDEN")),
        "{answer}"
    );

    join_through_handshake(&fake, &server, &room, &eve, "12").await;
    let (status, made) = fake.request(&server, "GET", &make_leave(&eve), None).await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["room_version"], "12");
    assert_eq!(made["event"]["content"]["membership"], "leave");
    let mut template = made["event"].clone();
    template["origin_server_ts"] = json!(now_ms());
    let (event_id, signed) = fake.sign_pdu(template, "12");
    let (status, answer) = fake
        .request(
            &server,
            "PUT",
            &format!(
                "/_matrix/federation/v2/send_leave/{}/{}",
                enc(&room),
                enc(&event_id)
            ),
            Some(signed),
        )
        .await;
    assert_eq!((status, answer), (200, json!({})));
    let members = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/joined_members",
            enc(&room)
        ))
        .await
        .ok();
    assert!(members["joined"].get(&eve).is_none(), "{members}");
    let member = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.member/{}",
            enc(&room),
            enc(&eve)
        ))
        .await
        .ok();
    assert_eq!(member["membership"], "leave");
}

/// An event naming an auth event this server lacks (a change of the sender's membership that
/// never reached it): the resident asks the sender for the event's auth chain (`/event_auth`),
/// checks and stores it, and takes the event.
#[tokio::test]
async fn unknown_auth_events_are_fetched_from_the_sender() {
    let server = TestServer::start_with(federated_options(free_port())).await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let eve = fake.user_id("eve");
    for version in ["11", "12"] {
        let room = alice
            .create_room(json!({ "preset": "public_chat", "room_version": version }))
            .await;
        let (join_id, join_depth) =
            join_through_handshake(&fake, &server, &room, &eve, version).await;
        let state = state_ids(&alice, &room).await;

        // Eve renames herself; the resident never hears of it.
        let mut rename_auth = auth_for(&state, version, &eve);
        rename_auth.push(id_of(&state, "m.room.join_rules", ""));
        let (rename_id, rename) = fake.sign_pdu(
            json!({
                "room_id": room, "sender": eve, "type": "m.room.member", "state_key": eve,
                "content": { "membership": "join", "displayname": "Evelyn" },
                "origin_server_ts": now_ms(), "depth": join_depth + 1,
                "prev_events": [join_id], "auth_events": rename_auth,
            }),
            version,
        );
        // Her message cites the rename as her membership.
        let mut message_auth: Vec<String> = auth_for(&state, version, &eve)
            .into_iter()
            .filter(|id| *id != join_id)
            .collect();
        message_auth.push(rename_id.clone());
        let (message_id, message) = fake.sign_pdu(
            json!({
                "room_id": room, "sender": eve, "type": "m.room.message",
                "content": { "msgtype": "m.text", "body": "after my rename" },
                "origin_server_ts": now_ms(), "depth": join_depth + 1,
                "prev_events": [join_id], "auth_events": message_auth,
            }),
            version,
        );
        // The auth chain the sender serves: the join's, as the resident serves it, the join
        // itself and the rename.
        let (status, chain) = fake
            .request(
                &server,
                "GET",
                &format!(
                    "/_matrix/federation/v1/event_auth/{}/{}",
                    enc(&room),
                    enc(&join_id)
                ),
                None,
            )
            .await;
        assert_eq!(status, 200, "{chain}");
        let (status, join) = fake
            .request(
                &server,
                "GET",
                &format!("/_matrix/federation/v1/event/{}", enc(&join_id)),
                None,
            )
            .await;
        assert_eq!(status, 200, "{join}");
        let mut auth_chain = chain["auth_chain"].as_array().unwrap().clone();
        auth_chain.push(join["pdus"][0].clone());
        auth_chain.push(rename);
        fake.serve(
            &format!("/_matrix/federation/v1/event_auth/{room}/{message_id}"),
            json!({ "auth_chain": auth_chain }),
        );

        let answer = send_one(&fake, &server, &format!("a{version}"), message).await;
        assert_eq!(answer, json!({}), "room {version}");
        let event = alice
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/event/{}",
                enc(&room),
                enc(&message_id)
            ))
            .await
            .ok();
        assert_eq!(event["content"]["body"], "after my rename");
        let outliers = server
            .count(&format!(
                "SELECT count(*) AS n FROM events WHERE event_id = '{rename_id}' AND outlier"
            ))
            .await;
        assert_eq!(
            outliers, 1,
            "the fetched auth event is stored as an outlier"
        );
    }
}

/// A restricted room: a user of another server who is in a room its join rules allow joins
/// with a local member as the authoriser, and the resident countersigns the join; a user in
/// no allowed room is refused the template.
#[tokio::test]
async fn a_restricted_room_admits_a_remote_member_of_an_allowed_room() {
    let server = TestServer::start_with(federated_options(free_port())).await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let (eve, mallory) = (fake.user_id("eve"), fake.user_id("mallory"));
    for version in ["11", "12"] {
        let space = alice
            .create_room(json!({ "preset": "public_chat", "room_version": version }))
            .await;
        join_through_handshake(&fake, &server, &space, &eve, version).await;
        let room = alice
            .create_room(json!({
                "preset": "private_chat", "room_version": version,
                "initial_state": [{
                    "type": "m.room.join_rules", "state_key": "",
                    "content": {
                        "join_rule": "restricted",
                        "allow": [{ "type": "m.room_membership", "room_id": space }],
                    },
                }],
            }))
            .await;
        let make_join = |user: &str| {
            format!(
                "/_matrix/federation/v1/make_join/{}/{}?ver=11&ver=12",
                enc(&room),
                enc(user)
            )
        };
        let (status, refused) = fake
            .request(&server, "GET", &make_join(&mallory), None)
            .await;
        assert_eq!(status, 403, "{refused}");
        assert_eq!(refused["errcode"], "M_FORBIDDEN");

        let (status, made) = fake.request(&server, "GET", &make_join(&eve), None).await;
        assert_eq!(status, 200, "{made}");
        let mut template = made["event"].clone();
        assert_eq!(
            template["content"]["join_authorised_via_users_server"],
            alice.user_id.as_str()
        );
        template["origin_server_ts"] = json!(now_ms());
        let (event_id, signed) = fake.sign_pdu(template, version);
        let (status, joined) = fake
            .request(
                &server,
                "PUT",
                &format!(
                    "/_matrix/federation/v2/send_join/{}/{}",
                    enc(&room),
                    enc(&event_id)
                ),
                Some(signed),
            )
            .await;
        assert_eq!(status, 200, "{joined}");
        assert!(
            joined["event"]["signatures"][server.server_name()].is_object(),
            "the resident countersigns the join: {joined}"
        );
        assert!(joined["event"]["signatures"][fake.name()].is_object());
        let members = alice
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/joined_members",
                enc(&room)
            ))
            .await
            .ok();
        assert!(members["joined"][&eve].is_object(), "{members}");
    }
}

/// `createRoom` with a user of another server among `invite` (and `is_direct`): the invite
/// goes through the invitee's server, as `/invite` does it; they see it as direct and join.
#[tokio::test]
async fn create_room_invites_users_of_other_servers() {
    let (a, b) = crate::support::federation::pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    for version in ["11", "12"] {
        let since = bob.next_batch().await;
        let room = alice
            .create_room(json!({
                "preset": "trusted_private_chat", "room_version": version,
                "invite": [bob.user_id], "is_direct": true,
            }))
            .await;
        let synced = bob.sync(Some(&since), 5_000, None).await;
        let invite = &synced["rooms"]["invite"][&room]["invite_state"]["events"];
        let events = invite.as_array().unwrap_or_else(|| panic!("{synced}"));
        assert!(
            events.iter().any(|e| e["type"] == "m.room.member"
                && e["state_key"] == bob.user_id.as_str()
                && e["content"]["membership"] == "invite"
                && e["content"]["is_direct"] == true),
            "{synced}"
        );
        bob.join(&room).await.ok();
        let members = alice
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/joined_members",
                enc(&room)
            ))
            .await
            .ok();
        assert!(members["joined"][&bob.user_id].is_object(), "{members}");
    }
}

/// A redaction of another server's event by a creator of a v12 room (who has every power,
/// without being listed in the power levels) takes effect on that other server.
#[tokio::test]
async fn a_v12_creator_redacts_a_message_of_another_server() {
    let (a, b) = crate::support::federation::pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "public_chat", "room_version": "12" }))
        .await;
    join_over_federation(&bob, &a, &room).await;
    let sent = bob.send_text(&room, "t1", "to be redacted").await.ok();
    let event_id = sent["event_id"].as_str().unwrap().to_owned();
    let mut seen = false;
    for _ in 0..100 {
        if alice.get_event(&room, &event_id).await.status.is_success() {
            seen = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(seen, "bob's message never reached alice's server");
    let path = format!(
        "/_matrix/client/v3/rooms/{}/redact/{}/r1",
        enc(&room),
        enc(&event_id)
    );
    let redaction = alice.put(&path, json!({})).await.ok();
    let mut served = Value::Null;
    for _ in 0..100 {
        served = bob.get_event(&room, &event_id).await.ok();
        if served["unsigned"]["redacted_because"]["event_id"] == redaction["event_id"] {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        served["unsigned"]["redacted_because"]["event_id"], redaction["event_id"],
        "{served}"
    );
    assert_eq!(served["content"], json!({}), "{served}");
}
