//! The outbox benchmark's Rust side: it drives the code of a project that
//! `gpkit new project outbox_bench` generated, through the kit's public API
//! only (`kit::worker::run`, `kit::dispatch`, `Transactor`,
//! `kit::outbox::wake::transactor`, `Config`), as the service's own code
//! would. `scripts/bench-outbox` copies this file to
//! `src/bin/outbox_bench.rs` of that project, builds it in release mode and
//! runs its subcommands; see scripts/bench/README.md. gpkit's CLI tests
//! compile it in a generated project of their own (`BENCH_SOURCES` in
//! tests/cli/event_e2e.rs), so it must build, warning-free under clippy,
//! with nothing but the dependencies a generated project has.
//!
//! Subcommands (each prints one JSON object on stdout):
//! - `sample`: the relay's encoded task message for a 1 KB event, for
//!   redis-benchmark (a worker of this process relays one event; the
//!   message is read back from Valkey);
//! - `seed`: a backlog of unpublished events with 1 KB payloads (of
//!   `orderPlaced`, which has no listeners, or of `--name`);
//! - `relay`: a worker of this process (`kit::worker::run`) that serves
//!   only as the relay (its consumer serves a queue nothing fills), until
//!   the queue holds `--expect` tasks; per-phase timings of the relay's
//!   rounds (its tracing spans), its counters (the worker's `/metrics`),
//!   CPU time and peak RSS;
//! - `load`: commits events at a steady rate (one per transaction, through
//!   `Transactor` and `kit::dispatch`) and reports commit-to-enqueue
//!   latency, with a relay in another process; with `--wake local`, the
//!   commits are a listener's `ctx.once` in a worker of this process, whose
//!   relay they wake in the process;
//! - `insert-cost`: a business transaction with and without the outbox
//!   insert;
//! - `listener-latency`: commits `benchDone` events at a steady rate (with
//!   `--committers` tasks when one connection cannot keep it) and reports
//!   commit-to-listener latency, read from what a worker's recording
//!   listener wrote;
//! - `inbox-cost`: a listener's transaction with and without the inbox
//!   (`ctx.once`), timed inside a listener of a worker of this process;
//! - `verify`: every event is in the queue exactly once;
//! - `verify-listeners`: after a worker ran, every event's task and the
//!   task of each `--listener` completed once, and nothing else is left.
//!
//! Configuration comes from the kit's `Config::from_env` (`DATABASE_URL`,
//! `VALKEY_ADDR`, `OUTBOX_*`, `WORKER_*`). The benchmark's own reads of
//! Valkey (queue lengths, task hashes) go through a small RESP client of
//! its own, by the asynq key names, which are the wire format Go asynq
//! shares.

// Nothing to test here: a test build of this binary (`cargo build
// --all-targets`, as gpkit's CI check does) compiles an empty crate rather
// than the benchmark a second time.
#![cfg(not(test))]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::{Display, Write as _};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kit::config::{Config, WakeMode};
use kit::database::Transactor;
use kit::outbox::Event;
use kit::scheduler::Schedules;
use kit::worker::listeners::{ListenerContext, ListenerError, Listeners};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::types::JsonValue as Json;

const USAGE: &str = "usage: outbox_bench [--queue Q] [--payload-bytes N] <command> [options]
commands: sample --message-file PATH | seed --events N [--name EVENT]
  | relay --expect N [--start-at UNIX_S] [--subscribe] [--timeout S]
  | load [--rate R] [--seconds S] [--wake off|valkey|local]
  | insert-cost [--iterations N] | inbox-cost [--iterations N]
  | listener-latency [--rate R] [--seconds S] [--wake off|valkey] [--committers N]
  | verify --expect N | verify-listeners --listener NAME...
(run by scripts/bench-outbox; see scripts/bench/README.md)";

/// A JSON object from `key => value` pairs (values `Into<Json>`).
macro_rules! object {
    ($($key:literal => $value:expr),* $(,)?) => {
        Json::from_iter([$((String::from($key), Json::from($value))),*])
    };
}

// ---------------------------------------------------------------------------
// The command line: `[--queue Q] [--payload-bytes N] <command> [--name value
// | --switch]...`, the global options anywhere.

/// Options that take no value.
const SWITCHES: &[&str] = &["subscribe"];

struct Args {
    command: String,
    /// The queue the relay publishes to (asynq:{<queue>}:...).
    queue: String,
    /// Size of each event's JSON payload, in bytes.
    payload_bytes: usize,
    values: HashMap<String, Vec<String>>,
    switches: HashSet<String>,
}

impl Args {
    fn parse() -> anyhow::Result<Self> {
        let mut command = None;
        let mut values: HashMap<String, Vec<String>> = HashMap::new();
        let mut switches = HashSet::new();
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            if arg == "--help" || arg == "-h" {
                println!("{USAGE}");
                std::process::exit(0);
            }
            if let Some(name) = arg.strip_prefix("--") {
                if SWITCHES.contains(&name) {
                    switches.insert(name.to_string());
                    continue;
                }
                let value = args
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--{name} needs a value\n{USAGE}"))?;
                values.entry(name.to_string()).or_default().push(value);
            } else if command.is_none() {
                command = Some(arg);
            } else {
                anyhow::bail!("unexpected argument {arg:?}\n{USAGE}");
            }
        }
        let mut args = Self {
            command: command.ok_or_else(|| anyhow::anyhow!("no command\n{USAGE}"))?,
            queue: String::new(),
            payload_bytes: 0,
            values,
            switches,
        };
        args.queue = args.get("queue", "outbox_bench".to_string())?;
        args.payload_bytes = args.get("payload-bytes", 1024)?;
        Ok(args)
    }

    /// Fails on an option the command does not take.
    fn allow(&self, names: &[&str]) -> anyhow::Result<()> {
        let known = |name: &String| {
            ["queue", "payload-bytes"].contains(&name.as_str()) || names.contains(&name.as_str())
        };
        if let Some(name) = self.values.keys().chain(&self.switches).find(|n| !known(n)) {
            anyhow::bail!("{} takes no --{name}\n{USAGE}", self.command);
        }
        Ok(())
    }

    fn optional<T: FromStr>(&self, name: &str) -> anyhow::Result<Option<T>>
    where
        T::Err: Display,
    {
        match self.values.get(name).and_then(|v| v.last()) {
            None => Ok(None),
            Some(text) => text
                .parse()
                .map(Some)
                .map_err(|err| anyhow::anyhow!("--{name} {text}: {err}")),
        }
    }

    fn get<T: FromStr>(&self, name: &str, default: T) -> anyhow::Result<T>
    where
        T::Err: Display,
    {
        Ok(self.optional(name)?.unwrap_or(default))
    }

    fn required<T: FromStr>(&self, name: &str) -> anyhow::Result<T>
    where
        T::Err: Display,
    {
        self.optional(name)?
            .ok_or_else(|| anyhow::anyhow!("{} needs --{name}\n{USAGE}", self.command))
    }

    fn all(&self, name: &str) -> &[String] {
        self.values.get(name).map_or(&[], Vec::as_slice)
    }

    fn switch(&self, name: &str) -> bool {
        self.switches.contains(name)
    }

    fn wake(&self, default: Wake) -> anyhow::Result<Wake> {
        match self.optional::<String>("wake")?.as_deref() {
            None => Ok(default),
            Some("off") => Ok(Wake::Off),
            Some("valkey") => Ok(Wake::Valkey),
            Some("local") => Ok(Wake::Local),
            Some(other) => anyhow::bail!("--wake {other}: off, valkey or local"),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// No wake-up: the load generator only commits; a relay in another
    /// process finds the events by polling.
    Off,
    /// Commits publish a wake-up on Valkey (`OUTBOX_WAKE=valkey`); a relay
    /// in another process subscribes to it.
    Valkey,
    /// `load` only: the commits are a listener's `ctx.once` in a worker of
    /// this process, whose relay they wake in the process (the kit has no
    /// public way to wake a worker's relay from a commit of the service's
    /// own transactor).
    Local,
}

// ---------------------------------------------------------------------------
// The events.

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

/// The events of `load --wake local`, one per commit to make: the
/// listener that runs each commits the `n`th event at its time.
#[derive(Serialize, Deserialize)]
struct BenchLoadTick {
    n: u64,
}

impl Event for BenchLoadTick {
    const NAME: &'static str = "benchLoadTick";
}

/// The events of `inbox-cost`, one per timed pair.
#[derive(Serialize, Deserialize)]
struct BenchInboxCost {
    n: u64,
}

impl Event for BenchInboxCost {
    const NAME: &'static str = "benchInboxCost";
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
        let base = Self {
            order_id: 10_000_000,
            ..event.clone()
        }
        .json_len();
        event.note = "x".repeat(bytes.saturating_sub(base));
        event
    }

    /// The length of the event's JSON as serde_json writes it (its
    /// strings need no escapes).
    fn json_len(&self) -> usize {
        format!(
            r#"{{"order_id":{},"customer_id":"{}","currency":"{}","total_cents":{},"note":"{}"}}"#,
            self.order_id, self.customer_id, self.currency, self.total_cents, self.note
        )
        .len()
    }
}

// ---------------------------------------------------------------------------
// Clocks, the process, JSON figures.

fn now_ns() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)
}

fn unix_s() -> f64 {
    now_ns() as f64 / 1e9
}

/// The process's peak and current resident set size, in KiB, and its CPU
/// time in clock ticks (user + system).
fn process_stats() -> (Option<u64>, Option<u64>, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|value| value.parse().ok())
    };
    (field("VmHWM:"), field("VmRSS:"), cpu_ticks())
}

fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses): utime is
    // field 14 and stime field 15 of the whole line.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    tick(11) + tick(12)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn summary_ms(mut values: Vec<f64>) -> Json {
    values.sort_by(f64::total_cmp);
    object! {
        "count" => values.len(),
        "min_ms" => values.first().copied(),
        "p50_ms" => percentile(&values, 50.0),
        "p90_ms" => percentile(&values, 90.0),
        "p99_ms" => percentile(&values, 99.0),
        "max_ms" => values.last().copied(),
        "mean_ms" => values.iter().sum::<f64>() / values.len().max(1) as f64,
    }
}

// ---------------------------------------------------------------------------
// Per-phase timing of relay rounds, from the relay's own tracing spans
// (`outbox.claim`, which also marks, and `outbox.enqueue`) and the gaps
// between them. Valid when one relay runs in the process (rounds are
// sequential). The process's tracing subscriber, also printing warnings
// and errors to stderr: the kit's logs subscriber would drop the relay's
// debug spans at RUST_LOG=warn, and the project has no tracing-subscriber
// of its own to layer on it.

#[derive(Default)]
struct Phases {
    samples: BTreeMap<&'static str, Vec<f64>>,
    last_close: Option<(&'static str, Instant)>,
    /// When the first claim started (Unix seconds).
    first_claim: Option<f64>,
}

#[derive(Clone, Default)]
struct PhaseTimer(Arc<Mutex<Phases>>);

struct OpenSpan {
    name: &'static str,
    start: Instant,
    refs: usize,
}

struct BenchSubscriber {
    timer: PhaseTimer,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, OpenSpan>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl BenchSubscriber {
    fn wants(metadata: &tracing::Metadata<'_>) -> bool {
        if metadata.is_span() {
            metadata.name().starts_with("outbox.")
        } else {
            *metadata.level() <= tracing::Level::WARN
        }
    }
}

impl tracing::Subscriber for BenchSubscriber {
    fn register_callsite(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if Self::wants(metadata) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        Self::wants(metadata)
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::DEBUG)
    }

    fn new_span(&self, attrs: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let now = Instant::now();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let name = attrs.metadata().name();
        lock(&self.open).insert(
            id,
            OpenSpan {
                name,
                start: now,
                refs: 1,
            },
        );
        let mut phases = lock(&self.timer.0);
        if name == "outbox.claim" && phases.first_claim.is_none() {
            phases.first_claim = Some(unix_s());
        }
        // The gap before this span, named after what runs in it.
        let gap = match (phases.last_close, name) {
            // enqueue closed -> replies, commit, loop, begin -> next claim
            (Some(("outbox.enqueue", at)), "outbox.claim") => Some(("commit+begin", at)),
            // claim closed -> build the tasks (serde_json of each envelope)
            (Some(("outbox.claim", at)), "outbox.enqueue") => Some(("build_tasks", at)),
            _ => None,
        };
        if let Some((gap, at)) = gap {
            let ms = now.duration_since(at).as_secs_f64() * 1000.0;
            phases.samples.entry(gap).or_default().push(ms);
        }
        tracing::span::Id::from_u64(id)
    }

    fn record(&self, _span: &tracing::span::Id, _values: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _span: &tracing::span::Id, _follows: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    let _ = write!(self.0, " {value:?}");
                } else {
                    let _ = write!(self.0, " {}={value:?}", field.name());
                }
            }
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        let metadata = event.metadata();
        eprintln!("{} {}:{}", metadata.level(), metadata.target(), fields.0);
    }

    fn enter(&self, _span: &tracing::span::Id) {}

    fn exit(&self, _span: &tracing::span::Id) {}

    fn clone_span(&self, id: &tracing::span::Id) -> tracing::span::Id {
        if let Some(span) = lock(&self.open).get_mut(&id.into_u64()) {
            span.refs += 1;
        }
        id.clone()
    }

    fn try_close(&self, id: tracing::span::Id) -> bool {
        let now = Instant::now();
        let closed = {
            let mut open = lock(&self.open);
            let Some(span) = open.get_mut(&id.into_u64()) else {
                return false;
            };
            span.refs -= 1;
            if span.refs > 0 {
                return false;
            }
            open.remove(&id.into_u64())
        };
        let Some(span) = closed else { return false };
        let key = match span.name {
            "outbox.claim" => "claim",
            "outbox.enqueue" => "enqueue",
            _ => return true,
        };
        let mut phases = lock(&self.timer.0);
        let ms = now.duration_since(span.start).as_secs_f64() * 1000.0;
        phases.samples.entry(key).or_default().push(ms);
        phases.last_close = Some((span.name, now));
        true
    }
}

impl PhaseTimer {
    /// Installs the process's subscriber, which times the relay's rounds.
    fn install() -> Self {
        let timer = Self::default();
        let subscriber = BenchSubscriber {
            timer: timer.clone(),
            next_id: AtomicU64::new(1),
            open: Mutex::default(),
        };
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
        timer
    }

    fn first_claim(&self) -> Option<f64> {
        lock(&self.0).first_claim
    }

    fn report(&self) -> Json {
        let phases = lock(&self.0);
        Json::from_iter(phases.samples.iter().map(|(name, samples)| {
            let mut sorted = samples.clone();
            sorted.sort_by(f64::total_cmp);
            let total: f64 = sorted.iter().sum();
            let figures = object! {
                "count" => sorted.len(),
                "mean_ms" => total / sorted.len().max(1) as f64,
                "p50_ms" => percentile(&sorted, 50.0),
                "p99_ms" => percentile(&sorted, 99.0),
                "total_s" => total / 1000.0,
            };
            ((*name).to_string(), figures)
        }))
    }
}

// ---------------------------------------------------------------------------
// Valkey: the benchmark's own reads, on one blocking connection (RESP2).

enum Reply {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Status(String),
    Array(Vec<Reply>),
}

impl Reply {
    fn int(&self) -> i64 {
        match self {
            Self::Int(n) => *n,
            Self::Bulk(bytes) => String::from_utf8_lossy(bytes).parse().unwrap_or(0),
            _ => 0,
        }
    }

    fn text(&self) -> Option<String> {
        match self {
            Self::Bulk(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            Self::Status(text) => Some(text.clone()),
            _ => None,
        }
    }

    fn texts(&self) -> Vec<String> {
        match self {
            Self::Array(items) => items.iter().filter_map(Self::text).collect(),
            _ => Vec::new(),
        }
    }
}

struct Redis {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Redis {
    /// Connects to `VALKEY_ADDR` (and selects `VALKEY_DB`): the benchmark
    /// runs against a server of its own, without a password or TLS.
    fn connect(config: &Config) -> anyhow::Result<Self> {
        let valkey = &config.valkey;
        anyhow::ensure!(
            valkey.url.is_none()
                && valkey.cluster_addrs.is_none()
                && valkey.sentinel_addrs.is_none()
                && valkey.password.is_none()
                && valkey.tls != Some(true),
            "the benchmark reads Valkey at VALKEY_ADDR, without a password or TLS"
        );
        let addr = valkey.addr.as_deref().unwrap_or("localhost:6379");
        let writer = TcpStream::connect(addr)?;
        writer.set_nodelay(true)?;
        let mut redis = Self {
            reader: BufReader::new(writer.try_clone()?),
            writer,
        };
        if let Some(db) = valkey.db.filter(|db| *db != 0) {
            redis.call(&["SELECT", &db.to_string()])?;
        }
        Ok(redis)
    }

    fn send(&mut self, args: &[&str]) -> anyhow::Result<()> {
        let mut command = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            command.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            command.extend_from_slice(arg.as_bytes());
            command.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&command)?;
        Ok(())
    }

    fn read(&mut self) -> anyhow::Result<Reply> {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line)?;
        anyhow::ensure!(line.ends_with(b"\r\n"), "Valkey closed the connection");
        let text = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
        let number = || text.parse::<i64>();
        Ok(match line[0] {
            b'+' => Reply::Status(text),
            b'-' => anyhow::bail!("Valkey: {text}"),
            b':' => Reply::Int(number()?),
            b'$' => match usize::try_from(number()?) {
                Err(_) => Reply::Nil,
                Ok(len) => {
                    let mut bytes = vec![0; len + 2];
                    self.reader.read_exact(&mut bytes)?;
                    bytes.truncate(len);
                    Reply::Bulk(bytes)
                }
            },
            b'*' => match usize::try_from(number()?) {
                Err(_) => Reply::Nil,
                Ok(len) => Reply::Array(
                    (0..len)
                        .map(|_| self.read())
                        .collect::<anyhow::Result<_>>()?,
                ),
            },
            other => anyhow::bail!("unexpected reply from Valkey: {:?}", char::from(other)),
        })
    }

    fn call(&mut self, args: &[&str]) -> anyhow::Result<Reply> {
        self.send(args)?;
        self.read()
    }

    /// The commands in one round trip; their replies.
    fn pipeline(&mut self, commands: &[Vec<String>]) -> anyhow::Result<Vec<Reply>> {
        for command in commands {
            let args: Vec<&str> = command.iter().map(String::as_str).collect();
            self.send(&args)?;
        }
        commands.iter().map(|_| self.read()).collect()
    }

    fn size(&mut self, command: &str, key: &str) -> anyhow::Result<i64> {
        Ok(self.call(&[command, key])?.int())
    }
}

/// A key of `queue`, as asynq names it: `asynq:{<queue>}:<name>`.
fn key(queue: &str, name: &str) -> String {
    format!("asynq:{{{queue}}}:{name}")
}

// ---------------------------------------------------------------------------
// The project's code: configuration, pool, a worker of this process.

fn config() -> anyhow::Result<Config> {
    Config::from_env().map_err(|err| anyhow::anyhow!("{err}"))
}

async fn pool(config: &Config) -> anyhow::Result<PgPool> {
    let pool = kit::database::connect_lazy(&config.database);
    // Open a connection now, so that start-up is not timed.
    sqlx::query("SELECT 1").execute(&pool).await?;
    Ok(pool)
}

/// `config` for a worker that serves as the relay alone: its relay
/// publishes to `queue`; its consumer (one slot) serves `<queue>_idle`,
/// which nothing fills; no scheduler; wake-ups through Valkey
/// (`OUTBOX_WAKE=valkey`: the relay subscribes, and its enqueues wake
/// consumers) only with `subscribe`. The kit has no public relay of its
/// own: this is the closest public way to run one.
fn relay_config(mut config: Config, queue: &str, subscribe: bool) -> anyhow::Result<Config> {
    config.outbox.queues = queue.parse().map_err(anyhow::Error::msg)?;
    config.worker.queues = format!("{queue}_idle=1")
        .parse()
        .map_err(anyhow::Error::msg)?;
    config.worker.concurrency = 1;
    config.scheduler.enabled = false;
    config.outbox.wake = if subscribe {
        WakeMode::Valkey
    } else {
        WakeMode::Off
    };
    Ok(config)
}

/// A worker of this process (`kit::worker::run`), with its metrics
/// endpoint on a free port of the loopback.
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    metrics: SocketAddr,
}

impl Running {
    fn start(mut config: Config, listeners: Listeners) -> anyhow::Result<Self> {
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        config.worker.metrics_addr = metrics;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            kit::worker::run(&config, listeners, Schedules::new(), shutdown).await
        });
        Ok(Self {
            stop,
            task,
            metrics,
        })
    }

    /// Fails when the worker stopped by itself (it could not start).
    async fn check(&mut self) -> anyhow::Result<()> {
        if self.task.is_finished() {
            (&mut self.task).await??;
            anyhow::bail!("the worker stopped");
        }
        Ok(())
    }

    /// The counters of the worker's `/metrics` whose names are given.
    fn counters(&self, names: &[&str]) -> anyhow::Result<BTreeMap<String, f64>> {
        let mut stream = TcpStream::connect(self.metrics)?;
        stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
        let mut text = String::new();
        stream.read_to_string(&mut text)?;
        Ok(text
            .lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(' ')?;
                if !names.contains(&name) {
                    return None;
                }
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect())
    }

    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await?
    }
}

// ---------------------------------------------------------------------------

async fn cmd_sample(args: &Args) -> anyhow::Result<()> {
    args.allow(&["message-file"])?;
    let message_file: String = args.required("message-file")?;
    let config = config()?;
    let pool = pool(&config).await?;
    let mut redis = Redis::connect(&config)?;
    let event = OrderPlaced::sized(12_345_678, args.payload_bytes);
    let envelope = kit::dispatch(&pool, &event).await?;
    let mut worker = Running::start(relay_config(config, &args.queue, false)?, Listeners::new())?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while redis.size("LLEN", &key(&args.queue, "pending"))? < 1 {
        worker.check().await?;
        anyhow::ensure!(
            Instant::now() < deadline,
            "the relay queued nothing in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.stop().await?;
    let task = key(&args.queue, &format!("t:{}", envelope.id));
    let Reply::Bulk(message) = redis.call(&["HGET", &task, "msg"])? else {
        anyhow::bail!("no message in {task}");
    };
    std::fs::write(&message_file, &message)?;
    println!(
        "{}",
        object! {
            "event_payload_bytes" => event.json_len(),
            "envelope_bytes" => protobuf_field_len(&message, 2),
            "message_bytes" => message.len(),
            "message_has_nul" => message.contains(&0),
        }
    );
    Ok(())
}

/// The length of the first field `number` of wire type 2 (bytes) in the
/// protobuf `message` (a task message's payload is field 2: the envelope).
fn protobuf_field_len(message: &[u8], number: u64) -> Option<usize> {
    fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
        let mut value = 0;
        for shift in (0..64).step_by(7) {
            let byte = *bytes.get(*at)?;
            *at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
    let mut at = 0;
    while at < message.len() {
        let tag = varint(message, &mut at)?;
        let len = match tag & 7 {
            0 => {
                varint(message, &mut at)?;
                0
            }
            1 => 8,
            2 => usize::try_from(varint(message, &mut at)?).ok()?,
            5 => 4,
            _ => return None,
        };
        if tag >> 3 == number && tag & 7 == 2 {
            return Some(len);
        }
        at += len;
    }
    None
}

async fn cmd_seed(args: &Args) -> anyhow::Result<()> {
    args.allow(&["events", "name"])?;
    let events: i64 = args.required("events")?;
    let name: String = args.get("name", OrderPlaced::NAME.to_string())?;
    let config = config()?;
    let pool = pool(&config).await?;
    let template = OrderPlaced::sized(0, args.payload_bytes);
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
        .bind(&name)
        .bind(sqlx::types::Json(&template))
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
        object! {
            "unpublished" => count,
            "avg_payload_bytes" => avg,
            "seconds" => started.elapsed().as_secs_f64(),
        }
    );
    Ok(())
}

async fn cmd_relay(args: &Args) -> anyhow::Result<()> {
    args.allow(&["expect", "start-at", "subscribe", "timeout"])?;
    let expect: i64 = args.required("expect")?;
    let start_at: Option<f64> = args.optional("start-at")?;
    let timeout: u64 = args.get("timeout", 600)?;
    let timer = PhaseTimer::install();
    let config = relay_config(config()?, &args.queue, args.switch("subscribe"))?;
    let (pool_size, batch_size) = (config.database.max_connections, config.outbox.batch_size);
    let poll_interval = config.outbox.poll_interval;
    let mut redis = Redis::connect(&config)?;
    if let Some(at) = start_at {
        let wait = at - unix_s();
        if wait > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
    }
    let cpu_before = cpu_ticks();
    let started = unix_s();
    let mut worker = Running::start(config, Listeners::new())?;
    let deadline = Instant::now() + Duration::from_secs(timeout);
    let pending = key(&args.queue, "pending");
    let mut timed_out = false;
    // Polled from the runtime's main thread (which runs no task of the
    // worker's): a blocking read every 5 ms.
    while redis.size("LLEN", &pending)? < expect {
        worker.check().await?;
        if Instant::now() > deadline {
            timed_out = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let finished = unix_s();
    let counters = worker.counters(&[
        "outbox_published_total",
        "outbox_duplicates_total",
        "outbox_relay_errors_total",
    ])?;
    worker.stop().await?;
    let (vm_hwm_kb, vm_rss_kb, cpu_after) = process_stats();
    // Counters, whole numbers in the text format; none: not scraped.
    let counter = |name: &str| counters.get(name).map(|n| n.round() as u64);
    let published = counter("outbox_published_total").unwrap_or(0);
    let first_claim = timer.first_claim();
    println!(
        "{}",
        object! {
            "started" => started,
            "first_claim" => first_claim,
            "finished" => finished,
            "published" => published,
            "duplicates" => counter("outbox_duplicates_total"),
            "errors" => counter("outbox_relay_errors_total"),
            "timed_out" => timed_out,
            "events_per_s" => published as f64 / (finished - first_claim.unwrap_or(started)),
            "cpu_ticks" => cpu_after - cpu_before,
            "vm_hwm_kb" => vm_hwm_kb,
            "vm_rss_kb" => vm_rss_kb,
            "phases" => timer.report(),
            "db_pool_size" => pool_size,
            "batch_size" => batch_size,
            "poll_interval_ms" => poll_interval.as_secs_f64() * 1000.0,
        }
    );
    Ok(())
}

/// The transactor the load generator commits through: with `Valkey`, the
/// one a service builds for its handlers (`kit::outbox::wake::transactor`
/// with `OUTBOX_WAKE=valkey`: every commit publishes a wake-up).
fn load_transactor(
    pool: PgPool,
    config: &mut Config,
    wake: Wake,
) -> anyhow::Result<(Transactor, &'static str)> {
    Ok(match wake {
        Wake::Local => anyhow::bail!("--wake local: `load` only"),
        Wake::Off => (Transactor::new(pool), "none (polling only)"),
        Wake::Valkey => {
            config.outbox.wake = WakeMode::Valkey;
            (
                kit::outbox::wake::transactor(pool, config)?,
                "cross-process: OUTBOX_WAKE=valkey (kit::outbox::wake::transactor publishes, \
                 the relay's worker subscribes)",
            )
        }
    })
}

async fn cmd_load(args: &Args) -> anyhow::Result<()> {
    args.allow(&["rate", "seconds", "wake"])?;
    let rate: u32 = args.get("rate", 100)?;
    let seconds: u32 = args.get("seconds", 25)?;
    let wake = args.wake(Wake::Off)?;
    if wake == Wake::Local {
        return cmd_load_local(args, rate, seconds).await;
    }
    let mut config = config()?;
    let pool = pool(&config).await?;
    let mut redis = Redis::connect(&config)?;
    let (transactor, method) = load_transactor(pool, &mut config, wake)?;
    let total = u64::from(rate) * u64::from(seconds);
    let mut committed: Vec<(String, i64)> = Vec::new();
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut commit_ms = Vec::new();
    let started = Instant::now();
    for n in 0..total {
        ticker.tick().await;
        let event = OrderPlaced::sized(10_000_000 + n, args.payload_bytes);
        let t0 = Instant::now();
        let envelope = transactor
            .run(async |tx| Ok(kit::dispatch(&mut *tx, &event).await?))
            .await?;
        // The commit is acknowledged (and the after-commit hook has run).
        let at = now_ns();
        commit_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        committed.push((envelope.id.to_string(), at));
    }
    let produced_s = started.elapsed().as_secs_f64();
    // Wait for the relay (in another process) to queue everything.
    let deadline = Instant::now() + Duration::from_secs(30);
    let pending = key(&args.queue, "pending");
    while redis.size("LLEN", &pending)? < i64::try_from(total)? && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = enqueue_latency(&mut redis, &args.queue, &committed)?;
    println!(
        "{}",
        object! {
            "wake" => method,
            "events" => total,
            "achieved_rate" => total as f64 / produced_s,
            "missing" => report.1,
            "negative" => report.2,
            "latency" => report.0,
            "commit" => summary_ms(commit_ms),
            "poll_interval_ms" => config.outbox.poll_interval.as_secs_f64() * 1000.0,
        }
    );
    Ok(())
}

/// Commit to enqueue of each `(task id, commit time in ns)`: the enqueue
/// script stores `pending_since`, the relay's clock (ns) when it sent the
/// batch, in the task's hash in `queue`; both clocks are this machine's.
/// The latencies' summary, how many tasks were not found, how many
/// latencies were negative.
fn enqueue_latency(
    redis: &mut Redis,
    queue: &str,
    committed: &[(String, i64)],
) -> anyhow::Result<(Json, usize, usize)> {
    let mut latencies = Vec::with_capacity(committed.len());
    let mut missing = 0;
    for chunk in committed.chunks(1000) {
        let commands: Vec<Vec<String>> = chunk
            .iter()
            .map(|(id, _)| {
                let task = key(queue, &format!("t:{id}"));
                vec!["HGET".into(), task, "pending_since".into()]
            })
            .collect();
        for ((_, at), since) in chunk.iter().zip(redis.pipeline(&commands)?) {
            match since {
                Reply::Nil => missing += 1,
                since => latencies.push((since.int() - at) as f64 / 1e6),
            }
        }
    }
    let negative = latencies.iter().filter(|l| **l < 0.0).count();
    Ok((summary_ms(latencies), missing, negative))
}

/// What the listener of `load --wake local` recorded: (event id, commit
/// time in ns), and how long each `ctx.once` took.
type LoadCommits = Arc<Mutex<(Vec<(String, i64)>, Vec<f64>)>>;

/// `load --wake local`: the commits are made in a worker of this process,
/// each by a run of its listener (`ctx.once`, one event per transaction),
/// which wakes that worker's relay in the process. `rate` × `seconds`
/// `benchLoadTick` events are committed first; the nth one's run waits for
/// its time (n / `rate` s after the start) and then commits the nth
/// measured event. Every event goes to two queues: the benchmark's, where
/// its task waits with its `pending_since`, and `<queue>_local`, the one
/// the worker consumes (ticks run the listener; the measured events have
/// no listener). With `OUTBOX_WAKE=valkey`, so that the relay's enqueues
/// wake the worker's consumer at once; the relay is woken in the process
/// first, before the wake-up published on Valkey comes back.
async fn cmd_load_local(args: &Args, rate: u32, seconds: u32) -> anyhow::Result<()> {
    let mut config = config()?;
    let pool = pool(&config).await?;
    let mut redis = Redis::connect(&config)?;
    let total = u64::from(rate) * u64::from(seconds);
    let ticks = format!("{}_local", args.queue);
    config.outbox.queues = format!("{},{ticks}", args.queue)
        .parse()
        .map_err(anyhow::Error::msg)?;
    config.worker.queues = format!("{ticks}=1").parse().map_err(anyhow::Error::msg)?;
    config.scheduler.enabled = false;
    config.outbox.wake = WakeMode::Valkey;
    let poll_interval = config.outbox.poll_interval;
    sqlx::query(
        "INSERT INTO outbox_events (event_id, event_name, payload) \
         SELECT gen_random_uuid(), $1, jsonb_build_object('n', g) \
         FROM generate_series(0, $2 - 1) g",
    )
    .bind(BenchLoadTick::NAME)
    .bind(i64::try_from(total)?)
    .execute(&pool)
    .await?;
    // Time for the worker to start and queue the ticks.
    let started = tokio::time::Instant::now() + Duration::from_secs(2);
    let period = Duration::from_secs_f64(1.0 / f64::from(rate));
    let commits = LoadCommits::default();
    let mut listeners = Listeners::new();
    listeners.listen("load", {
        let (commits, payload_bytes) = (Arc::clone(&commits), args.payload_bytes);
        move |tick: BenchLoadTick, ctx: ListenerContext| {
            let commits = Arc::clone(&commits);
            async move {
                tokio::time::sleep_until(started + period.mul_f64(tick.n as f64)).await;
                let event = OrderPlaced::sized(10_000_000 + tick.n, payload_bytes);
                let t0 = Instant::now();
                let stored = ctx
                    .once(async |tx| Ok(kit::dispatch(&mut *tx, &event).await?))
                    .await?;
                // The commit is acknowledged (and the after-commit hooks ran).
                let at = now_ns();
                if let Some(envelope) = stored {
                    let mut commits = lock(&commits);
                    commits.0.push((envelope.id.to_string(), at));
                    commits.1.push(t0.elapsed().as_secs_f64() * 1000.0);
                }
                Ok::<_, ListenerError>(())
            }
        }
    });
    let mut worker = Running::start(config, listeners)?;
    let deadline = Instant::now() + Duration::from_secs(u64::from(seconds) + 60);
    while (lock(&commits).0.len() as u64) < total {
        worker.check().await?;
        anyhow::ensure!(
            Instant::now() < deadline,
            "the listener committed {} of {total} events",
            lock(&commits).0.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let produced_s = (tokio::time::Instant::now() - started).as_secs_f64();
    // Wait for the relay to queue everything: each tick and each measured
    // event has a task in the benchmark's queue.
    let deadline = Instant::now() + Duration::from_secs(30);
    let pending = key(&args.queue, "pending");
    while redis.size("LLEN", &pending)? < 2 * i64::try_from(total)? && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.stop().await?;
    let (committed, commit_ms) = std::mem::take(&mut *lock(&commits));
    let report = enqueue_latency(&mut redis, &args.queue, &committed)?;
    println!(
        "{}",
        object! {
            "wake" => "in-process: a listener's ctx.once in the relay's own worker (kit::worker::run) \
                       dispatches, and its commit wakes that worker's relay",
            "events" => total,
            "achieved_rate" => total as f64 / produced_s,
            "missing" => report.1,
            "negative" => report.2,
            "latency" => report.0,
            "commit" => summary_ms(commit_ms),
            "poll_interval_ms" => poll_interval.as_secs_f64() * 1000.0,
        }
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
        for variant in if n.is_multiple_of(2) {
            [false, true]
        } else {
            [true, false]
        } {
            let t0 = Instant::now();
            run(variant, n).await?;
            let ms = t0.elapsed().as_secs_f64() * 1000.0;
            if n >= u64::from(WARMUP) {
                if variant {
                    with.push(ms)
                } else {
                    without.push(ms)
                }
            }
        }
    }
    Ok((without, with))
}

async fn pg_settings(pool: &PgPool) -> anyhow::Result<Json> {
    let settings: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, setting FROM pg_settings \
         WHERE name IN ('synchronous_commit', 'fsync', 'wal_sync_method')",
    )
    .fetch_all(pool)
    .await?;
    Ok(Json::from_iter(settings))
}

async fn cmd_insert_cost(args: &Args) -> anyhow::Result<()> {
    args.allow(&["iterations"])?;
    let iterations: u32 = args.get("iterations", 3000)?;
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
        let event = OrderPlaced::sized(10_000_000 + n, args.payload_bytes);
        let inner = transactor
            .run(async |tx| {
                business(&mut *tx, n).await?;
                if variant {
                    let t = Instant::now();
                    kit::dispatch(&mut *tx, &event).await?;
                    return Ok(Some(t.elapsed()));
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
    let settings = pg_settings(&pool).await?;
    sqlx::raw_sql("DROP TABLE bench_orders")
        .execute(&pool)
        .await?;
    println!(
        "{}",
        object! {
            "iterations" => iterations,
            "tx_business_only" => summary_ms(alone),
            "tx_with_dispatch" => summary_ms(with),
            "dispatch_in_tx" => summary_ms(dispatch),
            "pg_settings" => settings,
        }
    );
    Ok(())
}

async fn cmd_listener_latency(args: &Args) -> anyhow::Result<()> {
    args.allow(&["rate", "seconds", "wake", "committers"])?;
    let rate: u32 = args.get("rate", 20)?;
    let seconds: u32 = args.get("seconds", 10)?;
    let wake = args.wake(Wake::Valkey)?;
    let committers: u32 = args.get::<u32>("committers", 1)?.max(1);
    let mut config = config()?;
    let pool = pool(&config).await?;
    sqlx::raw_sql("TRUNCATE listener_runs")
        .execute(&pool)
        .await?;
    let (transactor, method) = load_transactor(pool.clone(), &mut config, wake)?;
    let total = u64::from(rate) * u64::from(seconds);
    let next = Arc::new(AtomicU64::new(0));
    let period = Duration::from_secs_f64(1.0 / f64::from(rate));
    let started = tokio::time::Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..committers {
        let (transactor, next, payload_bytes) =
            (transactor.clone(), Arc::clone(&next), args.payload_bytes);
        running.spawn(async move {
            let mut committed: Vec<(uuid::Uuid, i64)> = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    return Ok::<_, anyhow::Error>(committed);
                }
                tokio::time::sleep_until(started + period.mul_f64(n as f64)).await;
                let event = BenchDone(OrderPlaced::sized(20_000_000 + n, payload_bytes));
                let envelope = transactor
                    .run(async |tx| Ok(kit::dispatch(&mut *tx, &event).await?))
                    .await?;
                committed.push((envelope.id, now_ns()));
            }
        });
    }
    let mut committed: Vec<(uuid::Uuid, i64)> = Vec::new();
    while let Some(done) = running.join_next().await {
        committed.extend(done??);
    }
    let produced_s = started.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (ran,): (i64,) = sqlx::query_as("SELECT count(*) FROM listener_runs")
            .fetch_one(&pool)
            .await?;
        if ran >= i64::try_from(committed.len())? || Instant::now() > deadline {
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
        object! {
            "wake" => method,
            "events" => total,
            "rate" => rate,
            "committers" => committers,
            "achieved_rate" => total as f64 / produced_s,
            "missing" => committed.len() - latencies.len(),
            "latency" => summary_ms(latencies),
        }
    );
    Ok(())
}

/// The timings of one `inbox-cost` pair: (n, plain ms, in `ctx.once` ms).
type InboxSamples = Arc<Mutex<BTreeMap<u64, (f64, f64)>>>;

/// What `ctx.once` (the inbox) adds to a listener's transaction: the same
/// business INSERT in a plain transaction and in `ctx.once`, in each run
/// of a listener of a worker of this process (one slot), alternating which
/// goes first. Each pair needs an event of its own (`ctx.once` commits once
/// per event): `iterations` + [`WARMUP`] events are committed first.
async fn cmd_inbox_cost(args: &Args) -> anyhow::Result<()> {
    args.allow(&["iterations"])?;
    let iterations: u32 = args.get("iterations", 3000)?;
    let total = u64::from(iterations + WARMUP);
    let mut config = config()?;
    let pool = pool(&config).await?;
    let queue = format!("{}_inbox", args.queue);
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_ledger; \
         CREATE TABLE bench_ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
           event_id uuid NOT NULL, amount bigint NOT NULL)",
    )
    .execute(&pool)
    .await?;
    sqlx::query(
        "INSERT INTO outbox_events (event_id, event_name, payload) \
         SELECT gen_random_uuid(), $1, jsonb_build_object('n', g) \
         FROM generate_series(0, $2 - 1) g",
    )
    .bind(BenchInboxCost::NAME)
    .bind(i64::try_from(total)?)
    .execute(&pool)
    .await?;
    config.outbox.queues = queue.parse().map_err(anyhow::Error::msg)?;
    config.worker.queues = format!("{queue}=1").parse().map_err(anyhow::Error::msg)?;
    config.worker.concurrency = 1;
    config.scheduler.enabled = false;
    config.outbox.wake = WakeMode::Off;
    let samples = InboxSamples::default();
    let mut listeners = Listeners::new();
    listeners.listen("bench", {
        let samples = Arc::clone(&samples);
        move |event: BenchInboxCost, ctx: ListenerContext| {
            let samples = Arc::clone(&samples);
            async move { time_inbox_pair(event.n, ctx, samples).await }
        }
    });
    let mut worker = Running::start(config, listeners)?;
    let deadline = Instant::now() + Duration::from_secs(120 + total / 20);
    while (lock(&samples).len() as u64) < total {
        worker.check().await?;
        anyhow::ensure!(
            Instant::now() < deadline,
            "the listener ran {} of {total} times",
            lock(&samples).len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.stop().await?;
    let (plain, once): (Vec<f64>, Vec<f64>) = lock(&samples)
        .range(u64::from(WARMUP)..)
        .map(|(_, pair)| *pair)
        .unzip();
    sqlx::raw_sql(
        "DROP TABLE bench_ledger; DELETE FROM inbox_processed WHERE listener = 'bench'; \
         TRUNCATE outbox_events",
    )
    .execute(&pool)
    .await?;
    println!(
        "{}",
        object! {
            "iterations" => iterations,
            "tx_plain" => summary_ms(plain),
            "tx_once" => summary_ms(once),
            "pg_settings" => pg_settings(&pool).await?,
        }
    );
    Ok(())
}

/// One pair of `inbox-cost`: the business INSERT in a plain transaction
/// (on the worker's pool) and in `ctx.once`, in the order `n` says.
async fn time_inbox_pair(
    n: u64,
    ctx: ListenerContext,
    samples: InboxSamples,
) -> Result<(), ListenerError> {
    let transactor = Transactor::new(ctx.pool().clone());
    let id = ctx.event_id();
    let amount = i64::try_from(n)?;
    let business = async |tx: &mut sqlx::PgConnection| {
        sqlx::query("INSERT INTO bench_ledger (event_id, amount) VALUES ($1, $2)")
            .bind(id)
            .bind(amount)
            .execute(&mut *tx)
            .await?;
        Ok::<_, anyhow::Error>(())
    };
    let (mut plain, mut once) = (0.0, 0.0);
    for with_inbox in if n.is_multiple_of(2) {
        [false, true]
    } else {
        [true, false]
    } {
        let t0 = Instant::now();
        if with_inbox {
            let ran = ctx.once(async |tx| business(tx).await).await?;
            anyhow::ensure!(ran.is_some(), "ctx.once skipped a new event");
            once = t0.elapsed().as_secs_f64() * 1000.0;
        } else {
            transactor.run(async |tx| business(tx).await).await?;
            plain = t0.elapsed().as_secs_f64() * 1000.0;
        }
    }
    // A run again (a retry) keeps its first figures.
    lock(&samples).entry(n).or_insert((plain, once));
    Ok(())
}

async fn cmd_verify(args: &Args) -> anyhow::Result<()> {
    args.allow(&["expect"])?;
    let expect: i64 = args.required("expect")?;
    let config = config()?;
    let pool = pool(&config).await?;
    let mut redis = Redis::connect(&config)?;
    let queued = redis
        .call(&["LRANGE", &key(&args.queue, "pending"), "0", "-1"])?
        .texts();
    let unique: HashSet<&str> = queued.iter().map(String::as_str).collect();
    let ids: Vec<(uuid::Uuid,)> = sqlx::query_as("SELECT event_id FROM outbox_events")
        .fetch_all(&pool)
        .await?;
    let in_db: HashSet<String> = ids.into_iter().map(|(id,)| id.to_string()).collect();
    let (unpublished,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM outbox_events WHERE published_at IS NULL")
            .fetch_one(&pool)
            .await?;
    let missing = in_db
        .iter()
        .filter(|id| !unique.contains(id.as_str()))
        .count();
    let ok = i64::try_from(queued.len())? == expect
        && unique.len() == queued.len()
        && missing == 0
        && unpublished == 0
        && i64::try_from(in_db.len())? == expect;
    println!(
        "{}",
        object! {
            "ok" => ok,
            "expected" => expect,
            "queue_length" => queued.len(),
            "unique_ids" => unique.len(),
            "rows" => in_db.len(),
            "rows_not_in_queue" => missing,
            "unpublished_rows" => unpublished,
        }
    );
    Ok(())
}

/// After a worker drained the outbox: every row is published, and the
/// queue's completed set holds exactly each event's task and one task per
/// listener and event (ids as the fan-out derives them: the UUIDv5 of the
/// listener's name in the event id's namespace, as the generated README
/// says), each once; the processed and failed counters and the other states
/// are reported too.
async fn cmd_verify_listeners(args: &Args) -> anyhow::Result<()> {
    args.allow(&["listener"])?;
    let listeners = args.all("listener");
    anyhow::ensure!(!listeners.is_empty(), "verify-listeners needs --listener");
    let config = config()?;
    let pool = pool(&config).await?;
    let mut redis = Redis::connect(&config)?;
    let queue = &args.queue;
    let completed: HashSet<String> = redis
        .call(&["ZRANGE", &key(queue, "completed"), "0", "-1"])?
        .texts()
        .into_iter()
        .collect();
    let ids: Vec<(uuid::Uuid,)> = sqlx::query_as("SELECT event_id FROM outbox_events")
        .fetch_all(&pool)
        .await?;
    let mut expected = HashSet::new();
    for (id,) in &ids {
        expected.insert(id.to_string());
        for listener in listeners {
            expected.insert(uuid::Uuid::new_v5(id, listener.as_bytes()).to_string());
        }
    }
    let (unpublished,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM outbox_events WHERE published_at IS NULL")
            .fetch_one(&pool)
            .await?;
    let totals = redis.call(&["MGET", &key(queue, "processed"), &key(queue, "failed")])?;
    let (processed, failed) = match &totals {
        Reply::Array(values) if values.len() == 2 => (values[0].int(), values[1].int()),
        _ => (0, 0),
    };
    let mut left = BTreeMap::new();
    for (state, command) in [
        ("pending", "LLEN"),
        ("active", "LLEN"),
        ("scheduled", "ZCARD"),
        ("retry", "ZCARD"),
        ("archived", "ZCARD"),
    ] {
        left.insert(state.to_string(), redis.size(command, &key(queue, state))?);
    }
    let missing = expected.difference(&completed).count();
    let unexpected = completed.difference(&expected).count();
    let ok = missing == 0
        && unexpected == 0
        && unpublished == 0
        && processed == i64::try_from(expected.len())?
        && failed == 0
        && left.values().all(|n| *n == 0);
    println!(
        "{}",
        object! {
            "ok" => ok,
            "events" => ids.len(),
            "expected_tasks" => expected.len(),
            "completed" => completed.len(),
            "missing" => missing,
            "unexpected" => unexpected,
            "processed" => processed,
            "failed" => failed,
            "unpublished_rows" => unpublished,
            "left" => Json::from_iter(left),
        }
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse()?;
    match args.command.as_str() {
        "sample" => cmd_sample(&args).await,
        "seed" => cmd_seed(&args).await,
        "relay" => cmd_relay(&args).await,
        "load" => cmd_load(&args).await,
        "insert-cost" => cmd_insert_cost(&args).await,
        "inbox-cost" => cmd_inbox_cost(&args).await,
        "listener-latency" => cmd_listener_latency(&args).await,
        "verify" => cmd_verify(&args).await,
        "verify-listeners" => cmd_verify_listeners(&args).await,
        other => anyhow::bail!("unknown command {other:?}\n{USAGE}"),
    }
}
