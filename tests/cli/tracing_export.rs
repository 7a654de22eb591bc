//! Spans over OTLP, received by a real OTLP/HTTP receiver: the Go program
//! `otlpsink` (tests/interop/go/cmd/otlpsink), which decodes each export
//! with the official opentelemetry-proto definitions and writes the spans
//! down as JSON lines.
//!
//! The project is the asynq interop tests' `ordersvc` (event `orderPlaced`,
//! listeners `audit` and `email`, and `POST /orders`, which dispatches the
//! posted event). One request in a known trace, whose event makes `email`
//! fail once, must give one trace across the request (`server`), the
//! dispatch (`create`), the event task and every listener attempt
//! (`process`, children of the dispatch), and a relay round (`send`) in a
//! trace of its own that links to the dispatch; with the attributes of the
//! OpenTelemetry messaging conventions, and flushed when the binaries stop.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::asynq_interop::{
    TRACE_ID, TRACEPARENT, database, go, json_lines, listener_runs, project, start_worker,
    stop_worker, wait_for_state,
};
use crate::example::{request, request_with_headers};
use crate::go_peers::go_peer;
use crate::worker_e2e::{RedisServer, free_port, wait_until};

/// The span id of `TRACEPARENT`: the caller of the request.
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// `otlpsink` as a process: where it listens and where its spans go.
struct Sink {
    child: Child,
    endpoint: String,
    spans: PathBuf,
}

impl Sink {
    fn start(binary: &Path, dir: &Path) -> Self {
        let spans = dir.join("spans.jsonl");
        let mut child = Command::new(binary)
            .args(["-addr", "127.0.0.1:0", "-out"])
            .arg(&spans)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("otlpsink printed {line:?}"));
        Self {
            child,
            endpoint: format!("http://{addr}"),
            spans,
        }
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Value> {
        json_lines(&std::fs::read_to_string(&self.spans).unwrap_or_default())
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The project's server, exporting to `endpoint`; SIGTERM stops it.
fn start_server(db: &crate::e2e::Database, redis: &RedisServer, endpoint: &str) -> (Child, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let child = Command::new(project().join(".bin/server"))
        .current_dir(project())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", db.url())
        .env("VALKEY_ADDR", redis.addr())
        .env("HTTP_ADDR", &addr)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_SERVICE_NAME", "ordersvc-server")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(30), "the server answers", || {
        request(&addr, "GET", "/healthz", None).is_some()
    });
    (child, addr)
}

fn attribute<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

/// The one span named `name`; panics, listing what there is, if there are
/// none or several.
fn only<'a>(spans: &[&'a Value], name: &str) -> &'a Value {
    let found: Vec<&Value> = spans
        .iter()
        .copied()
        .filter(|span| span["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "spans named {name:?}: {found:#?}");
    found[0]
}

#[test]
#[ignore = "builds a generated project"]
fn one_request_is_one_trace_through_the_outbox_to_every_listener_attempt() {
    let Some(sink_binary) = go_peer("otlpsink") else {
        return;
    };
    let Some(peer) = go_peer("asynqpeer") else {
        return;
    };
    project();
    let dir = tempfile::tempdir().unwrap();
    let sink = Sink::start(&sink_binary, dir.path());
    let redis = RedisServer::start();
    let db = database();
    let mut worker = start_worker(
        &db,
        &redis,
        &[
            ("WORKER_QUEUES", "default=1"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &sink.endpoint),
            ("OTEL_SERVICE_NAME", "ordersvc-worker"),
        ],
    );
    let (mut server, addr) = start_server(&db, &redis, &sink.endpoint);

    // One request, in the caller's trace; its event makes `email` fail once.
    let body = r#"{"order_id": 41, "note": "fail-once:email"}"#;
    let traceparent = [("traceparent", TRACEPARENT)];
    let (status, response) =
        request_with_headers(&addr, "POST", "/orders", Some(body), &traceparent).unwrap();
    assert_eq!(status, 202, "{response}");

    // `audit` runs; `email` fails, waits in `retry`, and is run again at
    // once with Inspector.RunTask (instead of waiting out the retry delay).
    wait_until(
        Duration::from_secs(60),
        "audit ran and email failed",
        || {
            listener_runs(&db, "audit", "done").len() == 1
                && listener_runs(&db, "email", "failed").len() == 1
        },
    );
    let retrying = go(&peer, &redis, &["list", "default", "retry"], "");
    assert_eq!(retrying.len(), 1, "{retrying:?}");
    let email_task = retrying[0]["id"].as_str().unwrap().to_string();
    wait_for_state(&peer, &redis, "default", &email_task, "retry");
    go(&peer, &redis, &["run", "default", &email_task], "");
    wait_until(Duration::from_secs(60), "email ran again", || {
        listener_runs(&db, "email", "done").len() == 1
    });

    // The spans still buffered are sent when the binaries stop.
    stop_worker(&mut worker, Duration::from_secs(35));
    Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(server.wait().unwrap().success());
    let spans = sink.spans();
    let traced: Vec<&Value> = spans
        .iter()
        .filter(|span| span["trace_id"] == TRACE_ID)
        .collect();

    // The request: a server span, child of the caller's.
    let request_span = only(&traced, "POST /orders");
    assert_eq!(request_span["kind"], "SPAN_KIND_SERVER");
    assert_eq!(request_span["service"], "ordersvc-server");
    assert_eq!(request_span["parent_span_id"], CALLER_SPAN);
    assert_eq!(attribute(request_span, "http.request.method"), "POST");
    assert_eq!(attribute(request_span, "http.route"), "/orders");
    assert_eq!(attribute(request_span, "http.response.status_code"), 202);

    // The dispatch: a producer span inside the request, whose context the
    // envelope carries.
    let create = only(&traced, "create orderPlaced");
    assert_eq!(create["kind"], "SPAN_KIND_PRODUCER");
    assert_eq!(create["parent_span_id"], request_span["span_id"]);
    assert_eq!(attribute(create, "messaging.operation.type"), "create");
    let event_id = attribute(create, "messaging.message.id").as_str().unwrap();
    let traceparent = crate::e2e::psql(
        &db.url(),
        "SELECT metadata->>'traceparent' FROM outbox_events",
    );
    assert_eq!(
        traceparent,
        format!("00-{TRACE_ID}-{}-01", create["span_id"].as_str().unwrap())
    );

    // The relay's round: a send span of its own trace, linked to the dispatch.
    let sends: Vec<&Value> = spans
        .iter()
        .filter(|span| span["name"] == "send default")
        .filter(|span| {
            span["links"]
                .as_array()
                .unwrap()
                .iter()
                .any(|link| link["span_id"] == create["span_id"])
        })
        .collect();
    assert_eq!(
        sends.len(),
        1,
        "send spans linked to the dispatch: {sends:#?}"
    );
    let send = sends[0];
    assert_eq!(send["kind"], "SPAN_KIND_PRODUCER");
    assert_eq!(send["service"], "ordersvc-worker");
    assert_ne!(send["trace_id"], TRACE_ID, "a link, not a parent");
    assert_eq!(send["links"][0]["trace_id"], TRACE_ID);
    assert_eq!(attribute(send, "messaging.destination.name"), "default");
    assert_eq!(attribute(send, "messaging.operation.type"), "send");
    assert_eq!(attribute(send, "messaging.batch.message_count"), 1);

    // The event task and each listener attempt: consumer spans, children of
    // the dispatch, with the task's queue, type, id, retry count and outcome.
    let processes: Vec<&Value> = traced
        .iter()
        .copied()
        .filter(|span| span["kind"] == "SPAN_KIND_CONSUMER")
        .collect();
    let mut attempts: Vec<(String, i64, String, String)> = processes
        .iter()
        .map(|span| {
            assert_eq!(span["parent_span_id"], create["span_id"], "{span:#}");
            assert_eq!(span["service"], "ordersvc-worker");
            assert_eq!(attribute(span, "messaging.system"), "asynq");
            assert_eq!(attribute(span, "messaging.operation.type"), "process");
            assert_eq!(attribute(span, "messaging.destination.name"), "default");
            let task_type = attribute(span, "asynq.task.type").as_str().unwrap();
            assert_eq!(span["name"], format!("process {task_type}"));
            assert!(
                attribute(span, "messaging.message.id").is_string(),
                "{span:#}"
            );
            (
                task_type.to_string(),
                attribute(span, "asynq.task.retry_count").as_i64().unwrap(),
                attribute(span, "asynq.task.outcome")
                    .as_str()
                    .unwrap()
                    .to_string(),
                span["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    attempts.sort();
    let attempt = |task: &str, retried: i64, outcome: &str, status: &str| {
        (
            task.to_string(),
            retried,
            outcome.to_string(),
            status.to_string(),
        )
    };
    assert_eq!(
        attempts,
        [
            attempt("event:orderPlaced", 0, "succeeded", "STATUS_CODE_UNSET"),
            attempt(
                "listener:orderPlaced:audit",
                0,
                "succeeded",
                "STATUS_CODE_UNSET"
            ),
            attempt(
                "listener:orderPlaced:email",
                0,
                "failed",
                "STATUS_CODE_ERROR"
            ),
            attempt(
                "listener:orderPlaced:email",
                1,
                "succeeded",
                "STATUS_CODE_UNSET"
            ),
        ]
    );
    let event_task = only(&processes, "process event:orderPlaced");
    assert_eq!(attribute(event_task, "messaging.message.id"), event_id);
    let failed = processes
        .iter()
        .find(|span| span["status"] == "STATUS_CODE_ERROR")
        .unwrap();
    assert_eq!(failed["status_message"], "failing once, as the note asks");
    assert_eq!(
        attribute(failed, "messaging.message.id"),
        email_task.as_str()
    );

    // Each listener's run is a span inside its attempt.
    for process in processes
        .iter()
        .filter(|span| span["name"] != "process event:orderPlaced")
    {
        let inner: Vec<&&Value> = traced
            .iter()
            .filter(|span| span["parent_span_id"] == process["span_id"])
            .collect();
        assert!(
            inner.iter().any(|span| span["name"] == "listener"),
            "no listener span under {process:#}"
        );
    }
    eprintln!(
        "spans per event with two listeners (one failing once): {} in its trace, 1 send span",
        traced.len()
    );
}
