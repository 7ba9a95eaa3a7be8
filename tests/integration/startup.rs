//! Starting the binary: configuration errors and the help text.

use std::process::Command;

use serde_json::json;

use crate::support::{
    client::{enc, timeline},
    ServerOptions, TestServer,
};

#[test]
fn invalid_configuration_stops_with_one_line_naming_the_setting() {
    let output = Command::new(env!("CARGO_BIN_EXE_myelin"))
        .env_clear()
        .env("MYELIN_LISTEN", "not-an-address")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("MYELIN_LISTEN"), "{stderr}");
}

#[test]
fn help_explains_the_subcommands() {
    let output = Command::new(env!("CARGO_BIN_EXE_myelin"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    for word in ["serve", "migrate", "user"] {
        assert!(help.contains(word), "{help}");
    }
}

/// An IPv6 literal with a port is a valid server name: IDs carry it whole, brackets included.
#[tokio::test]
async fn ipv6_server_name_with_port_serves_registration_rooms_and_sync() {
    let server =
        TestServer::start_with(ServerOptions::default().env("MYELIN_SERVER_NAME", "[::1]:8448"))
            .await;
    let me = server.user_id("alice");
    assert_eq!(me, "@alice:[::1]:8448");
    let alice = server.register("alice").await;
    assert_eq!(alice.user_id, me);
    let whoami = alice.get("/_matrix/client/v3/account/whoami").await.ok();
    assert_eq!(whoami["user_id"], me);

    // Before room version 12 a room ID names the server that created it.
    let room = alice
        .create_room(json!({ "name": "v6", "room_version": "11" }))
        .await;
    assert!(
        room.ends_with(&format!(":{}", server.server_name())),
        "{room}"
    );
    let sent = alice.send_text(&room, "t1", "hello").await.ok();
    let sync = alice.sync(None, 0, None).await;
    let events = timeline(&sync, &room);
    let message = events
        .iter()
        .find(|e| e["event_id"] == sent["event_id"])
        .expect("the message is in the timeline");
    assert_eq!(message["sender"], me);
    assert!(events.iter().any(|e| e["type"] == "m.room.member"
        && e["state_key"] == me
        && e["content"]["membership"] == "join"));

    // The same user ID in a path (percent-encoded) reaches the same account.
    let profile = alice
        .get(&format!("/_matrix/client/v3/profile/{}", enc(&me)))
        .await;
    assert_eq!(profile.status.as_u16(), 200, "{}", profile.body);
}

/// A server name with capitals stays as configured in IDs, and logging in with the full ID
/// works whatever the case of its server name.
#[tokio::test]
async fn a_server_name_with_capitals_logs_in_by_full_user_id() {
    let server = TestServer::start_with(
        ServerOptions::default().env("MYELIN_SERVER_NAME", "Chat.Example.test:8448"),
    )
    .await;
    let alice = server.register("alice").await;
    assert_eq!(alice.user_id, "@alice:Chat.Example.test:8448");
    for login_as in [
        "@alice:Chat.Example.test:8448",
        "@ALICE:chat.example.TEST:8448",
        "Alice",
    ] {
        let session = server
            .client()
            .login_response(login_as, "password")
            .await
            .ok();
        assert_eq!(session["user_id"], alice.user_id, "{login_as}");
    }
    server
        .client()
        .login_response("@alice:chat.example.test:9999", "password")
        .await
        .assert_error(403, "M_FORBIDDEN");
}
