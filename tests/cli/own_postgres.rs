//! A Postgres cluster of a test's own, for tests that reconfigure the server
//! (TLS, `pg_hba.conf`): `initdb` into a temporary directory, started on a
//! free loopback port, stopped on drop. As root (CI), the cluster belongs to
//! Debian's `postgres` user, since `initdb` refuses to run as root.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A running throwaway cluster; `trust` authentication for its superuser.
pub struct OwnPostgres {
    dir: tempfile::TempDir,
    pub port: u16,
    /// `pg_ctl start`'s `-o`: the port, the socket directory, the settings.
    options: String,
}

/// The newest PostgreSQL's programs (Debian keeps them off `PATH`).
fn bin(program: &str) -> PathBuf {
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .expect(
            "PostgreSQL is installed under /usr/lib/postgresql (scripts/with-services installs it)",
        )
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .max()
        .expect("a PostgreSQL version under /usr/lib/postgresql");
    PathBuf::from(format!("/usr/lib/postgresql/{newest}/bin/{program}"))
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    // `/proc/self` belongs to the process's effective user.
    std::fs::metadata("/proc/self").unwrap().uid() == 0
}

/// `program args` as the cluster's owner; panics with its output on failure.
fn as_owner(program: &Path, args: &[&str]) {
    let mut command = if is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
            .arg(program);
        c
    } else {
        Command::new(program)
    };
    let output = command.args(args).output().unwrap();
    assert!(
        output.status.success(),
        "{} {args:?} failed:\n{}{}",
        program.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Gives `path` to the `postgres` user when running as root.
pub fn give_to_owner(path: &Path) {
    if is_root() {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl OwnPostgres {
    /// Starts a cluster with `settings` (`-c name=value` each) and, when
    /// given, `hba` as its whole `pg_hba.conf`.
    pub fn start(settings: &[(&str, &str)], hba: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        give_to_owner(dir.path());
        let data_arg = data.display().to_string();
        as_owner(
            &bin("initdb"),
            &[
                "-D",
                &data_arg,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
            ],
        );
        if let Some(hba) = hba {
            std::fs::write(data.join("pg_hba.conf"), hba).unwrap();
            give_to_owner(&data);
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            dir.path().display()
        );
        for (name, value) in settings {
            options += &format!(" -c {name}={value}");
        }
        let postgres = Self { dir, port, options };
        postgres.start_again();
        postgres
    }

    /// `postgresql://postgres@127.0.0.1:<port>/<database>`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`): its clients'
    /// connections break.
    pub fn stop(&self) {
        let data = self.dir.path().join("data").display().to_string();
        as_owner(
            &bin("pg_ctl"),
            &["-D", &data, "-m", "immediate", "-w", "stop"],
        );
    }

    /// Starts the stopped server again, on the same port with the same data.
    pub fn start_again(&self) {
        let data = self.dir.path().join("data").display().to_string();
        let log = self.dir.path().join("log").display().to_string();
        as_owner(
            &bin("pg_ctl"),
            &["-D", &data, "-l", &log, "-w", "-o", &self.options, "start"],
        );
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let data = self.dir.path().join("data").display().to_string();
        let _ = std::panic::catch_unwind(|| {
            as_owner(
                &bin("pg_ctl"),
                &["-D", &data, "-m", "immediate", "-w", "stop"],
            )
        });
    }
}
