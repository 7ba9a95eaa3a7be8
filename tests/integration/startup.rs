//! Starting the binary: configuration errors and the help text.

use std::process::Command;

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
