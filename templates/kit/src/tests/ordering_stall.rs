//! A worker process stopped (SIGSTOP) past its lease while it runs a
//! key's first run, then resumed (SIGCONT): another worker process takes
//! the run over, and the stopped one, once it runs again, neither commits
//! the run's work nor moves the key on; no run of the key's next event
//! begins before the run that holds the turn has done its work.

#![cfg(feature = "worker")]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sqlx::PgPool;

use super::ordering::{Placed, SEEN, chains, publish_shuffled, record, seen, worker_with};
use super::support::{TestDatabase, TestQueue, eventually, valkey_addr};
use crate::queue::{Client, ConsumerOptions};
use crate::worker::listeners::{ListenerContext, ListenerOptions, Listeners};
use crate::worker::ordering::Held;

/// Names the database and queue of the test's worker processes: the test
/// binary runs the test again as a worker when it is set.
const WORKER_OF: &str = "KIT_TEST_STALLED_WORKER";
/// The test, which its worker processes run.
const TEST: &str = "tests::ordering_stall::a_worker_stopped_past_its_lease_neither_commits_nor_moves_its_key_on_when_it_resumes";

/// Each run's start and end (its work committed), by process.
const RUNS: &str = "CREATE TABLE runs (id bigserial PRIMARY KEY, pid int NOT NULL, n int NOT NULL, \
                    what text NOT NULL)";

async fn log_run(pool: &PgPool, n: u32, what: &str) {
    sqlx::query("INSERT INTO runs (pid, n, what) VALUES ($1, $2, $3)")
        .bind(std::process::id() as i32)
        .bind(n as i32)
        .bind(what)
        .execute(pool)
        .await
        .unwrap();
}

/// `(pid, n, what)` of each line of `runs`, in order.
async fn runs(pool: &PgPool) -> Vec<(i32, i32, String)> {
    sqlx::query_as("SELECT pid, n, what FROM runs ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// A worker process: a consumer of `queue` with 2-second leases, whose
/// ordered `ledger` takes a second over step 1 before its work; until
/// SIGTERM.
async fn act_as_worker(url: &str, queue: &str) {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(url)
        .await
        .unwrap();
    let client = Client::connect(&valkey_addr(), None, 0).await.unwrap();
    let mut listeners = Listeners::new();
    listeners.listen_with(
        "ledger",
        ListenerOptions::new().ordered(),
        |event: Placed, context: ListenerContext| async move {
            log_run(context.pool(), event.n, "start").await;
            if event.n == 1 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            record(&context, event.key, event.n).await?;
            log_run(context.pool(), event.n, "end").await;
            Ok(())
        },
    );
    let options = ConsumerOptions {
        queues: queue.parse().unwrap(),
        concurrency: 4,
        poll_interval: Duration::from_millis(50),
        forward_interval: Duration::from_millis(50),
        lease_duration: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(300),
        recover_interval: Duration::from_millis(300),
        shutdown_timeout: Duration::from_secs(5),
        retry_delay: |_| Duration::from_millis(20),
        ..ConsumerOptions::default()
    };
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            terminate.recv().await;
            stop.cancel();
        }
    });
    worker_with(client, queue, &pool, listeners, options)
        .run(stop.cancelled_owned())
        .await
        .unwrap();
}

fn signal(worker: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &worker.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal}");
}

#[tokio::test]
async fn a_worker_stopped_past_its_lease_neither_commits_nor_moves_its_key_on_when_it_resumes() {
    if let Ok(worker) = std::env::var(WORKER_OF) {
        let (url, queue) = worker.split_once(' ').unwrap();
        return act_as_worker(url, queue).await;
    }
    // Arrange: key 1's steps 1 to 3; two worker processes.
    let db = TestDatabase::migrated().await;
    for table in [SEEN, RUNS] {
        sqlx::query(table).execute(&db.pool).await.unwrap();
    }
    let queue = TestQueue::new().await;
    for n in 1..=3 {
        crate::outbox::dispatch(&db.pool, &Placed { key: 1, n })
            .await
            .unwrap();
    }
    let logs: Vec<std::path::PathBuf> = (0..2)
        .map(|n| std::env::temp_dir().join(format!("{}-worker-{n}.log", queue.name)))
        .collect();
    let mut workers: Vec<Child> = logs
        .iter()
        .map(|log| {
            Command::new(std::env::current_exe().unwrap())
                .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
                .env(WORKER_OF, format!("{} {}", db.url(), queue.name))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(log).unwrap())
                .spawn()
                .unwrap()
        })
        .collect();

    // Act: the process that starts step 1 is stopped for as long as its
    // lease and the recoverer's grace take; the other takes the run over,
    // and runs the key's later steps; then the stopped one resumes, and
    // both stop.
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(3)).await;
    eventually(Duration::from_secs(20), "step 1 to start", || async {
        runs(&db.pool).await.iter().any(|(_, n, _)| *n == 1)
    })
    .await;
    let first = runs(&db.pool).await[0].0 as u32;
    let stopped = workers.iter().position(|w| w.id() == first).unwrap();
    signal(&workers[stopped], "-STOP");
    eventually(
        Duration::from_secs(60),
        "the other worker to run steps 1 to 3",
        || async { seen(&db.pool).await.get(&1).map(Vec::len) == Some(3) },
    )
    .await;
    signal(&workers[stopped], "-CONT");
    for worker in &mut workers {
        signal(worker, "-TERM");
    }
    for (worker, log) in workers.iter_mut().zip(&logs) {
        let status = worker.wait().unwrap();
        let output = std::fs::read_to_string(log).unwrap_or_default();
        let _ = std::fs::remove_file(log);
        assert!(
            status.success(),
            "a worker process ended with {status}:\n{output}"
        );
    }

    // Assert: the stopped worker's run of step 1 did not do its work, the
    // other's did; each step began after the one before had done its work.
    let log = runs(&db.pool).await;
    assert!(
        !log.contains(&(first as i32, 1, "end".to_string())),
        "the stopped worker did step 1's work after it resumed: {log:?}"
    );
    let position = |n: i32, what: &str| log.iter().position(|(_, m, w)| *m == n && w == what);
    for n in 1..3 {
        let end = position(n, "end").unwrap();
        let next = position(n + 1, "start").unwrap();
        assert!(
            end < next,
            "step {} began before step {n} ended: {log:?}",
            n + 1
        );
    }
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![1, 2, 3]));
    assert_eq!(
        chains(&db.pool, &queue).held().await.unwrap(),
        Held::default()
    );
}
