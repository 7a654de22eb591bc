//! `gpkit add event`: typed events and listeners added to fresh and to
//! hand-edited projects, every changed file snapshotted, and every refusal
//! leaving the project as it was.

use std::path::Path;

use predicates::str::contains;

use crate::support::{
    assert_tree_snapshot, changed_since, disk_state, edit, gpkit, new_project, read_tree,
};

const ORDER_PLACED: &[&str] = &[
    "add",
    "event",
    "orderPlaced",
    "--field",
    "order_id:uuid",
    "--field",
    "total_cents:i64",
    "--field",
    "note:Option<string>",
    "--listener",
    "audit",
    "--listener",
    "email",
];

#[test]
fn a_fresh_project_gets_the_event_its_listeners_and_the_dispatcher_wiring() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &[]);

    let before = read_tree(&project, &[".gpkit"]);
    gpkit(&project)
        .args(ORDER_PLACED)
        .assert()
        .success()
        .stderr(contains("Added the event `orderPlaced`."));
    let changed = changed_since(&before, &project);

    assert_tree_snapshot("add-event/fresh", &changed);
}

#[test]
fn a_hand_edited_project_keeps_every_edit() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &[]);
    // Code around and inside the files gpkit manages regions in.
    edit(
        &project.join("src/startup.rs"),
        "    pub pool: PgPool,\n",
        "    pub pool: PgPool,\n    /// Ours: the shop's display name.\n    pub shop_name: String,\n",
    );
    edit(
        &project.join("src/startup.rs"),
        "            pool,\n        };",
        "            pool,\n            shop_name: \"Ours\".into(),\n        };",
    );
    edit(
        &project.join("src/lib.rs"),
        "// gpkit:end modules\n",
        "// gpkit:end modules\n\npub mod pricing;\n",
    );
    std::fs::write(
        project.join("src/pricing.rs"),
        "//! Ours.\n\npub const VAT_PERCENT: u32 = 20;\n",
    )
    .unwrap();
    edit(
        &project.join("src/listeners/mod.rs"),
        "    // Keeps the parameter in use",
        "    // Ours: listeners registered by hand go here.\n    // Keeps the parameter in use",
    );

    let before = read_tree(&project, &[".gpkit"]);
    gpkit(&project).args(ORDER_PLACED).assert().success();
    let changed = changed_since(&before, &project);

    assert_tree_snapshot("add-event/edited", &changed);
    let startup = String::from_utf8(changed["src/startup.rs"].clone()).unwrap();
    assert!(
        startup.contains("pub shop_name: String,")
            && startup.contains("shop_name: \"Ours\".into(),")
    );
    assert!(startup.contains("pub transactor: kit::Transactor,"));
}

#[test]
fn adding_a_listener_to_an_existing_event_adds_just_the_listener() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &[]);
    gpkit(&project).args(ORDER_PLACED).assert().success();

    let before = read_tree(&project, &[".gpkit"]);
    gpkit(&project)
        .args(["add", "event", "OrderPlaced", "--listener", "shipping"])
        .assert()
        .success();
    let changed = changed_since(&before, &project);

    let paths: Vec<&String> = changed.keys().collect();
    assert_eq!(
        paths,
        [
            "gpkit.toml",
            "src/listeners/mod.rs",
            "src/listeners/order_placed/mod.rs",
            "src/listeners/order_placed/shipping.rs",
            "tests/listeners/main.rs",
            "tests/listeners/order_placed_shipping.rs"
        ]
    );
}

#[test]
fn ordered_listeners_are_registered_in_order_of_the_events_key() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &[]);
    gpkit(&project)
        .args(["add", "event", "orderCancelled", "--field", "order_id:uuid"])
        .args(["--listener", "shipping", "--ordered-by", "order_id"])
        .assert()
        .success();
    gpkit(&project)
        .args(["add", "event", "orderCancelled", "--listener", "refund"])
        .args(["--ordered-by", "order_id"])
        .assert()
        .success();
    gpkit(&project)
        .args(["add", "event", "orderCancelled", "--listener", "audit"])
        .assert()
        .success();

    let event = std::fs::read_to_string(project.join("src/events/order_cancelled.rs")).unwrap();
    assert!(
        event.contains(
            "    fn order_key(&self) -> Option<String> {\n        \
             Some(format!(\"order_id:{}\", self.order_id))\n    }"
        ),
        "{event}"
    );
    let registry = std::fs::read_to_string(project.join("src/listeners/mod.rs")).unwrap();
    for ordered in ["shipping", "refund"] {
        assert!(
            registry.contains(&format!(
                "    listeners.listen_with(\n        \"{ordered}\",\n        \
                 order_cancelled::{ordered}::options(),\n        \
                 order_cancelled::{ordered}::handle,\n    );"
            )),
            "{registry}"
        );
        let listener = std::fs::read_to_string(
            project.join(format!("src/listeners/order_cancelled/{ordered}.rs")),
        )
        .unwrap();
        assert!(
            listener.contains(
                "pub fn options() -> ListenerOptions<OrderCancelled> {\n    \
                 ListenerOptions::new().ordered()\n}"
            ),
            "{listener}"
        );
    }
    assert!(
        registry.contains("    listeners.listen(\"audit\", order_cancelled::audit::handle);"),
        "{registry}"
    );
    // Limits: in the listener's own `options()`, formatted as rustfmt would.
    gpkit(&project)
        .args(["add", "event", "orderCancelled", "--listener", "email"])
        .args(["--concurrency", "5", "--rate", "10/s", "--burst", "20"])
        .assert()
        .success();
    let email =
        std::fs::read_to_string(project.join("src/listeners/order_cancelled/email.rs")).unwrap();
    assert!(
        email.contains(
            "pub fn options() -> ListenerOptions<OrderCancelled> {\n    \
             ListenerOptions::new()\n        .concurrency(5)\n        \
             .rate(Rate::per_second(10).with_burst(20))\n}"
        ),
        "{email}"
    );
    assert_refused(
        &project,
        &[
            "add",
            "event",
            "orderCancelled",
            "--listener",
            "sms",
            "--rate",
            "10/d",
        ],
        "`--rate 10/d`: `d` is not a period",
    );
    assert_refused(
        &project,
        &[
            "add",
            "event",
            "orderCancelled",
            "--listener",
            "sms",
            "--concurrency",
            "0",
        ],
        "`--concurrency 0` would never run the listener",
    );
    // A retry policy: after the limits, with `Duration` imported for it.
    gpkit(&project)
        .args(["add", "event", "orderCancelled", "--listener", "charge"])
        .args([
            "--retries",
            "3",
            "--timeout",
            "60s",
            "--backoff",
            "fixed:20s",
        ])
        .assert()
        .success();
    let charge =
        std::fs::read_to_string(project.join("src/listeners/order_cancelled/charge.rs")).unwrap();
    assert!(
        charge.contains("use std::time::Duration;\n\nuse kit::prelude::*;"),
        "{charge}"
    );
    assert!(
        charge.contains(
            "/// How the worker runs it: at most 3 retries, 20 seconds apart; each run\n\
             /// stopped after 1 minute. `WORKER_RETRIES` overrides its retries at deploy\n\
             /// time.\n\
             pub fn options() -> ListenerOptions<OrderCancelled> {\n    \
             ListenerOptions::new()\n        .retries(3)\n        \
             .timeout(Duration::from_secs(60))\n        \
             .backoff(Backoff::fixed(Duration::from_secs(20)))\n}"
        ),
        "{charge}"
    );
    for (flag, value, message) in [
        ("--timeout", "10", "`--timeout 10` has no unit"),
        ("--backoff", "linear", "`--backoff linear` is not a backoff"),
        (
            "--backoff",
            "exponential:1m:1s",
            "the most, 1 second, is less than the first delay, 1 minute",
        ),
    ] {
        assert_refused(
            &project,
            &[
                "add",
                "event",
                "orderCancelled",
                "--listener",
                "sms",
                flag,
                value,
            ],
            message,
        );
    }
    assert_refused(
        &project,
        &["add", "event", "orderCancelled", "--retries", "2"],
        "say how the listeners given with them run, and none is given",
    );
    let manifest = std::fs::read_to_string(project.join("gpkit.toml")).unwrap();
    assert!(manifest.contains("ordered_by = \"order_id\""), "{manifest}");
    assert!(
        manifest.contains("retries = 3\ntimeout = \"60s\"\nbackoff = \"fixed:20s\""),
        "{manifest}"
    );
}

/// Runs `args` in `project` and checks it fails with `message` (and a
/// `help:` line) and changes nothing.
fn assert_refused(project: &Path, args: &[&str], message: &str) {
    let before = read_tree(project, &[]);
    let output = gpkit(project).args(args).output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(
        stderr.contains(message),
        "{args:?}: expected {message:?} in:\n{stderr}"
    );
    assert!(stderr.contains("help:"), "{args:?}: no help in:\n{stderr}");
    assert_eq!(
        read_tree(project, &[]),
        before,
        "{args:?} changed the project"
    );
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &[]);
    gpkit(&project)
        .args(["add", "event", "orderPlaced"])
        .assert()
        .success();

    assert_refused(
        &project,
        &["add", "event", "order_placed"],
        "the event `orderPlaced` already exists",
    );
    assert_refused(&project, &["add", "event", "match"], "is a Rust keyword");
    assert_refused(
        &project,
        &["add", "event", "order placed"],
        "is not a valid event name",
    );
    assert_refused(
        &project,
        &["add", "event", "shipped", "--field", "at:instant"],
        "`instant` is not a field type",
    );
    assert_refused(
        &project,
        &["add", "event", "shipped", "--field", "type:string"],
        "is a Rust keyword",
    );
    assert_refused(
        &project,
        &["add", "event", "shipped", "--listener", "Audit"],
        "snake_case",
    );
    assert_refused(
        &project,
        &[
            "add", "event", "shipped", "--field", "a:i32", "--field", "a:i64",
        ],
        "given twice",
    );
    assert_refused(
        &project,
        &[
            "add",
            "event",
            "orderPlaced",
            "--field",
            "a:i32",
            "--listener",
            "x",
        ],
        "its fields are yours to edit",
    );
    let ordered = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut args = vec!["add", "event", "shipped", "--field", "order_id:i64"];
        args.extend_from_slice(extra);
        args
    };
    assert_refused(
        &project,
        &ordered(&["--ordered-by", "order_id"]),
        "say how the listeners given with them run, and none is given",
    );
    assert_refused(
        &project,
        &ordered(&["--listener", "x", "--ordered-by", "orderid"]),
        "`--ordered-by orderid` names no field of the event (its fields: order_id)",
    );
    assert_refused(
        &project,
        &[
            "add",
            "event",
            "shipped",
            "--field",
            "at:Option<i64>",
            "--listener",
            "x",
            "--ordered-by",
            "at",
        ],
        "a field of type `Option<i64>` cannot key an order",
    );
    // `orderPlaced` exists without an order key: a listener cannot be
    // ordered by one now (the event's file is the user's).
    assert_refused(
        &project,
        &[
            "add",
            "event",
            "orderPlaced",
            "--listener",
            "x",
            "--ordered-by",
            "id",
        ],
        "`orderPlaced` cannot order listeners by `id`: it has no order key",
    );
    // A module of the user's where the event's module would go.
    std::fs::write(project.join("src/events/refunded.rs"), "//! Ours.\n").unwrap();
    assert_refused(
        &project,
        &["add", "event", "refunded"],
        "`src/events/refunded.rs` already exists and gpkit did not write it",
    );
}

#[test]
fn listeners_need_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &["--no-worker"]);
    assert_refused(
        &project,
        &["add", "event", "orderPlaced", "--listener", "audit"],
        "run `gpkit add worker` first",
    );
}

#[test]
fn a_missing_region_stops_it_with_the_code_to_restore() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &[]);
    edit(
        &project.join("src/startup.rs"),
        "    // gpkit:begin state-fields\n    // gpkit:end state-fields\n",
        "",
    );

    assert_refused(
        &project,
        &["add", "event", "orderPlaced"],
        "`src/startup.rs`: the gpkit region `state-fields` is gone",
    );
    let output = gpkit(&project)
        .args(["add", "event", "orderPlaced"])
        .output()
        .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("pub transactor: kit::Transactor,"),
        "{stderr}"
    );
}

#[test]
fn dry_run_shows_every_change_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &[]);
    let before = disk_state(&project, &[]);

    let output = gpkit(&project)
        .arg("--dry-run")
        .arg("--diff")
        .args(ORDER_PLACED)
        .output()
        .unwrap();

    let text = String::from_utf8(output.stdout).unwrap();
    assert!(output.status.success());
    for path in [
        "src/events/order_placed.rs",
        "src/listeners/order_placed/audit.rs",
        "src/startup.rs",
        "src/events/mod.rs",
    ] {
        assert!(
            text.contains(&format!("b/{path}\n")),
            "no diff for {path}:\n{text}"
        );
    }
    assert!(
        text.contains("+    pub transactor: kit::Transactor,"),
        "{text}"
    );
    assert_eq!(disk_state(&project, &[]), before);
}
