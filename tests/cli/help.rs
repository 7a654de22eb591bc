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
    &["add", "deploy"],
    &["add", "event"],
    &["add", "schedule"],
    &["upgrade"],
    &["upgrade", "templates"],
    &["completions"],
    &["man"],
    &["doctor"],
    &["dev"],
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

#[test]
fn completions_cover_every_command_in_every_shell() {
    let dir = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let output = gpkit(dir.path())
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(output.status.success(), "{shell}");
        let script = String::from_utf8(output.stdout).unwrap();
        for word in [
            "project",
            "migration",
            "worker",
            "event",
            "schedule",
            "templates",
            "dry-run",
        ] {
            assert!(script.contains(word), "{shell}: no `{word}`");
        }
    }
    // The bash script is valid bash.
    let script = gpkit(dir.path())
        .args(["completions", "bash"])
        .output()
        .unwrap()
        .stdout;
    let path = dir.path().join("gpkit.bash");
    std::fs::write(&path, script).unwrap();
    let check = std::process::Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn the_man_page_is_roff_and_lists_the_commands() {
    let dir = tempfile::tempdir().unwrap();
    let output = gpkit(dir.path()).arg("man").output().unwrap();
    assert!(output.status.success());
    let page = String::from_utf8(output.stdout).unwrap();
    assert!(page.contains(".TH gpkit 1"), "{page}");
    for command in ["new", "add", "upgrade", "completions"] {
        assert!(
            page.contains(&format!("{command}(1)")) || page.contains(command),
            "{command}"
        );
    }
}
