//! The traces of the processes `gpkit dev` runs, with nothing to install:
//! an OTLP/HTTP receiver on a loopback port of its own, which `gpkit dev`
//! names in `OTEL_EXPORTER_OTLP_ENDPOINT` for the server, the worker and
//! the console (unless the project names a collector of its own), and
//! which keeps every span it receives as one JSON line ([`otlp::records`])
//! under `.gpkit/dev/traces/`, in files of ten minutes
//! (`<unix time of the first second>.jsonl`), deleted once they are an
//! hour old.

pub(crate) mod otlp;

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result};

/// The directory under `.gpkit/dev/` that holds the spans.
pub(crate) const DIR: &str = "traces";
/// How much time one file holds.
const FILE_SPAN: Duration = Duration::from_secs(600);
/// How long spans are kept.
pub(crate) const KEPT: Duration = Duration::from_secs(3600);
/// The largest request body taken (the exporter sends batches of at most
/// 512 spans).
const MAX_BODY: u64 = 32 << 20;

/// The running receiver; stopped on drop.
pub(crate) struct Receiver {
    server: Arc<tiny_http::Server>,
    port: u16,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    /// Listens on a free loopback port and keeps what it receives in `dir`.
    pub(crate) fn start(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("failed to create {}", dir.display()))?;
        let server = tiny_http::Server::http("127.0.0.1:0")
            .map_err(|err| anyhow::anyhow!("failed to listen for traces on 127.0.0.1: {err}"))?;
        let port = server
            .server_addr()
            .to_ip()
            .map(|addr| addr.port())
            .context("the trace receiver has no IP address")?;
        let server = Arc::new(server);
        let store = Store {
            dir: dir.to_path_buf(),
        };
        let serving = server.clone();
        let thread = std::thread::Builder::new()
            .name("gpkit-dev-traces".into())
            .spawn(move || serve(&serving, &store))
            .context("failed to start the trace receiver")?;
        Ok(Self {
            server,
            port,
            thread: Some(thread),
        })
    }

    /// The value of `OTEL_EXPORTER_OTLP_ENDPOINT` that reaches it.
    pub(crate) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Answers each request: `POST /v1/traces` in protobuf is kept and answered
/// with an empty `ExportTraceServiceResponse`; anything else is refused.
fn serve(server: &tiny_http::Server, store: &Store) {
    for mut request in server.incoming_requests() {
        let (status, text) = match take(&mut request) {
            Ok(spans) => match store.append(&spans) {
                Ok(()) => (200, String::new()),
                Err(err) => (500, format!("{err:#}")),
            },
            Err((status, text)) => (status, text),
        };
        let content_type = if status == 200 {
            "application/x-protobuf"
        } else {
            "text/plain; charset=utf-8"
        };
        let response = tiny_http::Response::from_string(text)
            .with_status_code(status)
            .with_header(
                tiny_http::Header::from_bytes("Content-Type", content_type)
                    .expect("a valid header"),
            );
        let _ = request.respond(response);
    }
}

/// The spans of one export request, or the status and reason to refuse it.
fn take(request: &mut tiny_http::Request) -> Result<Vec<serde_json::Value>, (u16, String)> {
    if request.url() != "/v1/traces" {
        return Err((404, "traces go to /v1/traces".into()));
    }
    if *request.method() != tiny_http::Method::Post {
        return Err((405, "POST only".into()));
    }
    let header = |name: &'static str| {
        request
            .headers()
            .iter()
            .find(|h| h.field.equiv(name))
            .map(|h| h.value.as_str().to_string())
    };
    let content_type = header("Content-Type").unwrap_or_default();
    if content_type != "application/x-protobuf" {
        return Err((
            415,
            format!("want application/x-protobuf, got {content_type:?}"),
        ));
    }
    let gzipped = header("Content-Encoding").as_deref() == Some("gzip");
    let mut body = Vec::new();
    let reader = request.as_reader().take(MAX_BODY);
    let read = if gzipped {
        flate2::read::GzDecoder::new(reader).read_to_end(&mut body)
    } else {
        { reader }.read_to_end(&mut body)
    };
    read.map_err(|err| (400, format!("could not read the body: {err}")))?;
    otlp::records(&body).map_err(|err| (400, format!("not an OTLP trace export: {err}")))
}

/// The files of spans.
struct Store {
    dir: PathBuf,
}

impl Store {
    /// Appends `spans` to the current file, and deletes the files past
    /// [`KEPT`].
    fn append(&self, spans: &[serde_json::Value]) -> Result<()> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let start = now - now % FILE_SPAN.as_secs();
        let path = self.dir.join(format!("{start}.jsonl"));
        let mut lines = String::new();
        for span in spans {
            lines.push_str(&span.to_string());
            lines.push('\n');
        }
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut file| file.write_all(lines.as_bytes()))
            .with_context(|| format!("failed to write {}", path.display()))?;
        for old in expired(&self.dir, now) {
            let _ = std::fs::remove_file(old);
        }
        Ok(())
    }
}

/// The files of `dir` whose last second is more than [`KEPT`] before
/// `now` (Unix seconds).
fn expired(dir: &Path, now: u64) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| {
            path.extension().is_some_and(|ext| ext == "jsonl")
                && path
                    .file_stem()
                    .and_then(|stem| stem.to_str()?.parse::<u64>().ok())
                    .is_some_and(|start| start + FILE_SPAN.as_secs() + KEPT.as_secs() < now)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_whose_last_second_is_an_hour_old_expire() {
        let dir = tempfile::tempdir().unwrap();
        let now = 10_000_000;
        for start in [now - 4200 - 600, now - 4200, now - 600, now] {
            std::fs::write(dir.path().join(format!("{start}.jsonl")), "").unwrap();
        }
        std::fs::write(dir.path().join("notes.txt"), "").unwrap();
        let mut gone: Vec<String> = expired(dir.path(), now)
            .iter()
            .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        gone.sort();
        assert_eq!(gone, [format!("{}.jsonl", now - 4800)]);
    }
}
