//! `gpkit dev --install`: installs a server `gpkit dev` did not find with
//! the system's package manager, on Debian-like systems (`apt-get`; through
//! `sudo` when not root), saying first what it runs. Elsewhere it says what
//! to install and stops, having changed nothing.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

/// A server `gpkit dev` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Server {
    Postgres,
    Valkey,
}

impl Server {
    fn name(self) -> &'static str {
        match self {
            Self::Postgres => "Postgres",
            Self::Valkey => "Valkey",
        }
    }

    /// The Debian package: `postgresql`; `valkey-server` where the archive
    /// has it (Debian 13, Ubuntu 24.10 and later), else `redis-server`.
    fn package(self) -> &'static str {
        match self {
            Self::Postgres => "postgresql",
            Self::Valkey => {
                let known = Command::new("apt-cache")
                    .args(["show", "valkey-server"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|status| status.success());
                if known {
                    "valkey-server"
                } else {
                    "redis-server"
                }
            }
        }
    }
}

/// Installs `server`'s package with `apt-get install -y`, after `apt-get
/// update` when the first try fails (a machine whose package lists were
/// never fetched). Fails, naming the command, when it cannot.
pub(crate) fn install(server: Server) -> Result<()> {
    if !Path::new("/etc/debian_version").is_file() || super::services::on_path("apt-get").is_none()
    {
        bail!(
            "`--install` installs with apt-get, on Debian-like systems only; nothing was started\n\
             help: install {} with the system's package manager (on macOS `brew install {}`), \
             then run `gpkit dev` again",
            server.name(),
            match server {
                Server::Postgres => "postgresql@17",
                Server::Valkey => "valkey",
            }
        );
    }
    let package = server.package();
    let install = ["install", "-y", "--no-install-recommends", package];
    super::note(&format!(
        "installing {}: {}apt-get {}",
        server.name(),
        sudo_prefix(),
        install.join(" ")
    ));
    if apt_get(&install)? {
        return Ok(());
    }
    super::note("the install failed; fetching the package lists (apt-get update) and trying again");
    if apt_get(&["update"])? && apt_get(&install)? {
        return Ok(());
    }
    bail!(
        "`{}apt-get {}` failed (its output is above); nothing was started\n\
         help: run it yourself, then `gpkit dev` again",
        sudo_prefix(),
        install.join(" ")
    )
}

/// `sudo ` when this process is not root, for the commands shown.
fn sudo_prefix() -> &'static str {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        ""
    } else {
        "sudo "
    }
}

/// Runs `apt-get args` (through `sudo` when not root), its output shown as
/// it comes; whether it succeeded.
fn apt_get(args: &[&str]) -> Result<bool> {
    let mut command = if sudo_prefix().is_empty() {
        Command::new("apt-get")
    } else {
        let mut sudo = Command::new("sudo");
        sudo.arg("apt-get");
        sudo
    };
    let status = command
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("failed to run {}apt-get", sudo_prefix()))?;
    Ok(status.success())
}
