//! `gpkit dev --compose`: the Postgres and Valkey of the project's
//! `compose.yaml` (`gpkit add deploy`), run by a container engine through
//! `docker compose`, instead of servers of the project's own.
//!
//! - The compose project is `<name>-dev`, so its containers and volumes are
//!   apart from those of a `docker compose up` of the whole service; dev
//!   data survives a restart in its volumes (`--fresh` removes them).
//! - Only the `postgres` service (and `valkey`, with the worker) is started,
//!   `up -d --wait` (until their health checks pass), with each port
//!   published on a free loopback port by an override file under
//!   `.gpkit/dev/`; `docker compose port` says which.
//! - The database's user, password and name are read from the resolved
//!   configuration (`docker compose config --format json`), so a
//!   `compose.yaml` you edited is followed.
//! - At the end the services are stopped (`stop`), not removed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, Result, bail};

use crate::domain::url_part::encode;

/// The compose file, at the project's root.
pub(crate) const COMPOSE_FILE: &str = "compose.yaml";

/// The override file that publishes the ports, in the dev directory.
const PORTS_FILE: &str = "compose.ports.yaml";

/// The services of the project's compose file, run for one `gpkit dev`.
pub(crate) struct Compose {
    docker: PathBuf,
    args: Vec<String>,
    services: Vec<&'static str>,
    /// `DATABASE_URL` and, with the worker, `VALKEY_ADDR`.
    env: Vec<(String, String)>,
    /// Whether `up` was asked for (it may have started some services even
    /// when it failed) and `stop` has not run since: what `Drop` stops.
    started: bool,
}

/// The reasons `--compose` cannot run, checked before anything starts:
/// the compose file is missing, or no container engine answers. Returns
/// the `docker` to run.
pub(crate) fn check(root: &Path) -> Result<PathBuf> {
    if !root.join(COMPOSE_FILE).is_file() {
        bail!(
            "--compose runs the Postgres and Valkey of the project's `{COMPOSE_FILE}`, and it has none\n\
             help: run `gpkit add deploy` to add one, or run `gpkit dev` without --compose"
        );
    }
    let Some(docker) = super::services::on_path("docker") else {
        bail!(
            "--compose needs a container engine, and there is no `docker` on PATH\n\
             help: install Docker (or Podman with its `docker` command and compose), or run \
             `gpkit dev` without --compose to use servers of the project's own"
        );
    };
    let info = run(&docker, &["info", "--format", "{{.ServerVersion}}"])?;
    if !info.status.success() {
        bail!(
            "--compose needs a running container engine, and `docker info` failed: {}\n\
             help: start Docker (or Podman), or run `gpkit dev` without --compose",
            first_line(&info.stderr)
        );
    }
    Ok(docker)
}

impl Compose {
    /// Starts `postgres` (and `valkey` when `with_worker`) of the compose
    /// file at `root` as the compose project `project`, waiting for their
    /// health checks; `fresh` removes their volumes first.
    pub(crate) fn start(
        docker: PathBuf,
        root: &Path,
        dev_dir: &Path,
        project: &str,
        with_worker: bool,
        fresh: bool,
    ) -> Result<Self> {
        let services: Vec<&'static str> = if with_worker {
            vec!["postgres", "valkey"]
        } else {
            vec!["postgres"]
        };
        let mut ports = String::from(
            "# Written by `gpkit dev --compose`: each service's port on a free\n\
             # loopback port of the host, for the processes gpkit dev runs.\nservices:\n",
        );
        for (service, port) in services.iter().zip([5432, 6379]) {
            ports += &format!("  {service}:\n    ports:\n      - \"127.0.0.1::{port}\"\n");
        }
        let ports_file = dev_dir.join(PORTS_FILE);
        std::fs::write(&ports_file, ports)
            .with_context(|| format!("failed to write {}", ports_file.display()))?;
        let args = vec![
            "compose".to_string(),
            "--project-name".to_string(),
            project.to_string(),
            "--project-directory".to_string(),
            root.display().to_string(),
            "-f".to_string(),
            root.join(COMPOSE_FILE).display().to_string(),
            "-f".to_string(),
            ports_file.display().to_string(),
        ];
        let mut compose = Self {
            docker,
            args,
            services,
            env: Vec::new(),
            started: false,
        };
        let config = compose.config()?;
        if fresh {
            compose.compose(
                &["down", "--volumes"],
                "remove the dev containers and volumes",
            )?;
        }
        let mut up = vec!["up", "--detach", "--wait"];
        up.extend(compose.services.iter().copied());
        compose.started = true;
        compose.compose(&up, "start the services")?;

        let postgres = compose.port("postgres", 5432)?;
        let (user, password, database) = database_of(&config)?;
        compose.env.push((
            "DATABASE_URL".to_string(),
            format!(
                "postgres://{}:{}@{postgres}/{}",
                encode(&user),
                encode(&password),
                encode(&database)
            ),
        ));
        if with_worker {
            let valkey = compose.port("valkey", 6379)?;
            compose.env.push(("VALKEY_ADDR".to_string(), valkey));
        }
        Ok(compose)
    }

    /// `DATABASE_URL` and, with the worker, `VALKEY_ADDR` of the services.
    pub(crate) fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// The services started, for messages.
    pub(crate) fn services(&self) -> String {
        self.services.join(" and ")
    }

    /// The resolved configuration, as JSON.
    fn config(&self) -> Result<serde_json::Value> {
        let output = self.compose(&["config", "--format", "json"], "read the compose file")?;
        serde_json::from_slice(&output.stdout).with_context(|| {
            format!(
                "`docker compose config --format json` printed no JSON: {}",
                first_line(&output.stdout)
            )
        })
    }

    /// `host:port` on which `service`'s `port` is published.
    fn port(&self, service: &str, port: u16) -> Result<String> {
        let output = self.compose(
            &["port", service, &port.to_string()],
            &format!("find the port of `{service}`"),
        )?;
        let text = String::from_utf8_lossy(&output.stdout);
        let published = text.lines().next().unwrap_or("").trim();
        match published.rsplit_once(':') {
            Some((_, port)) if port.parse::<u16>().is_ok_and(|p| p > 0) => {
                Ok(format!("127.0.0.1:{port}"))
            }
            _ => bail!(
                "`docker compose port {service} {port}` gave no published port: {published:?}\n\
                 help: check that the service `{service}` of {COMPOSE_FILE} listens on {port}"
            ),
        }
    }

    /// Runs `docker compose <args>` for the project; an error names `what`
    /// it was for, with the engine's message.
    fn compose(&self, args: &[&str], what: &str) -> Result<Output> {
        let mut all: Vec<&str> = self.args.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        let output = run(&self.docker, &all)?;
        if !output.status.success() {
            bail!(
                "`docker compose {}` failed to {what}: {}\n\
                 help: see `docker compose logs` for the service, or run `gpkit dev` without --compose",
                args.join(" "),
                first_line(&output.stderr)
            );
        }
        Ok(output)
    }

    /// Stops the services, keeping their containers and volumes.
    pub(crate) fn stop(&mut self) {
        if !self.started {
            return;
        }
        self.started = false;
        let mut stop = vec!["stop"];
        stop.extend(self.services.iter().copied());
        if let Err(err) = self.compose(&stop, "stop the services") {
            eprintln!("gpkit dev: {err:#}");
        }
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The user, password and database of the `postgres` service of a
/// resolved compose configuration (the image's defaults where unset).
fn database_of(config: &serde_json::Value) -> Result<(String, String, String)> {
    let Some(environment) = config["services"]["postgres"].get("environment") else {
        bail!(
            "the `postgres` service of {COMPOSE_FILE} has no `environment`\n\
             help: set POSTGRES_PASSWORD (and POSTGRES_USER, POSTGRES_DB) there, as `gpkit add deploy` writes it"
        );
    };
    let get = |name: &str| {
        environment
            .get(name)
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    let user = get("POSTGRES_USER").unwrap_or_else(|| "postgres".to_string());
    let Some(password) = get("POSTGRES_PASSWORD") else {
        bail!(
            "the `postgres` service of {COMPOSE_FILE} sets no POSTGRES_PASSWORD\n\
             help: set it there, as `gpkit add deploy` writes it"
        );
    };
    let database = get("POSTGRES_DB").unwrap_or_else(|| user.clone());
    Ok((user, password, database))
}

fn run(docker: &Path, args: &[&str]) -> Result<Output> {
    Command::new(docker)
        .args(args)
        .output()
        .with_context(|| format!("failed to run `{}`", docker.display()))
}

fn first_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    text.lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .unwrap_or("(no message)")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_comes_from_the_resolved_configuration() {
        let config = serde_json::json!({"services": {"postgres": {"environment": {
            "POSTGRES_USER": "app", "POSTGRES_PASSWORD": "s3:cret", "POSTGRES_DB": "shop"
        }}}});
        assert_eq!(
            database_of(&config).unwrap(),
            ("app".into(), "s3:cret".into(), "shop".into())
        );
        let defaults = serde_json::json!({"services": {"postgres": {"environment": {
            "POSTGRES_PASSWORD": "pw"
        }}}});
        assert_eq!(
            database_of(&defaults).unwrap(),
            ("postgres".into(), "pw".into(), "postgres".into())
        );
        let none = serde_json::json!({"services": {"postgres": {"environment": {}}}});
        assert!(
            database_of(&none)
                .unwrap_err()
                .to_string()
                .contains("POSTGRES_PASSWORD")
        );
    }
}
