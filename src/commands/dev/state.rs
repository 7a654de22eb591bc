//! The files of `gpkit dev` under `.gpkit/dev/`: the lock that keeps a
//! second run in the same project out, and the state file of the running
//! one (its environment, for `--print-env`, and its processes' ids, so that
//! the next run can stop what a killed run left behind).
//!
//! The lock is a `flock` on `.gpkit/dev/lock`, which holds the pid of the
//! run holding it. The kernel drops the lock when that run dies, so the
//! file a killed run leaves is no refusal.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Where `gpkit dev` keeps its data, relative to the project root.
pub(crate) const DEV_DIR: &str = ".gpkit/dev";
const LOCK_FILE: &str = "lock";
const STATE_FILE: &str = "state";

/// The lock of the running `gpkit dev`; the state file goes with it.
#[derive(Debug)]
pub(crate) struct DevLock {
    _file: File,
    dir: PathBuf,
}

impl DevLock {
    /// Creates `.gpkit/dev/` (with a `.gitignore` that keeps all of it out
    /// of git) and takes its lock, or fails naming the run that holds it.
    pub(crate) fn acquire(root: &Path) -> Result<Self> {
        let dir = root.join(DEV_DIR);
        for part in [root.join(".gpkit"), dir.clone()] {
            if part.is_symlink() {
                bail!(
                    "`{}` is a symbolic link; gpkit does not follow it",
                    part.display()
                );
            }
        }
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("failed to create `{}`", dir.display()))?;
        let ignore = dir.join(".gitignore");
        if !ignore.exists() {
            std::fs::write(&ignore, "*\n")
                .with_context(|| format!("failed to write `{}`", ignore.display()))?;
        }
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("failed to open `{}`", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let pid = std::fs::read_to_string(&path).unwrap_or_default();
                let who = match pid.trim() {
                    "" => "another `gpkit dev`".to_string(),
                    pid => format!("`gpkit dev` (process {pid})"),
                };
                bail!(
                    "{who} is already running in this project; nothing was started\n\
                     help: stop it (Ctrl-C in its terminal), or use its servers: \
                     `gpkit dev --print-env`"
                );
            }
            Err(TryLockError::Error(err)) => {
                return Err(err).with_context(|| format!("failed to lock `{}`", path.display()));
            }
        }
        file.set_len(0)?;
        writeln!(file, "{}", std::process::id())?;
        Ok(Self { _file: file, dir })
    }

    /// The directory `.gpkit/dev/`.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes the state file: `env` as `NAME=value` lines, then a
    /// `pid <pid> <program>` line for each process it runs.
    pub(crate) fn write_state(
        &self,
        env: &[(String, String)],
        pids: &[(u32, PathBuf)],
    ) -> Result<()> {
        let mut text = String::new();
        for (name, value) in env {
            text.push_str(&format!("{name}={value}\n"));
        }
        for (pid, program) in pids {
            text.push_str(&format!("pid {pid} {}\n", program.display()));
        }
        let path = self.dir.join(STATE_FILE);
        let temporary = self.dir.join(format!("{STATE_FILE}.tmp"));
        std::fs::write(&temporary, text)
            .with_context(|| format!("failed to write `{}`", temporary.display()))?;
        std::fs::rename(&temporary, &path)
            .with_context(|| format!("failed to write `{}`", path.display()))?;
        Ok(())
    }

    /// Stops the processes a killed run left behind (from its state file):
    /// each pid whose process still runs the same program gets SIGKILL.
    /// Returns how many it stopped.
    pub(crate) fn stop_leftovers(&self) -> usize {
        let Ok(text) = std::fs::read_to_string(self.dir.join(STATE_FILE)) else {
            return 0;
        };
        let mut stopped = 0;
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("pid ") else {
                continue;
            };
            let Some((pid, program)) = rest.split_once(' ') else {
                continue;
            };
            let Ok(pid) = pid.parse::<u32>() else {
                continue;
            };
            if runs(pid, Path::new(program)) {
                super::signals::send(pid, libc::SIGKILL);
                stopped += 1;
            }
        }
        let _ = std::fs::remove_file(self.dir.join(STATE_FILE));
        stopped
    }
}

impl Drop for DevLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.dir.join(STATE_FILE));
    }
}

/// Whether the process `pid` exists and runs `program` (read from `/proc`:
/// its executable, possibly replaced by a later build since, or the start
/// of its command line, which Valkey rewrites; elsewhere no process counts
/// as a match).
fn runs(pid: u32, program: &Path) -> bool {
    let wanted = program.as_os_str().as_encoded_bytes();
    if let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) {
        let exe = exe.as_os_str().as_encoded_bytes();
        if exe == wanted || exe.strip_suffix(b" (deleted)") == Some(wanted) {
            return true;
        }
    }
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| cmdline.starts_with(wanted))
}

/// The `gpkit dev` running in a project, as its lock and state file have it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Running {
    /// Its process id.
    pub(crate) pid: String,
    /// The environment it gives the project's processes, `(name, value)`.
    pub(crate) env: Vec<(String, String)>,
}

/// The `gpkit dev` running in the project at `root`: `Ok(None)` when none
/// runs, and an error while one is starting and has not written its state.
pub(crate) fn running(root: &Path) -> Result<Option<Running>> {
    let dir = root.join(DEV_DIR);
    let Ok(file) = File::open(dir.join(LOCK_FILE)) else {
        return Ok(None);
    };
    match file.try_lock_shared() {
        // Nobody holds it: no run.
        Ok(()) => return Ok(None),
        Err(TryLockError::WouldBlock) => {}
        Err(TryLockError::Error(err)) => return Err(err.into()),
    }
    let state = std::fs::read_to_string(dir.join(STATE_FILE)).map_err(|_| {
        anyhow::anyhow!(
            "`gpkit dev` is starting in this project and has not started its servers yet\n\
             help: ask again in a moment"
        )
    })?;
    let pid = std::fs::read_to_string(dir.join(LOCK_FILE))
        .unwrap_or_default()
        .trim()
        .to_string();
    let env = state
        .lines()
        .filter(|line| !line.starts_with("pid "))
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    Ok(Some(Running { pid, env }))
}

/// The environment of the `gpkit dev` running in the project at `root`, as
/// `NAME=value` lines, or an error when none runs.
pub(crate) fn running_env(root: &Path) -> Result<String> {
    let running = running(root)?.ok_or_else(|| {
        anyhow::anyhow!(
            "no `gpkit dev` is running in this project\n\
             help: start one with `gpkit dev`, then ask again"
        )
    })?;
    Ok(running
        .env
        .iter()
        .map(|(name, value)| format!("{name}={value}\n"))
        .collect())
}
