//! The outbox benchmark's Rust side: it drives the code of a project that
//! `gpkit new project outbox_bench` generated (the relay, the dispatcher,
//! the transactor, the queue client), unchanged. `scripts/bench-outbox`
//! copies this file to `src/bin/outbox_bench.rs` of that project, builds it
//! in release mode and runs its subcommands; see scripts/bench/README.md.
//!
//! Subcommands (each prints one JSON object on stdout):
//! - `sample`: the enqueue script's SHA and a real encoded task message for
//!   a 1 KB event, for redis-benchmark;
//! - `seed`: a backlog of unpublished events with 1 KB payloads (of
//!   `orderPlaced`, which has no listeners, or of `--name`);
//! - `relay`: one relay (`Relay::run`), until the queue holds `--expect`
//!   tasks; per-phase timings of its rounds, CPU time and peak RSS;
//! - `load`: commits events at a steady rate (one per transaction, through
//!   `Transactor` and `OutboxDispatcher`) and reports commit-to-enqueue
//!   latency; with `--wake local` a relay runs in the same process and is
//!   woken after each commit;
//! - `insert-cost`: a business transaction with and without the outbox
//!   insert;
//! - `listener-latency`: commits `benchDone` events at a steady rate (with
//!   `--committers` tasks when one connection cannot keep it) and reports
//!   commit-to-listener latency, read from what a worker's recording
//!   listener wrote;
//! - `inbox-cost`: a listener's transaction with and without the inbox;
//! - `verify`: every event is in the queue exactly once;
//! - `verify-listeners`: after a worker ran, every event's task and the
//!   task of each `--listener` completed once, and nothing else is left.
//!
//! Configuration comes from the project's own `Config::from_env`
//! (`DATABASE_URL`, `VALKEY_ADDR`, `OUTBOX_*`).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::Subscriber;
use tracing::span::{Attributes, Id};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use outbox_bench::config::Config;
use outbox_bench::database::{self, Transactor};
use outbox_bench::dispatch::{Dispatcher, Event};
use outbox_bench::outbox::relay::{EVENT_TASK_PREFIX, MAX_RETRY, Relay, TASK_TIMEOUT};
use outbox_bench::outbox::{Envelope, OutboxDispatcher};
use outbox_bench::queue::message::TaskMessage;
use outbox_bench::queue::{Client, keys, scripts};
use outbox_bench::worker::inbox;
use outbox_bench::worker::listeners::listener_task_id;
use outbox_bench::worker::metrics::Metrics;

#[derive(Parser)]
#[command(about = "gpkit outbox benchmark (run by scripts/bench-outbox)")]
struct Cli {
    /// The queue the relay publishes to (asynq:{<queue>}:...).
    #[arg(long, global = true, default_value = "outbox_bench")]
    queue: String,
    /// Size of each event's JSON payload, in bytes.
    #[arg(long, global = true, default_value_t = 1024)]
    payload_bytes: usize,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Sample {
        /// Where to write the encoded task message.
        #[arg(long)]
        message_file: std::path::PathBuf,
    },
    Seed {
        #[arg(long)]
        events: i64,
        /// The event name (its payload is the 1 KB `orderPlaced` JSON,
        /// which a listener of an event without fields decodes).
        #[arg(long, default_value = OrderPlaced::NAME)]
        name: String,
    },
    Relay {
        /// Stop once the queue's pending list holds this many tasks.
        #[arg(long)]
        expect: i64,
        /// Start claiming at this Unix time (seconds), so that several
        /// relay processes start together.
        #[arg(long)]
        start_at: Option<f64>,
        /// Also wake on the published Valkey wake-ups (`OUTBOX_WAKE=valkey`).
        #[arg(long)]
        subscribe: bool,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    Load {
        #[arg(long, default_value_t = 100)]
        rate: u32,
        #[arg(long, default_value_t = 25)]
        seconds: u32,
        #[arg(long, value_enum, default_value = "off")]
        wake: WakeArg,
    },
    InsertCost {
        #[arg(long, default_value_t = 3000)]
        iterations: u32,
    },
    /// From commit to the listener running, through a worker process of
    /// the project started with `BENCH_RECORD_LISTENER_RUNS=1` (its first
    /// `benchDone` listener then records when it ran in `listener_runs`):
    /// commits `benchDone` events at `rate` for `seconds`, with `wake`.
    /// Event n is due at n / `rate` s after the start (a late one is
    /// committed at once); `committers` tasks commit them, each one event
    /// per transaction, so that a rate above what one connection's
    /// round trips allow is still kept.
    ListenerLatency {
        #[arg(long, default_value_t = 20)]
        rate: u32,
        #[arg(long, default_value_t = 10)]
        seconds: u32,
        #[arg(long, value_enum, default_value = "valkey")]
        wake: WakeArg,
        #[arg(long, default_value_t = 1)]
        committers: u32,
    },
    /// What `ListenerContext::once` (the inbox) adds to a listener's
    /// transaction: the same business INSERT in a plain transaction and in
    /// `inbox::once`, alternating.
    InboxCost {
        #[arg(long, default_value_t = 3000)]
        iterations: u32,
    },
    Verify {
        #[arg(long)]
        expect: i64,
    },
    VerifyListeners {
        /// The listeners every event has (their task ids derive from the
        /// event id, see `worker::listeners::listener_task_id`).
        #[arg(long = "listener", required = true)]
        listeners: Vec<String>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum WakeArg {
    /// No wake-up: the load generator only commits; a relay in another
    /// process finds the events by polling.
    Off,
    /// A relay in this process, woken after each commit (in-process signal).
    Local,
    /// Commits publish a wake-up on Valkey (`OUTBOX_WAKE=valkey`); a relay
    /// in another process subscribes to it.
    Valkey,
}

/// The event the benchmark dispatches; `note` pads it to the payload size.
#[derive(Debug, Clone, Serialize)]
struct OrderPlaced {
    order_id: u64,
    customer_id: String,
    currency: &'static str,
    total_cents: u64,
    note: String,
}

impl Event for OrderPlaced {
    const NAME: &'static str = "orderPlaced";
}

/// The end-to-end run's event, `benchDone` (the project's listeners decode
/// it; the event has no fields, so they ignore the payload).
#[derive(Serialize)]
#[serde(transparent)]
struct BenchDone(OrderPlaced);

impl Event for BenchDone {
    const NAME: &'static str = "benchDone";
}

impl OrderPlaced {
    /// An event whose JSON is `bytes` long (for order ids of 8 digits).
    fn sized(order_id: u64, bytes: usize) -> Self {
        let mut event = Self {
            order_id,
            customer_id: "customer-0000042".into(),
            currency: "EUR",
            total_cents: 129_990,
            note: String::new(),
        };
        let base = serde_json::to_vec(&Self { order_id: 10_000_000, ..event.clone() })
            .expect("serialises")
            .len();
        event.note = "x".repeat(bytes.saturating_sub(base));
        event
    }
}

fn now_ns() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos(),
    )
    .expect("fits")
}

fn unix_s() -> f64 {
    now_ns() as f64 / 1e9
}

fn config() -> anyhow::Result<Config> {
    Config::from_env().map_err(|err| anyhow::anyhow!("{err}"))
}

/// A plain Redis connection for the benchmark's own reads (queue length,
/// task hashes); the relay uses the project's `Client`.
async fn redis_conn(config: &Config) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let url = format!(
        "redis://{}/{}",
        config.valkey.addr.as_deref().unwrap_or("localhost:6379"),
        config.valkey.db.unwrap_or(0)
    );
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

async fn pending_len(conn: &mut redis::aio::MultiplexedConnection, queue: &str) -> i64 {
    redis::cmd("LLEN")
        .arg(keys::pending(queue))
        .query_async(conn)
        .await
        .unwrap_or(0)
}

/// The process's peak and current resident set size, in KiB, and its CPU
/// time in clock ticks (user + system).
fn process_stats() -> serde_json::Value {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|value| value.parse().ok())
    };
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses): utime is
    // field 14 and stime field 15 of the whole line.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    json!({
        "vm_hwm_kb": field("VmHWM:"),
        "vm_rss_kb": field("VmRSS:"),
        "cpu_ticks": tick(11) + tick(12),
    })
}

// ---------------------------------------------------------------------------
// Per-phase timing of relay rounds, from the relay's own tracing spans
// (`outbox.claim`, which also marks, and `outbox.enqueue`) and the gaps between
// them. Valid when one relay runs in the process (rounds are sequential).

#[derive(Default)]
struct Phases {
    samples: BTreeMap<&'static str, Vec<u64>>,
    last_close: Option<(&'static str, Instant)>,
}

#[derive(Clone, Default)]
struct PhaseTimer(Arc<Mutex<Phases>>);

struct SpanStart(Instant);

impl<S> Layer<S> for PhaseTimer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let now = Instant::now();
        let name = attrs.metadata().name();
        if !name.starts_with("outbox.") {
            return;
        }
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanStart(now));
        }
        let mut phases = self.0.lock().unwrap();
        // The gap before this span, named after what runs in it.
        let gap = match (phases.last_close, name) {
            // enqueue closed -> replies, commit, loop, begin -> next claim
            (Some(("outbox.enqueue", at)), "outbox.claim") => Some(("commit+begin", at)),
            // claim closed -> build the tasks (serde_json of each envelope)
            (Some(("outbox.claim", at)), "outbox.enqueue") => Some(("build_tasks", at)),
            _ => None,
        };
        if let Some((gap, at)) = gap {
            let micros = now.duration_since(at).as_micros() as u64;
            phases.samples.entry(gap).or_default().push(micros);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let now = Instant::now();
        let Some(span) = ctx.span(&id) else { return };
        let name = span.name();
        let Some(start) = span.extensions().get::<SpanStart>().map(|s| s.0) else {
            return;
        };
        let mut phases = self.0.lock().unwrap();
        let micros = now.duration_since(start).as_micros() as u64;
        let key = match name {
            "outbox.claim" => "claim",
            "outbox.enqueue" => "enqueue",
            _ => return,
        };
        phases.samples.entry(key).or_default().push(micros);
        phases.last_close = Some((name, now));
    }
}

impl PhaseTimer {
    fn install(&self) {
        use tracing_subscriber::filter::{LevelFilter, filter_fn};
        // By span name, not module path: the spans are the kit crate's
        // (`kit::outbox::relay`, `kit::spans`), whatever the project's name.
        let timer = self
            .clone()
            .with_filter(filter_fn(|meta| meta.is_span() && meta.name().starts_with("outbox.")));
        let warnings = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(LevelFilter::WARN);
        let subscriber = tracing_subscriber::registry().with(timer).with(warnings);
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
    }

    fn report(&self) -> serde_json::Value {
        let phases = self.0.lock().unwrap();
        let mut out = serde_json::Map::new();
        for (name, samples) in &phases.samples {
            let mut sorted = samples.clone();
            sorted.sort_unstable();
            let total: u64 = sorted.iter().sum();
            out.insert(
                (*name).to_string(),
                json!({
                    "count": sorted.len(),
                    "mean_ms": total as f64 / sorted.len().max(1) as f64 / 1000.0,
                    "p50_ms": percentile_us(&sorted, 50.0) / 1000.0,
                    "p99_ms": percentile_us(&sorted, 99.0) / 1000.0,
                    "total_s": total as f64 / 1e6,
                }),
            );
        }
        serde_json::Value::Object(out)
    }
}

fn percentile_us(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)] as f64
}

fn percentile_f(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn summary_ms(mut values: Vec<f64>) -> serde_json::Value {
    values.sort_by(f64::total_cmp);
    json!({
        "count": values.len(),
        "min_ms": values.first(),
        "p50_ms": percentile_f(&values, 50.0),
        "p90_ms": percentile_f(&values, 90.0),
        "p99_ms": percentile_f(&values, 99.0),
        "max_ms": values.last(),
        "mean_ms": values.iter().sum::<f64>() / values.len().max(1) as f64,
    })
}

// ---------------------------------------------------------------------------

async fn pool(config: &Config) -> anyhow::Result<PgPool> {
    let pool = database::connect_lazy(&config.database);
    // Open a connection now, so that start-up is not timed.
    sqlx::query("SELECT 1").execute(&pool).await?;
    Ok(pool)
}

fn relay(pool: PgPool, client: Client, config: &Config, metrics: &Metrics, queue: &str) -> Relay {
    Relay::new(pool, client, &config.outbox, metrics.relay.clone()).with_queue(queue)
}

async fn cmd_sample(cli: &Cli, message_file: &std::path::Path) -> anyhow::Result<()> {
    let config = config()?;
    let event = OrderPlaced::sized(12_345_678, cli.payload_bytes);
    let envelope = Envelope::new(OrderPlaced::NAME, serde_json::to_value(&event)?);
    let payload = serde_json::to_vec(&envelope)?;
    // What `Client::enqueue` stores for the relay's task (see relay.rs
    // `task_for` and client.rs `to_message`).
    let message = TaskMessage {
        r#type: format!("{EVENT_TASK_PREFIX}{}", OrderPlaced::NAME),
        payload: payload.clone(),
        id: envelope.id.to_string(),
        queue: cli.queue.clone(),
        retry: MAX_RETRY as i32,
        timeout: TASK_TIMEOUT.as_secs() as i64,
        retention: config.outbox.task_retention.as_secs() as i64,
        ..TaskMessage::default()
    };
    let bytes = prost::Message::encode_to_vec(&message);
    std::fs::write(message_file, &bytes)?;
    println!(
        "{}",
        json!({
            "enqueue_sha": scripts::ENQUEUE.get_hash(),
            "event_payload_bytes": serde_json::to_vec(&event)?.len(),
            "envelope_bytes": payload.len(),
            "message_bytes": bytes.len(),
            "message_has_nul": bytes.contains(&0),
        })
    );
    Ok(())
}

async fn cmd_seed(cli: &Cli, events: i64, name: &str) -> anyhow::Result<()> {
    let config = config()?;
    let pool = pool(&config).await?;
    let template = serde_json::to_value(OrderPlaced::sized(0, cli.payload_bytes))?;
    let started = Instant::now();
    let chunk = 50_000;
    let mut from = 1;
    while from <= events {
        let to = (from + chunk - 1).min(events);
        sqlx::query(
            "INSERT INTO outbox_events (event_id, event_name, payload, metadata, created_at) \
             SELECT gen_random_uuid(), $1, jsonb_set($2::jsonb, '{order_id}', to_jsonb(10000000 + g)), \
                    '{}'::jsonb, now() \
             FROM generate_series($3::bigint, $4::bigint) g",
        )
        .bind(name)
        .bind(&template)
        .bind(from)
        .bind(to)
        .execute(&pool)
        .await?;
        from = to + 1;
    }
    let (count, avg): (i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*), avg(octet_length(payload::text))::float8 FROM outbox_events \
         WHERE published_at IS NULL",
    )
    .fetch_one(&pool)
    .await?;
    println!(
        "{}",
        json!({"unpublished": count, "avg_payload_bytes": avg, "seconds": started.elapsed().as_secs_f64()})
    );
    Ok(())
}

async fn cmd_relay(
    cli: &Cli,
    expect: i64,
    start_at: Option<f64>,
    subscribe: bool,
    timeout: u64,
) -> anyhow::Result<()> {
    let timer = PhaseTimer::default();
    timer.install();
    let config = config()?;
    let pool = pool(&config).await?;
    let client = Client::from_config(&config.valkey).await?;
    let mut conn = redis_conn(&config).await?;
    let metrics = Metrics::new();
    let relay = relay(pool.clone(), client.clone(), &config, &metrics, &cli.queue);
    let stop = CancellationToken::new();
    if subscribe {
        subscribe_to_wakeups(client.clone(), &relay, stop.clone());
    }
    if let Some(at) = start_at {
        let wait = at - unix_s();
        if wait > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
    }
    let cpu_before = process_stats()["cpu_ticks"].as_u64().unwrap_or(0);
    let started = unix_s();
    let running = tokio::spawn(relay.run(stop.clone()));
    let deadline = Instant::now() + Duration::from_secs(timeout);
    let mut timed_out = false;
    while pending_len(&mut conn, &cli.queue).await < expect {
        if Instant::now() > deadline {
            timed_out = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.cancel();
    running.await?;
    let finished = unix_s();
    let stats = process_stats();
    let published = metrics.relay.published.get();
    println!(
        "{}",
        json!({
            "started": started,
            "finished": finished,
            "published": published,
            "duplicates": metrics.relay.duplicates.get(),
            "errors": metrics.relay.errors.get(),
            "timed_out": timed_out,
            "events_per_s": published as f64 / (finished - started),
            "cpu_ticks": stats["cpu_ticks"].as_u64().unwrap_or(0) - cpu_before,
            "vm_hwm_kb": stats["vm_hwm_kb"],
            "vm_rss_kb": stats["vm_rss_kb"],
            "phases": timer.report(),
            "db_pool_size": config.database.max_connections,
            "batch_size": config.outbox.batch_size,
            "poll_interval_ms": config.outbox.poll_interval.as_millis() as u64,
        })
    );
    Ok(())
}

#[cfg(feature = "wake")]
fn subscribe_to_wakeups(client: Client, relay: &Relay, stop: CancellationToken) {
    tokio::spawn(outbox_bench::outbox::wake::forward_published(
        client,
        relay.waker(),
        stop,
    ));
}

#[cfg(not(feature = "wake"))]
fn subscribe_to_wakeups(_client: Client, _relay: &Relay, _stop: CancellationToken) {
    eprintln!("error: this project has no cross-process wake-up (kit/src/outbox/wake.rs)");
    std::process::exit(2);
}

/// The transactor the load generator commits through, with the wake-up
/// hook the project offers for `wake`.
async fn load_transactor(
    pool: PgPool,
    config: &Config,
    wake: WakeArg,
    local: Option<Arc<tokio::sync::Notify>>,
) -> anyhow::Result<(Transactor, &'static str)> {
    #[cfg(feature = "wake")]
    {
        use outbox_bench::outbox::wake::{self as w, Wake};
        match wake {
            WakeArg::Off => Ok((Transactor::new(pool), "none (polling only)")),
            WakeArg::Local => {
                let signal = Wake::local(local.expect("a local relay"));
                Ok((
                    Transactor::new(pool).after_commit(move || signal.signal()),
                    "in-process: Transactor::after_commit + Wake::local(relay.waker())",
                ))
            }
            WakeArg::Valkey => Ok((
                w::transactor(pool, config)?,
                "cross-process: OUTBOX_WAKE=valkey (wake::transactor publishes, relay runs wake::forward_published)",
            )),
        }
    }
    #[cfg(not(feature = "wake"))]
    {
        let _ = config;
        match wake {
            WakeArg::Off => Ok((Transactor::new(pool), "none (polling only)")),
            WakeArg::Local => {
                // No after_commit hook in this project: the load generator
                // notifies the relay's waker itself right after each commit.
                let _ = local;
                Ok((
                    Transactor::new(pool),
                    "in-process: relay.waker().notify_one() after each commit (no after_commit hook in this project)",
                ))
            }
            WakeArg::Valkey => anyhow::bail!("this project has no cross-process wake-up"),
        }
    }
}

async fn cmd_load(cli: &Cli, rate: u32, seconds: u32, wake: WakeArg) -> anyhow::Result<()> {
    if wake == WakeArg::Local {
        PhaseTimer::default().install();
    }
    let config = config()?;
    let pool = pool(&config).await?;
    let mut conn = redis_conn(&config).await?;
    let stop = CancellationToken::new();
    let metrics = Metrics::new();
    let mut local_waker = None;
    let mut local_relay = None;
    if wake == WakeArg::Local {
        let relay_pool = database::connect_lazy(&config.database);
        let client = Client::from_config(&config.valkey).await?;
        let relay = relay(relay_pool, client, &config, &metrics, &cli.queue);
        local_waker = Some(relay.waker());
        local_relay = Some(tokio::spawn(relay.run(stop.clone())));
    }
    let (transactor, method) = load_transactor(pool.clone(), &config, wake, local_waker.clone()).await?;
    // Without the project's hook, notify the relay directly after commit.
    let manual_notify = if cfg!(feature = "wake") { None } else { local_waker.clone() };
    let dispatcher = OutboxDispatcher::new();
    let total = u64::from(rate) * u64::from(seconds);
    let mut committed: Vec<(String, i64)> = Vec::with_capacity(total as usize);
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut commit_ms = Vec::with_capacity(total as usize);
    let started = Instant::now();
    for n in 0..total {
        ticker.tick().await;
        let event = OrderPlaced::sized(10_000_000 + n, cli.payload_bytes);
        let t0 = Instant::now();
        let envelope = transactor
            .run(async |tx| dispatcher.dispatch(&mut *tx, &event).await.map_err(anyhow::Error::from))
            .await?;
        // The commit is acknowledged (and the after-commit hook has run).
        let at = now_ns();
        if let Some(waker) = &manual_notify {
            waker.notify_one();
        }
        commit_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        committed.push((envelope.id.to_string(), at));
    }
    let produced_s = started.elapsed().as_secs_f64();
    // Wait for the relay (here or elsewhere) to queue everything.
    let deadline = Instant::now() + Duration::from_secs(30);
    while pending_len(&mut conn, &cli.queue).await < total as i64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    if let Some(running) = local_relay {
        running.await?;
    }
    // The enqueue script stores `pending_since` = the relay's clock (ns)
    // when it sent the batch; both clocks are this machine's.
    let mut latencies = Vec::with_capacity(committed.len());
    let mut missing = 0;
    for chunk in committed.chunks(1000) {
        let mut pipe = redis::pipe();
        for (id, _) in chunk {
            pipe.cmd("HGET").arg(keys::task(&cli.queue, id)).arg("pending_since");
        }
        let values: Vec<Option<i64>> = pipe.query_async(&mut conn).await?;
        for ((_, at), since) in chunk.iter().zip(values) {
            match since {
                Some(since) => latencies.push((since - at) as f64 / 1e6),
                None => missing += 1,
            }
        }
    }
    let negative = latencies.iter().filter(|l| **l < 0.0).count();
    println!(
        "{}",
        json!({
            "wake": method,
            "events": total,
            "achieved_rate": total as f64 / produced_s,
            "missing": missing,
            "negative": negative,
            "latency": summary_ms(latencies),
            "commit": summary_ms(commit_ms),
            "poll_interval_ms": config.outbox.poll_interval.as_millis() as u64,
        })
    );
    Ok(())
}

/// Pairs run before the timed ones by [`alternating`].
const WARMUP: u32 = 200;

/// Runs `run(variant, n)` for both variants of each `n`, alternating which
/// goes first so that drift affects both alike; the milliseconds each run
/// took after the first [`WARMUP`] pairs: (runs of `false`, runs of `true`).
async fn alternating(
    iterations: u32,
    mut run: impl AsyncFnMut(bool, u64) -> anyhow::Result<()>,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for n in 0..u64::from(iterations + WARMUP) {
        for variant in if n % 2 == 0 { [false, true] } else { [true, false] } {
            let t0 = Instant::now();
            run(variant, n).await?;
            let ms = t0.elapsed().as_secs_f64() * 1000.0;
            if n >= u64::from(WARMUP) {
                if variant { with.push(ms) } else { without.push(ms) }
            }
        }
    }
    Ok((without, with))
}

async fn cmd_insert_cost(cli: &Cli, iterations: u32) -> anyhow::Result<()> {
    let config = config()?;
    let pool = pool(&config).await?;
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_orders; \
         CREATE TABLE bench_orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
           customer_id text NOT NULL, total_cents bigint NOT NULL, \
           created_at timestamptz NOT NULL DEFAULT now())",
    )
    .execute(&pool)
    .await?;
    let transactor = Transactor::new(pool.clone());
    let dispatcher = OutboxDispatcher::new();
    let business = async |tx: &mut sqlx::PgConnection, n: u64| -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO bench_orders (customer_id, total_cents) VALUES ($1, $2)")
            .bind(format!("customer-{n}"))
            .bind(i64::try_from(n).unwrap_or(0))
            .execute(&mut *tx)
            .await?;
        Ok(())
    };
    let mut dispatch = Vec::new();
    let (alone, with) = alternating(iterations, async |variant, n| {
        let event = OrderPlaced::sized(10_000_000 + n, cli.payload_bytes);
        let inner = transactor
            .run(async |tx| {
                business(&mut *tx, n).await?;
                if variant {
                    let t = Instant::now();
                    dispatcher.dispatch(&mut *tx, &event).await?;
                    return Ok::<_, anyhow::Error>(Some(t.elapsed()));
                }
                Ok(None)
            })
            .await?;
        if let Some(d) = inner.filter(|_| n >= u64::from(WARMUP)) {
            dispatch.push(d.as_secs_f64() * 1000.0);
        }
        Ok(())
    })
    .await?;
    let settings: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, setting FROM pg_settings WHERE name IN ('synchronous_commit', 'fsync', 'wal_sync_method')",
    )
    .fetch_all(&pool)
    .await?;
    sqlx::raw_sql("DROP TABLE bench_orders").execute(&pool).await?;
    println!(
        "{}",
        json!({
            "iterations": iterations,
            "tx_business_only": summary_ms(alone),
            "tx_with_dispatch": summary_ms(with),
            "dispatch_in_tx": summary_ms(dispatch),
            "pg_settings": settings.into_iter().collect::<BTreeMap<_, _>>(),
        })
    );
    Ok(())
}

async fn cmd_listener_latency(
    cli: &Cli,
    rate: u32,
    seconds: u32,
    wake: WakeArg,
    committers: u32,
) -> anyhow::Result<()> {
    let config = config()?;
    let pool = pool(&config).await?;
    sqlx::raw_sql("TRUNCATE listener_runs").execute(&pool).await?;
    let (transactor, method) = load_transactor(pool.clone(), &config, wake, None).await?;
    let total = u64::from(rate) * u64::from(seconds);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let period = Duration::from_secs_f64(1.0 / f64::from(rate));
    let started = tokio::time::Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..committers.max(1) {
        let (transactor, next, payload_bytes) = (transactor.clone(), Arc::clone(&next), cli.payload_bytes);
        running.spawn(async move {
            let dispatcher = OutboxDispatcher::new();
            let mut committed: Vec<(uuid::Uuid, i64)> = Vec::new();
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n >= total {
                    return Ok::<_, anyhow::Error>(committed);
                }
                tokio::time::sleep_until(started + period.mul_f64(n as f64)).await;
                let event = BenchDone(OrderPlaced::sized(20_000_000 + n, payload_bytes));
                let envelope = transactor
                    .run(async |tx| dispatcher.dispatch(&mut *tx, &event).await.map_err(anyhow::Error::from))
                    .await?;
                committed.push((envelope.id, now_ns()));
            }
        });
    }
    let mut committed: Vec<(uuid::Uuid, i64)> = Vec::with_capacity(total as usize);
    while let Some(done) = running.join_next().await {
        committed.extend(done??);
    }
    let produced_s = started.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (ran,): (i64,) = sqlx::query_as("SELECT count(*) FROM listener_runs")
            .fetch_one(&pool)
            .await?;
        if ran >= committed.len() as i64 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ran: BTreeMap<uuid::Uuid, i64> =
        sqlx::query_as::<_, (uuid::Uuid, i64)>("SELECT event_id, ran_at_ns FROM listener_runs")
            .fetch_all(&pool)
            .await?
            .into_iter()
            .collect();
    let latencies: Vec<f64> = committed
        .iter()
        .filter_map(|(id, at)| ran.get(id).map(|ran| (ran - at) as f64 / 1e6))
        .collect();
    println!(
        "{}",
        json!({
            "wake": method,
            "events": total,
            "rate": rate,
            "committers": committers.max(1),
            "achieved_rate": total as f64 / produced_s,
            "missing": committed.len() - latencies.len(),
            "latency": summary_ms(latencies),
        })
    );
    Ok(())
}

async fn cmd_inbox_cost(iterations: u32) -> anyhow::Result<()> {
    let config = config()?;
    let pool = pool(&config).await?;
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_ledger; \
         CREATE TABLE bench_ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
           event_id uuid NOT NULL, amount bigint NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let transactor = Transactor::new(pool.clone());
    let business = async |tx: &mut sqlx::PgConnection, id: uuid::Uuid, n: u64| {
        sqlx::query("INSERT INTO bench_ledger (event_id, amount) VALUES ($1, $2)")
            .bind(id)
            .bind(i64::try_from(n).unwrap_or(0))
            .execute(&mut *tx)
            .await?;
        Ok::<_, anyhow::Error>(())
    };
    let (plain, once) = alternating(iterations, async |with_inbox, n| {
        let id = uuid::Uuid::now_v7();
        if with_inbox {
            let ran = inbox::once(&transactor, "bench", id, async |tx| business(tx, id, n).await)
                .await?;
            anyhow::ensure!(ran.is_some(), "a new event id was skipped");
        } else {
            transactor.run(async |tx| business(tx, id, n).await).await?;
        }
        Ok(())
    })
    .await?;
    sqlx::raw_sql("DROP TABLE bench_ledger; DELETE FROM inbox_processed WHERE listener = 'bench'")
        .execute(&pool)
        .await?;
    println!(
        "{}",
        json!({
            "iterations": iterations,
            "tx_plain": summary_ms(plain),
            "tx_once": summary_ms(once),
        })
    );
    Ok(())
}

async fn cmd_verify(cli: &Cli, expect: i64) -> anyhow::Result<()> {
    let config = config()?;
    let pool = pool(&config).await?;
    let mut conn = redis_conn(&config).await?;
    let queued: Vec<String> = redis::cmd("LRANGE")
        .arg(keys::pending(&cli.queue))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await?;
    let unique: HashSet<&str> = queued.iter().map(String::as_str).collect();
    let ids: Vec<(uuid::Uuid,)> = sqlx::query_as("SELECT event_id FROM outbox_events")
        .fetch_all(&pool)
        .await?;
    let in_db: HashSet<String> = ids.into_iter().map(|(id,)| id.to_string()).collect();
    let (unpublished,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM outbox_events WHERE published_at IS NULL")
            .fetch_one(&pool)
            .await?;
    let missing = in_db.iter().filter(|id| !unique.contains(id.as_str())).count();
    let ok = queued.len() as i64 == expect
        && unique.len() == queued.len()
        && missing == 0
        && unpublished == 0
        && in_db.len() as i64 == expect;
    println!(
        "{}",
        json!({
            "ok": ok,
            "expected": expect,
            "queue_length": queued.len(),
            "unique_ids": unique.len(),
            "rows": in_db.len(),
            "rows_not_in_queue": missing,
            "unpublished_rows": unpublished,
        })
    );
    Ok(())
}

/// After a worker drained the outbox: every row is published, and the
/// queue's completed set holds exactly each event's task and one task per
/// listener and event (ids as the fan-out derives them), each once; the
/// processed and failed counters and the other states are reported too.
async fn cmd_verify_listeners(cli: &Cli, listeners: &[String]) -> anyhow::Result<()> {
    let config = config()?;
    let pool = pool(&config).await?;
    let mut conn = redis_conn(&config).await?;
    let queue = &cli.queue;
    let completed: Vec<String> = redis::cmd("ZRANGE")
        .arg(keys::completed(queue))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await?;
    let completed: HashSet<String> = completed.into_iter().collect();
    let ids: Vec<(uuid::Uuid,)> = sqlx::query_as("SELECT event_id FROM outbox_events")
        .fetch_all(&pool)
        .await?;
    let mut expected = HashSet::new();
    for (id,) in &ids {
        expected.insert(id.to_string());
        for listener in listeners {
            expected.insert(listener_task_id(*id, listener).to_string());
        }
    }
    let (unpublished,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM outbox_events WHERE published_at IS NULL")
            .fetch_one(&pool)
            .await?;
    let (processed, failed): (Option<i64>, Option<i64>) = redis::cmd("MGET")
        .arg(keys::processed_total(queue))
        .arg(keys::failed_total(queue))
        .query_async(&mut conn)
        .await?;
    let mut left = serde_json::Map::new();
    for (state, key, list) in [
        ("pending", keys::pending(queue), true),
        ("active", keys::active(queue), true),
        ("scheduled", keys::scheduled(queue), false),
        ("retry", keys::retry(queue), false),
        ("archived", keys::archived(queue), false),
    ] {
        let n: i64 = redis::cmd(if list { "LLEN" } else { "ZCARD" })
            .arg(key)
            .query_async(&mut conn)
            .await?;
        left.insert(state.to_string(), json!(n));
    }
    let missing = expected.difference(&completed).count();
    let unexpected = completed.difference(&expected).count();
    let processed = processed.unwrap_or(0);
    let failed = failed.unwrap_or(0);
    let ok = missing == 0
        && unexpected == 0
        && unpublished == 0
        && processed == expected.len() as i64
        && failed == 0
        && left.values().all(|n| n.as_i64() == Some(0));
    println!(
        "{}",
        json!({
            "ok": ok,
            "events": ids.len(),
            "expected_tasks": expected.len(),
            "completed": completed.len(),
            "missing": missing,
            "unexpected": unexpected,
            "processed": processed,
            "failed": failed,
            "unpublished_rows": unpublished,
            "left": left,
        })
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match &cli.command {
        Command::Sample { message_file } => cmd_sample(&cli, message_file).await,
        Command::Seed { events, name } => cmd_seed(&cli, *events, name).await,
        Command::Relay {
            expect,
            start_at,
            subscribe,
            timeout,
        } => cmd_relay(&cli, *expect, *start_at, *subscribe, *timeout).await,
        Command::Load {
            rate,
            seconds,
            wake,
        } => cmd_load(&cli, *rate, *seconds, *wake).await,
        Command::InsertCost { iterations } => cmd_insert_cost(&cli, *iterations).await,
        Command::InboxCost { iterations } => cmd_inbox_cost(*iterations).await,
        Command::ListenerLatency {
            rate,
            seconds,
            wake,
            committers,
        } => cmd_listener_latency(&cli, *rate, *seconds, *wake, *committers).await,
        Command::Verify { expect } => cmd_verify(&cli, *expect).await,
        Command::VerifyListeners { listeners } => cmd_verify_listeners(&cli, listeners).await,
    }
}
