//! `gpkit add schedule`: the files it writes (snapshotted), its refusals
//! (each leaving the project as it was), and the generated scheduler as
//! worker processes against real Postgres and a Redis server of the test's
//! own: three replicas enqueue each tick once, over the whole time they
//! run and with no tick from before the first start; event ticks wake the
//! relay; a SIGKILLed leader is replaced within the lease TTL (with
//! `--catch-up`, no tick lost); and a leader paused past its lease is
//! replaced no sooner than the lease ends and enqueues nothing when it
//! resumes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use predicates::str::contains;

use crate::e2e::{Database, build_binaries, cargo, lint, migrate, psql};
use crate::support::{assert_tree_snapshot, changed_since, gpkit, new_project, read_tree};
use crate::worker_e2e::{RedisServer, Worker, wait_until};

#[test]
fn add_schedule_writes_the_schedule_and_registers_it() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &[]);
    gpkit(&project)
        .args(["add", "event", "reportDue", "--field", "day:string"])
        .assert()
        .success();

    let before = read_tree(&project, &[".gpkit"]);
    gpkit(&project)
        .args([
            "add",
            "schedule",
            "nightly_report",
            "--cron",
            "30 2 * * *",
            "--tz",
            "Europe/Paris",
            "--event",
            "reportDue",
        ])
        .assert()
        .success()
        .stderr(contains(
            "Added the schedule `nightly_report`: it dispatches `reportDue` on `30 2 * * *` \
             (Europe/Paris time).",
        ));
    gpkit(&project)
        .args([
            "add",
            "schedule",
            "heartbeat",
            "--cron",
            "@every 30s",
            "--job",
            "--catch-up",
            "3",
        ])
        .assert()
        .success()
        .stderr(contains("it runs the job `job:heartbeat`"));
    let changed = changed_since(&before, &project);

    assert_tree_snapshot("add-schedule/fresh", &changed);
}

/// Runs gpkit with `args`, expecting exit `code` and `message` with a
/// `help:` on stderr, and the project unchanged.
fn assert_refused(project: &Path, args: &[&str], code: i32, message: &str) -> String {
    let before = read_tree(project, &[]);
    let output = gpkit(project).args(args).output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
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
    stderr
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &[]);
    gpkit(&project)
        .args(["add", "schedule", "beat", "--cron", "@hourly", "--job"])
        .assert()
        .success();

    assert_refused(
        &project,
        &["add", "schedule", "beat", "--cron", "@daily", "--job"],
        1,
        "the schedule `beat` already exists",
    );
    assert_refused(
        &project,
        &[
            "add",
            "schedule",
            "report",
            "--cron",
            "@daily",
            "--event",
            "reportDue",
        ],
        1,
        "add it first with `gpkit add event reportDue`",
    );
    let stderr = assert_refused(
        &project,
        &["add", "schedule", "report", "--cron", "0 2 32 * *", "--job"],
        2,
        "the day-of-month field `32` is not valid",
    );
    assert!(
        stderr.contains("    0 2 32 * *\n        ^^\n"),
        "no caret under the field:\n{stderr}"
    );
    assert_refused(
        &project,
        &[
            "add", "schedule", "report", "--cron", "@daily", "--job", "--tz", "Paris",
        ],
        1,
        "such as `Europe/Paris`",
    );
    assert_refused(
        &project,
        &["add", "schedule", "Report", "--cron", "@daily", "--job"],
        1,
        "not a valid schedule name",
    );
    // Neither --event nor --job: clap says which is needed.
    let output = gpkit(&project)
        .args(["add", "schedule", "report", "--cron", "@daily"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--event <EVENT>|--job"));
}

#[test]
fn a_project_without_the_worker_is_told_to_add_it() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &["--no-worker"]);
    assert_refused(
        &project,
        &["add", "schedule", "beat", "--cron", "@hourly", "--job"],
        1,
        "run `gpkit add worker` first",
    );
}

#[test]
fn dry_run_prints_the_plan_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &[]);
    let before = read_tree(&project, &[]);
    let output = gpkit(&project)
        .args([
            "--dry-run",
            "add",
            "schedule",
            "beat",
            "--cron",
            "@hourly",
            "--job",
        ])
        .output()
        .unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("src/schedules/beat.rs"), "{stdout}");
    assert!(
        stdout.contains("Nothing was written (--dry-run)."),
        "{stdout}"
    );
    assert_eq!(read_tree(&project, &[]), before);
}

/// The lease TTL the process tests run with. The leader renews every third
/// of it, so a replica stalled for two thirds of it loses the lease: 3 s
/// was too little on a busy 2-core CI machine, where a second replica once
/// took over in the middle of the three-replica window.
const LEASE_TTL: Duration = Duration::from_secs(6);

/// A project with three schedules ticking every second: `beat` (a job,
/// missed ticks skipped), `catch_up_beat` (a job, `--catch-up 30`) and
/// `beat_event` (the event `beaten`, through the outbox); generated, checked
/// (clippy, fmt, its own tests) and built once per test run.
///
/// Named `shop`, as the other tests' projects of the same options are, so
/// that its kit is the build of theirs (see `e2e::cargo_lock`).
pub(crate) fn scheduled_project() -> &'static Path {
    static PROJECT: OnceLock<PathBuf> = OnceLock::new();
    PROJECT.get_or_init(|| {
        let project = crate::e2e::new_shop_in("e2e-schedule", &[]);
        for args in [
            &["add", "event", "beaten"][..],
            &["add", "schedule", "beat", "--cron", "@every 1s", "--job"],
            &[
                "add",
                "schedule",
                "catch_up_beat",
                "--cron",
                "* * * * * *",
                "--job",
                "--catch-up",
                "30",
            ],
            &[
                "add",
                "schedule",
                "beat_event",
                "--cron",
                "@every 1s",
                "--event",
                "beaten",
            ],
        ] {
            gpkit(&project).args(args).assert().success();
        }
        build_binaries(&project);
        project
    })
}

#[test]
#[ignore = "builds a generated project"]
fn a_project_with_schedules_builds_cleanly_and_passes_its_tests() {
    let project = scheduled_project();
    lint(project);
    cargo(project, &["fmt", "--check"]);
    cargo(project, &["test"]);
}

/// One `scheduler: tick enqueued` log line.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Enqueued {
    schedule: String,
    tick: String,
    tick_id: String,
    new: bool,
}

/// The log lines of one worker: enqueues, job runs (schedule, tick id),
/// and when it took the lead (seconds since the epoch, from the log's
/// timestamps).
#[derive(Debug, Default)]
struct Log {
    enqueued: Vec<Enqueued>,
    runs: Vec<(String, String)>,
    led: Vec<f64>,
}

/// Seconds since the epoch of a JSON log line's `timestamp` (RFC 3339).
fn logged_at(json: &serde_json::Value) -> f64 {
    let text = json["timestamp"].as_str().unwrap_or_default();
    let at = chrono::DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|err| panic!("not a log timestamp: {text:?}: {err}"));
    at.timestamp_micros() as f64 / 1e6
}

/// Seconds since the epoch, now.
fn now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn parse_log(text: &str) -> Log {
    let mut log = Log::default();
    for line in text.lines() {
        let Ok(json) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let fields = &json["fields"];
        let field = |name: &str| fields[name].as_str().unwrap_or_default().to_string();
        let message = field("message");
        if message == "scheduler: tick enqueued" {
            log.enqueued.push(Enqueued {
                schedule: field("schedule"),
                tick: field("tick"),
                tick_id: field("tick_id"),
                new: fields["new"].as_bool().unwrap_or_default(),
            });
        } else if message == "scheduler: this replica leads" {
            log.led.push(logged_at(&json));
        } else if let Some(span) = json["span"].as_object()
            && span.get("name").and_then(|n| n.as_str()) == Some("job")
            && ["beat", "catch_up_beat"].contains(&message.as_str())
        {
            log.runs
                .push((message, span["tick_id"].as_str().unwrap_or_default().into()));
        }
    }
    log
}

/// Seconds since the epoch of a tick as the log prints it (chrono's
/// `Display`: `2026-01-01 00:00:01 UTC`).
fn tick_seconds(tick: &str) -> i64 {
    chrono::NaiveDateTime::parse_from_str(tick, "%Y-%m-%d %H:%M:%S UTC")
        .unwrap_or_else(|err| panic!("not a tick time: {tick:?}: {err}"))
        .and_utc()
        .timestamp()
}

/// The ticks of `schedule` enqueued as new, in order, and how many times
/// each was enqueued as new or tried again, over all `logs`.
fn ticks_of(logs: &[Log], schedule: &str) -> (Vec<i64>, BTreeMap<i64, usize>) {
    let mut tries = BTreeMap::new();
    let mut new = BTreeSet::new();
    for entry in logs.iter().flat_map(|l| &l.enqueued) {
        if entry.schedule != schedule {
            continue;
        }
        let at = tick_seconds(&entry.tick);
        *tries.entry(at).or_insert(0) += 1;
        if entry.new {
            new.insert(at);
        }
    }
    (new.into_iter().collect(), tries)
}

/// The task ids of `job:<schedule>` in the queue `idle`.
fn job_task_ids(redis: &RedisServer, schedule: &str) -> BTreeSet<String> {
    let keys = redis
        .cli(&["--scan", "--pattern", "asynq:{idle}:t:*"])
        .unwrap_or_default();
    keys.lines()
        .filter(|key| {
            redis
                .cli(&["HGET", key, "msg"])
                .is_some_and(|msg| msg.contains(&format!("job:{schedule}\u{12}")))
        })
        .map(|key| key.rsplit(':').next().unwrap().to_string())
        .collect()
}

/// How many times each tick of `schedule` was enqueued as new, over all
/// No tick of the job `schedule` ran twice over `logs`, which hold at least
/// one run of it (none parsed would prove nothing: a changed run line).
fn assert_no_tick_ran_twice(logs: &[Log], schedule: &str) {
    let runs: Vec<&String> = logs
        .iter()
        .flat_map(|l| &l.runs)
        .filter(|(name, _)| name == schedule)
        .map(|(_, id)| id)
        .collect();
    assert!(
        !runs.is_empty(),
        "{schedule}: no run of it in the workers' logs (has the run line changed?)"
    );
    let distinct: BTreeSet<&String> = runs.iter().copied().collect();
    assert_eq!(runs.len(), distinct.len(), "{schedule}: a tick ran twice");
}

/// `logs`: a tick enqueued twice is a tick some listener or job gets twice.
fn new_counts(logs: &[Log], schedule: &str) -> BTreeMap<i64, usize> {
    let mut counts = BTreeMap::new();
    for entry in logs.iter().flat_map(|l| &l.enqueued) {
        if entry.schedule == schedule && entry.new {
            *counts.entry(tick_seconds(&entry.tick)).or_insert(0) += 1;
        }
    }
    counts
}

/// Every tick of `schedule` was enqueued as new exactly once.
fn assert_each_tick_new_once(logs: &[Log], schedule: &str) {
    let twice: Vec<(i64, usize)> = new_counts(logs, schedule)
        .into_iter()
        .filter(|&(_, n)| n > 1)
        .collect();
    assert!(
        twice.is_empty(),
        "{schedule}: ticks enqueued as new twice: {twice:?}"
    );
}

/// The ticks (every second) cover the window from `from` to `to` (seconds
/// since the epoch): the first is due within one period after `from`, and
/// none before it (no tick from before the window, such as a catch-up on a
/// first start); the last is due within one period, and the time it takes
/// to enqueue (0.5 s), before `to`.
fn assert_covers(ticks: &[i64], from: f64, to: f64, what: &str) {
    let (Some(&first), Some(&last)) = (ticks.first(), ticks.last()) else {
        panic!("{what}: no tick");
    };
    let (first, last) = (first as f64, last as f64);
    eprintln!(
        "{what}: first tick {:+.2} s after the window opens, last {:+.2} s before it closes",
        first - from,
        to - last
    );
    assert!(
        first > from - 1.0 && first <= from + 1.0,
        "{what}: the first tick is {:.2} s after the window opens",
        first - from
    );
    assert!(
        to - last <= 1.5,
        "{what}: the last tick is {:.2} s before the window closes",
        to - last
    );
}

/// Waits until each of `schedules` has at least `count` ticks enqueued as
/// new in `workers`' logs, more than it had in `before`.
fn wait_for_new_ticks(workers: &[Worker], schedules: &[&str], count: usize, before: &[Log]) {
    wait_until(
        Duration::from_secs(count as u64 * 3 + 10),
        &format!("{count} more ticks of {schedules:?}"),
        || {
            let logs: Vec<Log> = workers.iter().map(|w| parse_log(&w.log())).collect();
            schedules.iter().all(|schedule| {
                ticks_of(&logs, schedule).0.len() >= ticks_of(before, schedule).0.len() + count
            })
        },
    );
}

/// `ticks` has no hole: consecutive seconds.
fn assert_consecutive(ticks: &[i64], what: &str) {
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            1,
            "{what}: a tick is missing in {ticks:?}"
        );
    }
}

fn start_workers(
    db: &Database,
    redis: &RedisServer,
    count: usize,
    env: &[(&str, &str)],
) -> Vec<Worker> {
    let bin = scheduled_project().join(".bin/worker");
    let ttl = format!("{}s", LEASE_TTL.as_secs());
    let mut env = env.to_vec();
    env.extend([
        ("SCHEDULER_LEASE_TTL", ttl.as_str()),
        ("OUTBOX_QUEUES", "events"),
    ]);
    (0..count)
        .map(|_| Worker::start_binary(&bin, db, redis, &env))
        .collect()
}

/// Stops `workers` with SIGTERM, the leader `leader` last: a stopping
/// leader hands its lease back, and a follower still running would take it
/// over for the last moments (as it should in a rolling restart), which
/// would blur what these tests measure. Returns when the leader was
/// signalled (seconds since the epoch): the end of the window it led.
fn stop_leader_last(workers: &mut [Worker], leader: usize) -> f64 {
    let order: Vec<usize> = (0..workers.len())
        .filter(|&i| i != leader)
        .chain([leader])
        .collect();
    let mut stopped_at = 0.0;
    for i in order {
        stopped_at = now_seconds();
        workers[i].signal("-TERM");
        assert_eq!(workers[i].wait(Duration::from_secs(10)), Some(0));
    }
    stopped_at
}

fn migrated_database() -> Database {
    let db = Database::create("gpkit_schedule");
    migrate(scheduled_project(), &db, &["up"]);
    db
}

/// The index of the worker that leads, once one does.
fn leader(workers: &[Worker]) -> usize {
    let mut found = None;
    wait_until(Duration::from_secs(20), "a replica leads", || {
        found = workers
            .iter()
            .position(|w| !parse_log(&w.log()).led.is_empty());
        found.is_some()
    });
    found.unwrap()
}

/// The schedules of [`scheduled_project`].
const SCHEDULES: [&str; 3] = ["beat", "catch_up_beat", "beat_event"];

fn logs_of(workers: &[Worker]) -> Vec<Log> {
    workers.iter().map(|w| parse_log(&w.log())).collect()
}

/// Each worker's scheduler log lines but its enqueues (the lease's story:
/// when it led, lost the lead, failed to renew), for a failure message.
fn lease_story(workers: &[Worker]) -> String {
    let mut story = String::new();
    for (index, worker) in workers.iter().enumerate() {
        story.push_str(&format!("--- replica {index}\n"));
        for line in worker.log().lines() {
            let Ok(json) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let message = json["fields"]["message"].as_str().unwrap_or_default();
            if message.starts_with("scheduler:") && message != "scheduler: tick enqueued" {
                story.push_str(line);
                story.push('\n');
            }
        }
    }
    story
}

/// Of `workers` (their `logs`), one took the lead once, and kept it.
fn assert_one_leader(logs: &[Log], workers: &[Worker]) {
    assert_eq!(
        logs.iter().map(|l| l.led.len()).sum::<usize>(),
        1,
        "one replica led throughout:\n{}",
        lease_story(workers)
    );
}

/// The lease key of the scheduled project: the kit names the service after
/// its own package, `shop-kit`.
const LEASE_KEY: &str = "scheduler:{shop-kit}:leader";

#[test]
#[ignore = "builds a generated project"]
fn three_replicas_enqueue_every_tick_exactly_once_over_the_whole_window() {
    let db = migrated_database();
    let redis = RedisServer::start();
    // The relays poll once a minute: only the event ticks' wake-ups can
    // publish them within the second the test allows.
    let mut workers = start_workers(&db, &redis, 3, &[("OUTBOX_POLL_INTERVAL", "60s")]);
    let first = leader(&workers);
    wait_for_new_ticks(&workers, &SCHEDULES, 10, &[]);
    let stopped_at = stop_leader_last(&mut workers, first);
    let logs = logs_of(&workers);
    assert_one_leader(&logs, &workers);
    let led_at = logs[first].led[0];

    for schedule in SCHEDULES {
        let (ticks, tries) = ticks_of(&logs, schedule);
        let duplicates = tries.values().filter(|&&n| n > 1).count();
        eprintln!(
            "{schedule}: {} ticks enqueued by 3 replicas, {duplicates} enqueued twice",
            ticks.len()
        );
        assert!(ticks.len() >= 10, "{schedule}: only {} ticks", ticks.len());
        assert_eq!(duplicates, 0, "{schedule}: {tries:?}");
        assert_each_tick_new_once(&logs, schedule);
        assert_consecutive(&ticks, schedule);
        // No catch-up on a first start: nothing before the leader began.
        assert_covers(&ticks, led_at, stopped_at, schedule);
    }
    // The ids: one task per tick in the queue, one outbox row per tick,
    // each the id the log reported.
    for schedule in ["beat", "catch_up_beat"] {
        let logged: BTreeSet<String> = logs
            .iter()
            .flat_map(|l| &l.enqueued)
            .filter(|e| e.schedule == schedule)
            .map(|e| e.tick_id.clone())
            .collect();
        assert_eq!(job_task_ids(&redis, schedule), logged, "{schedule}");
        assert_no_tick_ran_twice(&logs, schedule);
    }
    let rows = psql(
        &db.url(),
        "SELECT event_id FROM outbox_events WHERE event_name = 'beaten' ORDER BY event_id",
    );
    let rows: BTreeSet<String> = rows.lines().map(str::to_string).collect();
    let logged: BTreeSet<String> = logs
        .iter()
        .flat_map(|l| &l.enqueued)
        .filter(|e| e.schedule == "beat_event")
        .map(|e| e.tick_id.clone())
        .collect();
    assert_eq!(rows, logged, "one outbox row per event tick, with its id");

    // Event ticks wake the relay: each was published within a second of
    // its commit (but the last, which the stop may have left to the next
    // worker), though the relay polled only once in the whole run.
    let lags = psql(
        &db.url(),
        "SELECT coalesce(extract(epoch FROM published_at - created_at)::text, 'unpublished') \
         FROM outbox_events WHERE event_name = 'beaten' ORDER BY created_at",
    );
    let lags: Vec<&str> = lags.lines().collect();
    let (_, published) = lags.split_last().expect("event ticks in the outbox");
    let slowest = published
        .iter()
        .map(|lag| {
            lag.parse::<f64>()
                .unwrap_or_else(|_| panic!("an event tick was left to the poll: {lags:?}"))
        })
        .fold(0.0, f64::max);
    eprintln!(
        "beat_event: {} ticks published, the slowest {slowest:.3} s after its commit",
        published.len()
    );
    assert!(slowest < 1.0, "an event tick waited for the poll: {lags:?}");
}

/// A tick whose enqueue waits past the lease TTL (its outbox insert stuck
/// behind a table lock held for twice the TTL) does not cost the leader its
/// lease, which is renewed on its own: no other replica takes over. The job
/// schedules, which need only Valkey, tick on meanwhile, and the event ticks
/// due meanwhile are enqueued once the insert goes through, each once.
#[test]
#[ignore = "builds a generated project"]
fn a_leader_whose_enqueue_waits_past_the_lease_ttl_keeps_the_lead() {
    let db = migrated_database();
    let redis = RedisServer::start();
    let mut workers = start_workers(&db, &redis, 2, &[("OUTBOX_POLL_INTERVAL", "60s")]);
    let first = leader(&workers);
    wait_for_new_ticks(&workers, &SCHEDULES, 2, &[]);

    // No insert into the outbox for twice the TTL: the event tick's waits.
    let hold = LEASE_TTL * 2;
    let mut lock = std::process::Command::new("psql")
        .args([&db.url(), "-v", "ON_ERROR_STOP=1", "-qc"])
        .arg(format!(
            "BEGIN; LOCK TABLE outbox_events IN EXCLUSIVE MODE; SELECT pg_sleep({}); COMMIT;",
            hold.as_secs()
        ))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(10), "the outbox is locked", || {
        psql(
            &db.url(),
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
             WHERE c.relname = 'outbox_events' AND l.mode = 'ExclusiveLock' AND l.granted",
        ) == "1"
    });
    let granted = std::time::Instant::now();
    let locked = logs_of(&workers);
    // The event ticks are counted from a second after the lock (an insert
    // that committed just before it may log its tick a moment later) to a
    // second and a half before its end: the waiting inserts commit as soon
    // as it ends, before `lock.wait()` returns on a loaded machine (seen
    // twice in CI, 2 ticks each time). No insert can commit in between.
    std::thread::sleep(Duration::from_secs(1));
    let settled = logs_of(&workers);
    std::thread::sleep(
        (granted + hold - Duration::from_millis(1500))
            .saturating_duration_since(std::time::Instant::now()),
    );
    let still_locked = logs_of(&workers);
    assert!(
        lock.wait().unwrap().success(),
        "the lock's transaction failed"
    );
    let unlocked = logs_of(&workers);
    let new_ticks =
        |schedule| ticks_of(&unlocked, schedule).0.len() - ticks_of(&locked, schedule).0.len();
    let event_ticks =
        ticks_of(&still_locked, "beat_event").0.len() - ticks_of(&settled, "beat_event").0.len();
    eprintln!(
        "while the outbox was locked for {hold:?}: {} beat, {} catch_up_beat ticks enqueued, \
         {event_ticks} beat_event ticks from a second after the lock to 1.5 s before its end",
        new_ticks("beat"),
        new_ticks("catch_up_beat"),
    );
    // One insert may have been on its way when the lock was taken.
    assert!(
        event_ticks <= 1,
        "event ticks went in while the outbox was locked: {event_ticks}"
    );
    for schedule in ["beat", "catch_up_beat"] {
        assert!(
            new_ticks(schedule) as u64 >= hold.as_secs() - 2,
            "{schedule}: {} ticks in the {hold:?} the outbox was locked",
            new_ticks(schedule)
        );
    }
    // The ticks due while it held go through, then new ones.
    wait_for_new_ticks(&workers, &SCHEDULES, 3, &locked);
    stop_leader_last(&mut workers, first);

    let logs = logs_of(&workers);
    assert_one_leader(&logs, &workers);
    for schedule in SCHEDULES {
        let (ticks, _) = ticks_of(&logs, schedule);
        assert_each_tick_new_once(&logs, schedule);
        assert_consecutive(&ticks, schedule);
    }
}

#[test]
#[ignore = "builds a generated project"]
fn a_killed_leader_is_replaced_within_the_lease_ttl_and_catch_up_loses_no_tick() {
    let db = migrated_database();
    let redis = RedisServer::start();
    let mut workers = start_workers(&db, &redis, 3, &[]);
    let first = leader(&workers);
    wait_for_new_ticks(&workers, &SCHEDULES, 3, &[]);

    workers[first].signal("-KILL");
    let killed = Instant::now();
    let mut next = None;
    wait_until(LEASE_TTL * 2, "another replica leads", || {
        next = workers
            .iter()
            .enumerate()
            .position(|(i, w)| i != first && !parse_log(&w.log()).led.is_empty());
        next.is_some()
    });
    let takeover = killed.elapsed();
    eprintln!("takeover after SIGKILL: {takeover:?} (lease TTL {LEASE_TTL:?})");
    assert!(
        takeover <= LEASE_TTL + Duration::from_millis(300),
        "takeover took {takeover:?}, past the lease TTL {LEASE_TTL:?}"
    );
    let before = logs_of(&workers);
    wait_for_new_ticks(&workers, &SCHEDULES, 3, &before);
    let next = next.unwrap();
    let mut survivors: Vec<Worker> = Vec::new();
    let mut killed_worker = None;
    for (i, worker) in workers.drain(..).enumerate() {
        if i == first {
            killed_worker = Some(worker);
        } else {
            survivors.push(worker);
        }
    }
    let next_index = if next > first { next - 1 } else { next };
    let stopped_at = stop_leader_last(&mut survivors, next_index);
    workers = survivors;
    workers.extend(killed_worker);
    let logs = logs_of(&workers);
    let led_at = logs.last().unwrap().led[0];

    for schedule in SCHEDULES {
        assert_each_tick_new_once(&logs, schedule);
    }
    // With --catch-up, the new leader enqueued the ticks no one did: no
    // hole from the first leader's start to the second's stop.
    let (caught_up, _) = ticks_of(&logs, "catch_up_beat");
    assert_consecutive(&caught_up, "catch_up_beat");
    assert_covers(&caught_up, led_at, stopped_at, "catch_up_beat");
    assert_eq!(
        job_task_ids(&redis, "catch_up_beat").len(),
        caught_up.len(),
        "one task per tick"
    );
    // Without, the ticks while no replica led are skipped.
    let (skipped, _) = ticks_of(&logs, "beat");
    let holes: i64 = skipped.windows(2).map(|p| p[1] - p[0] - 1).sum();
    eprintln!("beat (no catch-up): {holes} ticks skipped while no replica led");
    assert!(holes >= 1, "{skipped:?}");
}

#[test]
#[ignore = "builds a generated project"]
fn a_leader_paused_past_its_lease_is_replaced_when_it_ends_and_enqueues_nothing_after() {
    let db = migrated_database();
    let redis = RedisServer::start();
    let mut workers = start_workers(&db, &redis, 2, &[]);
    let first = leader(&workers);
    wait_for_new_ticks(&workers, &SCHEDULES, 2, &[]);

    workers[first].signal("-STOP");
    // The lease ends no sooner than this: its time left, read after the
    // pause, from a moment before the read.
    let read_at = now_seconds();
    let left_ms: f64 = redis
        .cli(&["PTTL", LEASE_KEY])
        .and_then(|left| left.trim().parse().ok())
        .expect("the lease key has an expiry");
    assert!(left_ms > 0.0, "the lease had run out already: {left_ms}");
    let lease_ends = read_at + left_ms / 1000.0;
    let paused_log = parse_log(&workers[first].log()).enqueued.len();
    wait_until(LEASE_TTL * 2, "the other replica leads", || {
        !parse_log(&workers[1 - first].log()).led.is_empty()
    });
    let took_over_at = parse_log(&workers[1 - first].log()).led[0];
    eprintln!(
        "takeover of a paused leader: {:+.3} s after its lease ended ({left_ms} ms left at the pause)",
        took_over_at - lease_ends
    );
    // The log's timestamps are in microseconds, the lease's in milliseconds.
    assert!(
        took_over_at >= lease_ends - 0.002,
        "the other replica took over {:.3} s before the lease ended",
        lease_ends - took_over_at
    );
    let before = logs_of(&workers);
    wait_for_new_ticks(&workers, &SCHEDULES, 2, &before);

    workers[first].signal("-CONT");
    wait_until(
        Duration::from_secs(10),
        "the resumed leader notices it lost the lease",
        || {
            let log = workers[first].log();
            log.contains("scheduler: lost the lease")
                || log.contains("scheduler: the lease ran out")
        },
    );
    let stopped_at = stop_leader_last(&mut workers, 1 - first);
    let logs = logs_of(&workers);
    assert_eq!(
        logs[first].enqueued.len(),
        paused_log,
        "the paused leader enqueued after it resumed: {:?}",
        &logs[first].enqueued[paused_log..]
    );
    for schedule in SCHEDULES {
        let (ticks, tries) = ticks_of(&logs, schedule);
        let twice: Vec<_> = tries.iter().filter(|&(_, &n)| n > 1).collect();
        eprintln!("{schedule}: {} ticks, tried twice: {twice:?}", ticks.len());
        assert_each_tick_new_once(&logs, schedule);
        assert!(!ticks.is_empty());
    }
    let (beat, tries) = ticks_of(&logs, "beat");
    assert!(tries.values().all(|&n| n == 1), "beat: {tries:?}");
    assert!(!beat.is_empty());
    // With --catch-up, the pause left no hole.
    let (caught_up, _) = ticks_of(&logs, "catch_up_beat");
    assert_consecutive(&caught_up, "catch_up_beat");
    assert_covers(&caught_up, logs[first].led[0], stopped_at, "catch_up_beat");
    for schedule in ["beat", "catch_up_beat"] {
        assert_no_tick_ran_twice(&logs, schedule);
    }
}

/// Go asynq's Inspector (what asynqmon's Schedulers page shows) on `redis`.
fn inspect(peer: &Path, redis: &RedisServer, args: &[&str]) -> serde_json::Value {
    let output = std::process::Command::new(peer)
        .arg(redis.addr())
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "inspectpeer {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
#[ignore = "builds a generated project"]
fn go_asynq_lists_the_leaders_schedules_and_their_ticks() {
    let Some(peer) = crate::go_peers::go_peer("inspectpeer") else {
        return;
    };
    let db = migrated_database();
    let redis = RedisServer::start();
    let mut workers = start_workers(&db, &redis, 1, &[]);
    leader(&workers);
    wait_for_new_ticks(&workers, &SCHEDULES, 3, &[]);

    let entries = inspect(&peer, &redis, &["schedulers"]);
    let entries = entries.as_array().unwrap();
    let specs: BTreeSet<(String, String)> = entries
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_string(),
                e["spec"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        specs,
        BTreeSet::from([
            ("job:beat".to_string(), "@every 1s".to_string()),
            ("job:catch_up_beat".to_string(), "* * * * * *".to_string()),
            ("event:beaten".to_string(), "@every 1s".to_string()),
        ])
    );
    let beat = entries.iter().find(|e| e["type"] == "job:beat").unwrap();
    let history = inspect(&peer, &redis, &["history", beat["id"].as_str().unwrap()]);
    let listed: BTreeSet<String> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|event| event["task_id"].as_str().unwrap().to_string())
        .collect();
    assert!(!listed.is_empty(), "no tick in the history");
    let logged: BTreeSet<String> = parse_log(&workers[0].log())
        .enqueued
        .into_iter()
        .filter(|e| e.schedule == "beat" && e.new)
        .map(|e| e.tick_id)
        .collect();
    assert!(
        listed.is_subset(&logged),
        "history {listed:?} is not among the ticks enqueued {logged:?}"
    );

    // The console's Schedules page reads the same state: every schedule
    // with its spec and a tick the leader logged, and the leader's process.
    let console =
        crate::console::Console::start(&scheduled_project().join(".bin/outbox"), &db.url(), &redis);
    let (status, page) = console.get("/schedules");
    assert_eq!(status, 200, "{page}");
    for (task_type, spec) in [
        ("job:beat", "@every 1s"),
        ("job:catch_up_beat", "* * * * * *"),
        ("event:beaten", "@every 1s"),
    ] {
        assert!(
            page.contains(&format!(
                "<td><code>{task_type}</code></td><td><code>{spec}</code></td>"
            )),
            "{task_type} ({spec}) is not on the Schedules page:\n{page}"
        );
    }
    assert!(
        page.contains(&format!(", process {}", workers[0].pid())),
        "the leader's process is not on the page:\n{page}"
    );
    assert!(
        logged.iter().any(|tick| page.contains(tick.as_str())),
        "no tick the leader enqueued is on the page:\n{page}"
    );

    // A leader that stops takes its entries off the page.
    workers[0].signal("-TERM");
    assert_eq!(workers[0].wait(Duration::from_secs(10)), Some(0));
    assert_eq!(
        inspect(&peer, &redis, &["schedulers"]),
        serde_json::json!([])
    );
    let (status, page) = console.get("/schedules");
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("No scheduler leads now"), "{page}");
}
