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

/// Mode bits of a path.
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn the_embedded_cluster_is_private_to_the_server_user() {
    use std::io::{BufRead, BufReader};
    let data = std::env::temp_dir().join(format!("myelin-startup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let mut server = Command::new(env!("CARGO_BIN_EXE_myelin"))
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("MYELIN_DATA_DIR", &data)
        .env("MYELIN_LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = server.stdout.take().unwrap();
    let listening = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.starts_with("myelin: listening on"));
    let postgres = data.join("postgres");
    let checks = || {
        assert!(listening, "the server did not start");
        assert_eq!(mode(&postgres), 0o700, "postgres/");
        assert_eq!(mode(&postgres.join("data")), 0o700, "postgres/data");
        assert_eq!(mode(&postgres.join("run")), 0o700, "postgres/run");
        assert_eq!(
            mode(&postgres.join("run/.s.PGSQL.5432")) & 0o077,
            0,
            "the socket"
        );
        assert_eq!(mode(&data.join("media")), 0o700, "media/");
        let hba = std::fs::read_to_string(postgres.join("data/pg_hba.conf")).unwrap();
        let rules: Vec<_> = hba.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(rules, ["local all all peer map=myelin"], "{hba}");
    };
    let result = std::panic::catch_unwind(checks);
    // SIGTERM: the server stops its cluster on the way out.
    let _ = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&data);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
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
