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
