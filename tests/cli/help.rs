//! `--help` output is part of the interface: snapshot it, so changes show up
//! in review, and check that every command has an example.

use crate::support::{assert_text_snapshot, gpkit};

const COMMANDS: &[&[&str]] = &[
    &[],
    &["new"],
    &["new", "project"],
    &["new", "migration"],
    &["add"],
    &["add", "worker"],
    &["add", "event"],
    &["upgrade"],
    &["upgrade", "templates"],
];

#[test]
fn help_output_matches_the_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    for words in COMMANDS {
        let output = gpkit(dir.path())
            .args(*words)
            .arg("--help")
            .output()
            .unwrap();
        assert!(output.status.success());
        let text = String::from_utf8(output.stdout).unwrap();
        let name = if words.is_empty() {
            "gpkit".to_string()
        } else {
            format!("gpkit-{}", words.join("-"))
        };
        assert_text_snapshot(&format!("help/{name}.txt"), &text);
    }
}

#[test]
fn every_command_help_has_an_example() {
    let dir = tempfile::tempdir().unwrap();
    for words in COMMANDS.iter().filter(|w| w.len() == 2) {
        let output = gpkit(dir.path())
            .args(*words)
            .arg("--help")
            .output()
            .unwrap();
        let text = String::from_utf8(output.stdout).unwrap();
        assert!(
            text.contains("Examples:\n  gpkit "),
            "{words:?} has no example:\n{text}"
        );
    }
}

#[test]
fn usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    gpkit(dir.path())
        .args(["new", "project", "a", "b"])
        .assert()
        .code(2);
    gpkit(dir.path()).arg("frobnicate").assert().code(2);
}
