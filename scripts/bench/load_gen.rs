//! `load_gen`: the open-loop HTTP load generator of gpkit's
//! `scripts/bench/load`, which copies this file into the generated project as
//! `src/bin/load_gen.rs` (so it uses only tokio, already in the project).
//!
//! ```text
//! load_gen --addr 127.0.0.1:8080 --rate 1000 --seconds 15 --warmup 2 \
//!          [--path /bench] [--connections 16] [--timeout 10] [--out FILE]
//! ```
//!
//! Request `i` (from 0) is due at `t0 + i / rate`, for `warmup + seconds`
//! seconds: a scheduler hands each request at its due time to a queue that
//! `--connections` HTTP/1.1 keep-alive connections take from, so a slow answer
//! never delays the next request's due time (no coordinated omission): a
//! request waiting for a free connection counts that wait in its latency.
//! Its JSON body is `{"sent_at_us": <due time, unix µs>}`, the value the
//! listeners compare their start with. The first `warmup` seconds of requests
//! are sent but left out of the figures.
//!
//! Each request's outcome goes to `--out`, one line each:
//! `<sent_at_us> <status> <latency_us> <send_lag_us> <warmup 0|1>`, where
//! status is the HTTP status (0: no answer: connection error or timeout),
//! latency is from the due time to the end of the response, and send lag
//! from the due time to the request's first byte written (the generator's
//! lateness and the wait for a free connection; -1: never written). The
//! summary is one JSON line on stdout: requests sent, answered 2xx, errors,
//! the answered requests' latency percentiles (nearest rank), the send lag's,
//! and the dispatch lag's (how late the scheduler handed requests over: the
//! generator's own lateness), warm-up excluded.

// Nothing to test here: a test build of this binary (`cargo build
// --all-targets`, as gpkit's CI check does) compiles an empty crate.
#![cfg(not(test))]

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Mutex, mpsc};
use tokio::time::Instant;

struct Args {
    addr: String,
    path: String,
    rate: f64,
    seconds: f64,
    warmup: f64,
    connections: usize,
    timeout: Duration,
    out: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        addr: String::new(),
        path: "/bench".into(),
        rate: 0.0,
        seconds: 15.0,
        warmup: 2.0,
        connections: 16,
        timeout: Duration::from_secs(10),
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |v: &str| v.parse::<f64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--addr" => args.addr = value,
            "--path" => args.path = value,
            "--rate" => args.rate = number(&value)?,
            "--seconds" => args.seconds = number(&value)?,
            "--warmup" => args.warmup = number(&value)?,
            "--connections" => args.connections = number(&value)? as usize,
            "--timeout" => args.timeout = Duration::from_secs_f64(number(&value)?),
            "--out" => args.out = Some(value),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if args.addr.is_empty() || args.rate <= 0.0 || args.seconds <= 0.0 || args.connections == 0 {
        return Err(
            "usage: load_gen --addr HOST:PORT --rate N [--seconds S] [--warmup S] \
                    [--path P] [--connections N] [--timeout S] [--out FILE]"
                .into(),
        );
    }
    Ok(args)
}

/// One request's outcome.
struct Outcome {
    index: u32,
    status: u16,
    latency_us: i64,
    send_lag_us: i64,
}

/// The schedule: request `i` is due at `start + offset(i)`; its body carries
/// `t0_us + offset(i)`.
struct Plan {
    start: Instant,
    t0_us: i64,
    rate: f64,
    warmup_count: u32,
    total: u32,
}

impl Plan {
    fn offset_us(&self, i: u32) -> i64 {
        (f64::from(i) * 1e6 / self.rate).round() as i64
    }

    fn due(&self, i: u32) -> Instant {
        self.start + Duration::from_micros(self.offset_us(i) as u64)
    }

    fn sent_at_us(&self, i: u32) -> i64 {
        self.t0_us + self.offset_us(i)
    }
}

fn unix_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// One keep-alive HTTP/1.1 connection, with the bytes read past the last
/// response.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

enum Body {
    Length(usize),
    Chunked,
    UntilClose,
}

impl Conn {
    async fn open(addr: &str) -> std::io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: Vec::with_capacity(4096),
        })
    }

    async fn fill(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 4096];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// Reads one response; returns its status and whether the connection
    /// stays open.
    async fn response(&mut self) -> std::io::Result<(u16, bool)> {
        let head_end = loop {
            if let Some(at) = find(&self.buf, b"\r\n\r\n") {
                break at + 4;
            }
            self.fill().await?;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(format!("bad status line {status_line:?}")))?;
        let mut body = Body::UntilClose;
        let mut keep_alive = !status_line.starts_with("HTTP/1.0");
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
            match name.as_str() {
                "content-length" => {
                    body = Body::Length(value.parse().map_err(|_| bad("bad content-length"))?)
                }
                "transfer-encoding" if value.eq_ignore_ascii_case("chunked") => {
                    body = Body::Chunked
                }
                "connection" => keep_alive = !value.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
        self.buf.drain(..head_end);
        if status == 204 || status == 304 || (100..200).contains(&status) {
            body = Body::Length(0);
        }
        match body {
            Body::Length(n) => {
                while self.buf.len() < n {
                    self.fill().await?;
                }
                self.buf.drain(..n);
            }
            Body::Chunked => loop {
                let line_end = loop {
                    if let Some(at) = find(&self.buf, b"\r\n") {
                        break at;
                    }
                    self.fill().await?;
                };
                let size_text = String::from_utf8_lossy(&self.buf[..line_end]).into_owned();
                let size =
                    usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                        .map_err(|_| bad("bad chunk size"))?;
                // The chunk and its CRLF; the last chunk (0) ends with an
                // empty line (no trailers expected).
                let need = line_end + 2 + size + 2;
                while self.buf.len() < need {
                    self.fill().await?;
                }
                self.buf.drain(..need);
                if size == 0 {
                    break;
                }
            },
            Body::UntilClose => {
                while self.fill().await.is_ok() {}
                self.buf.clear();
                keep_alive = false;
            }
        }
        Ok((status, keep_alive))
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn bad(text: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, text.into())
}

/// One connection's loop: takes due requests from the queue until it closes.
async fn connection(
    args: Arc<Args>,
    plan: Arc<Plan>,
    queue: Arc<Mutex<mpsc::UnboundedReceiver<u32>>>,
    deadline: Instant,
) -> Vec<Outcome> {
    let mut outcomes = Vec::with_capacity(plan.total as usize / args.connections + 16);
    // Opened ahead of the first due time (the plan starts 200 ms ahead); a
    // connection that fails or closes is opened again by the next request.
    let mut conn = Conn::open(&args.addr).await.ok();
    let mut request = Vec::with_capacity(256);
    loop {
        let Some(index) = queue.lock().await.recv().await else {
            return outcomes;
        };
        let due = plan.due(index);
        let now = Instant::now();
        if now >= deadline {
            // Given up: the run's end is long past.
            outcomes.push(Outcome {
                index,
                status: 0,
                latency_us: (now - due).as_micros() as i64,
                send_lag_us: -1,
            });
            continue;
        }
        let body = format!("{{\"sent_at_us\":{}}}", plan.sent_at_us(index));
        request.clear();
        write!(
            request,
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
            args.path,
            args.addr,
            body.len(),
            body
        )
        .expect("writing to a Vec");
        let mut send_lag_us = -1;
        let attempt = async {
            if conn.is_none() {
                conn = Some(Conn::open(&args.addr).await?);
            }
            let c = conn.as_mut().expect("just opened");
            send_lag_us = (Instant::now() - due).as_micros() as i64;
            c.stream.write_all(&request).await?;
            c.response().await
        };
        let result = tokio::time::timeout(args.timeout, attempt).await;
        let done = Instant::now();
        let status = match result {
            Ok(Ok((status, keep_alive))) => {
                if !keep_alive {
                    conn = None;
                }
                status
            }
            Ok(Err(_)) | Err(_) => {
                conn = None;
                0
            }
        };
        outcomes.push(Outcome {
            index,
            status,
            latency_us: (done - due).as_micros() as i64,
            send_lag_us,
        });
    }
}

/// Nearest-rank percentile of sorted values, in ms.
fn percentile_ms(sorted: &[i64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    // Less a hair, so that 0.99 × 1000 (990.000...01 in floating point) is 990.
    let rank = ((p * sorted.len() as f64 - 1e-6).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1] as f64 / 1000.0)
}

fn json_ms(value: Option<f64>) -> String {
    value.map_or("null".into(), |v| format!("{v:.3}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = match args() {
        Ok(args) => Arc::new(args),
        Err(err) => {
            eprintln!("load_gen: {err}");
            return std::process::ExitCode::from(2);
        }
    };
    let warmup_count = (args.warmup * args.rate).round() as u32;
    let total = warmup_count + (args.seconds * args.rate).round() as u32;
    // Start a little ahead, so that the connections are open by the first
    // due time.
    let lead = Duration::from_millis(200);
    let plan = Arc::new(Plan {
        start: Instant::now() + lead,
        t0_us: unix_us() + lead.as_micros() as i64,
        rate: args.rate,
        warmup_count,
        total,
    });
    // A request still waiting for a connection this long after the last
    // due time is given up (counted as an error, not sent).
    let end = plan.due(total.saturating_sub(1));
    let deadline = end + args.timeout * 3;
    let (tx, rx) = mpsc::unbounded_channel::<u32>();
    let rx = Arc::new(Mutex::new(rx));
    let mut workers = Vec::new();
    for _ in 0..args.connections {
        workers.push(tokio::spawn(connection(
            Arc::clone(&args),
            Arc::clone(&plan),
            Arc::clone(&rx),
            deadline,
        )));
    }
    // The schedule: wake at the next due time, hand over every request due
    // by now (the timer's granularity is about a millisecond).
    // How late each request was handed over: the generator's own lateness
    // (its timer, and its thread's share of the CPU), apart from any wait
    // for a free connection.
    let mut dispatch_lag_us = Vec::with_capacity(total as usize);
    let mut next = 0u32;
    while next < total {
        tokio::time::sleep_until(plan.due(next)).await;
        let now = Instant::now();
        while next < total && plan.due(next) <= now {
            let _ = tx.send(next);
            dispatch_lag_us.push((now - plan.due(next)).as_micros() as i64);
            next += 1;
        }
    }
    drop(tx);
    let mut outcomes = Vec::with_capacity(total as usize);
    for worker in workers {
        outcomes.extend(worker.await.expect("a connection task panicked"));
    }
    outcomes.sort_by_key(|o| o.index);

    if let Some(path) = &args.out {
        let mut text = String::with_capacity(outcomes.len() * 40);
        for o in &outcomes {
            use std::fmt::Write as _;
            let _ = writeln!(
                text,
                "{} {} {} {} {}",
                plan.sent_at_us(o.index),
                o.status,
                o.latency_us,
                o.send_lag_us,
                u8::from(o.index < plan.warmup_count)
            );
        }
        if let Err(err) = std::fs::write(path, text) {
            eprintln!("load_gen: writing {path}: {err}");
            return std::process::ExitCode::FAILURE;
        }
    }

    let measured: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.index >= plan.warmup_count)
        .collect();
    let ok = measured
        .iter()
        .filter(|o| (200..300).contains(&o.status))
        .count();
    let mut latencies: Vec<i64> = measured
        .iter()
        .filter(|o| (200..300).contains(&o.status))
        .map(|o| o.latency_us)
        .collect();
    latencies.sort_unstable();
    let mut lags: Vec<i64> = measured
        .iter()
        .filter(|o| o.send_lag_us >= 0)
        .map(|o| o.send_lag_us)
        .collect();
    lags.sort_unstable();
    let mut dispatch: Vec<i64> = dispatch_lag_us[plan.warmup_count as usize..].to_vec();
    dispatch.sort_unstable();
    println!(
        "{{\"rate\":{},\"seconds\":{},\"warmup_s\":{},\"connections\":{},\"t0_us\":{},\
         \"window_start_us\":{},\"window_end_us\":{},\"warmup_sent\":{},\"sent\":{},\"ok\":{},\
         \"errors\":{},\"http_p50_ms\":{},\"http_p99_ms\":{},\"http_p999_ms\":{},\
         \"http_max_ms\":{},\"send_lag_p50_ms\":{},\"send_lag_p99_ms\":{},\"send_lag_max_ms\":{},\
         \"dispatch_lag_p99_ms\":{},\"dispatch_lag_max_ms\":{}}}",
        args.rate,
        args.seconds,
        args.warmup,
        args.connections,
        plan.t0_us,
        plan.sent_at_us(plan.warmup_count),
        plan.t0_us + ((args.warmup + args.seconds) * 1e6).round() as i64,
        plan.warmup_count,
        measured.len(),
        ok,
        measured.len() - ok,
        json_ms(percentile_ms(&latencies, 0.50)),
        json_ms(percentile_ms(&latencies, 0.99)),
        json_ms(percentile_ms(&latencies, 0.999)),
        json_ms(latencies.last().map(|&v| v as f64 / 1000.0)),
        json_ms(percentile_ms(&lags, 0.50)),
        json_ms(percentile_ms(&lags, 0.99)),
        json_ms(lags.last().map(|&v| v as f64 / 1000.0)),
        json_ms(percentile_ms(&dispatch, 0.99)),
        json_ms(dispatch.last().map(|&v| v as f64 / 1000.0)),
    );
    std::process::ExitCode::SUCCESS
}
