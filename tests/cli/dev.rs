//! `gpkit dev`: in a project made with `--example`, it starts the project's
//! own Postgres and Valkey, builds, migrates and runs the server and the
//! worker (an order posted reaches its listener), prefixes their output,
//! restarts a process that dies, rebuilds and restarts on a change (keeping the running processes when
//! the build fails), stops everything on SIGINT (no process, no port
//! left), keeps the data for the next run, refuses a second run in the same project, and says
//! what to install when there is no Postgres. With `--compose`, a stand-in
//! `docker` plays the container engine over the tests' own servers.
//!
//! `scripts/test` gives the tests servers of its own through DATABASE_URL
//! and VALKEY_ADDR: they are removed here, so that `gpkit dev` starts its
//! own. The project's build uses the generated projects' shared target
//! directory, under the lock that lets one cargo run at a time.

use std::fs::File;
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::e2e::cargo_lock;
use crate::example::request;
use crate::support::free_port;
use crate::support::new_project;
use crate::worker_e2e::wait_until;

/// A project directory the `postgres` user can enter: as root, `gpkit dev`
/// runs Postgres as that user, and a temp dir is private to its owner.
fn parent_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// `gpkit dev <args>` in `project`, with no servers given, so that it
/// starts its own; the environment the tests' own servers came with is
/// removed (VALKEY_SERVER, a binary's path, is kept).
fn dev_command(project: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(assert_cmd::cargo::cargo_bin("gpkit"));
    command
        .arg("dev")
        .args(args)
        .current_dir(project)
        .env_remove("DATABASE_URL")
        .env_remove("VALKEY_ADDR")
        .env_remove("VALKEY_URL")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null());
    crate::e2e::shared_build(&mut command);
    command
}

/// A running `gpkit dev`, its output in files; stopped with SIGINT (then
/// SIGKILL) if the test ends before stopping it.
struct Dev {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Dev {
    fn start(project: &Path, logs: &Path, port: u16, name: &str) -> Self {
        Self::start_with(project, logs, port, name, &[])
    }

    /// `start` with `env` added to the environment.
    fn start_with(
        project: &Path,
        logs: &Path,
        port: u16,
        name: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let out = logs.join(format!("{name}.out"));
        let err = logs.join(format!("{name}.err"));
        let child = dev_command(project, &["--port", &port.to_string()])
            .envs(env.iter().copied())
            .stdout(File::create(&out).unwrap())
            .stderr(File::create(&err).unwrap())
            // A group of its own, with the cargo it runs: a test can kill
            // both, as closing a terminal would.
            .process_group(0)
            .spawn()
            .unwrap();
        Self { child, out, err }
    }

    fn log(&self) -> String {
        format!(
            "--- stdout\n{}\n--- stderr\n{}",
            std::fs::read_to_string(&self.out).unwrap_or_default(),
            std::fs::read_to_string(&self.err).unwrap_or_default()
        )
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("gpkit dev ended with {status}:\n{}", self.log());
        }
    }

    /// Waits until `/healthz` on `addr` answers 200; the time it took.
    fn wait_healthy(&mut self, addr: &str, limit: Duration) -> Duration {
        let start = Instant::now();
        loop {
            if request(addr, "GET", "/healthz", None).is_some_and(|(status, _)| status == 200) {
                return start.elapsed();
            }
            self.assert_running();
            assert!(
                start.elapsed() < limit,
                "no /healthz within {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends SIGINT and waits for the exit code.
    fn interrupt(&mut self, limit: Duration) -> Option<i32> {
        let status = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                start.elapsed() < limit,
                "gpkit dev did not stop within {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-INT", &self.child.id().to_string()])
                .status();
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(30) {
                if matches!(self.child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The processes alive now: pid, parent pid, command line (NULs as spaces).
fn processes() -> Vec<(u32, u32, String)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces.
        let Some((_, after)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = after.split_whitespace().collect();
        if fields.first() == Some(&"Z") {
            continue;
        }
        let ppid = fields.get(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        all.push((pid, ppid, cmdline));
    }
    all
}

/// The processes that belong to the `gpkit dev` with pid `root_pid` in
/// `project`: its descendants, and any whose command line names the
/// project (Postgres, which `pg_ctl` detaches).
fn belonging(root_pid: u32, project: &Path) -> Vec<(u32, String)> {
    let all = processes();
    let needle = project.to_string_lossy().to_string();
    let mut ours: Vec<u32> = vec![root_pid];
    loop {
        let more: Vec<u32> = all
            .iter()
            .filter(|(pid, ppid, _)| ours.contains(ppid) && !ours.contains(pid))
            .map(|(pid, _, _)| *pid)
            .collect();
        if more.is_empty() {
            break;
        }
        ours.extend(more);
    }
    all.into_iter()
        .filter(|(pid, _, cmdline)| {
            *pid != root_pid && (ours.contains(pid) || cmdline.contains(&needle))
        })
        .map(|(pid, _, cmdline)| (pid, cmdline))
        .collect()
}

/// Of `ours`, and of the processes whose command line names `project`,
/// those still running.
fn left_running(ours: &[(u32, String)], project: &Path) -> Vec<String> {
    processes()
        .into_iter()
        .filter(|(pid, _, cmd)| {
            ours.iter().any(|(p, _)| p == pid) || cmd.contains(&*project.to_string_lossy())
        })
        .map(|(pid, _, cmd)| format!("{pid} {cmd}"))
        .collect()
}

/// The pid of the server the `gpkit dev` with pid `dev` runs.
fn server_pid(dev: u32, project: &Path) -> u32 {
    belonging(dev, project)
        .into_iter()
        .find(|(_, cmdline)| cmdline.contains("/debug/server"))
        .map(|(pid, _)| pid)
        .expect("a server runs")
}

/// `NAME=value` from `gpkit dev --print-env` output.
fn env_value<'a>(printed: &'a str, name: &str) -> &'a str {
    printed
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in:\n{printed}"))
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit(['@', '/', ':'])
        .find_map(|part| part.parse().ok())
        .unwrap_or_else(|| panic!("no port in {addr}"))
}

fn port_from_url(url: &str) -> u16 {
    // postgres://postgres@127.0.0.1:<port>/<db>
    let host = url.rsplit_once('@').unwrap().1;
    host.split(['/', ':']).nth(1).unwrap().parse().unwrap()
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|err| panic!("not JSON ({err}): {text}"))
}

fn print_env(project: &Path) -> Output {
    dev_command(project, &["--print-env"]).output().unwrap()
}

#[test]
#[ignore = "builds a generated project"]
fn dev_runs_the_example_end_to_end_stops_cleanly_and_keeps_its_data() {
    let parent = parent_dir();
    let project = new_project(parent.path(), &["--example"]);
    let project = project.canonicalize().unwrap();
    // The build uses the shared target, where `debug/server` is whichever
    // project was built last: no other cargo while this runs.
    let _one_cargo_at_a_time = cargo_lock(&project);

    // No run yet: --print-env says so.
    let none = print_env(&project);
    assert_eq!(none.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("no `gpkit dev` is running"),
        "{none:?}"
    );

    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut dev = Dev::start(&project, parent.path(), port, "first");
    let first_health = dev.wait_healthy(&addr, Duration::from_secs(900));
    eprintln!(
        "gpkit dev: first /healthz 200 after {:.1} s (first run, the project's crates compiled)",
        first_health.as_secs_f64()
    );

    let printed = print_env(&project);
    assert!(printed.status.success(), "{printed:?}");
    let printed = String::from_utf8(printed.stdout).unwrap();
    let database_url = env_value(&printed, "DATABASE_URL").to_string();
    let valkey_addr = env_value(&printed, "VALKEY_ADDR").to_string();
    assert!(
        database_url.starts_with("postgres://postgres@127.0.0.1:")
            && database_url.ends_with("/shop"),
        "{database_url}"
    );
    assert!(
        project
            .join(".gpkit/dev/postgres/data/PG_VERSION")
            .is_file()
    );
    assert_eq!(
        std::fs::read_to_string(project.join(".gpkit/dev/.gitignore")).unwrap(),
        "*\n"
    );

    // `gpkit doctor` reports the run and checks its servers, not the
    // defaults of `.env.example` (nothing listens there).
    let doctor = crate::support::gpkit(&project)
        .args(["doctor", "--format", "json"])
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:9/none")
        .env("VALKEY_ADDR", "127.0.0.1:9")
        .output()
        .unwrap();
    let report = json(&String::from_utf8_lossy(&doctor.stdout));
    let finding = |check: &str| {
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|finding| finding["check"] == check)
            .cloned()
            .unwrap_or_else(|| panic!("no {check} finding: {report}"))
    };
    let dev_finding = finding("dev");
    assert_eq!(dev_finding["status"], "ok", "{report}");
    assert!(
        dev_finding["detail"].as_str().unwrap().contains(&format!(
            "`gpkit dev` runs in this project (process {})",
            dev.child.id()
        )),
        "{report}"
    );
    for check in ["postgres", "migrations", "valkey"] {
        assert_eq!(finding(check)["status"], "ok", "{report}");
    }
    assert_eq!(doctor.status.code(), Some(0), "{report}");

    // An order reaches its listener through the outbox and the worker.
    let (status, body) = request(
        &addr,
        "POST",
        "/orders",
        Some(r#"{"sku": "tea", "quantity": 2}"#),
    )
    .unwrap();
    assert_eq!(status, 201, "{body}");
    let id = json(&body)["id"].as_str().unwrap().to_string();
    wait_until(Duration::from_secs(60), "the order is confirmed", || {
        let (status, body) = request(&addr, "GET", &format!("/orders/{id}"), None).unwrap();
        assert_eq!(status, 200, "{body}");
        json(&body)["confirmed"] == serde_json::Value::Bool(true)
    });
    // The console beside them, at the address printed: the order's event
    // on its Events page.
    let stderr = std::fs::read_to_string(&dev.err).unwrap();
    let console = stderr
        .split("the console at http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no console address:\n{}", dev.log()))
        .to_string();
    let event_id = crate::e2e::psql(
        &database_url,
        "SELECT event_id FROM outbox_events WHERE event_name = 'orderPlaced'",
    );
    let (status, page) = request(&console, "GET", "/events?name=orderPlaced", None).unwrap();
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains(&event_id),
        "{event_id} not on the page:\n{page}"
    );
    // The request's trace, as gpkit dev received it and keeps it: the
    // POST and, in the same trace, its event's listener run by the worker.
    let traces = stderr
        .split("traces: received at http://127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(", kept for 1h in ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("no trace receiver:\n{}", dev.log()));
    assert_eq!(traces, ".gpkit/dev/traces");
    let spans = || -> Vec<serde_json::Value> {
        std::fs::read_dir(project.join(traces))
            .unwrap()
            .flat_map(|file| {
                std::fs::read_to_string(file.unwrap().path())
                    .unwrap()
                    .lines()
                    .filter_map(|line| serde_json::from_str(line).ok())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let mut trace_id = String::new();
    wait_until(
        Duration::from_secs(30),
        "the POST's trace holds the listener's run",
        || {
            let spans = spans();
            let posts = spans
                .iter()
                .filter(|span| span["name"] == "POST /orders" && span["service"] == "server");
            let traced = posts.into_iter().find(|post| {
                spans.iter().any(|span| {
                    span["trace_id"] == post["trace_id"]
                        && span["name"] == "process listener:orderPlaced:confirm"
                        && span["service"] == "worker"
                })
            });
            if let Some(post) = traced {
                trace_id = post["trace_id"].as_str().unwrap().to_string();
            }
            traced.is_some()
        },
    );
    // The console draws it, the relay's `send` (a trace of its own)
    // through its link, and the event's page leads there.
    let (status, page) = request(&console, "GET", &format!("/traces/{trace_id}"), None).unwrap();
    assert_eq!(status, 200, "{page}");
    for span in [
        "POST /orders",
        "create orderPlaced",
        "send default",
        "process listener:orderPlaced:confirm",
    ] {
        assert!(page.contains(span), "no {span} on the waterfall:\n{page}");
    }
    let (status, page) = request(&console, "GET", &format!("/events/{event_id}"), None).unwrap();
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains(&format!("../traces/{trace_id}")),
        "the event's page does not lead to its trace:\n{page}"
    );
    if let Some(browser) = crate::browser::Browser::start(1100) {
        browser.open(&format!("http://{console}/events/{event_id}"));
        browser.click("a.waterfall");
        let waterfall = browser.text();
        assert!(
            waterfall.contains("process listener:orderPlaced:confirm")
                && waterfall.contains("send default"),
            "{waterfall}"
        );
        browser.screenshot(&crate::browser::screenshot_path("dev-trace-waterfall"));
    }
    // The worker listens for commits' wake-ups (OUTBOX_WAKE=valkey), so an
    // event does not wait for the relay's next poll.
    let valkey_port = valkey_addr.rsplit(':').next().unwrap();
    let subscribers = Command::new("redis-cli")
        .args(["-p", valkey_port, "PUBSUB", "NUMSUB", "outbox:wake"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&subscribers.stdout).trim(),
        "outbox:wake\n1",
        "the worker does not listen for wake-ups"
    );
    let out = std::fs::read_to_string(&dev.out).unwrap();
    for prefix in [" server | ", " worker | ", "console | ", "migrate | "] {
        assert!(out.contains(prefix), "no `{prefix}` line:\n{}", dev.log());
    }
    // Not a terminal: no colours, its own or the processes'.
    assert!(!out.contains('\x1b'), "{}", dev.log());

    // A change that does not build: reported, the running server kept.
    let lib = project.join("src/lib.rs");
    let original = std::fs::read_to_string(&lib).unwrap();
    let before = server_pid(dev.child.id(), &project);
    std::fs::write(&lib, format!("{original}\nfn broken( {{\n")).unwrap();
    let err = dev.err.clone();
    let stderr_has = |text: &str| std::fs::read_to_string(&err).unwrap().contains(text);
    wait_until(
        Duration::from_secs(300),
        "the failed build is reported",
        || stderr_has("the build failed; the running processes are kept"),
    );
    dev.assert_running();
    assert_eq!(
        server_pid(dev.child.id(), &project),
        before,
        "{}",
        dev.log()
    );
    assert_eq!(
        request(&addr, "GET", "/healthz", None).map(|(s, _)| s),
        Some(200)
    );
    // The fix: rebuilt, and the processes restarted on the new build.
    std::fs::write(&lib, &original).unwrap();
    let reloading = Instant::now();
    wait_until(Duration::from_secs(300), "the processes restart", || {
        stderr_has("restarted on the new build")
    });
    dev.wait_healthy(&addr, Duration::from_secs(60));
    eprintln!(
        "gpkit dev: reloaded in {:.1} s after the fix was saved",
        reloading.elapsed().as_secs_f64()
    );
    assert_ne!(
        server_pid(dev.child.id(), &project),
        before,
        "{}",
        dev.log()
    );

    // SIGINT: everything stops, and nothing is left behind.
    let ours = belonging(dev.child.id(), &project);
    let names: Vec<&str> = ours.iter().map(|(_, cmd)| cmd.as_str()).collect();
    assert!(
        names.iter().any(|c| c.contains("/debug/server"))
            && names.iter().any(|c| c.contains("/debug/worker"))
            && names.iter().any(|c| c.contains("/debug/outbox console"))
            && names.iter().any(|c| c.contains("postgres")),
        "{names:#?}"
    );
    let stopping = Instant::now();
    assert_eq!(
        dev.interrupt(Duration::from_secs(40)),
        Some(0),
        "{}",
        dev.log()
    );
    eprintln!(
        "gpkit dev: stopped {} processes in {:.1} s after SIGINT",
        ours.len(),
        stopping.elapsed().as_secs_f64()
    );
    let alive = left_running(&ours, &project);
    assert!(alive.is_empty(), "left running: {alive:#?}\n{}", dev.log());
    for (what, port) in [
        ("the server", port),
        ("Postgres", port_from_url(&database_url)),
        ("Valkey", port_of(&valkey_addr)),
    ] {
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "{what} still listens on {port}"
        );
    }
    let stopped = print_env(&project);
    assert_eq!(stopped.status.code(), Some(1), "{stopped:?}");

    // A second run finds the order of the first.
    let mut again = Dev::start(&project, parent.path(), port, "second");
    let warm_health = again.wait_healthy(&addr, Duration::from_secs(300));
    eprintln!(
        "gpkit dev: first /healthz 200 after {:.1} s (warm build, data kept)",
        warm_health.as_secs_f64()
    );
    let (status, body) = request(&addr, "GET", &format!("/orders/{id}"), None).unwrap();
    assert_eq!(status, 200, "{body}\n{}", again.log());
    assert_eq!(
        json(&body)["confirmed"],
        serde_json::Value::Bool(true),
        "{body}"
    );
    assert_eq!(
        again.interrupt(Duration::from_secs(40)),
        Some(0),
        "{}",
        again.log()
    );
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the server still listens on {port}"
    );

    // The same project with a compose.yaml, its build warm: --compose.
    crate::support::gpkit(&project)
        .args(["add", "deploy"])
        .assert()
        .success();
    runs_with_compose(&project, parent.path(), port);
}

#[test]
#[ignore = "builds a generated project"]
fn a_second_dev_in_the_same_project_is_refused_naming_the_first() {
    let parent = parent_dir();
    let project = new_project(parent.path(), &[]).canonicalize().unwrap();
    let _one_cargo_at_a_time = cargo_lock(&project);
    let mut first = Dev::start(&project, parent.path(), free_port(), "first");
    // It holds the lock once its servers run and the build starts.
    wait_until(Duration::from_secs(60), "the first run builds", || {
        first.assert_running();
        std::fs::read_to_string(&first.err)
            .unwrap()
            .contains("gpkit dev: cargo build --bins")
    });
    let second = dev_command(&project, &["--port", &free_port().to_string()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "`gpkit dev` (process {}) is already running in this project",
            first.child.id()
        )),
        "{stderr}"
    );
    // Interrupted during its build, the first stops its servers and exits.
    let ours = belonging(first.child.id(), &project);
    assert_eq!(
        first.interrupt(Duration::from_secs(40)),
        Some(0),
        "{}",
        first.log()
    );
    let alive = left_running(&ours, &project);
    assert!(
        alive.is_empty(),
        "left running: {alive:#?}\n{}",
        first.log()
    );
}

#[test]
fn without_postgres_it_says_what_to_install_and_starts_nothing() {
    let parent = parent_dir();
    let project = new_project(parent.path(), &[]);
    let output = dev_command(&project, &[])
        // Test-only: the one place gpkit dev looks for Postgres.
        .env("GPKIT_DEV_PG_BIN", "/nonexistent")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no Postgres found"), "{stderr}");
    assert!(stderr.contains("`apt-get install postgresql`"), "{stderr}");
    assert!(stderr.contains("`brew install postgresql@17`"), "{stderr}");
    assert!(!project.join(".gpkit/dev").exists(), "{stderr}");
}

#[test]
#[ignore = "builds a generated project"]
fn a_killed_dev_is_no_refusal_and_the_next_run_stops_what_it_left() {
    let parent = parent_dir();
    let project = new_project(parent.path(), &[]).canonicalize().unwrap();
    let _one_cargo_at_a_time = cargo_lock(&project);
    let mut first = Dev::start(&project, parent.path(), free_port(), "first");
    wait_until(Duration::from_secs(60), "the first run builds", || {
        first.assert_running();
        std::fs::read_to_string(&first.err)
            .unwrap()
            .contains("gpkit dev: cargo build --bins")
    });
    // SIGKILL to it and its cargo: its Postgres and Valkey keep running,
    // and its lock file stays.
    let left = belonging(first.child.id(), &project);
    let status = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", first.child.id())])
        .status()
        .unwrap();
    assert!(status.success());
    first.child.wait().unwrap();
    assert!(project.join(".gpkit/dev/lock").is_file());
    let servers: Vec<&(u32, String)> = left
        .iter()
        .filter(|(_, cmd)| cmd.contains("postgres -D") || cmd.contains("-server"))
        .collect();
    assert_eq!(servers.len(), 2, "{left:#?}");
    // A killed process takes a moment to exit (a rustc frees its memory):
    // only the two servers stay.
    let start = Instant::now();
    loop {
        let alive = left_running(&left, &project);
        if alive.len() == 2 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "30 s after the SIGKILL, not only its two servers run: {alive:#?}\nof {left:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(print_env(&project).status.code(), Some(1));

    // The next run is not refused, and stops the servers left behind.
    let mut next = Dev::start(&project, parent.path(), free_port(), "next");
    wait_until(Duration::from_secs(60), "the next run builds", || {
        next.assert_running();
        std::fs::read_to_string(&next.err)
            .unwrap()
            .contains("gpkit dev: cargo build --bins")
    });
    assert!(
        next.log()
            .contains("stopped 1 process(es) an earlier, killed `gpkit dev` left running"),
        "{}",
        next.log()
    );
    let ours = belonging(next.child.id(), &project);
    assert_eq!(
        next.interrupt(Duration::from_secs(40)),
        Some(0),
        "{}",
        next.log()
    );
    let all: Vec<(u32, String)> = left.into_iter().chain(ours).collect();
    let alive = left_running(&all, &project);
    assert!(alive.is_empty(), "left running: {alive:#?}\n{}", next.log());
}

#[test]
fn dev_refuses_dry_run_and_diff_and_starts_nothing() {
    let parent = parent_dir();
    let project = new_project(parent.path(), &[]);
    for flag in ["--dry-run", "--diff"] {
        let output = dev_command(&project, &[flag]).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("takes neither `--dry-run` nor `--diff`"),
            "{stderr}"
        );
    }
    assert!(!project.join(".gpkit/dev").exists());
}

#[test]
#[ignore = "builds a generated project"]
fn a_database_url_that_answers_is_used_instead_of_a_cluster_of_its_own() {
    let parent = parent_dir();
    let project = new_project(parent.path(), &[]).canonicalize().unwrap();
    // The tests' server; the database is missing, which counts as answering
    // (`migrate up --create-database` creates it).
    let given = crate::e2e::database_url(&format!("gpkit_dev_given_{}", std::process::id()));
    let _one_cargo_at_a_time = cargo_lock(&project);
    let mut dev = Dev::start_with(
        &project,
        parent.path(),
        free_port(),
        "given",
        &[("DATABASE_URL", &given)],
    );
    wait_until(Duration::from_secs(60), "it builds", || {
        dev.assert_running();
        std::fs::read_to_string(&dev.err)
            .unwrap()
            .contains("gpkit dev: cargo build --bins")
    });
    let log = dev.log();
    assert!(
        log.contains("Postgres: using DATABASE_URL from the environment, which answers"),
        "{log}"
    );
    assert!(!project.join(".gpkit/dev/postgres").exists(), "{log}");
    let printed = print_env_with(&project, &given);
    assert_eq!(env_value(&printed, "DATABASE_URL"), given);
    assert_eq!(
        dev.interrupt(Duration::from_secs(40)),
        Some(0),
        "{}",
        dev.log()
    );
}

/// `gpkit dev --print-env` with `DATABASE_URL` set as for the run.
fn print_env_with(project: &Path, database_url: &str) -> String {
    let output = dev_command(project, &["--print-env"])
        .env("DATABASE_URL", database_url)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// Whether this is a Debian-like system, which `--install` needs (it runs
/// apt-get); see `support::require`.
fn on_debian() -> bool {
    crate::support::require(
        "a Debian-like system (`--install` knows only those)",
        Path::new("/etc/debian_version").is_file(),
        "run the tests on Debian or Ubuntu, as CI does",
    )
}

/// The newest `/usr/lib/postgresql/*/bin` with the three binaries gpkit dev
/// runs (Debian's layout, where `scripts/test` installs Postgres).
fn debian_postgres_bin() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .filter(|bin| {
            ["initdb", "pg_ctl", "postgres"]
                .iter()
                .all(|b| bin.join(b).is_file())
        })
        .collect();
    dirs.sort();
    dirs.pop()
}

/// A directory with a stand-in `apt-get` (and a `sudo` that runs its
/// arguments), which records each call in `apt-get.log` and runs `then`
/// (a shell script) after it, and the path of that log.
fn fake_apt_get(dir: &Path, then: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let bin = dir.join("fake-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let log = dir.join("apt-get.log");
    for (name, script) in [
        (
            "apt-get",
            format!("#!/bin/sh\necho \"$*\" >> '{}'\n{then}\n", log.display()),
        ),
        ("sudo", "#!/bin/sh\nexec \"$@\"\n".to_string()),
    ] {
        let path = bin.join(name);
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    log
}

#[test]
#[ignore = "builds a generated project"]
fn with_install_a_missing_postgres_is_installed_with_apt_get_then_started() {
    if !on_debian() {
        return;
    }
    let real = debian_postgres_bin();
    if !crate::support::require(
        "Debian's Postgres (/usr/lib/postgresql/*/bin), to stand in for the installed one",
        real.is_some(),
        "scripts/test installs Debian's postgresql package",
    ) {
        return;
    }
    let real = real.unwrap();
    let parent = parent_dir();
    let project = new_project(parent.path(), &["--no-worker"])
        .canonicalize()
        .unwrap();
    // Where gpkit dev looks for Postgres (test-only): empty until the
    // stand-in apt-get "installs" it there.
    let pg_bin = parent.path().join("pg-bin");
    std::fs::create_dir_all(&pg_bin).unwrap();
    let install = format!(
        "case \"$*\" in *postgresql*) for b in initdb pg_ctl postgres; do ln -sf '{real}'/$b '{pg}'/$b; done;; esac",
        real = real.display(),
        pg = pg_bin.display()
    );
    let log = fake_apt_get(parent.path(), &install);
    let path = format!(
        "{}:{}",
        parent.path().join("fake-bin").display(),
        std::env::var("PATH").unwrap()
    );
    let _one_cargo_at_a_time = cargo_lock(&project);
    let out = parent.path().join("install.out");
    let err = parent.path().join("install.err");
    let child = dev_command(&project, &["--install", "--port", &free_port().to_string()])
        .env("PATH", &path)
        .env("GPKIT_DEV_PG_BIN", &pg_bin)
        .stdout(File::create(&out).unwrap())
        .stderr(File::create(&err).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut dev = Dev { child, out, err };

    // It says what it runs, runs it, finds Postgres and starts it.
    wait_until(
        Duration::from_secs(120),
        "the installed Postgres runs",
        || {
            dev.assert_running();
            std::fs::read_to_string(&dev.err)
                .unwrap()
                .contains("gpkit dev: cargo build --bins")
        },
    );
    let stderr = dev.log();
    assert!(
        stderr.contains("installing Postgres: ")
            && stderr.contains("apt-get install -y --no-install-recommends postgresql"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "install -y --no-install-recommends postgresql\n"
    );
    assert!(
        project
            .join(".gpkit/dev/postgres/data/PG_VERSION")
            .is_file(),
        "{stderr}"
    );
    assert_eq!(
        dev.interrupt(Duration::from_secs(40)),
        Some(0),
        "{}",
        dev.log()
    );
}

#[test]
fn with_install_a_failing_apt_get_is_named_and_nothing_is_started() {
    if !on_debian() {
        return;
    }
    let parent = parent_dir();
    let project = new_project(parent.path(), &["--no-worker"]);
    let log = fake_apt_get(parent.path(), "exit 100");
    let path = format!(
        "{}:{}",
        parent.path().join("fake-bin").display(),
        std::env::var("PATH").unwrap()
    );
    let output = dev_command(&project, &["--install"])
        .env("PATH", &path)
        .env("GPKIT_DEV_PG_BIN", "/nonexistent")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("apt-get install -y --no-install-recommends postgresql` failed")
            && stderr.contains("nothing was started"),
        "{stderr}"
    );
    // Tried, then the package lists fetched (which fails as well): no
    // second try.
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "install -y --no-install-recommends postgresql\nupdate\n"
    );
    assert!(!project.join(".gpkit/dev").exists(), "{stderr}");
}

/// A directory with a stand-in `docker` that records each call in
/// `docker.log` and plays a container engine whose compose services are
/// the tests' own servers: `info` answers (or fails, with `engine_down`),
/// `compose config` gives the generated compose file's `postgres`
/// environment with `database`, `compose port` names the tests' Postgres
/// and Valkey; `up` and `stop` do nothing else. Returns the `PATH` to use
/// and the log.
fn fake_docker(dir: &Path, database: &str, engine_down: bool) -> (String, PathBuf) {
    use std::os::unix::fs::PermissionsExt as _;
    let bin = dir.join("docker-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let log = dir.join("docker.log");
    let postgres = std::env::var("DATABASE_URL").expect("scripts/test gives DATABASE_URL");
    let postgres = postgres
        .split_once('@')
        .map_or(postgres.as_str(), |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let valkey = std::env::var("VALKEY_ADDR").expect("scripts/test gives VALKEY_ADDR");
    let config = serde_json::json!({"services": {"postgres": {"environment": {
        "POSTGRES_USER": "postgres", "POSTGRES_PASSWORD": "postgres", "POSTGRES_DB": database
    }}}});
    let info = if engine_down {
        "echo 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock.' >&2; exit 1"
    } else {
        "echo 28.2.2"
    };
    let script = format!(
        "#!/bin/sh\necho \"$*\" >> '{log}'\ncase \"$*\" in\n\
         'info --format {{{{.ServerVersion}}}}') {info} ;;\n\
         *' config --format json') echo '{config}' ;;\n\
         *' port postgres 5432') echo '0.0.0.0:{postgres_port}' ;;\n\
         *' port valkey 6379') echo '0.0.0.0:{valkey_port}' ;;\n\
         esac\n",
        log = log.display(),
        postgres_port = postgres.rsplit_once(':').unwrap().1,
        valkey_port = valkey.rsplit_once(':').unwrap().1,
    );
    let path = bin.join("docker");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    (path, log)
}

/// `--compose` in `project` (built, with a `compose.yaml`), with a
/// stand-in engine (no container engine runs on these machines): the
/// services of `compose.yaml` are started with `up --wait` as the project
/// `shop-dev`, their published ports found with `compose port`, the
/// database's credentials read from `compose config`, and the service runs
/// against them (`/healthz`); Ctrl-C stops the services.
fn runs_with_compose(project: &Path, logs: &Path, port: u16) {
    let database = format!("gpkit_dev_compose_{}", std::process::id());
    let (path, log) = fake_docker(logs, &database, false);
    let out = logs.join("compose.out");
    let err = logs.join("compose.err");
    let child = dev_command(project, &["--port", &port.to_string(), "--compose"])
        .env("PATH", &path)
        .stdout(File::create(&out).unwrap())
        .stderr(File::create(&err).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut dev = Dev { child, out, err };
    dev.wait_healthy(&format!("127.0.0.1:{port}"), Duration::from_secs(600));

    let printed = print_env(project);
    let printed = String::from_utf8(printed.stdout).unwrap();
    let database_url = env_value(&printed, "DATABASE_URL");
    assert!(
        database_url.starts_with("postgres://postgres:postgres@127.0.0.1:")
            && database_url.ends_with(&format!("/{database}")),
        "{printed}"
    );
    assert_eq!(
        env_value(&printed, "VALKEY_ADDR"),
        std::env::var("VALKEY_ADDR").unwrap()
    );
    let log_text = dev.log();
    assert!(
        log_text.contains("postgres and valkey of compose.yaml at 127.0.0.1:"),
        "{log_text}"
    );
    assert!(!log_text.contains("gpkit dev: Postgres "), "{log_text}");
    let ports = std::fs::read_to_string(project.join(".gpkit/dev/compose.ports.yaml")).unwrap();
    assert!(ports.contains("\"127.0.0.1::5432\"") && ports.contains("\"127.0.0.1::6379\""));

    assert_eq!(
        dev.interrupt(Duration::from_secs(40)),
        Some(0),
        "{}",
        dev.log()
    );
    let calls = std::fs::read_to_string(&log).unwrap();
    assert!(
        calls.lines().skip(1).all(|call| call.starts_with(&format!(
            "compose --project-name shop-dev --project-directory {}",
            project.display()
        ))),
        "{calls}"
    );
    let calls: Vec<&str> = calls
        .lines()
        .map(|call| {
            call.split_once("compose.ports.yaml ")
                .map_or(call, |(_, rest)| rest)
        })
        .collect();
    assert_eq!(
        calls,
        [
            "info --format {{.ServerVersion}}",
            "config --format json",
            "up --detach --wait postgres valkey",
            "port postgres 5432",
            "port valkey 6379",
            "stop postgres valkey",
        ],
        "the engine's calls"
    );
}

#[test]
fn compose_without_a_compose_file_or_an_engine_is_refused_and_starts_nothing() {
    let parent = parent_dir();
    let project = new_project(parent.path(), &[]).canonicalize().unwrap();
    let refused = |project: &Path, path: &str, message: &str| {
        let output = dev_command(project, &["--compose"])
            .env("PATH", path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(message), "{stderr}");
        assert!(stderr.contains("help: "), "{stderr}");
        assert!(!project.join(".gpkit/dev").exists(), "{stderr}");
    };
    let (up, up_log) = fake_docker(parent.path(), "unused", false);
    refused(
        &project,
        &up,
        "the project's `compose.yaml`, and it has none",
    );
    assert!(!up_log.exists(), "the engine was asked something");

    let deployed = parent.path().join("deployed");
    std::fs::create_dir_all(&deployed).unwrap();
    let deployed = new_project(&deployed, &["--deploy"])
        .canonicalize()
        .unwrap();
    refused(&deployed, "/nonexistent", "there is no `docker` on PATH");
    let down_dir = parent.path().join("down");
    std::fs::create_dir_all(&down_dir).unwrap();
    let (down, down_log) = fake_docker(&down_dir, "unused", true);
    refused(
        &deployed,
        &down,
        "`docker info` failed: Cannot connect to the Docker daemon",
    );
    assert_eq!(
        std::fs::read_to_string(down_log).unwrap(),
        "info --format {{.ServerVersion}}\n",
        "only the engine was asked"
    );
}
