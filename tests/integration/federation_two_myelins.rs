//! Rooms between two Myelins: a user joins a room on the other server, an invite across
//! servers accepted and one rejected. (A resident Myelin with a fake server's users is in
//! federation_rooms.)

use serde_json::json;

use crate::support::{
    client::{enc, timeline},
    federation::{join_over_federation, state_ids},
};

/// A user of one Myelin joins a room of another through make_join/send_join: the joining
/// server checks the answer's state and starts the room there; both sides agree on who is in
/// it and on its state.
#[tokio::test]
async fn a_user_joins_a_room_on_another_myelin() {
    let (a, b) = crate::support::federation::pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    for version in ["11", "12"] {
        let room = alice
            .create_room(json!({
                "preset": "public_chat", "room_version": version, "name": format!("Room {version}"),
                "topic": "far away",
            }))
            .await;
        join_over_federation(&bob, &a, &room).await;

        // Both servers have Bob joined.
        for (client, side) in [(&alice, "resident"), (&bob, "joiner")] {
            let members = client
                .get(&format!(
                    "/_matrix/client/v3/rooms/{}/joined_members",
                    enc(&room)
                ))
                .await
                .ok();
            assert!(
                members["joined"][&bob.user_id].is_object(),
                "{side}: {members}"
            );
            assert!(
                members["joined"][&alice.user_id].is_object(),
                "{side}: {members}"
            );
        }
        // Bob's server has the room's state, as the resident has it.
        let name = bob
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/state/m.room.name/",
                enc(&room)
            ))
            .await
            .ok();
        assert_eq!(name["name"], format!("Room {version}"));
        let state_a = state_ids(&alice, &room).await;
        let state_b = state_ids(&bob, &room).await;
        let mut sorted_a = state_a.clone();
        let mut sorted_b = state_b.clone();
        sorted_a.sort();
        sorted_b.sort();
        assert_eq!(sorted_a, sorted_b, "the two servers' states differ");

        // Bob's first sync has the room with its state and his join.
        let synced = bob.sync(None, 0, None).await;
        let joined_room = &synced["rooms"]["join"][&room];
        assert!(joined_room.is_object(), "{synced}");
        let has_topic = joined_room["state"]["events"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(timeline(&synced, &room))
            .any(|e| e["type"] == "m.room.topic" && e["content"]["topic"] == "far away");
        assert!(has_topic, "{synced}");
    }
}

/// A user of one Myelin invites a user of another into a private room: the invitee's server
/// countersigns the invite, the invitee's /sync shows it with the room's name, and accepting it
/// joins through the inviter's server.
#[tokio::test]
async fn a_user_invites_a_user_of_another_myelin_who_accepts() {
    let (a, b) = crate::support::federation::pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    for version in ["11", "12"] {
        let room = alice
            .create_room(json!({
                "preset": "private_chat", "room_version": version, "name": format!("Secret {version}"),
            }))
            .await;
        let since = bob.next_batch().await;
        alice
            .post(
                &format!("/_matrix/client/v3/rooms/{}/invite", enc(&room)),
                json!({ "user_id": bob.user_id }),
            )
            .await
            .ok();
        let synced = bob.sync(Some(&since), 5_000, None).await;
        let invite = &synced["rooms"]["invite"][&room]["invite_state"]["events"];
        let events = invite.as_array().unwrap_or_else(|| panic!("{synced}"));
        assert!(
            events.iter().any(|e| e["type"] == "m.room.name"
                && e["content"]["name"] == format!("Secret {version}")),
            "{synced}"
        );
        assert!(
            events.iter().any(|e| e["type"] == "m.room.member"
                && e["state_key"] == bob.user_id.as_str()
                && e["content"]["membership"] == "invite"),
            "{synced}"
        );

        // Accepting: the room is private, the invite lets Bob in, through Alice's server.
        bob.post(
            &format!("/_matrix/client/v3/rooms/{}/join", enc(&room)),
            json!({}),
        )
        .await
        .ok();
        let members = alice
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/joined_members",
                enc(&room)
            ))
            .await
            .ok();
        assert!(members["joined"][&bob.user_id].is_object(), "{members}");
        let synced = bob.sync(None, 0, None).await;
        assert!(synced["rooms"]["join"][&room].is_object(), "{synced}");
        let name = bob
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/state/m.room.name/",
                enc(&room)
            ))
            .await
            .ok();
        assert_eq!(name["name"], format!("Secret {version}"));
    }
}

/// Rejecting an invite from another server to a room this server is not in: the invite goes
/// away from the invitee's /sync, and the inviting server learns that the invitee left.
#[tokio::test]
async fn an_invite_from_another_myelin_is_rejected() {
    let (a, b) = crate::support::federation::pair().await;
    let alice = a.register("alice").await;
    let bob = b.register("bob").await;
    let room = alice
        .create_room(json!({ "preset": "private_chat", "room_version": "11" }))
        .await;
    alice
        .post(
            &format!("/_matrix/client/v3/rooms/{}/invite", enc(&room)),
            json!({ "user_id": bob.user_id }),
        )
        .await
        .ok();
    let synced = bob.sync(None, 0, None).await;
    assert!(synced["rooms"]["invite"][&room].is_object(), "{synced}");
    let since = synced["next_batch"].as_str().unwrap().to_owned();

    bob.post(
        &format!("/_matrix/client/v3/rooms/{}/leave", enc(&room)),
        json!({}),
    )
    .await
    .ok();
    let synced = bob.sync(Some(&since), 0, None).await;
    assert!(synced["rooms"]["invite"].get(&room).is_none(), "{synced}");
    assert!(synced["rooms"]["leave"][&room].is_object(), "{synced}");
    let synced = bob.sync(None, 0, None).await;
    assert!(synced["rooms"]["invite"].get(&room).is_none(), "{synced}");

    crate::support::wait_until(
        "the inviting server sees the invite rejected",
        std::time::Duration::from_secs(15),
        || {
            let alice = alice.clone();
            let room = room.clone();
            let bob_id = bob.user_id.clone();
            async move {
                let member = alice
                    .get(&format!(
                        "/_matrix/client/v3/rooms/{}/state/m.room.member/{}",
                        enc(&room),
                        enc(&bob_id)
                    ))
                    .await;
                member.status == 200 && member.ok()["membership"] == "leave"
            }
        },
    )
    .await;
}
