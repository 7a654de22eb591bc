//! The ordering protocol under random sequences of what can happen to it,
//! against real Postgres and Valkey: events dispatched and committed late,
//! published in any order, runs failing (retried, or for good: held, or
//! moved on), operators skipping and sending back, leases ending under a
//! run still going, workers killed, Valkey losing the queue's keys or the
//! chains. After each sequence the test recovers as the README says and
//! drains; then it checks the invariants:
//!
//! - **no overlap**: the runs that did a key's work (their `ctx.once`
//!   committed) did not overlap: each began after the one before had done
//!   its work;
//! - **order**: they did it in commit order, but for runs an operator or
//!   the listener moved past and that were sent back (they run at their
//!   key's end);
//! - **once**: every event's work was done exactly once per listener (the
//!   drain sends back every run that failed for good);
//! - **nothing waits**: no run, event or failure holds anything.
//!
//! A failing sequence shrinks (ops removed while it still fails) and is
//! printed, with its seed. CI runs [`CASES`] seeded cases;
//! `scripts/ordering-protocol` runs more (`KIT_PROTOCOL_CASES`,
//! `KIT_PROTOCOL_SEED`).

#![cfg(feature = "worker")]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::ordering::worker_with;
use super::support::{TestDatabase, TestQueue, eventually};
use crate::dispatch::Event;
use crate::outbox::dispatch;
use crate::queue::{ConsumerOptions, QueueError, SkipRetry};
use crate::worker::listeners::{
    ListenerContext, ListenerError, ListenerOptions, Listeners, OnFailure,
};
use crate::worker::ordering::{Held, Ordering};

/// Cases CI runs.
const CASES: u64 = 20;
/// Ops in a case, at most.
const MAX_OPS: usize = 28;
/// Keys a case's events fall in.
const KEYS: u32 = 3;
/// The listeners: one holds its key on a failure for good, one moves on.
const LISTENERS: [(&str, OnFailure); 2] =
    [("ledger", OnFailure::HoldKey), ("audit", OnFailure::MoveOn)];

/// An event of the test: a step of `key`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Step {
    key: u32,
}

impl Event for Step {
    const NAME: &'static str = "protocolStep";

    fn order_key(&self) -> Option<String> {
        Some(format!("step:{}", self.key))
    }
}

/// One thing that happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// An event of `key` commits.
    Dispatch { key: u32 },
    /// An event of `key` is dispatched in a transaction left open (it holds
    /// the key's row: later events of the key wait for it to commit).
    Hold { key: u32 },
    /// The oldest transaction left open commits.
    Release,
    /// The committed events not published yet are, in id order or shuffled.
    Publish { shuffled: bool },
    /// The next run of `listener` on `key` fails for good (`SkipRetry`).
    Refuse { listener: usize, key: u32 },
    /// The next run of `listener` on `key` fails, before or after its work.
    Fail {
        listener: usize,
        key: u32,
        after_work: bool,
    },
    /// `outbox skip` of the first run that holds a key, if any.
    Skip,
    /// `outbox retry-archived`.
    RetryArchived,
    /// Every lease in the queue ends now (a stall past the lease, a clock
    /// step): another worker recovers the runs still going.
    ExpireLeases,
    /// Worker `worker` is killed (and started again by a later op or the
    /// drain).
    Kill { worker: usize },
    /// Worker `worker` starts, if it was killed.
    Start { worker: usize },
    /// Valkey loses the queue's task keys.
    LoseQueue,
    /// Valkey loses the chains (not the queue).
    LoseChains,
    /// Time passes.
    Wait { millis: u64 },
}

/// A random sequence of ops.
fn ops(rng: &mut fastrand::Rng) -> Vec<Op> {
    let count = rng.usize(6..=MAX_OPS);
    (0..count)
        .map(|_| {
            let key = rng.u32(0..KEYS);
            let listener = rng.usize(..LISTENERS.len());
            match rng.u32(0..100) {
                0..=27 => Op::Dispatch { key },
                28..=32 => Op::Hold { key },
                33..=37 => Op::Release,
                38..=49 => Op::Publish {
                    shuffled: rng.bool(),
                },
                50..=56 => Op::Refuse { listener, key },
                57..=63 => Op::Fail {
                    listener,
                    key,
                    after_work: rng.bool(),
                },
                64..=67 => Op::Skip,
                68..=71 => Op::RetryArchived,
                72..=75 => Op::ExpireLeases,
                76..=78 => Op::Kill {
                    worker: rng.usize(..2),
                },
                79..=81 => Op::Start {
                    worker: rng.usize(..2),
                },
                82..=83 => Op::LoseQueue,
                84..=85 => Op::LoseChains,
                _ => Op::Wait {
                    millis: rng.u64(0..150),
                },
            }
        })
        .collect()
}

/// What the next run of a listener on a key does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Refuse,
    FailBefore,
    FailAfter,
}

/// The faults waiting for their run, by (listener, key), and the runs
/// refused so far: (listener, key, seq).
#[derive(Debug, Clone, Default)]
struct Faults {
    next: Arc<Mutex<HashMap<(String, u32), Fault>>>,
    refused: Arc<Mutex<HashSet<(String, u32, i64)>>>,
}

/// The tables of the test: each run's start, and the work each run did
/// once.
const TABLES: [&str; 2] = [
    "CREATE TABLE runs_log (run bigint PRIMARY KEY, listener text NOT NULL, key int NOT NULL, \
       seq bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
    "CREATE TABLE work (id bigserial PRIMARY KEY, listener text NOT NULL, key int NOT NULL, \
       seq bigint NOT NULL, run bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
];

/// The listeners, with the faults of `faults`.
fn listeners(faults: &Faults) -> Listeners {
    let mut listeners = Listeners::new();
    for (name, on_failure) in LISTENERS {
        let faults = faults.clone();
        listeners.listen_with(
            name,
            ListenerOptions::new().ordered().on_failure(on_failure),
            move |step: Step, context: ListenerContext| {
                let faults = faults.clone();
                async move { run_step(name, step.key, &faults, &context).await }
            },
        );
    }
    listeners
}

/// One run: logged, then its fault or its work, once.
async fn run_step(
    listener: &str,
    key: u32,
    faults: &Faults,
    context: &ListenerContext,
) -> Result<(), ListenerError> {
    let seq: i64 = context.metadata()["order_seq"].parse()?;
    let fault = faults
        .next
        .lock()
        .unwrap()
        .remove(&(listener.to_string(), key));
    if fault == Some(Fault::Refuse) {
        faults
            .refused
            .lock()
            .unwrap()
            .insert((listener.to_string(), key, seq));
    }
    let run = fastrand::i64(1..i64::MAX);
    sqlx::query("INSERT INTO runs_log (run, listener, key, seq) VALUES ($1, $2, $3, $4)")
        .bind(run)
        .bind(listener)
        .bind(key as i32)
        .bind(seq)
        .execute(context.pool())
        .await?;
    match fault {
        Some(Fault::Refuse) => {
            return Err(SkipRetry(format!("{listener} refuses {key}/{seq}")).into());
        }
        Some(Fault::FailBefore) => {
            return Err(anyhow::anyhow!("{listener} fails before {key}/{seq}"));
        }
        _ => {}
    }
    tokio::time::sleep(Duration::from_millis(fastrand::u64(0..15))).await;
    context
        .once(async |tx| {
            sqlx::query("INSERT INTO work (listener, key, seq, run) VALUES ($1, $2, $3, $4)")
                .bind(listener)
                .bind(key as i32)
                .bind(seq)
                .bind(run)
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
        .await?;
    if fault == Some(Fault::FailAfter) {
        return Err(anyhow::anyhow!("{listener} fails after {key}/{seq}"));
    }
    Ok(())
}

/// A worker running, and how to stop it.
type RunningWorker = (CancellationToken, JoinHandle<Result<(), QueueError>>);

/// A run that did its work: listener, key, seq, when it began, when it did
/// its work.
type Effective = (
    String,
    i32,
    i64,
    chrono::DateTime<chrono::Utc>,
    chrono::DateTime<chrono::Utc>,
);

/// One case: its servers, workers and what it did.
pub(super) struct Case {
    /// The Valkey (or Redis) it runs on.
    addr: String,
    pub(super) db: TestDatabase,
    pub(super) queue: TestQueue,
    pub(super) pool: PgPool,
    faults: Faults,
    workers: [Option<RunningWorker>; 2],
    /// Transactions left open, each with its key.
    open: Vec<(u32, sqlx::Transaction<'static, sqlx::Postgres>)>,
    /// Dispatches waiting for an open transaction of their key.
    blocked: Vec<JoinHandle<()>>,
    /// The runs an operator skipped: (listener, key, seq).
    skipped: HashSet<(String, u32, i64)>,
    /// Whether Valkey lost data (the drain replays then).
    lost: bool,
    started: chrono::DateTime<chrono::Utc>,
    rng: fastrand::Rng,
}

impl Case {
    async fn new(seed: u64) -> Self {
        Self::on(&super::support::valkey_addr(), seed).await
    }

    /// A case on the Valkey (or Redis) at `addr`.
    pub(super) async fn on(addr: &str, seed: u64) -> Self {
        let db = TestDatabase::migrated().await;
        for table in TABLES {
            sqlx::query(table).execute(&db.pool).await.unwrap();
        }
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(30)
            .connect_with(db.options.clone())
            .await
            .unwrap();
        let mut case = Self {
            addr: addr.to_string(),
            db,
            queue: TestQueue::on(addr).await,
            pool,
            faults: Faults::default(),
            workers: [None, None],
            open: Vec::new(),
            blocked: Vec::new(),
            skipped: HashSet::new(),
            lost: false,
            started: chrono::Utc::now() - chrono::TimeDelta::seconds(1),
            rng: fastrand::Rng::with_seed(seed),
        };
        case.start(0);
        case.start(1);
        case
    }

    pub(super) fn ordering(&self) -> Ordering {
        Ordering::new(
            self.pool.clone(),
            self.queue.client.clone(),
            vec![self.queue.name.clone()],
            Duration::from_secs(60),
        )
    }

    fn context(&self) -> crate::follow::Context {
        let mut config = crate::testing::config(&self.db.url());
        config.valkey.addr = Some(self.addr.clone());
        config.outbox.queues = self.queue.name.parse().unwrap();
        config.worker.queues = self.queue.name.parse().unwrap();
        crate::follow::Context::new(config, listeners(&self.faults))
    }

    /// Starts worker `n` unless it runs. Its leases last 30 s and are not
    /// extended meanwhile, so that [`Op::ExpireLeases`] decides when one
    /// ends; its recoverer looks every 100 ms.
    fn start(&mut self, n: usize) {
        if self.workers[n].is_some() {
            return;
        }
        let options = ConsumerOptions {
            queues: self.queue.name.parse().unwrap(),
            concurrency: 6,
            shutdown_timeout: Duration::from_secs(5),
            poll_interval: Duration::from_millis(30),
            forward_interval: Duration::from_millis(30),
            recover_interval: Duration::from_millis(100),
            lease_duration: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(29),
            retry_delay: |_| Duration::from_millis(20),
            ..ConsumerOptions::default()
        };
        let consumer = worker_with(
            self.queue.client.clone(),
            &self.queue.name,
            &self.pool,
            listeners(&self.faults),
            options,
        );
        let stop = CancellationToken::new();
        let running = tokio::spawn(consumer.run(stop.clone().cancelled_owned()));
        self.workers[n] = Some((stop, running));
    }

    pub(super) async fn dispatch(&mut self, key: u32) {
        let pool = self.pool.clone();
        let dispatching = async move {
            let mut tx = pool.begin().await.unwrap();
            dispatch(&mut *tx, &Step { key }).await.unwrap();
            tx.commit().await.unwrap();
        };
        if self.open.iter().any(|(held, _)| *held == key) {
            self.blocked.push(tokio::spawn(dispatching));
        } else {
            dispatching.await;
        }
    }

    pub(super) async fn apply(&mut self, op: Op) {
        match op {
            Op::Dispatch { key } => self.dispatch(key).await,
            Op::Hold { key } => {
                if self.open.iter().any(|(held, _)| *held == key) {
                    return self.dispatch(key).await;
                }
                let mut tx = self.pool.begin().await.unwrap();
                dispatch(&mut *tx, &Step { key }).await.unwrap();
                self.open.push((key, tx));
            }
            Op::Release => self.release().await,
            Op::Publish { shuffled } => self.publish(shuffled).await,
            Op::Refuse { listener, key } => self.fault(listener, key, Fault::Refuse),
            Op::Fail {
                listener,
                key,
                after_work,
            } => {
                let fault = if after_work {
                    Fault::FailAfter
                } else {
                    Fault::FailBefore
                };
                self.fault(listener, key, fault);
            }
            Op::Skip => self.skip().await,
            Op::RetryArchived => {
                let args = crate::operations::retry_archived::Args {
                    listener: None,
                    since: None,
                    include_cancelled: false,
                };
                crate::operations::retry_archived::run(
                    &self.context(),
                    &args,
                    crate::operations::output::Format::Json,
                )
                .await
                .unwrap();
            }
            Op::ExpireLeases => self.expire_leases().await,
            Op::Kill { worker } => {
                if let Some((_, running)) = self.workers[worker].take() {
                    running.abort();
                    let _ = running.await;
                }
            }
            Op::Start { worker } => self.start(worker),
            Op::LoseQueue => {
                self.queue.delete_keys();
                self.lost = true;
            }
            Op::LoseChains => {
                self.queue.delete_chains();
                self.lost = true;
            }
            Op::Wait { millis } => tokio::time::sleep(Duration::from_millis(millis)).await,
        }
    }

    fn fault(&mut self, listener: usize, key: u32, fault: Fault) {
        self.faults
            .next
            .lock()
            .unwrap()
            .insert((LISTENERS[listener].0.to_string(), key), fault);
    }

    async fn release(&mut self) {
        if self.open.is_empty() {
            return;
        }
        let (_, tx) = self.open.remove(0);
        tx.commit().await.unwrap();
    }

    /// Publishes what is committed and not published, as the relay does
    /// (event id as task id), in id order or shuffled.
    async fn publish(&mut self, shuffled: bool) {
        let rows: Vec<(
            Uuid,
            String,
            serde_json::Value,
            serde_json::Value,
            chrono::DateTime<chrono::Utc>,
        )> = sqlx::query_as(
            "UPDATE outbox_events SET published_at = now() WHERE published_at IS NULL \
                 RETURNING event_id, event_name, payload, metadata, created_at",
        )
        .fetch_all(&self.pool)
        .await
        .unwrap();
        let mut tasks: Vec<_> = rows
            .into_iter()
            .map(|(id, name, payload, metadata, occurred_at)| {
                let envelope = crate::outbox::Envelope {
                    id,
                    name,
                    payload,
                    metadata: serde_json::from_value(metadata).unwrap(),
                    occurred_at,
                };
                crate::outbox::relay::event_task(
                    &envelope,
                    id.to_string(),
                    &self.queue.name,
                    Duration::from_secs(60),
                )
            })
            .collect();
        if shuffled {
            self.rng.shuffle(&mut tasks);
        }
        if !tasks.is_empty() {
            for result in self.queue.client.enqueue(&tasks).await.unwrap() {
                result.unwrap();
            }
        }
    }

    /// `outbox skip` of the first failure that holds a key.
    async fn skip(&mut self) {
        let holding: Option<(String, String, Option<Uuid>)> = sqlx::query_as(
            "SELECT task_id, listener, event_id FROM listener_failures WHERE holds_key \
             ORDER BY failed_at LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await
        .unwrap();
        let Some((task_id, listener, Some(event_id))) = holding else {
            return;
        };
        let args = crate::operations::skip::Args { task_id };
        let skipped = crate::operations::skip::run(
            &self.context(),
            &args,
            crate::operations::output::Format::Json,
        )
        .await;
        if skipped.is_ok() {
            let (key, seq) = self.place_of(event_id).await;
            self.skipped.insert((listener, key, seq));
        }
    }

    async fn place_of(&self, event_id: Uuid) -> (u32, i64) {
        let (key, seq): (i32, i64) = sqlx::query_as(
            "SELECT (payload ->> 'key')::int, (metadata ->> 'order_seq')::bigint \
             FROM outbox_events WHERE event_id = $1",
        )
        .bind(event_id)
        .fetch_one(&self.pool)
        .await
        .unwrap();
        (key as u32, seq)
    }

    async fn expire_leases(&self) {
        let mut conn = self.queue.connection().await;
        let leased: Vec<String> = redis::cmd("ZRANGE")
            .arg(crate::queue::keys::lease(&self.queue.name))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        for id in leased {
            let () = redis::cmd("ZADD")
                .arg(crate::queue::keys::lease(&self.queue.name))
                .arg("XX")
                .arg(chrono::Utc::now().timestamp() - 120)
                .arg(id)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }

    /// Recovers as the README says, and runs until every run is done: the
    /// open transactions commit, no fault is left, both workers run, what
    /// is committed is published, what was archived is sent back, and
    /// after a loss the events are replayed (`outbox replay --lost`).
    pub(super) async fn drain(&mut self) -> Result<(), String> {
        for (_, tx) in std::mem::take(&mut self.open) {
            tx.commit().await.unwrap();
        }
        for dispatching in std::mem::take(&mut self.blocked) {
            dispatching.await.unwrap();
        }
        self.faults.next.lock().unwrap().clear();
        self.start(0);
        self.start(1);
        let events: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_events")
            .fetch_one(&self.pool)
            .await
            .unwrap();
        let expected = events * LISTENERS.len() as i64;
        let ordering = self.ordering();
        let ordered = listeners(&self.faults).ordered();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut round = 0;
        loop {
            let done: i64 =
                sqlx::query_scalar("SELECT count(DISTINCT (listener, key, seq)) FROM work")
                    .fetch_one(&self.pool)
                    .await
                    .unwrap();
            if done >= expected {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "after the drain {done} of {expected} runs did their work; held: {:?}",
                    ordering.held().await.unwrap()
                ));
            }
            round += 1;
            self.publish(false).await;
            self.apply(Op::RetryArchived).await;
            if round % 5 == 0 {
                // Runs of killed workers, and runs left to a run that no
                // longer holds its turn.
                self.expire_leases().await;
            }
            if self.lost && round % 5 == 1 {
                let args = crate::operations::replay::Args {
                    ids: Vec::new(),
                    name: None,
                    since: Some(self.started),
                    until: None,
                    listener: None,
                    lost: true,
                    yes: true,
                };
                crate::operations::replay::run(
                    &self.context(),
                    &args,
                    crate::operations::output::Format::Json,
                )
                .await
                .unwrap();
            }
            ordering.heal_stale_waits(Duration::ZERO).await.unwrap();
            ordering
                .look_at_old_heads(Duration::ZERO, &ordered)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The invariants (module docs); `Err` says which one broke.
    pub(super) async fn check(&self) -> Result<(), String> {
        // Moved past: the runs an operator skipped, and those the listener
        // that moves on refused.
        let mut moved_past = self.skipped.clone();
        for refused in self.faults.refused.lock().unwrap().iter() {
            if refused.0 == "audit" {
                moved_past.insert(refused.clone());
            }
        }
        // (listener, key, seq, run start, work time), by when each run began.
        let effective: Vec<Effective> = sqlx::query_as(
                "SELECT w.listener, w.key, w.seq, r.at, w.at FROM work w JOIN runs_log r ON r.run = w.run \
                 ORDER BY r.at",
            )
            .fetch_all(&self.pool)
            .await
            .unwrap();
        type Runs = Vec<(
            i64,
            chrono::DateTime<chrono::Utc>,
            chrono::DateTime<chrono::Utc>,
        )>;
        let mut by_chain: BTreeMap<(String, i32), Runs> = BTreeMap::new();
        for (listener, key, seq, start, worked) in effective {
            by_chain
                .entry((listener, key))
                .or_default()
                .push((seq, start, worked));
        }
        for ((listener, key), runs) in &by_chain {
            let mut seqs: Vec<i64> = runs.iter().map(|(seq, _, _)| *seq).collect();
            for pair in runs.windows(2) {
                if pair[1].1 < pair[0].2 {
                    return Err(format!(
                        "no overlap: {listener} began key {key}'s seq {} before seq {} had done its work",
                        pair[1].0, pair[0].0
                    ));
                }
            }
            let in_order: Vec<i64> = runs
                .iter()
                .map(|(seq, _, _)| *seq)
                .filter(|seq| !moved_past.contains(&(listener.clone(), *key as u32, *seq)))
                .collect();
            if in_order.windows(2).any(|pair| pair[0] >= pair[1]) {
                return Err(format!(
                    "order: {listener} did key {key}'s work in the order {seqs:?} (moved past: {moved_past:?})"
                ));
            }
            seqs.sort_unstable();
            let before = seqs.len();
            seqs.dedup();
            if seqs.len() != before {
                return Err(format!(
                    "once: {listener} did some of key {key}'s work twice"
                ));
            }
        }
        let missing: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbox_events e CROSS JOIN (VALUES ('ledger'), ('audit')) l(name) \
             WHERE NOT EXISTS (SELECT 1 FROM work w WHERE w.listener = l.name \
               AND w.seq = (e.metadata ->> 'order_seq')::bigint AND w.key = (e.payload ->> 'key')::int)",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap();
        if missing > 0 {
            return Err(format!("once: {missing} runs never did their work"));
        }
        let ordering = self.ordering();
        eventually(Duration::from_secs(10), "the chains to empty", || async {
            ordering.held().await.unwrap() == Held::default()
        })
        .await;
        let holding: i64 =
            sqlx::query_scalar("SELECT count(*) FROM listener_failures WHERE holds_key")
                .fetch_one(&self.pool)
                .await
                .unwrap();
        if holding > 0 {
            return Err(format!(
                "nothing waits: {holding} failures still hold their keys"
            ));
        }
        Ok(())
    }

    pub(super) async fn stop(mut self) {
        for worker in &mut self.workers {
            if let Some((stop, running)) = worker.take() {
                stop.cancel();
                let _ = running.await;
            }
        }
    }
}

/// Every op once or more, in an order that makes each step of the chains
/// happen (each of their scripts runs), on the Valkey at `addr`, then the
/// drain and the check: the workload of `super::script_keys`.
pub(super) async fn run_every_step_on(addr: &str) {
    let mut case = Case::on(addr, 7).await;
    // Runs a worker of template set 22 left, moved beside their queue.
    for _ in 0..2 {
        case.dispatch(2).await;
    }
    super::ordering_upgrade::leave_set_22_chains(&case.db, &case.pool, &case.queue, "ledger").await;
    case.ordering()
        .move_from_database_namespace()
        .await
        .unwrap();
    let ops = [
        Op::Hold { key: 0 },
        Op::Dispatch { key: 0 },
        Op::Dispatch { key: 1 },
        Op::Dispatch { key: 1 },
        Op::Refuse {
            listener: 0,
            key: 1,
        },
        Op::Refuse {
            listener: 1,
            key: 1,
        },
        Op::Fail {
            listener: 0,
            key: 0,
            after_work: true,
        },
        Op::Publish { shuffled: true },
        Op::Wait { millis: 300 },
        Op::Release,
        Op::Publish { shuffled: true },
        Op::Wait { millis: 300 },
        Op::Skip,
        Op::RetryArchived,
        Op::ExpireLeases,
        Op::Wait { millis: 300 },
        Op::LoseChains,
        Op::Dispatch { key: 1 },
        Op::Publish { shuffled: false },
        Op::Wait { millis: 200 },
        Op::LoseQueue,
        Op::Kill { worker: 0 },
        Op::Start { worker: 0 },
    ];
    for op in ops {
        case.apply(op).await;
    }
    case.drain().await.unwrap();
    case.check().await.unwrap();
    // A head a process that is not a kit worker completed, with a run behind
    // it; a chain of a listener no worker orders, released.
    super::ordering_upgrade::complete_a_head_as_go_would(&mut case).await;
    super::ordering_upgrade::release_a_gone_listeners_chain(&mut case).await;
    case.ordering().own_queues("protocol").await.unwrap();
    case.stop().await;
}

/// Runs `ops` in a case of its own seeded by `seed`; `Err` says what broke.
async fn run_case(seed: u64, ops: &[Op]) -> Result<(), String> {
    let mut case = Case::new(seed).await;
    for &op in ops {
        case.apply(op).await;
    }
    let result = match case.drain().await {
        Ok(()) => case.check().await,
        Err(err) => Err(err),
    };
    case.stop().await;
    result
}

/// The shortest sequence found by removing ops from `ops` while the case
/// still fails.
async fn shrink(seed: u64, mut ops: Vec<Op>) -> (Vec<Op>, String) {
    let mut failure = run_case(seed, &ops).await.err().unwrap_or_default();
    let mut chunk = ops.len() / 2;
    while chunk >= 1 {
        let mut start = 0;
        while start < ops.len() {
            let mut fewer = ops.clone();
            fewer.drain(start..(start + chunk).min(ops.len()));
            match run_case(seed, &fewer).await {
                Err(err) => {
                    ops = fewer;
                    failure = err;
                }
                Ok(()) => start += chunk,
            }
        }
        chunk /= 2;
    }
    (ops, failure)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_runs_keep_their_invariants_whatever_happens_to_them() {
    let first: u64 = std::env::var("KIT_PROTOCOL_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(61);
    let cases: u64 = std::env::var("KIT_PROTOCOL_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(CASES);
    for seed in first..first + cases {
        let ops = ops(&mut fastrand::Rng::with_seed(seed));
        if let Err(first) = run_case(seed, &ops).await {
            eprintln!("seed {seed}: {first}; shrinking {} ops", ops.len());
            let (shortest, failure) = shrink(seed, ops.clone()).await;
            panic!(
                "seed {seed}: {failure}\nthe sequence, shrunk from {} ops to {}:\n{shortest:#?}",
                ops.len(),
                shortest.len()
            );
        }
        eprintln!("seed {seed}: {} ops, the invariants hold", ops.len());
    }
}
