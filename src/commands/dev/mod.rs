//! `gpkit dev`: the project's development loop in one command. It starts
//! a Postgres cluster and (with the worker) a Valkey server of the
//! project's own, or uses the servers `DATABASE_URL` and `VALKEY_ADDR`
//! name when they answer; builds the binaries once, applies the pending
//! migrations, and runs `server` and `worker`, restarting a process that
//! exits; on a change to the sources it rebuilds, migrates and restarts
//! them (a failed build keeps the running ones). Ctrl-C or SIGTERM stops
//! the processes, then the servers.
//!
//! Layers: [`services`] (the servers), [`compose`] (`--compose`: the
//! servers of the project's `compose.yaml`), [`install`] (`--install`: a
//! missing server from the system's packages), [`processes`] (the supervised
//! processes), [`watch`] (changed sources), [`state`] (the lock and the
//! state file under `.gpkit/dev/`), [`output`] (prefixed lines),
//! [`signals`], [`traces`] (the spans the processes export).

mod compose;
mod install;
mod output;
mod processes;
mod services;
mod signals;
pub(super) mod state;
mod traces;
mod watch;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::Context;
use super::doctor::environment;
use crate::cli::DevArgs;
use state::DevLock;

/// The variables `gpkit dev` reads, from the environment or `.env`.
const SETTINGS: &[&str] = &[
    "DATABASE_URL",
    "VALKEY_ADDR",
    "VALKEY_URL",
    "VALKEY_SENTINEL_ADDRS",
    "VALKEY_CLUSTER_ADDRS",
    "WORKER_METRICS_ADDR",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OUTBOX_WAKE",
];

/// An orderly stop was asked for (Ctrl-C or SIGTERM) during start-up.
#[derive(Debug)]
struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

/// A note of gpkit's own, on standard error.
fn note(text: &str) {
    eprintln!("gpkit dev: {text}");
}

/// The server binary `find` finds; when there is none and `install` is
/// set, `server` installed from the system's packages and found then.
fn found_or_installed(
    find: fn() -> Result<PathBuf>,
    server: install::Server,
    install: bool,
) -> Result<PathBuf> {
    match find() {
        Ok(found) => Ok(found),
        Err(_) if install => {
            install::install(server)?;
            find().context("installed, but still not found")
        }
        Err(err) => Err(err),
    }
}

pub(crate) fn run(ctx: &Context, args: DevArgs) -> Result<ExitCode> {
    if ctx.dry_run || ctx.diff {
        bail!(
            "`gpkit dev` writes no plan, so it takes neither `--dry-run` nor `--diff`\n\
             help: run `gpkit dev` without them"
        );
    }
    let (project, _) = ctx.open_project("dev", true)?;
    let root = project
        .root
        .canonicalize()
        .with_context(|| format!("failed to resolve `{}`", project.root.display()))?;
    if args.print_env {
        super::print_out(&state::running_env(&root)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let run = Processes::of(&project.manifest);
    let database = project.manifest.answers.name.replace('-', "_");

    // What to run, decided before anything is written or started.
    let docker = args.compose.then(|| compose::check(&root)).transpose()?;
    let (mut settings, _) = environment::load(&root, SETTINGS);
    if docker.is_some() {
        for name in SETTINGS
            .iter()
            .filter(|name| name.contains("VALKEY") || **name == "DATABASE_URL")
        {
            if settings.get(name).is_some() {
                note(&format!(
                    "--compose: {name} (from {}) is not used",
                    settings.where_set(name)
                ));
            }
        }
        settings = environment::Settings::default();
    }
    let mut given_db = settings.get("DATABASE_URL");
    if let Some(url) = given_db
        && let Err(reason) = services::postgres_answers(url)
    {
        note(&format!(
            "DATABASE_URL (from {}) cannot be used ({reason}); starting the project's own Postgres",
            settings.where_set("DATABASE_URL")
        ));
        given_db = None;
    }
    let pg_bin = match given_db {
        Some(_) => None,
        None if docker.is_some() => None,
        None => Some(found_or_installed(
            services::find_postgres,
            install::Server::Postgres,
            args.install,
        )?),
    };
    let other_valkey = [
        "VALKEY_URL",
        "VALKEY_SENTINEL_ADDRS",
        "VALKEY_CLUSTER_ADDRS",
    ]
    .into_iter()
    .find(|name| settings.get(name).is_some());
    let given_valkey = settings
        .get("VALKEY_ADDR")
        .filter(|addr| services::valkey_answers(addr));
    let valkey_bin =
        if run.worker && docker.is_none() && given_valkey.is_none() && other_valkey.is_none() {
            if settings.get("VALKEY_ADDR").is_some() {
                note(&format!(
                    "VALKEY_ADDR (from {}) does not answer; starting the project's own Valkey",
                    settings.where_set("VALKEY_ADDR")
                ));
            }
            Some(found_or_installed(
                services::find_valkey,
                install::Server::Valkey,
                args.install,
            )?)
        } else {
            None
        };

    let lock = DevLock::acquire(&root)?;
    let leftovers = lock.stop_leftovers();
    if leftovers > 0 {
        note(&format!(
            "stopped {leftovers} process(es) an earlier, killed `gpkit dev` left running"
        ));
    }
    signals::install();

    // The servers.
    let mut env: Vec<(String, String)> = Vec::new();
    let compose = match docker {
        Some(docker) => {
            let project_name = format!("{}-dev", project.manifest.answers.name);
            let compose = compose::Compose::start(
                docker,
                &root,
                lock.dir(),
                &project_name,
                run.worker,
                args.fresh,
            )?;
            note(&format!(
                "{} of {} at {} (docker compose project `{project_name}`)",
                compose.services(),
                compose::COMPOSE_FILE,
                compose
                    .env()
                    .iter()
                    .map(|(name, value)| match name.as_str() {
                        "DATABASE_URL" => value
                            .rsplit_once('@')
                            .map_or(value.as_str(), |(_, host)| host)
                            .split('/')
                            .next()
                            .unwrap_or_default()
                            .to_string(),
                        _ => value.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(" and ")
            ));
            env.extend(compose.env().iter().cloned());
            Some(compose)
        }
        None => None,
    };
    let postgres = match (&pg_bin, given_db) {
        (Some(bin), _) => {
            let postgres = services::Postgres::start(bin, lock.dir(), args.fresh)?;
            note(&format!(
                "Postgres {} at 127.0.0.1:{} (data in {}/postgres)",
                bin.display(),
                postgres.port(),
                state::DEV_DIR
            ));
            env.push(("DATABASE_URL".into(), postgres.url(&database)));
            Some(postgres)
        }
        (None, Some(url)) => {
            note(&format!(
                "Postgres: using DATABASE_URL from {}, {}{}",
                settings.where_set("DATABASE_URL"),
                if services::asks_for_tls(url) {
                    "as given (it asks for TLS: not checked)"
                } else {
                    "which answers"
                },
                if args.fresh {
                    " (--fresh empties only the project's own servers)"
                } else {
                    ""
                }
            ));
            env.push(("DATABASE_URL".into(), url.to_string()));
            None
        }
        (None, None) if compose.is_some() => None,
        (None, None) => unreachable!("a Postgres binary was found or a server answers"),
    };
    let valkey = match (&valkey_bin, given_valkey) {
        (Some(bin), _) => {
            let valkey = services::Valkey::start(bin, lock.dir(), args.fresh)?;
            note(&format!(
                "Valkey {} at {} (data in {}/valkey)",
                bin.display(),
                valkey.addr(),
                state::DEV_DIR
            ));
            env.push(("VALKEY_ADDR".into(), valkey.addr()));
            Some(valkey)
        }
        (None, Some(addr)) if run.worker => {
            note(&format!(
                "Valkey: using VALKEY_ADDR from {}, which answers",
                settings.where_set("VALKEY_ADDR")
            ));
            env.push(("VALKEY_ADDR".into(), addr.to_string()));
            None
        }
        _ => {
            if let (true, Some(name)) = (run.worker, other_valkey) {
                note(&format!(
                    "Valkey: using {name} from {} as it is",
                    settings.where_set(name)
                ));
            }
            None
        }
    };
    let service_pids: Vec<(u32, PathBuf)> = valkey.iter().filter_map(|v| v.pid()).collect();
    lock.write_state(&env, &service_pids)?;
    env.push(("HTTP_ADDR".into(), format!("127.0.0.1:{}", args.port)));
    // The worker's metrics default to 0.0.0.0:9090: a loopback port of its
    // own instead, unless one is set.
    if run.worker && settings.get("WORKER_METRICS_ADDR").is_none() {
        env.push((
            "WORKER_METRICS_ADDR".into(),
            format!("127.0.0.1:{}", services::free_port()?),
        ));
    }
    // The console: a loopback port of its own, unless one is set.
    if run.console && settings.get("OUTBOX_CONSOLE_ADDR").is_none() {
        env.push((
            "OUTBOX_CONSOLE_ADDR".into(),
            format!("127.0.0.1:{}", services::free_port()?),
        ));
    }
    // A commit wakes the worker's relay at once, through Valkey, rather
    // than at its next poll (up to a second later), unless set.
    if run.worker && settings.get("OUTBOX_WAKE").is_none() {
        env.push(("OUTBOX_WAKE".into(), "valkey".into()));
    }
    // Their spans: to gpkit's own receiver, unless the project names a
    // collector.
    let traces = match [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .into_iter()
    .find(|name| settings.get(name).is_some())
    {
        Some(name) => {
            note(&format!(
                "traces: to {} ({name} from {})",
                settings.get(name).unwrap_or_default(),
                settings.where_set(name)
            ));
            None
        }
        None => {
            let kept_in = lock.dir().join(traces::DIR);
            let receiver = traces::Receiver::start(&kept_in)?;
            note(&format!(
                "traces: received at {}, kept for {} in {}/{} (a JSON line a span)",
                receiver.endpoint(),
                humantime::format_duration(traces::KEPT),
                state::DEV_DIR,
                traces::DIR
            ));
            env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), receiver.endpoint()));
            // Where the console reads them, to draw each event's trace.
            env.push((
                "OUTBOX_CONSOLE_TRACES".into(),
                kept_in.display().to_string(),
            ));
            // Exported half a second after they end, not five.
            if settings.get("OTEL_BSP_SCHEDULE_DELAY").is_none() {
                env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "500".into()));
            }
            Some(receiver)
        }
    };
    // Their output goes through gpkit: colours only when gpkit's does.
    if !output::colour() && std::env::var_os("NO_COLOR").is_none() {
        env.push(("NO_COLOR".into(), "1".into()));
    }

    let result = run_service(&root, &lock, &env, &service_pids, run, !args.no_watch);
    drop(traces);
    drop(valkey);
    drop(postgres);
    drop(compose);
    match result {
        Ok(()) => {
            note("stopped");
            Ok(ExitCode::SUCCESS)
        }
        Err(err) if err.is::<Interrupted>() => {
            note("stopped");
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => Err(err),
    }
}

/// Builds, migrates and runs the processes until a stop is asked for.
fn run_service(
    root: &Path,
    lock: &DevLock,
    env: &[(String, String)],
    service_pids: &[(u32, PathBuf)],
    run: Processes,
    watching: bool,
) -> Result<()> {
    let Some(binaries) = build(root)? else {
        bail!(
            "the build failed; nothing was run\n\
             help: fix the errors above, then run `gpkit dev` again"
        );
    };
    migrate(&binary(&binaries, "migrate")?, root, env)?;
    let programs = programs(&binaries, run)?;
    let mut supervisor = processes::Supervisor::start(&programs, env, root)?;
    let addr = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let console = match addr("OUTBOX_CONSOLE_ADDR").filter(|_| run.console) {
        Some(console) => format!("; the console at http://{console}/"),
        None => String::new(),
    };
    note(&format!(
        "running {}; http://{}{console}; Ctrl-C stops it all",
        programs
            .iter()
            .map(|program| program.name.as_str())
            .collect::<Vec<_>>()
            .join(" and "),
        addr("HTTP_ADDR").unwrap_or_default()
    ));
    let write_state = |supervisor: &processes::Supervisor| {
        let pids: Vec<(u32, PathBuf)> = service_pids
            .iter()
            .cloned()
            .chain(supervisor.pids())
            .collect();
        let shown: Vec<(String, String)> = env
            .iter()
            .filter(|(k, _)| k == "DATABASE_URL" || k == "VALKEY_ADDR")
            .cloned()
            .collect();
        lock.write_state(&shown, &pids)
    };
    write_state(&supervisor)?;
    let mut watch = watching.then(|| watch::Watch::new(root));
    let mut scanned = Instant::now();
    while signals::received().is_none() {
        if supervisor.tick() {
            write_state(&supervisor)?;
        }
        if let Some(watch) = watch.as_mut()
            && scanned.elapsed() >= watch::INTERVAL
        {
            let changes = watch.changes();
            if !changes.is_empty() {
                reload(root, env, run, &mut supervisor, &changes)?;
                write_state(&supervisor)?;
            }
            scanned = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    note(&format!(
        "{}: stopping",
        signals::name(signals::received().unwrap_or(libc::SIGINT))
    ));
    supervisor.stop();
    Ok(())
}

/// The binary `name` of a build.
fn binary(binaries: &Binaries, name: &str) -> Result<PathBuf> {
    binaries.get(name).cloned().with_context(|| {
        format!("`cargo build --bins` built no `{name}` binary; is this a gpkit project?")
    })
}

/// Which of the service's processes `gpkit dev` runs beside the server.
#[derive(Debug, Clone, Copy)]
struct Processes {
    worker: bool,
    /// `outbox console`: with the worker, from the template set whose
    /// `outbox` binary serves it.
    console: bool,
}

/// The first template set whose `outbox` binary has the `console`
/// subcommand.
const CONSOLE_SINCE_SET: u32 = 16;

impl Processes {
    fn of(manifest: &crate::engine::manifest::Manifest) -> Self {
        let worker = manifest.components.worker;
        Self {
            worker,
            console: worker && manifest.gpkit.template_set >= CONSOLE_SINCE_SET,
        }
    }
}

/// The processes to run, by name, from a build.
fn programs(binaries: &Binaries, run: Processes) -> Result<Vec<processes::Program>> {
    let program = |name: &str, binary_name: &str, args: &[&str]| -> Result<processes::Program> {
        Ok(processes::Program {
            name: name.to_string(),
            path: binary(binaries, binary_name)?,
            args: args.iter().map(|arg| arg.to_string()).collect(),
        })
    };
    let mut programs = vec![program("server", "server", &[])?];
    if run.worker {
        programs.push(program("worker", "worker", &[])?);
    }
    if run.console {
        programs.push(program("console", "outbox", &["console"])?);
    }
    Ok(programs)
}

/// After `changes` to the sources: rebuilds; when that succeeds, applies
/// new migrations and restarts the processes on the new binaries. A failed
/// build or migration leaves the running processes as they are.
fn reload(
    root: &Path,
    env: &[(String, String)],
    run: Processes,
    supervisor: &mut processes::Supervisor,
    changes: &[PathBuf],
) -> Result<()> {
    let shown: Vec<String> = changes
        .iter()
        .take(3)
        .map(|p| p.display().to_string())
        .collect();
    let more = match changes.len() {
        n if n > 3 => format!(" and {} more", n - 3),
        _ => String::new(),
    };
    note(&format!("changed: {}{more}; rebuilding", shown.join(", ")));
    let Some(binaries) = build(root)? else {
        note("the build failed; the running processes are kept (save a fix to rebuild)");
        return Ok(());
    };
    let restarted = binary(&binaries, "migrate")
        .and_then(|migrate_bin| migrate(&migrate_bin, root, env))
        .and_then(|()| programs(&binaries, run));
    match restarted {
        Ok(programs) => {
            supervisor.restart(&programs)?;
            note("restarted on the new build");
        }
        Err(err) if err.is::<Interrupted>() => return Err(err),
        Err(err) => note(&format!(
            "{err:#}\nthe running processes are kept (save a fix to retry)"
        )),
    }
    Ok(())
}

/// Runs `command` to its end, or stops it (SIGTERM) when a stop is asked for.
fn wait_stoppable(mut child: std::process::Child) -> Result<std::process::ExitStatus> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if signals::received().is_some() {
            signals::send(child.id(), libc::SIGTERM);
            let _ = child.wait();
            return Err(Interrupted.into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The binaries a build made, by name.
type Binaries = BTreeMap<String, PathBuf>;

/// `cargo build --bins` in the project: the built binaries by name, or
/// `None` when the build failed. Cargo's messages go to standard error as
/// they come.
fn build(root: &Path) -> Result<Option<Binaries>> {
    let started = Instant::now();
    note("cargo build --bins");
    let mut child = Command::new("cargo")
        .args([
            "build",
            "--bins",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("failed to run cargo")?;
    let stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut binaries = BTreeMap::new();
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if message["reason"] != "compiler-artifact" {
                continue;
            }
            if let (Some(name), Some(path)) = (
                message["target"]["name"].as_str(),
                message["executable"].as_str(),
            ) {
                binaries.insert(name.to_string(), PathBuf::from(path));
            }
        }
        binaries
    });
    let status = wait_stoppable(child)?;
    let binaries = reader.join().unwrap_or_default();
    if !status.success() {
        note(&format!(
            "`cargo build --bins` failed ({})",
            processes::describe(status)
        ));
        return Ok(None);
    }
    note(&format!(
        "built in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(Some(binaries))
}

/// `migrate up --create-database` with the dev environment, its output
/// prefixed by `migrate`.
fn migrate(program: &Path, root: &Path, env: &[(String, String)]) -> Result<()> {
    let mut child = Command::new(program)
        .args(["up", "--create-database"])
        .current_dir(root)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("failed to run `{}`", program.display()))?;
    let pumps = [
        output::pump("migrate", child.stdout.take().expect("piped")),
        output::pump("migrate", child.stderr.take().expect("piped")),
    ];
    let status = wait_stoppable(child)?;
    for pump in pumps {
        let _ = pump.join();
    }
    if !status.success() {
        bail!(
            "`migrate up --create-database` failed ({}); nothing was run\n\
             help: fix the migration named above, then run `gpkit dev` again",
            processes::describe(status)
        );
    }
    Ok(())
}
