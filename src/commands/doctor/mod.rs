//! `gpkit doctor`: checks that a project can run on this machine: the Rust
//! toolchain, `.env`, Postgres and the migrations, Valkey, and whether a
//! template upgrade is available. Each problem comes with its fix; a failed
//! check makes the exit code 1. It reads and connects, and writes nothing.

pub(super) mod environment;
mod pg_tls;
mod postgres;
mod report;
mod tls;
mod toolchain;
mod valkey;

use std::process::ExitCode;

use anyhow::Result;

use super::{Context, display};
use crate::cli::{DoctorArgs, ReportFormat};
use crate::engine::blueprint::TEMPLATE_SET_VERSION;
use crate::engine::manifest::Manifest;
use report::{Finding, Report};

/// The variables the checks read, from the environment or `.env`.
const SETTINGS: &[&str] = &[
    "DATABASE_URL",
    "GOOSE_MIGRATION_DIR",
    "GOOSE_TABLE",
    "VALKEY_URL",
    "VALKEY_ADDR",
    "VALKEY_USERNAME",
    "VALKEY_PASSWORD",
    "VALKEY_DB",
    "VALKEY_SENTINEL_ADDRS",
    "VALKEY_SENTINEL_USERNAME",
    "VALKEY_SENTINEL_PASSWORD",
    "VALKEY_CLUSTER_ADDRS",
    "VALKEY_TLS",
    "VALKEY_CA_CERT",
    "PGSSLMODE",
    "PGSSLROOTCERT",
    "PGSSLCERT",
    "PGSSLKEY",
];

pub(crate) fn run(ctx: &Context, args: DoctorArgs) -> Result<ExitCode> {
    let manifest = Manifest::load(&ctx.dir)?;
    let root = ctx.dir.as_path();
    let mut findings = vec![templates(&manifest), toolchain::check(root)];
    let (mut settings, env_finding) = environment::load(root, SETTINGS);
    findings.push(env_finding);
    #[cfg(unix)]
    if let Some(dev) = dev_run(root, &mut settings) {
        findings.push(dev);
    }
    let (connected, client) = postgres::connect(root, &settings);
    findings.push(connected);
    findings.push(match client {
        Some(mut client) => postgres::check_migrations(root, &mut client, &settings),
        None => Finding::skip("migrations", "needs a connection to Postgres"),
    });
    findings.push(valkey::check(root, &settings));
    let report = Report {
        project: match display(root).as_str() {
            "." => manifest.answers.name.clone(),
            shown => shown.to_string(),
        },
        findings,
    };
    super::print_out(&match args.format {
        ReportFormat::Text => report.to_text(),
        ReportFormat::Json => report.to_json(),
    })?;
    Ok(if report.failed() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The `gpkit dev` running in the project, if any: its servers are the
/// ones the project's processes use, so the checks after it use them too.
#[cfg(unix)]
fn dev_run(root: &std::path::Path, settings: &mut environment::Settings) -> Option<Finding> {
    const DEV: &str = "dev";
    let running = match super::dev::state::running(root) {
        Ok(Some(running)) => running,
        Ok(None) => return None,
        Err(err) => {
            return Some(Finding::warn(
                DEV,
                format!("{err:#}"),
                "run gpkit doctor again",
            ));
        }
    };
    let mut servers = Vec::new();
    for (name, value) in &running.env {
        if SETTINGS.contains(&name.as_str()) {
            settings.use_dev_run(name, value);
            servers.push(name.as_str());
        }
    }
    Some(Finding::ok(
        DEV,
        format!(
            "`gpkit dev` runs in this project (process {}); the checks below use its {}",
            running.pid,
            servers.join(" and ")
        ),
    ))
}

/// Whether this gpkit has newer templates than the project was made with.
fn templates(manifest: &Manifest) -> Finding {
    let project = manifest.gpkit.template_set;
    match project.cmp(&TEMPLATE_SET_VERSION) {
        std::cmp::Ordering::Equal => Finding::ok(
            "templates",
            format!("template set {project}, the newest this gpkit has"),
        ),
        std::cmp::Ordering::Less => Finding::warn(
            "templates",
            format!(
                "template set {project}; this gpkit has set {TEMPLATE_SET_VERSION}, an upgrade is \
                 available"
            ),
            "gpkit upgrade templates --dry-run --diff, then gpkit upgrade templates",
        ),
        std::cmp::Ordering::Greater => Finding::fail(
            "templates",
            format!(
                "template set {project} comes from gpkit {}, newer than this gpkit (set \
                 {TEMPLATE_SET_VERSION})",
                manifest.gpkit.version
            ),
            format!("install gpkit {} or later", manifest.gpkit.version),
        ),
    }
}
