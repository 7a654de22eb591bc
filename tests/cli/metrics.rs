//! The generated service's metrics, scraped from a running server and
//! worker (real Postgres and Valkey) and parsed: every metric the kit's
//! `docs/metrics.md` lists and every metric the Grafana dashboard of `gpkit add
//! deploy` queries is exported, and the values follow what ran (events,
//! listener runs, requests, the scheduler's lead, the queue's totals under
//! Go asynq's names).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::{http_get, repo};
use crate::valkey_infra::{bin, commit_events, database, project, wait_for_listeners};
use crate::worker_e2e::{RedisServer, free_port, wait_until};

/// One sample of the Prometheus text format: its labels and value.
pub(crate) type Samples = BTreeMap<String, Vec<(BTreeMap<String, String>, f64)>>;

/// Parses the Prometheus text format: sample name to its label sets and
/// values. Panics on a line that is not a comment or a sample.
fn parse(text: &str) -> Samples {
    let mut samples = Samples::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("not a sample: {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("not a value: {line:?}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let rest = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels: {line:?}"));
                let labels = rest
                    .split("\",")
                    .filter(|pair| !pair.is_empty())
                    .map(|pair| {
                        let (key, value) = pair
                            .split_once("=\"")
                            .unwrap_or_else(|| panic!("not a label: {pair:?} in {line:?}"));
                        (key.to_string(), value.trim_end_matches('"').to_string())
                    })
                    .collect();
                (name, labels)
            }
            None => (series, BTreeMap::new()),
        };
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "not a metric name: {name:?} in {line:?}"
        );
        samples
            .entry(name.to_string())
            .or_default()
            .push((labels, value));
    }
    samples
}

/// The value of `name`'s sample whose labels include `labels`.
pub(crate) fn value(samples: &Samples, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples.get(name)?.iter().find_map(|(have, value)| {
        labels
            .iter()
            .all(|(key, want)| have.get(*key).map(String::as_str) == Some(*want))
            .then_some(*value)
    })
}

/// `GET /metrics` on 127.0.0.1:`port`, parsed.
pub(crate) fn scrape(port: u16) -> Samples {
    let (status, body) = http_get(port, "/metrics");
    assert_eq!(status, 200, "{body}");
    parse(&body)
}

/// `GET path` on 127.0.0.1:`port`; the status code, 0 when nothing answers.
fn status(port: u16, path: &str) -> u16 {
    http_get(port, path).0
}

/// A binary of the project, stopped (SIGTERM, then killed) when dropped.
struct Process(Child);

impl Process {
    fn start(name: &str, env: &[(&str, &str)]) -> Self {
        let child = Command::new(bin(name))
            .current_dir(project())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Self(child)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        for _ in 0..100 {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The metric names of the kit's metrics table (`kit/docs/metrics.md`).
fn readme_metrics(project: &Path) -> BTreeSet<String> {
    let readme = std::fs::read_to_string(project.join("kit/docs/metrics.md")).unwrap();
    let table: BTreeSet<String> = readme
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`').map(|(name, _)| name.to_string()))
        .filter(|name| {
            ["outbox_", "asynq_", "http_server_"]
                .iter()
                .any(|p| name.starts_with(p))
        })
        .collect();
    assert!(table.len() >= 20, "kit/docs/metrics.md lists {table:?}");
    table
}

/// The metric names the dashboard's queries use, and its panel titles.
fn dashboard_metrics() -> (BTreeSet<String>, Vec<String>) {
    let path = repo().join("templates/deploy/deploy/grafana/outbox.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut names = BTreeSet::new();
    let mut titles = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        titles.push(panel["title"].as_str().unwrap().to_string());
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("a query");
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if ["outbox_", "asynq_", "http_server_"]
                    .iter()
                    .any(|p| word.starts_with(p))
                {
                    names.insert(word.to_string());
                }
            }
        }
    }
    (names, titles)
}

/// A histogram or counter named in kit/docs/metrics.md is exported under its
/// sample names (`_bucket`/`_count`/`_sum`, `_total`).
fn is_exported(samples: &Samples, name: &str) -> bool {
    samples.contains_key(name) || samples.contains_key(&format!("{name}_count"))
}

#[test]
#[ignore = "builds a generated project"]
fn the_server_and_worker_export_every_metric_the_readme_and_dashboard_name() {
    const EVENTS: u32 = 20;
    let db = database();
    let redis = RedisServer::start();
    let (metrics_port, http_port) = (free_port(), free_port());
    let url = db.url();
    let addr = redis.addr();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let http_addr = format!("127.0.0.1:{http_port}");
    let common = [
        ("DATABASE_URL", url.as_str()),
        ("VALKEY_ADDR", addr.as_str()),
        ("OUTBOX_POLL_INTERVAL", "100ms"),
    ];
    let mut worker_env = common.to_vec();
    worker_env.extend([
        ("WORKER_QUEUES", "default=1"),
        ("WORKER_METRICS_ADDR", metrics_addr.as_str()),
        ("SCHEDULER_ENABLED", "true"),
        // A limit set at deploy time exports the limits' metrics; one too
        // wide to make any run wait.
        (
            "WORKER_LIMITS",
            "orderPlaced.email=concurrency:1000,rate:100000/s",
        ),
    ]);
    let _worker = Process::start("worker", &worker_env);
    let mut server_env = common.to_vec();
    server_env.push(("HTTP_ADDR", http_addr.as_str()));
    let _server = Process::start("server", &server_env);
    wait_until(Duration::from_secs(30), "the server is ready", || {
        status(http_port, "/readyz") == 200
    });
    for _ in 0..3 {
        assert_eq!(status(http_port, "/healthz"), 200);
    }
    assert_eq!(status(http_port, "/no/such/route"), 404);

    commit_events(&db, EVENTS);
    wait_for_listeners(&db, EVENTS as usize, Duration::from_secs(60));
    // The queue gauges are read every 5 s: wait for one that saw it all
    // (an event task and two listener tasks per event).
    let processed = |samples: &Samples| {
        value(
            samples,
            "asynq_tasks_processed_total",
            &[("queue", "default")],
        )
        .unwrap_or(0.0)
    };
    let mut worker = Samples::new();
    wait_until(
        Duration::from_secs(20),
        "the asynq gauges count every task",
        || {
            worker = scrape(metrics_port);
            processed(&worker) >= f64::from(EVENTS * 3)
        },
    );
    let server = scrape(http_port);

    let readme = readme_metrics(project());
    let (dashboard, titles) = dashboard_metrics();
    let missing: Vec<&String> = readme
        .iter()
        .chain(&dashboard)
        .filter(|name| {
            let sample = name.trim_end_matches("_bucket");
            !is_exported(&worker, sample) && !is_exported(&server, sample)
        })
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
    let undocumented: Vec<&String> = dashboard
        .iter()
        .filter(|name| {
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .fold(name.as_str(), |n, suffix| n.trim_end_matches(suffix));
            !readme.contains(base)
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "the dashboard queries metrics kit/docs/metrics.md does not list: {undocumented:?}"
    );
    eprintln!(
        "{} metrics in kit/docs/metrics.md; the dashboard's {} panels query {} of them: {titles:?}",
        readme.len(),
        titles.len(),
        dashboard.len()
    );

    // The values follow what ran.
    let events = f64::from(EVENTS);
    for listener in ["audit", "email"] {
        let labels = [
            ("event", "orderPlaced"),
            ("listener", listener),
            ("outcome", "succeeded"),
        ];
        assert_eq!(
            value(&worker, "outbox_listener_duration_seconds_count", &labels),
            Some(events),
            "{listener}"
        );
        assert_eq!(
            value(&worker, "outbox_listener_succeeded_total", &labels[..2]),
            Some(events)
        );
    }
    assert!(value(&worker, "outbox_published_total", &[]) >= Some(events));
    assert!(value(&worker, "outbox_relay_round_duration_seconds_count", &[]) >= Some(1.0));
    assert_eq!(value(&worker, "outbox_backlog", &[]), Some(0.0));
    assert_eq!(value(&worker, "outbox_scheduler_leader", &[]), Some(1.0));
    assert!(
        value(
            &worker,
            "outbox_scheduler_ticks_enqueued_total",
            &[("schedule", "pulse")]
        ) >= Some(1.0)
    );
    assert_eq!(
        value(&worker, "asynq_tasks_failed_total", &[("queue", "default")]),
        Some(0.0)
    );
    assert_eq!(
        value(&worker, "asynq_queue_paused_total", &[("queue", "default")]),
        Some(0.0)
    );
    let by_state: f64 = worker["asynq_tasks_enqueued_total"]
        .iter()
        .filter(|(labels, _)| labels["queue"] == "default")
        .map(|(_, count)| count)
        .sum();
    assert_eq!(
        value(&worker, "asynq_queue_size", &[("queue", "default")]),
        Some(by_state),
        "the size is the sum of the states"
    );
    let completed = value(
        &worker,
        "asynq_tasks_enqueued_total",
        &[("queue", "default"), ("state", "completed")],
    )
    .unwrap();
    assert!(completed >= f64::from(EVENTS * 3), "completed: {completed}");
    let requests = |route: &str, status: &str| {
        value(
            &server,
            "http_server_request_duration_seconds_count",
            &[("method", "GET"), ("route", route), ("status", status)],
        )
    };
    assert_eq!(requests("/healthz", "200"), Some(3.0));
    assert_eq!(requests("unmatched", "404"), Some(1.0));
}
