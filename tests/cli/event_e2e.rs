//! The whole path of an event, end to end: generate a project, add the
//! worker, add an event with two listeners ordered by its order id,
//! migrate, dispatch the event inside a transaction through the generated
//! code, run the worker, and see each listener run exactly once with the
//! typed payload and the envelope id; a rolled-back dispatch runs no
//! listener.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::e2e::{Database, build_binaries, cargo, lint, migrate, psql};
use crate::support::gpkit;
use crate::worker_e2e::{RedisServer, Worker, wait_until};

/// What the test's listeners do: record each run in `listener_runs`.
pub(crate) fn listener_body(listener: &str) -> String {
    format!(
        r#"//! `{listener}`: a listener of `orderPlaced`, filled in by the test.

use crate::events::order_placed::OrderPlaced;
use kit::worker::listeners::{{ListenerContext, ListenerError}};

/// Records the run, with the event id and the typed payload.
pub async fn handle(event: OrderPlaced, ctx: ListenerContext) -> Result<(), ListenerError> {{
    sqlx::query(
        "INSERT INTO listener_runs (listener, event_id, order_id, note) VALUES ($1, $2, $3, $4)",
    )
    .bind("{listener}")
    .bind(ctx.event_id())
    .bind(event.order_id)
    .bind(&event.note)
    .execute(ctx.pool())
    .await?;
    Ok(())
}}
"#
    )
}

/// A program that dispatches one event in a committed transaction and one
/// in a rolled-back one, as a request handler would.
const DISPATCH_DEMO: &str = r#"//! Dispatches `orderPlaced` twice: once committed, once rolled back.

use kit::Transactor;
use shop::events::order_placed::OrderPlaced;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let pool = sqlx::PgPool::connect(&std::env::var("DATABASE_URL")?).await?;
    let transactor = Transactor::new(pool);
    let committed = OrderPlaced { order_id: 42, note: "first".into() };
    let envelope = transactor
        .run(async |tx| Ok::<_, anyhow::Error>(kit::dispatch(&mut *tx, &committed).await?))
        .await?;
    println!("{}", envelope.id);
    let rolled_back = OrderPlaced { order_id: 43, note: "never".into() };
    let failed: anyhow::Result<()> = transactor
        .run(async |tx| {
            kit::dispatch(&mut *tx, &rolled_back).await?;
            anyhow::bail!("payment declined")
        })
        .await;
    assert!(failed.is_err());
    Ok(())
}
"#;

/// gpkit's benchmark programs that run as binaries of a generated project
/// (each benchmark script copies its file into a project's `src/bin/` and
/// builds it there), by path in gpkit's repository. This test's project
/// builds them beside its own binaries, in the same cargo run (linted, no
/// warnings), so that a change to the kit's public API that breaks one
/// fails here, not in the next benchmark run. A new one is a line here; it
/// may use the kit with the `worker` feature and the crates of a project
/// with events (serde, sqlx, tokio, tracing, uuid, anyhow, axum).
const BENCH_SOURCES: &[&str] = &["scripts/bench/outbox_bench.rs", "scripts/bench/load_gen.rs"];

/// Copies each of [`BENCH_SOURCES`] to `src/bin/` of `project`, under its
/// own file name: built with the project's binaries, and copied with them
/// to its `.bin/`, where nothing runs it.
fn add_bench_sources(project: &Path) {
    for source in BENCH_SOURCES {
        let source = crate::support::repo().join(source);
        let dest = project.join("src/bin").join(source.file_name().unwrap());
        assert!(!dest.exists(), "{} is the project's own", dest.display());
        std::fs::copy(&source, &dest)
            .unwrap_or_else(|err| panic!("cannot copy {}: {err}", source.display()));
    }
    // What scripts/bench-outbox adds too: the benchmark names `uuid`, which
    // a project lists only when an event of its own has a uuid field.
    let manifest = project.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    if !text.lines().any(|line| line.starts_with("uuid ")) {
        let line = r#"uuid = { version = "1", features = ["v4", "v5", "v7"] }"#;
        let text = text.replacen("[dependencies]\n", &format!("[dependencies]\n{line}\n"), 1);
        std::fs::write(&manifest, text).unwrap();
    }
}

fn write(project: &Path, path: &str, text: &str) {
    let dest = project.join(path);
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::write(dest, text).unwrap();
}

#[test]
#[ignore = "builds a generated project"]
fn an_event_reaches_each_listener_exactly_once() {
    // Generate, add the worker, add the event: the project stays clean.
    let project = crate::e2e::new_shop_in("e2e-events", &["--no-worker"]);
    gpkit(&project).args(["add", "worker"]).assert().success();
    gpkit(&project)
        .args([
            "add",
            "event",
            "orderPlaced",
            "--field",
            "order_id:i64",
            "--field",
            "note:string",
        ])
        .args(["--listener", "audit", "--listener", "email"])
        .args(["--ordered-by", "order_id"])
        .assert()
        .success();
    build_binaries(&project);
    lint(&project);
    cargo(&project, &["fmt", "--check"]);

    // The user's part: a table, the listener bodies, a dispatching program.
    gpkit(&project)
        .env("SOURCE_DATE_EPOCH", "1800000000")
        .args(["new", "migration", "listener_runs"])
        .assert()
        .success();
    write(
        &project,
        "migrations/20270115080000_listener_runs.sql",
        "-- +goose Up\nCREATE TABLE listener_runs (listener text NOT NULL, event_id uuid NOT NULL, \
         order_id bigint NOT NULL, note text NOT NULL);\n\n-- +goose Down\nDROP TABLE listener_runs;\n",
    );
    for listener in ["audit", "email"] {
        // Ordered, as gpkit registered them.
        let body = listener_body(listener).replace(
            "/// Records the run",
            "/// Ordered by the order id.\n\
             pub fn options() -> kit::worker::listeners::ListenerOptions<OrderPlaced> {\n    \
             kit::worker::listeners::ListenerOptions::new().ordered()\n}\n\n/// Records the run",
        );
        write(
            &project,
            &format!("src/listeners/order_placed/{listener}.rs"),
            &body,
        );
    }
    write(&project, "src/bin/dispatch_demo.rs", DISPATCH_DEMO);
    // The benchmarks compile in the build that compiles the user's code.
    add_bench_sources(&project);
    let bins = build_binaries(&project);
    let dispatch_demo = bins.join("dispatch_demo");

    // Migrate a fresh database and dispatch.
    let db = Database::create("gpkit_events");
    migrate(&project, &db, &["up"]);
    let output = Command::new(&dispatch_demo)
        .env("DATABASE_URL", db.url())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let envelope_id = String::from_utf8(output.stdout).unwrap().trim().to_string();
    assert_eq!(
        psql(&db.url(), "SELECT event_id FROM outbox_events"),
        envelope_id,
        "only the committed event is stored"
    );

    // Run the worker until both listeners ran, then a little longer.
    let redis = RedisServer::start();
    let mut worker = Worker::start_binary(
        &bins.join("worker"),
        &db,
        &redis,
        &[("WORKER_QUEUES", "default=1")],
    );
    let runs = || {
        psql(&db.url(), "SELECT count(*) FROM listener_runs")
            .parse::<u32>()
            .unwrap()
    };
    wait_until(Duration::from_secs(60), "both listeners ran", || {
        runs() >= 2
    });
    // Settled: the event task and both listener tasks completed, nothing
    // waiting, running, scheduled, to retry or archived, so no second run
    // can still come.
    let size = |command: &str, set: &str| -> String {
        redis
            .cli(&[command, &format!("asynq:{{default}}:{set}")])
            .unwrap_or_default()
    };
    wait_until(Duration::from_secs(30), "the three tasks completed", || {
        size("ZCARD", "completed") == "3"
    });
    assert_eq!(size("LLEN", "pending"), "0");
    assert_eq!(size("LLEN", "active"), "0");
    for set in ["scheduled", "retry", "archived"] {
        assert_eq!(size("ZCARD", set), "0", "tasks in {set}");
    }
    worker.signal("-TERM");
    assert_eq!(
        worker.wait(Duration::from_secs(35)),
        Some(0),
        "{}",
        worker.log()
    );

    // The event took its key's first number, and its ordered runs left
    // nothing waiting in Valkey: the key's last number fanned out is 1.
    assert_eq!(
        psql(&db.url(), "SELECT key, seq, epoch > 0 FROM outbox_keys"),
        "order_id:42|1|t"
    );
    let epoch = psql(&db.url(), "SELECT epoch FROM outbox_keys");
    // Beside the queue, in its hash slot.
    let chains = "ordered:{default}:";
    assert_eq!(
        redis
            .cli(&["GET", &format!("{chains}fan:{epoch}:order_id:42")])
            .unwrap_or_default(),
        "1"
    );
    for (command, set) in [("HLEN", "runs"), ("ZCARD", "heads"), ("ZCARD", "waiting")] {
        assert_eq!(
            redis
                .cli(&[command, &format!("{chains}{set}")])
                .unwrap_or_default(),
            "0",
            "{set}"
        );
    }

    // Each listener exactly once, with the typed payload and the envelope id.
    assert_eq!(
        psql(
            &db.url(),
            "SELECT listener, event_id, order_id, note FROM listener_runs ORDER BY listener"
        ),
        format!("audit|{envelope_id}|42|first\nemail|{envelope_id}|42|first")
    );
    assert_eq!(
        psql(
            &db.url(),
            "SELECT count(*) FROM outbox_events WHERE published_at IS NULL"
        ),
        "0"
    );
}
