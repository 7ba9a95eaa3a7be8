//! Presence in appservice transactions (`receive_ephemeral`): the presence of the users in its
//! namespace and of those in its rooms, nobody else's, and nothing for an appservice that did
//! not ask.

use std::time::Duration;

use serde_json::{json, Value};

use crate::{
    appservices::{as_user, register_ghost},
    presence::put_presence,
    support::{
        appservice::{FakeAppservice, FakeRegistration},
        client::enc,
        server_name, user_id, wait_until, Client, ServerOptions, TestServer,
    },
};

/// The `m.presence` events of every transaction the appservice was sent, in either the stable
/// or the unstable (MSC2409) field.
fn presence_sent(fake: &FakeAppservice) -> Vec<Value> {
    fake.transactions()
        .into_iter()
        .flat_map(|(_, body, _)| {
            ["ephemeral", "de.sorunome.msc2409.ephemeral"]
                .into_iter()
                .flat_map(|field| body[field].as_array().cloned().unwrap_or_default())
                .collect::<Vec<_>>()
        })
        .filter(|e| e["type"] == "m.presence")
        .collect()
}

/// The appservice's latest `m.presence` for `user` saying `state` with `status`.
fn presence_of(fake: &FakeAppservice, user: &str, state: &str, status: &str) -> Option<Value> {
    presence_sent(fake).into_iter().rev().find(|e| {
        e["sender"] == user
            && e["content"]["presence"] == state
            && e["content"]["status_msg"] == status
    })
}

/// A ghost of the appservice, joined to a room `alice` made.
async fn ghost_in_a_room_of(fake: &FakeAppservice, server: &TestServer, alice: &Client) -> String {
    let ghost = user_id("echo_ghost");
    register_ghost(&fake.client(server), "echo_ghost").await;
    let room = alice.create_room(json!({ "invite": [ghost] })).await;
    fake.client(server)
        .post(
            &as_user(&format!("/_matrix/client/v3/join/{}", enc(&room)), &ghost),
            json!({}),
        )
        .await
        .ok();
    room
}

#[tokio::test]
async fn presence_of_namespace_users_and_their_room_mates_reaches_the_appservice_only() {
    let fake = FakeAppservice::start(server_name()).await;
    // Interested in the same users, but it did not ask for ephemeral events.
    let plain = FakeAppservice::start_with(
        server_name(),
        FakeRegistration {
            id: "plain",
            exclusive: false,
            receive_ephemeral: false,
            ..FakeRegistration::default()
        },
    )
    .await;
    let server = TestServer::start_with(FakeAppservice::options_for(
        &[&fake, &plain],
        ServerOptions::default(),
    ))
    .await;
    let alice = server.register("alice").await;
    let eve = server.register("eve").await;
    let room = ghost_in_a_room_of(&fake, &server, &alice).await;
    let ghost = user_id("echo_ghost");

    // Eve shares no room with the appservice's users: her change comes first, so it would
    // be in the same transaction as the others or an earlier one.
    put_presence(
        &eve,
        json!({ "presence": "online", "status_msg": "eve here" }),
    )
    .await
    .ok();
    fake.client(&server)
        .put(
            &as_user(
                &format!("/_matrix/client/v3/presence/{}/status", enc(&ghost)),
                &ghost,
            ),
            json!({ "presence": "online", "status_msg": "ghost here" }),
        )
        .await
        .ok();
    put_presence(
        &alice,
        json!({ "presence": "unavailable", "status_msg": "alice away" }),
    )
    .await
    .ok();

    wait_until("presence is delivered", Duration::from_secs(20), || async {
        presence_of(&fake, &alice.user_id, "unavailable", "alice away").is_some()
            && presence_of(&fake, &ghost, "online", "ghost here").is_some()
    })
    .await;
    let alices = presence_of(&fake, &alice.user_id, "unavailable", "alice away").unwrap();
    assert!(alices["content"]["last_active_ago"].is_u64(), "{alices}");
    assert!(
        alices["content"].get("currently_active").is_none(),
        "{alices}"
    );
    let ghosts = presence_of(&fake, &ghost, "online", "ghost here").unwrap();
    assert!(
        ghosts["content"]["currently_active"].is_boolean(),
        "{ghosts}"
    );
    let eves: Vec<Value> = presence_sent(&fake)
        .into_iter()
        .filter(|e| e["sender"] == eve.user_id.as_str())
        .collect();
    assert!(eves.is_empty(), "eve's presence was sent: {eves:?}");
    // A change already sent is not sent again.
    let alice_count = |fake: &FakeAppservice| {
        presence_sent(fake)
            .iter()
            .filter(|e| e["sender"] == alice.user_id.as_str())
            .count()
    };
    assert_eq!(alice_count(&fake), 1);

    // The appservice that did not ask gets the room's events and no presence.
    let sent = alice.send_text(&room, "after", "after presence").await.ok();
    let event_id = sent["event_id"].as_str().unwrap().to_owned();
    wait_until(
        "the message reaches both",
        Duration::from_secs(20),
        || async {
            [&fake, &plain].iter().all(|appservice| {
                appservice
                    .delivered_events()
                    .iter()
                    .any(|e| e["event_id"] == event_id.as_str())
            })
        },
    )
    .await;
    assert_eq!(presence_sent(&plain), Vec::<Value>::new());
    assert_eq!(alice_count(&fake), 1, "a presence change was sent twice");
}
