//! The servers a project needs in development: a Postgres cluster under
//! `.gpkit/dev/postgres/` and a Valkey (or Redis) server under
//! `.gpkit/dev/valkey/`, each the project's own, on a free loopback port,
//! with data kept from one run to the next; or the servers `DATABASE_URL`
//! and `VALKEY_ADDR` name, when those answer.
//!
//! Postgres is set up the way gpkit's `scripts/with-services` does it:
//! `initdb` with trust authentication, `listen_addresses=127.0.0.1`, the
//! unix socket inside the cluster's directory. Postgres refuses to run as
//! root, so as root the cluster belongs to the `postgres` user (which
//! Debian's package creates) and its commands run as that user.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How long a server may take to answer a check.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Test-only override: the directory holding `initdb`, `pg_ctl` and
/// `postgres`; when set, it is the only place looked at.
pub(crate) const PG_BIN_ENV: &str = "GPKIT_DEV_PG_BIN";

/// A port nothing listens on right now, on the loopback interface.
pub(crate) fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")
        .context("failed to find a free port on 127.0.0.1")?
        .local_addr()?
        .port())
}

/// The newest Postgres `bin` directory this machine has: Debian's
/// `/usr/lib/postgresql/<version>/bin`, Homebrew's, or `initdb` on `PATH`;
/// or an error saying what to install.
pub(crate) fn find_postgres() -> Result<PathBuf> {
    let complete = |dir: &Path| {
        ["initdb", "pg_ctl", "postgres"]
            .iter()
            .all(|b| dir.join(b).is_file())
    };
    let found = if let Some(dir) = std::env::var_os(PG_BIN_ENV) {
        Some(PathBuf::from(dir)).filter(|dir| complete(dir))
    } else {
        let mut candidates: Vec<PathBuf> = Vec::new();
        for pattern in [
            ("/usr/lib/postgresql", "bin"),
            ("/opt/homebrew/opt", "bin"),
            ("/usr/local/opt", "bin"),
        ] {
            let mut dirs: Vec<(Vec<u64>, PathBuf)> = std::fs::read_dir(pattern.0)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let version = if pattern.0 == "/usr/lib/postgresql" {
                        name.clone()
                    } else {
                        name.strip_prefix("postgresql")?
                            .trim_start_matches('@')
                            .to_string()
                    };
                    let key = version
                        .split('.')
                        .map(|part| part.parse::<u64>().unwrap_or(0))
                        .collect();
                    Some((key, entry.path().join(pattern.1)))
                })
                .collect();
            dirs.sort();
            candidates.extend(dirs.into_iter().rev().map(|(_, dir)| dir));
        }
        if let Some(path) = std::env::var_os("PATH") {
            candidates.extend(std::env::split_paths(&path));
        }
        candidates.into_iter().find(|dir| complete(dir))
    };
    found.ok_or_else(|| {
        anyhow::anyhow!(
            "no Postgres found (looked for initdb, pg_ctl and postgres in \
             /usr/lib/postgresql/*/bin, Homebrew's postgresql and PATH); nothing was started\n\
             help: install it: on Debian or Ubuntu `apt-get install postgresql` (or run \
             `gpkit dev --install`), on macOS `brew install postgresql@17`; or set DATABASE_URL \
             to a server of yours"
        )
    })
}

/// The Valkey (or Redis) server binary: `VALKEY_SERVER`, else
/// `valkey-server` or `redis-server` on `PATH`; or an error saying what to
/// install.
pub(crate) fn find_valkey() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("VALKEY_SERVER") {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        bail!(
            "VALKEY_SERVER is `{}`, which is not a file; nothing was started",
            path.display()
        );
    }
    for name in ["valkey-server", "redis-server"] {
        if let Some(found) = on_path(name) {
            return Ok(found);
        }
    }
    bail!(
        "no Valkey found (looked for VALKEY_SERVER, valkey-server and redis-server on PATH); \
         nothing was started\n\
         help: install it: on Debian or Ubuntu `apt-get install valkey-server` (or \
         `redis-server`; or run `gpkit dev --install`), on macOS `brew install valkey`; or set \
         VALKEY_ADDR to a server of yours"
    )
}

/// `program` in the first directory of `PATH` that has it as a file.
pub(crate) fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Whether a Postgres URL asks for TLS (`sslmode=require` and up).
pub(crate) fn asks_for_tls(url: &str) -> bool {
    url.contains("sslmode=require") || url.contains("sslmode=verify")
}

/// Whether the Postgres server `url` names answers and lets its user in (a
/// missing database counts: `migrate up --create-database` creates it), or
/// why not. A URL that asks for TLS is taken as it is.
pub(crate) fn postgres_answers(url: &str) -> std::result::Result<(), String> {
    if asks_for_tls(url) {
        return Ok(());
    }
    let mut config =
        postgres::Config::from_str(url).map_err(|_| "not a Postgres URL".to_string())?;
    config.connect_timeout(CHECK_TIMEOUT);
    match config.connect(postgres::NoTls) {
        Ok(_) => Ok(()),
        Err(err)
            if err
                .code()
                .is_some_and(|code| *code == postgres::error::SqlState::INVALID_CATALOG_NAME) =>
        {
            Ok(())
        }
        Err(err) => Err(match err.as_db_error() {
            Some(db) => db.message().to_string(),
            None => "no answer".to_string(),
        }),
    }
}

/// Whether a Valkey server answers PING at `addr` (`host:port`).
pub(crate) fn valkey_answers(addr: &str) -> bool {
    redis::Client::open(format!("redis://{addr}"))
        .and_then(|client| {
            let mut connection = client.get_connection_with_timeout(CHECK_TIMEOUT)?;
            connection.set_read_timeout(Some(CHECK_TIMEOUT))?;
            redis::cmd("PING").query::<String>(&mut connection)
        })
        .is_ok()
}

/// Whether gpkit runs as root, when Postgres must run as `postgres`.
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A command run as the cluster's owner: as `postgres` when gpkit is root.
fn as_owner(program: &Path) -> Command {
    if is_root() {
        let mut command = Command::new("setpriv");
        command
            .args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
            .arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// The last lines of a log file, for an error.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// `text` quoted for `sh` (pg_ctl passes `-o` through a shell).
fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The project's Postgres cluster, running; stopped on drop.
#[derive(Debug)]
pub(crate) struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    running: bool,
}

impl Postgres {
    /// Creates the cluster under `dev_dir/postgres/` if it does not exist
    /// (`fresh`: removes it first) and starts it on a free port.
    pub(crate) fn start(bin: &Path, dev_dir: &Path, fresh: bool) -> Result<Self> {
        let cluster = dev_dir.join("postgres");
        let data = cluster.join("data");
        let mut postgres = Self {
            bin: bin.to_path_buf(),
            data: data.clone(),
            port: 0,
            running: false,
        };
        // A cluster a killed run left running is stopped first.
        if data.join("postmaster.pid").exists() {
            postgres.running = true;
            postgres.stop();
        }
        if fresh && cluster.exists() {
            std::fs::remove_dir_all(&cluster)
                .with_context(|| format!("failed to remove `{}`", cluster.display()))?;
        }
        std::fs::create_dir_all(&cluster)
            .with_context(|| format!("failed to create `{}`", cluster.display()))?;
        if is_root() {
            if cfg!(not(target_os = "linux")) {
                bail!("Postgres does not run as root\nhelp: run `gpkit dev` as another user");
            }
            let status = Command::new("chown")
                .arg("postgres:postgres")
                .arg(&cluster)
                .status()
                .context("failed to run chown")?;
            if !status.success() {
                bail!(
                    "failed to give `{}` to the `postgres` user (Postgres does not run as root)\n\
                     help: create that user (Debian's postgresql package does), or run \
                     `gpkit dev` as another user",
                    cluster.display()
                );
            }
            let reachable = as_owner(Path::new("test"))
                .args(["-w".as_ref(), cluster.as_os_str()])
                .status()
                .is_ok_and(|s| s.success());
            if !reachable {
                bail!(
                    "the `postgres` user cannot write to `{}` (as root, gpkit dev runs Postgres \
                     as that user); nothing was started\n\
                     help: let others enter the project's parent directories (`chmod o+x`), \
                     or run `gpkit dev` as another user",
                    cluster.display()
                );
            }
        }
        if !data.join("PG_VERSION").exists() {
            let log = cluster.join("initdb.log");
            let output = as_owner(&bin.join("initdb"))
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
                .stdin(Stdio::null())
                .output()
                .context("failed to run initdb")?;
            let _ = std::fs::write(&log, [output.stdout, output.stderr.clone()].concat());
            if !output.status.success() {
                bail!(
                    "initdb failed:\n{}",
                    String::from_utf8_lossy(&output.stderr).trim_end()
                );
            }
        }
        postgres.port = free_port()?;
        // A unix socket path longer than ~100 bytes is refused: then none.
        let socket = if cluster.as_os_str().len() < 80 {
            format!("-k {}", sh_quote(&cluster.to_string_lossy()))
        } else {
            "-c unix_socket_directories=".to_string()
        };
        let log = cluster.join("postgres.log");
        let output = as_owner(&bin.join("pg_ctl"))
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "60", "start", "-o"])
            .arg(format!(
                "-p {} {socket} -c listen_addresses=127.0.0.1",
                postgres.port
            ))
            .stdin(Stdio::null())
            // Its own process group: a Ctrl-C in the terminal reaches gpkit
            // only, which stops the processes before the servers.
            .process_group(0)
            .output()
            .context("failed to run pg_ctl")?;
        if !output.status.success() {
            bail!(
                "Postgres did not start ({}):\n{}",
                log.display(),
                tail(&log)
            );
        }
        postgres.running = true;
        Ok(postgres)
    }

    /// The URL of `database` on this cluster.
    pub(crate) fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The port it listens on.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Stops the cluster (`pg_ctl stop -m fast`), waiting for it.
    pub(crate) fn stop(&mut self) {
        if !self.running {
            return;
        }
        self.running = false;
        let _ = as_owner(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "-t", "30", "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .status();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The project's Valkey server, running as gpkit's child; stopped on drop.
#[derive(Debug)]
pub(crate) struct Valkey {
    child: Option<Child>,
    program: PathBuf,
    port: u16,
}

impl Valkey {
    /// Starts `program` with its data (append-only file) under
    /// `dev_dir/valkey/` (`fresh`: removed first), on a free port, and
    /// waits for it to answer.
    pub(crate) fn start(program: &Path, dev_dir: &Path, fresh: bool) -> Result<Self> {
        let dir = dev_dir.join("valkey");
        if fresh && dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("failed to remove `{}`", dir.display()))?;
        }
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("failed to create `{}`", dir.display()))?;
        let port = free_port()?;
        let log = dir.join("valkey.log");
        let child = Command::new(program)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(&log)
            .args(["--appendonly", "yes", "--save", "", "--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .with_context(|| format!("failed to start `{}`", program.display()))?;
        let mut valkey = Self {
            child: Some(child),
            program: program.to_path_buf(),
            port,
        };
        let start = Instant::now();
        let addr = valkey.addr();
        while !valkey_answers(&addr) {
            let exited = valkey
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if exited.is_some() || start.elapsed() > Duration::from_secs(15) {
                valkey.stop();
                bail!("Valkey did not start ({}):\n{}", log.display(), tail(&log));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(valkey)
    }

    /// Its address, `127.0.0.1:<port>`.
    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Its pid and program, for the state file.
    pub(crate) fn pid(&self) -> Option<(u32, PathBuf)> {
        self.child
            .as_ref()
            .map(|child| (child.id(), self.program.clone()))
    }

    /// Stops it: SIGTERM (it writes its append-only file and exits), then
    /// SIGKILL after 10 s.
    pub(crate) fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        super::signals::send(child.id(), libc::SIGTERM);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Valkey {
    fn drop(&mut self) {
        self.stop();
    }
}
