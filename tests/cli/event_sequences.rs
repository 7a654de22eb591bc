//! Property: any sequence of `gpkit add event` / `--listener` calls, with
//! names of every length (1 to 40) and spelling, and the flags that say how
//! the listeners run (limits, retry policy), leaves the project
//! `cargo fmt`-clean. rustfmt sorts `mod` declarations and breaks long
//! lines, so the order of additions and the names' lengths must not matter.
//!
//! Each case runs gpkit in-process (`gpkit::run`, the binary's own entry
//! point) and rustfmt on the files the calls wrote, so that hundreds of
//! cases stay cheap: 128 under CI (`CI=true`), fewer elsewhere. Every 4th
//! sequence ends with a call that adds a listener to an event an earlier
//! call created, a path random sequences rarely take. Once per run, the largest
//! sequence is replayed and the project passes `cargo fmt --check` and
//! `cargo clippy --all-targets -- -D warnings` (it compiles, warning-free),
//! with the shared target directory of the other end-to-end tests.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::Parser as _;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use gpkit::cli::Cli;
use gpkit::domain::events::EventNames;
use gpkit::domain::names::is_rust_keyword;

use crate::support::{changed_since, read_tree};

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
        .prop_map(|(snake, spelling)| spell(&snake, spelling))
}

/// `snake` in spelling `spelling`: snake_case, kebab-case, camelCase or
/// PascalCase.
fn spell(snake: &str, spelling: u8) -> String {
    match spelling % 4 {
        0 => snake.to_string(),
        1 => snake.replace('_', "-"),
        2 => camel(snake, false),
        _ => camel(snake, true),
    }
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

/// How the listeners of a call run, as `add event`'s flags say: nothing,
/// limits, a retry policy, or both (each flag set's `options()` has its own
/// width and imports).
const RUN_FLAGS: &[&[&str]] = &[
    &[],
    &[],
    &["--concurrency", "5"],
    &["--rate", "1000/m", "--burst", "20"],
    &["--retries", "3"],
    &["--timeout", "90s", "--backoff", "exponential:1s:10m"],
    &["--backoff", "exponential:500ms:1h"],
    &[
        "--concurrency",
        "2",
        "--retries",
        "0",
        "--backoff",
        "fixed:1500ms",
    ],
];

/// One `add event` call: an event, zero to two listeners, and how they run
/// (an index into [`RUN_FLAGS`]).
fn call() -> impl Strategy<Value = Call> {
    (
        event_name(),
        prop::collection::vec(snake_name(), 0..3),
        0..RUN_FLAGS.len(),
    )
        .prop_map(|(event, listeners, run)| Call {
            event,
            listeners,
            run,
        })
}

/// One `add event` call of a sequence.
#[derive(Debug, Clone)]
struct Call {
    event: String,
    listeners: Vec<String>,
    /// Its flags, in [`RUN_FLAGS`] (used only with listeners).
    run: usize,
}

/// The last call of a forced sequence: a new listener for an event an
/// earlier call created (the `event`-th of them, modulo their number),
/// named in spelling `spelling`.
#[derive(Debug, Clone)]
struct AddListener {
    event: usize,
    spelling: u8,
    listener: String,
}

/// The calls of one case.
#[derive(Debug, Clone)]
struct Sequence {
    calls: Vec<Call>,
    then: Option<AddListener>,
}

fn sequence(forced: bool) -> impl Strategy<Value = Sequence> {
    let then = (any::<usize>(), 0..4u8, snake_name()).prop_map(|(event, spelling, listener)| {
        AddListener {
            event,
            spelling,
            listener,
        }
    });
    (prop::collection::vec(call(), 1..6), then).prop_map(move |(calls, then)| Sequence {
        calls,
        then: forced.then_some(then),
    })
}

/// How many sequences: 128 under CI (each run draws new ones), 64
/// elsewhere; `PROPTEST_CASES=<n>`
/// sets it.
fn cases() -> u32 {
    if let Some(n) = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        return n;
    }
    if crate::support::in_ci() { 128 } else { 64 }
}

/// Every this many sequences, one ends with an [`AddListener`] call.
const FORCED_EVERY: u32 = 4;

/// `gpkit -C <dir> --no-input <args>`, in this process; whether it
/// succeeded.
fn run_gpkit(dir: &Path, args: &[&str]) -> bool {
    let mut argv = vec!["gpkit", "-C", dir.to_str().unwrap(), "--no-input"];
    argv.extend_from_slice(args);
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|err| panic!("{args:?}: {err}"));
    matches!(gpkit::run(cli), Ok(code) if code == ExitCode::SUCCESS)
}

/// A new project `shop` under `dir`, made in this process.
fn fresh_project(dir: &Path) -> PathBuf {
    assert!(run_gpkit(dir, &["new", "project", "shop"]));
    dir.join("shop")
}

/// A directory for one case's project: in memory (`/dev/shm`) where there
/// is one, since a case writes and deletes a whole project.
fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// `files` (a `read_tree` of a new project, `.gpkit/` included) written
/// as the project `shop` under `dir`: the same project as
/// [`fresh_project`] makes (`new project` is deterministic), without
/// rendering it again for every case.
fn copy_project(files: &BTreeMap<String, Vec<u8>>, dir: &Path) -> PathBuf {
    let project = dir.join("shop");
    for (path, contents) in files {
        let dest = project.join(path);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::write(dest, contents).unwrap();
    }
    project
}

/// `add event <event> --listener <l>... <flags>`; whether it succeeded.
fn add_event(project: &Path, event: &str, listeners: &[String], flags: &[&str]) -> bool {
    let mut args = vec!["add", "event", event];
    for listener in listeners {
        args.extend(["--listener", listener.as_str()]);
    }
    if !listeners.is_empty() {
        args.extend_from_slice(flags);
    }
    run_gpkit(project, &args)
}

/// What a sequence did to its project.
struct Played {
    /// How many calls were applied.
    applied: usize,
}

/// Runs `sequence` in the project: each call, then its forced last call,
/// which must be applied.
fn play(project: &Path, sequence: &Sequence) -> Result<Played, TestCaseError> {
    // The events the applied calls created, by module, with their listeners.
    let mut events: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut created = Vec::new();
    let mut applied = 0;
    for Call {
        event,
        listeners,
        run,
    } in &sequence.calls
    {
        // A repeated event without new listeners, or a repeated listener,
        // is refused; the project must still be clean.
        if add_event(project, event, listeners, RUN_FLAGS[*run]) {
            applied += 1;
            let module = EventNames::parse(event).unwrap().module;
            if !events.contains_key(&module) {
                created.push(module.clone());
            }
            events.entry(module).or_default().extend(listeners.clone());
        }
    }
    prop_assert!(applied > 0, "no call of {:?} was applied", sequence.calls);
    if let Some(then) = &sequence.then {
        let module = &created[then.event % created.len()];
        prop_assume!(!events[module].contains(&then.listener));
        let event = spell(module, then.spelling);
        prop_assert!(
            add_event(project, &event, std::slice::from_ref(&then.listener), &[]),
            "after {:?}, adding the listener `{}` to the existing event `{event}` failed",
            sequence.calls,
            then.listener
        );
        applied += 1;
        let file = format!("src/listeners/{module}/{}.rs", then.listener);
        prop_assert!(project.join(&file).is_file(), "no {file}");
    }
    Ok(Played { applied })
}

/// The edition of the package at `project`, for rustfmt.
fn edition(project: &Path) -> String {
    let manifest: toml_edit::DocumentMut = std::fs::read_to_string(project.join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    manifest["package"]["edition"].as_str().unwrap().to_string()
}

/// Whether `project` is `cargo fmt`-clean, given `fresh`, a `read_tree` of
/// the project as `new project` made it (which is clean: the replay at the
/// end runs `cargo fmt --check` on a whole project). rustfmt checks the
/// Rust files the calls changed or wrote, and the modules they declare,
/// which is all `cargo fmt` could find changed: a file no call touched is
/// as clean as it was. The message on failure is rustfmt's diff.
fn fmt_clean(project: &Path, fresh: &BTreeMap<String, Vec<u8>>) -> Result<(), String> {
    let changed: Vec<String> = changed_since(fresh, project)
        .into_keys()
        .filter(|path| path.ends_with(".rs"))
        .collect();
    if changed.is_empty() {
        return Ok(());
    }
    let output = Command::new("rustfmt")
        .args(["--check", "--edition", &edition(project)])
        .args(&changed)
        .current_dir(project)
        .output()
        .unwrap();
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

#[test]
#[ignore = "builds a generated project"]
fn any_sequence_of_add_event_calls_leaves_the_project_fmt_clean() {
    let fresh = {
        let dir = scratch_dir();
        read_tree(&fresh_project(dir.path()), &[])
    };
    let started = std::time::Instant::now();
    let total = cases();
    let adding = total / FORCED_EVERY;
    // The sequence with the most applied calls, for the build below.
    let largest: RefCell<Option<(usize, Sequence)>> = RefCell::new(None);
    for (forced, cases) in [(false, total - adding), (true, adding)] {
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&sequence(forced), |sequence| {
                let dir = scratch_dir();
                let project = copy_project(&fresh, dir.path());
                let played = play(&project, &sequence)?;
                if let Err(diff) = fmt_clean(&project, &fresh) {
                    return Err(TestCaseError::fail(format!(
                        "after {sequence:?} ({} applied), the project is not fmt-clean:\n{diff}",
                        played.applied
                    )));
                }
                let mut largest = largest.borrow_mut();
                if largest.as_ref().is_none_or(|(n, _)| played.applied > *n) {
                    *largest = Some((played.applied, sequence));
                }
                Ok(())
            })
            .unwrap();
    }

    eprintln!(
        "{total} sequences ({adding} adding a listener to an existing event) in {:.1?}",
        started.elapsed()
    );

    // The largest sequence, replayed: the whole project is fmt-clean and
    // builds without a warning or a lint.
    let (_, sequence) = largest.into_inner().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let project = fresh_project(dir.path());
    play(&project, &sequence).unwrap();
    // Every form of `options()` is compiled, whatever the sequence drew.
    for (i, flags) in RUN_FLAGS.iter().enumerate() {
        let listener = format!("runs_{i}");
        assert!(
            add_event(&project, "flagsChecked", &[listener], flags),
            "add event flagsChecked {flags:?}"
        );
    }
    let fmt = Command::new(env!("CARGO"))
        .args(["fmt", "--check"])
        .current_dir(&project)
        .output()
        .unwrap();
    assert!(
        fmt.status.success(),
        "after {sequence:?}, `cargo fmt --check` fails:\n{}",
        String::from_utf8_lossy(&fmt.stdout)
    );
    let built = std::time::Instant::now();
    crate::e2e::lint(&project);
    eprintln!(
        "the largest sequence's project checked in {:.1?}",
        built.elapsed()
    );
}
