//! A new user's first hour. The next steps `gpkit new project` prints run
//! verbatim, each line in a shell, with this test's own Postgres and Valkey
//! in the environment (a variable set there wins over `.env`): they must
//! give a migrated database, a server that answers `/healthz` and `/readyz`,
//! and a worker that starts and stops cleanly on SIGTERM. They are, line for
//! line, the steps of the project README's "Run it" and of gpkit's README's
//! "Quickstart", so those run as written too. Then: the server reads `.env`
//! from its working directory, the dispatch example that `gpkit add event`
//! prints compiles as it is, and the README's Rust examples are the
//! `--example` project's code. Linux only: it finds the binary each shell
//! runs under `/proc`.
#![cfg(target_os = "linux")]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::e2e::{Database, cargo_lock, lint, psql};
use crate::kit_migrations::kit_versions;
use crate::support::{free_port, gpkit, readme_examples, section};
use crate::worker_e2e::wait_until;

/// The commands under "Next steps" in gpkit's output, as printed.
fn next_steps(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .skip_while(|line| !line.starts_with("Next steps"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .map(|line| line.trim().to_string())
        .collect()
}

/// The lines of the fenced blocks of `lang` in `text` (a Markdown section).
fn fenced_lines(text: &str, lang: &str) -> Vec<String> {
    text.split(&format!("```{lang}\n"))
        .skip(1)
        .flat_map(|block| block.split("```").next().unwrap().lines())
        .map(str::to_string)
        .collect()
}

/// The steps of a README section's shell blocks but those of `gpkit dev`
/// (the project's own servers, which this test stands in for).
fn readme_steps(readme: &str, heading: &str) -> Vec<String> {
    fenced_lines(section(readme, heading), "sh")
        .into_iter()
        .filter(|line| !line.contains("gpkit dev") && !line.trim().is_empty())
        .collect()
}

/// The status code of `GET path` on `addr`, or `None` while nothing answers.
fn http_status(addr: &str, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.split_whitespace().nth(1)?.parse().ok()
}

/// Where the steps run: the directory the `cd` lines lead to, and the
/// environment that points them at the test's servers.
struct Shell {
    dir: PathBuf,
    env: Vec<(&'static str, String)>,
    logs: tempfile::TempDir,
}

impl Shell {
    /// `sh -c <script>` in the current directory with the test's environment.
    fn command(&self, script: &str) -> Command {
        let mut command = Command::new("sh");
        crate::e2e::shared_build(&mut command)
            .arg("-c")
            .arg(script)
            .current_dir(&self.dir)
            .env_remove("LOG_FORMAT")
            .env_remove("GOOSE_MIGRATION_DIR")
            .env_remove("GOOSE_TABLE");
        for (key, value) in &self.env {
            command.env(key, value);
        }
        command
    }

    /// Runs `line` to its end; it must succeed. After a `cd`, later lines
    /// run where the shell went.
    fn run(&mut self, line: &str) -> Output {
        let script = if line.starts_with("cd ") {
            format!("{line}\npwd\n")
        } else {
            format!("{line}\n")
        };
        let output = self.command(&script).output().unwrap();
        assert!(
            output.status.success(),
            "`{line}` failed in {}:\n{}\n{}",
            self.dir.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        if line.starts_with("cd ") {
            self.dir = PathBuf::from(String::from_utf8(output.stdout.clone()).unwrap().trim());
        }
        output
    }

    /// Starts the long-running `line`, its output going to a log file.
    fn start(&self, line: &str, name: &str) -> Running {
        let log = self.logs.path().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let shell = self
            .command(&format!("{line}\n"))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Running {
            shell,
            log,
            name: name.to_string(),
        }
    }
}

/// A long-running step: a shell running `cargo run --bin <name>`, which
/// cargo replaces by the binary.
struct Running {
    shell: Child,
    log: PathBuf,
    name: String,
}

impl Running {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails the test with the log if the step has ended.
    fn assert_running(&mut self) {
        if let Some(status) = self.shell.try_wait().unwrap() {
            panic!("{} ended with {status}:\n{}", self.name, self.log());
        }
    }

    /// Sends SIGTERM to the binary (the shell's child) and returns its exit
    /// code, which the shell passes on.
    fn terminate(&mut self, limit: Duration) -> Option<i32> {
        let shell = self.shell.id();
        let children =
            std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).unwrap();
        let binary = children
            .split_whitespace()
            .next()
            .expect("the shell runs cargo");
        let comm = std::fs::read_to_string(format!("/proc/{binary}/comm")).unwrap();
        assert_eq!(comm.trim(), self.name, "cargo runs the binary in its place");
        let status = Command::new("kill")
            .args(["-TERM", binary])
            .status()
            .unwrap();
        assert!(status.success());
        let start = Instant::now();
        loop {
            if let Some(status) = self.shell.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                start.elapsed() < limit,
                "{} did not stop within {limit:?}:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.shell.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.shell.id())])
                .status();
            let _ = self.shell.wait();
        }
    }
}

#[test]
#[ignore = "builds a generated project"]
fn the_printed_next_steps_give_a_migrated_database_a_server_and_a_worker() {
    // gpkit's own words: the next steps, as a new user reads them.
    let parent = tempfile::tempdir().unwrap();
    let created = gpkit(parent.path())
        .args(["new", "project", "shop"])
        .output()
        .unwrap();
    assert!(created.status.success());
    let printed = String::from_utf8(created.stderr).unwrap();
    let steps = next_steps(&printed);
    assert!(
        printed.contains("If a step fails, `gpkit doctor` in the project says what to fix."),
        "{printed}"
    );
    assert!(printed.contains("\n  cd shop && gpkit dev\n"), "{printed}");
    assert!(
        steps
            .iter()
            .any(|step| step.starts_with("cargo run --bin worker")),
        "{printed}"
    );
    assert!(!printed.contains("export "), "{printed}");

    // The README's "Run it" steps and the worker's step ("The worker"), in
    // the project, are the printed steps after the `cd`; gpkit's own
    // Quickstart is `gpkit new project shop` and the printed steps. Running
    // these runs both as written.
    let readme = std::fs::read_to_string(parent.path().join("shop/README.md")).unwrap();
    assert_eq!(steps[0], "cd shop", "{printed}");
    let mut written = readme_steps(&readme, "## Run it");
    written.extend(readme_steps(&readme, "## The worker"));
    assert_eq!(written, &steps[1..], "{readme}");
    let ours = std::fs::read_to_string(crate::support::repo().join("README.md")).unwrap();
    let mut quickstart = vec!["gpkit new project shop".to_string()];
    quickstart.extend(steps.iter().cloned());
    assert_eq!(readme_steps(&ours, "## Quickstart"), quickstart);

    // A database that does not exist yet: the steps create it.
    let db = Database {
        name: format!("first_hour_{}_{}", std::process::id(), free_port()),
    };
    let http_addr = format!("127.0.0.1:{}", free_port());
    let mut shell = Shell {
        dir: parent.path().to_path_buf(),
        env: vec![
            ("DATABASE_URL", db.url()),
            (
                "VALKEY_ADDR",
                std::env::var("VALKEY_ADDR").unwrap_or_else(|_| "127.0.0.1:6379".into()),
            ),
            ("HTTP_ADDR", http_addr.clone()),
            ("WORKER_METRICS_ADDR", "127.0.0.1:0".into()),
            ("RUST_LOG", "info".into()),
            ("NO_COLOR", "1".into()),
        ],
        logs: tempfile::tempdir().unwrap(),
    };

    let one_cargo_at_a_time = cargo_lock(&parent.path().join("shop").canonicalize().unwrap());
    let mut running = Vec::new();
    for step in &steps {
        if let Some(rest) = step.strip_prefix("cargo run --bin ") {
            let name = rest.split_whitespace().next().unwrap();
            if name == "server" || name == "worker" {
                running.push(shell.start(step, name));
                continue;
            }
        }
        shell.run(step);
    }
    let [server, worker] = &mut running[..] else {
        panic!("expected the server and the worker among {steps:?}");
    };

    // The database was created and migrated: the version-0 row and the
    // kit's migrations.
    let applied: Vec<String> = std::iter::once(0)
        .chain(kit_versions())
        .map(|version| version.to_string())
        .collect();
    assert_eq!(
        psql(
            &db.url(),
            "SELECT version_id FROM goose_db_version WHERE is_applied ORDER BY id"
        ),
        applied.join("\n")
    );
    assert_eq!(
        psql(&db.url(), "SELECT to_regclass('outbox_events') IS NOT NULL"),
        "t"
    );

    // The server answers its probes (after cargo built it).
    wait_until(
        Duration::from_secs(600),
        "the server answers /healthz",
        || {
            server.assert_running();
            http_status(&http_addr, "/healthz").is_some()
        },
    );
    assert_eq!(http_status(&http_addr, "/healthz"), Some(200));
    assert_eq!(http_status(&http_addr, "/readyz"), Some(200));

    // The worker starts, and stops cleanly on SIGTERM, as does the server.
    wait_until(Duration::from_secs(600), "the worker has started", || {
        worker.assert_running();
        worker.log().contains("worker started")
    });
    // Both are built and running: other tests may build now.
    drop(one_cargo_at_a_time);
    assert_eq!(
        worker.terminate(Duration::from_secs(40)),
        Some(0),
        "{}",
        worker.log()
    );
    assert!(worker.log().contains("worker stopped"), "{}", worker.log());
    assert_eq!(
        server.terminate(Duration::from_secs(40)),
        Some(0),
        "{}",
        server.log()
    );

    let project = shell.dir.clone();
    assert_eq!(project, parent.path().join("shop").canonicalize().unwrap());
    the_server_reads_dotenv_from_its_working_directory(&project, &db);
    the_dispatch_examples_compile(&project);
}

/// `cargo run --bin server` from another directory: its `.env` configures
/// the server; a malformed line stops it with the file and the line.
fn the_server_reads_dotenv_from_its_working_directory(project: &Path, db: &Database) {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    std::fs::write(
        dir.path().join(".env"),
        format!("# local\nHTTP_ADDR={addr}\nDATABASE_URL={}\n", db.url()),
    )
    .unwrap();
    let manifest = project.join("Cargo.toml");
    let server = || {
        let mut command = Command::new(env!("CARGO"));
        crate::e2e::shared_build(&mut command)
            .args(["run", "--quiet", "--manifest-path"])
            .arg(&manifest)
            .args(["--bin", "server"])
            .current_dir(dir.path())
            .env_remove("HTTP_ADDR")
            .env_remove("DATABASE_URL")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    };

    let _one_at_a_time = cargo_lock(project);
    let mut child = server().spawn().unwrap();
    wait_until(
        Duration::from_secs(300),
        "the server answers /readyz",
        || {
            assert!(child.try_wait().unwrap().is_none(), "the server ended");
            http_status(&addr, "/readyz") == Some(200)
        },
    );
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(child.wait().unwrap().success());

    std::fs::write(
        dir.path().join(".env"),
        "HTTP_ADDR=127.0.0.1:1\nnot a line\n",
    )
    .unwrap();
    let output = server().output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("`.env` line 2"), "{stderr}");
}

/// The handler `gpkit add event` prints compiles as it is, without
/// warnings, in the project it is for; the README's Rust examples are the
/// `--example` project's code, which its own tests build (`example.rs`).
fn the_dispatch_examples_compile(project: &Path) {
    let added = gpkit(project)
        .args(["add", "event", "orderPlaced", "--field", "order_id:uuid"])
        .output()
        .unwrap();
    assert!(added.status.success());
    let printed = String::from_utf8(added.stderr).unwrap();
    let hint: String = printed
        .lines()
        .skip_while(|line| !line.starts_with("Dispatch it"))
        .skip_while(|line| !line.is_empty())
        .skip(1)
        .take_while(|line| line.is_empty() || line.starts_with("    "))
        .map(|line| format!("{}\n", line.strip_prefix("    ").unwrap_or(line)))
        .collect();
    assert!(
        hint.contains("pub async fn publish_order_placed("),
        "{printed}"
    );

    let readme = std::fs::read_to_string(project.join("README.md")).unwrap();
    let examples = readme_examples(&readme, "templates/example");
    assert!(
        examples[0].contains("kit::dispatch(&mut *tx, &event).await?;"),
        "{examples:?}"
    );

    std::fs::write(
        project.join("src/dispatch_hint.rs"),
        format!(
            "//! What `gpkit add event` printed.\n\n{}",
            hint.trim_start()
        ),
    )
    .unwrap();
    let lib = project.join("src/lib.rs");
    let mut text = std::fs::read_to_string(&lib).unwrap();
    text.push_str("pub mod dispatch_hint;\n");
    std::fs::write(&lib, text).unwrap();
    lint(project);
}
