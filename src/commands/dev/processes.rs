//! The service's processes (`server`, and `worker` and the console when
//! the project has the worker), run from the built binaries with the dev environment, their output
//! prefixed by name; a process that exits is restarted, after a pause that
//! doubles while it keeps exiting soon after its start (1 s up to 30 s),
//! and a line says why it exited. Stopping sends SIGTERM, then SIGKILL to
//! what still runs after 10 s.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::output;
use super::signals;

/// The first pause before a restart.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest pause before a restart.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A process that ran this long before exiting is restarted at once.
const HEALTHY_RUN: Duration = Duration::from_secs(10);
/// How long the processes get to stop after SIGTERM.
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How a process ended, for messages: its exit code or its signal.
pub(crate) fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by {}", signals::name(signal)),
        _ => "exited".to_string(),
    }
}

/// A process to run: a built binary and its arguments, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Program {
    /// What its output lines are prefixed with.
    pub(crate) name: String,
    pub(crate) path: PathBuf,
    pub(crate) args: Vec<String>,
}

/// One supervised process.
#[derive(Debug)]
struct Process {
    name: String,
    program: Program,
    child: Option<Child>,
    started: Instant,
    restart_at: Option<Instant>,
    backoff: Duration,
}

/// The running processes.
#[derive(Debug)]
pub(crate) struct Supervisor {
    processes: Vec<Process>,
    env: Vec<(String, String)>,
    dir: PathBuf,
}

impl Supervisor {
    /// Starts each `(name, program)` in `dir` with `env` added to gpkit's
    /// environment.
    pub(crate) fn start(
        programs: &[Program],
        env: &[(String, String)],
        dir: &Path,
    ) -> Result<Self> {
        let mut supervisor = Self {
            processes: Vec::new(),
            env: env.to_vec(),
            dir: dir.to_path_buf(),
        };
        for program in programs {
            let mut process = Process {
                name: program.name.clone(),
                program: program.clone(),
                child: None,
                started: Instant::now(),
                restart_at: None,
                backoff: FIRST_BACKOFF,
            };
            process.child = Some(supervisor.spawn(&process)?);
            supervisor.processes.push(process);
        }
        Ok(supervisor)
    }

    fn spawn(&self, process: &Process) -> Result<Child> {
        let mut child = Command::new(&process.program.path)
            .args(&process.program.args)
            .current_dir(&self.dir)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: a Ctrl-C in the terminal reaches gpkit
            // only, which then stops each process in turn.
            .process_group(0)
            .spawn()
            .with_context(|| format!("failed to start `{}`", process.program.path.display()))?;
        if let Some(stdout) = child.stdout.take() {
            output::pump(&process.name, stdout);
        }
        if let Some(stderr) = child.stderr.take() {
            output::pump(&process.name, stderr);
        }
        Ok(child)
    }

    /// The pid and program of each running process, for the state file.
    pub(crate) fn pids(&self) -> Vec<(u32, PathBuf)> {
        self.processes
            .iter()
            .filter_map(|p| p.child.as_ref().map(|c| (c.id(), p.program.path.clone())))
            .collect()
    }

    /// Notices the processes that exited, and restarts those whose pause is
    /// over. Returns true when a process was (re)started.
    pub(crate) fn tick(&mut self) -> bool {
        let mut started = false;
        for index in 0..self.processes.len() {
            let now = Instant::now();
            let process = &mut self.processes[index];
            if let Some(child) = process.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                process.child = None;
                let ran = now.duration_since(process.started);
                if ran >= HEALTHY_RUN {
                    process.backoff = FIRST_BACKOFF;
                }
                let pause = if ran >= HEALTHY_RUN {
                    Duration::ZERO
                } else {
                    process.backoff
                };
                output::line(
                    &process.name,
                    &format!(
                        "[gpkit dev] {} after {:.1} s; restarting in {} s",
                        describe(status),
                        ran.as_secs_f64(),
                        pause.as_secs()
                    ),
                );
                if ran < HEALTHY_RUN {
                    process.backoff = (process.backoff * 2).min(MAX_BACKOFF);
                }
                process.restart_at = Some(now + pause);
            }
            let process = &self.processes[index];
            if process.child.is_none() && process.restart_at.is_some_and(|at| at <= now) {
                let spawned = self.spawn(process);
                let process = &mut self.processes[index];
                process.restart_at = None;
                process.started = Instant::now();
                match spawned {
                    Ok(child) => {
                        process.child = Some(child);
                        started = true;
                    }
                    Err(err) => {
                        output::line(&process.name, &format!("[gpkit dev] {err:#}"));
                        process.restart_at = Some(Instant::now() + process.backoff);
                        process.backoff = (process.backoff * 2).min(MAX_BACKOFF);
                    }
                }
            }
        }
        started
    }

    /// Stops every process, then starts each again from `programs` (the
    /// same names, new binaries).
    pub(crate) fn restart(&mut self, programs: &[Program]) -> Result<()> {
        self.stop();
        for index in 0..self.processes.len() {
            if let Some(program) = programs
                .iter()
                .find(|program| program.name == self.processes[index].name)
            {
                self.processes[index].program = program.clone();
            }
            let child = self.spawn(&self.processes[index])?;
            let process = &mut self.processes[index];
            process.child = Some(child);
            process.started = Instant::now();
            process.backoff = FIRST_BACKOFF;
            process.restart_at = None;
        }
        Ok(())
    }

    /// Stops every process: SIGTERM, then SIGKILL after [`STOP_TIMEOUT`].
    pub(crate) fn stop(&mut self) {
        for process in &mut self.processes {
            process.restart_at = None;
            if let Some(child) = &process.child {
                signals::send(child.id(), libc::SIGTERM);
            }
        }
        let start = Instant::now();
        loop {
            let mut running = false;
            for process in &mut self.processes {
                let Some(child) = process.child.as_mut() else {
                    continue;
                };
                match child.try_wait() {
                    Ok(Some(status)) => {
                        output::line(
                            &process.name,
                            &format!("[gpkit dev] stopped: {}", describe(status)),
                        );
                        process.child = None;
                    }
                    Ok(None) if start.elapsed() >= STOP_TIMEOUT => {
                        output::line(
                            &process.name,
                            &format!(
                                "[gpkit dev] still running {} s after SIGTERM: sending SIGKILL",
                                STOP_TIMEOUT.as_secs()
                            ),
                        );
                        let _ = child.kill();
                        let _ = child.wait();
                        process.child = None;
                    }
                    Ok(None) => running = true,
                    Err(_) => process.child = None,
                }
            }
            if !running {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop();
    }
}
