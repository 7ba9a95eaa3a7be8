//! Room summaries for previews (MSC3266): `GET /_matrix/client/v1/room_summary/{roomIdOrAlias}`
//! and its unstable paths, only for rooms the caller may see or preview.

use serde_json::json;

use crate::support::{alias, client::enc, server_name, TestServer};

const STABLE: &str = "/_matrix/client/v1/room_summary";

#[tokio::test]
async fn summary_describes_a_room_anyone_may_preview() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice
        .create_room(json!({
            "preset": "public_chat",
            "name": "Lobby",
            "topic": "Say hi",
            "room_alias_name": "lobby",
            "initial_state": [
                { "type": "m.room.avatar", "state_key": "", "content": { "url": "mxc://example.org/abc" } },
                { "type": "m.room.encryption", "state_key": "", "content": { "algorithm": "m.megolm.v1.aes-sha2" } },
            ],
        }))
        .await;
    let bob = server.register("bob").await;

    let summary = bob
        .get(&format!(
            "{STABLE}/{}?via={}",
            enc(&room),
            enc(server_name())
        ))
        .await
        .ok();
    assert_eq!(summary["room_id"], room);
    assert_eq!(summary["name"], "Lobby");
    assert_eq!(summary["topic"], "Say hi");
    assert_eq!(summary["avatar_url"], "mxc://example.org/abc");
    assert_eq!(summary["canonical_alias"], alias("lobby"));
    assert_eq!(summary["num_joined_members"], 1);
    assert_eq!(summary["join_rule"], "public");
    assert_eq!(summary["guest_can_join"], false);
    assert_eq!(summary["world_readable"], false);
    assert_eq!(summary["encryption"], "m.megolm.v1.aes-sha2");
    assert_eq!(summary["room_version"], "12");
    assert_eq!(summary["membership"], "leave");
    assert!(summary.get("room_type").is_none(), "{summary}");

    // By alias, and at both unstable paths, the same; the caller's own membership shows.
    bob.join(&room).await.ok();
    for path in [
        format!("{STABLE}/{}", enc(&alias("lobby"))),
        format!(
            "/_matrix/client/unstable/im.nheko.summary/rooms/{}/summary",
            enc(&room)
        ),
        format!(
            "/_matrix/client/unstable/im.nheko.summary/summary/{}",
            enc(&alias("lobby"))
        ),
    ] {
        let summary = bob.get(&path).await.ok();
        assert_eq!(summary["room_id"], room, "{path}");
        assert_eq!(summary["membership"], "join", "{path}");
        assert_eq!(summary["num_joined_members"], 2, "{path}");
    }

    // Without a token: the room is public, so it is summarised, without a membership.
    let anonymous = server
        .client()
        .get(&format!("{STABLE}/{}", enc(&room)))
        .await
        .ok();
    assert_eq!(anonymous["name"], "Lobby");
    assert!(anonymous.get("membership").is_none(), "{anonymous}");

    // A space says so.
    let space = alice
        .create_room(json!({ "preset": "public_chat", "creation_content": { "type": "m.space" } }))
        .await;
    let summary = bob.get(&format!("{STABLE}/{}", enc(&space))).await.ok();
    assert_eq!(summary["room_type"], "m.space");
}

#[tokio::test]
async fn summary_of_a_room_the_caller_may_not_see_is_not_found() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let secret = alice
        .create_room(json!({
            "preset": "private_chat",
            "name": "SECRET NAME",
            "room_alias_name": "secret",
        }))
        .await;
    let mallory = server.register("mallory").await;

    let unknown_room = format!("!nowhere:{}", server_name());
    let unknown = mallory
        .get(&format!("{STABLE}/{}", enc(&unknown_room)))
        .await;
    unknown.assert_error(404, "M_NOT_FOUND");
    for path in [
        format!("{STABLE}/{}", enc(&secret)),
        format!("{STABLE}/{}", enc(&alias("secret"))),
        format!(
            "/_matrix/client/unstable/im.nheko.summary/summary/{}",
            enc(&secret)
        ),
    ] {
        let hidden = mallory.get(&path).await;
        hidden.assert_error(404, "M_NOT_FOUND");
        assert_eq!(
            hidden.body, unknown.body,
            "{path}: the same as an unknown room"
        );
    }
    server
        .client()
        .get(&format!("{STABLE}/{}", enc(&secret)))
        .await
        .assert_error(404, "M_NOT_FOUND");
    mallory
        .get(&format!("{STABLE}/{}", enc(&alias("nothing"))))
        .await
        .assert_error(404, "M_NOT_FOUND");
    mallory
        .get(&format!("{STABLE}/not-a-room"))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    mallory
        .get(&format!("{STABLE}/{}?via=bad%20server", enc(&secret)))
        .await
        .assert_error(400, "M_INVALID_PARAM");

    // Invited, Mallory may look before she joins.
    alice
        .room_action(&secret, "invite", json!({ "user_id": mallory.user_id }))
        .await
        .ok();
    let summary = mallory
        .get(&format!("{STABLE}/{}", enc(&secret)))
        .await
        .ok();
    assert_eq!(summary["name"], "SECRET NAME");
    assert_eq!(summary["membership"], "invite");
    assert_eq!(summary["join_rule"], "invite");
}

#[tokio::test]
async fn summary_of_a_restricted_room_follows_the_allowed_rooms() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let space = alice
        .create_room(json!({ "preset": "public_chat", "creation_content": { "type": "m.space" } }))
        .await;
    let restricted = alice
        .create_room(json!({
            "preset": "private_chat",
            "name": "Team",
            "initial_state": [{
                "type": "m.room.join_rules",
                "state_key": "",
                "content": { "join_rule": "restricted",
                             "allow": [{ "type": "m.room_membership", "room_id": space }] },
            }],
        }))
        .await;
    let bob = server.register("bob").await;
    let path = format!("{STABLE}/{}", enc(&restricted));
    bob.get(&path).await.assert_error(404, "M_NOT_FOUND");
    bob.join(&space).await.ok();
    let summary = bob.get(&path).await.ok();
    assert_eq!(summary["join_rule"], "restricted");
    assert_eq!(summary["allowed_room_ids"], json!([space]));
    assert_eq!(summary["membership"], "leave");
}
