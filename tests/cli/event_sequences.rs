//! Property: any sequence of `gpkit add event` / `--listener` calls, with
//! names of every length (1 to 40) and spelling, leaves the project
//! `cargo fmt`-clean. rustfmt sorts `mod` declarations and breaks long
//! lines, so the order of additions and the names' lengths must not matter.

use std::process::Command;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use gpkit::domain::names::is_rust_keyword;

use crate::support::{gpkit, new_project};

/// One snake_case word of 1 to 40 characters (a valid listener name).
fn snake_name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9]{0,12}(_[a-z][a-z0-9]{0,8}){0,3}"
        .prop_map(|name| name.chars().take(40).collect::<String>())
        .prop_filter("not a keyword", |name| !is_rust_keyword(name))
}

/// An event name in one of the spellings gpkit accepts. A one-letter word
/// followed by another (`a_b_c`, camelCase `aBC`) is refused: its spellings
/// do not convert into one another.
fn event_name() -> impl Strategy<Value = String> {
    let unambiguous = |snake: &String| {
        let words: Vec<&str> = snake.split('_').collect();
        !words.windows(2).any(|pair| pair[0].len() == 1)
    };
    (
        snake_name().prop_filter("spellings agree", unambiguous),
        0..4u8,
    )
        .prop_map(|(snake, spelling)| match spelling {
            0 => snake,
            1 => snake.replace('_', "-"),
            2 => camel(&snake, false),
            _ => camel(&snake, true),
        })
}

fn camel(snake: &str, upper_first: bool) -> String {
    let mut out = String::new();
    for (i, word) in snake.split('_').enumerate() {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            if i == 0 && !upper_first {
                out.push(first);
            } else {
                out.extend(first.to_uppercase());
            }
            out.extend(chars);
        }
    }
    out
}

/// One `add event` call: an event and zero to two listeners.
fn call() -> impl Strategy<Value = (String, Vec<String>)> {
    (event_name(), prop::collection::vec(snake_name(), 0..3))
}

#[test]
fn any_sequence_of_add_event_calls_leaves_the_project_fmt_clean() {
    let mut runner = TestRunner::new(Config {
        // More with PROPTEST_CASES=<n>.
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(24),
        failure_persistence: None,
        ..Config::default()
    });
    let calls = prop::collection::vec(call(), 1..6);
    runner
        .run(&calls, |calls| {
            let dir = tempfile::tempdir().unwrap();
            let project = new_project(dir.path(), &[]);
            let mut applied = 0;
            for (event, listeners) in &calls {
                let mut cmd = gpkit(&project);
                cmd.args(["--no-input", "add", "event", event]);
                for listener in listeners {
                    cmd.args(["--listener", listener]);
                }
                let output = cmd.output().unwrap();
                // A repeated event without new listeners, or a repeated
                // listener, is refused; the project must still be clean.
                applied += usize::from(output.status.success());
            }
            let fmt = Command::new(env!("CARGO"))
                .args(["fmt", "--check"])
                .current_dir(&project)
                .output()
                .unwrap();
            prop_assert!(
                fmt.status.success(),
                "after {calls:?} ({applied} applied), `cargo fmt --check` fails:\n{}",
                String::from_utf8_lossy(&fmt.stdout)
            );
            prop_assert!(applied > 0, "no call of {calls:?} was applied");
            Ok(())
        })
        .unwrap();
}
