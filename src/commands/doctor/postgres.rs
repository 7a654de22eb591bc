//! The Postgres checks: `DATABASE_URL` reaches its server and database,
//! and every migration in `migrations/` is applied there (goose's version
//! table, as the project's `migrate` binary keeps it).
//! TLS as the project's sqlx makes it: see [`super::pg_tls`].

use std::collections::HashSet;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use postgres::Client;
use postgres::error::SqlState;

use super::environment::Settings;
use super::pg_tls::{TlsSettings, take_sqlx_params};
use super::report::Finding;
use crate::domain::migration;

const CONNECT: &str = "postgres";
const MIGRATIONS: &str = "migrations";
const MIGRATE_UP: &str = "cargo run --bin migrate -- up";

/// How long a server may take to answer before it counts as unreachable.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Connects as `DATABASE_URL` says (file paths in it are relative to the
/// project directory `root`); returns the finding and, when connected, the
/// client for the migration check.
pub(crate) fn connect(root: &Path, settings: &Settings) -> (Finding, Option<Client>) {
    let Some(url) = settings.get("DATABASE_URL") else {
        return (
            Finding::fail(
                CONNECT,
                "DATABASE_URL is not set, in the environment or in .env",
                "cp .env.example .env, then edit DATABASE_URL",
            ),
            None,
        );
    };
    let where_set = settings.where_set("DATABASE_URL");
    let (rest, params) = take_sqlx_params(url);
    let mut config = match postgres::Config::from_str(&rest) {
        Ok(config) => config,
        Err(err) => {
            return (
                Finding::fail(
                    CONNECT,
                    format!("DATABASE_URL is not a Postgres URL: {err}"),
                    format!(
                        "set DATABASE_URL in {where_set} to \
                         postgres://user:password@host:5432/database"
                    ),
                ),
                None,
            );
        }
    };
    let target = describe(&config);
    let tls = TlsSettings::read(&params, settings, &config);
    let (tls, connector) = match tls.and_then(|tls| Ok((tls.connector(root)?, tls))) {
        Ok((connector, tls)) => (tls, connector),
        Err((detail, fix)) => {
            return (
                Finding::fail(CONNECT, format!("{target}: {detail}"), fix),
                None,
            );
        }
    };
    config.connect_timeout(TIMEOUT);
    config.ssl_mode(tls.wire_mode());
    match config.connect(connector) {
        Ok(mut client) => {
            let how = tls.describe_connection(&mut client);
            (
                Finding::ok(CONNECT, format!("connected to {target}{how}")),
                Some(client),
            )
        }
        Err(err) => (
            refused(&err, &target, &host(&config), where_set, &tls),
            None,
        ),
    }
}

/// Compares the migration files with the versions applied in the database.
pub(crate) fn check_migrations(root: &Path, client: &mut Client, settings: &Settings) -> Finding {
    let dir = settings.get("GOOSE_MIGRATION_DIR").unwrap_or("migrations");
    let table = settings.get("GOOSE_TABLE").unwrap_or("goose_db_version");
    let files = match migration::existing_versions(&root.join(dir)) {
        Ok(files) => files,
        Err(err) => {
            return Finding::fail(MIGRATIONS, format!("{err:#}"), "rename the file as shown");
        }
    };
    if !table
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    {
        return Finding::warn(
            MIGRATIONS,
            format!("not checked: GOOSE_TABLE `{table}` is not a plain table name"),
            "run `cargo run --bin migrate -- status` to check",
        );
    }
    let exists = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .map(|row| row.get::<_, bool>(0));
    let rows = match exists {
        Ok(false) => {
            return Finding::fail(
                MIGRATIONS,
                format!(
                    "no migration applied yet: there is no `{table}` table ({} file(s) in {dir}/)",
                    files.len()
                ),
                MIGRATE_UP,
            );
        }
        Ok(true) => client.query(
            &format!("SELECT version_id, is_applied FROM {table} ORDER BY id DESC"),
            &[],
        ),
        Err(err) => Err(err),
    };
    let rows = match rows {
        Ok(rows) => rows,
        Err(err) => {
            return Finding::fail(
                MIGRATIONS,
                format!("cannot read `{table}`: {}", reason(&err)),
                "check that DATABASE_URL's user may read the table",
            );
        }
    };
    // The newest row of each version says whether it is applied.
    let mut seen = HashSet::new();
    let mut applied = HashSet::new();
    for row in rows {
        let (version, is_applied): (i64, bool) = (row.get(0), row.get(1));
        if seen.insert(version) && is_applied && version != 0 {
            applied.insert(version);
        }
    }
    let pending: Vec<&str> = files
        .iter()
        .filter(|(version, _)| !applied.contains(version))
        .map(|(_, name)| name.as_str())
        .collect();
    let file_versions: HashSet<i64> = files.iter().map(|(version, _)| *version).collect();
    let mut unknown: Vec<i64> = applied.difference(&file_versions).copied().collect();
    unknown.sort_unstable();
    if !pending.is_empty() {
        return Finding::fail(
            MIGRATIONS,
            format!(
                "{} of {} migration(s) not applied: {}",
                pending.len(),
                files.len(),
                list(&pending)
            ),
            MIGRATE_UP,
        );
    }
    if !unknown.is_empty() {
        let unknown: Vec<String> = unknown.iter().map(i64::to_string).collect();
        return Finding::warn(
            MIGRATIONS,
            format!(
                "the database has version(s) {} that no file in {dir}/ has",
                list(&unknown)
            ),
            "restore the missing files, or check that DATABASE_URL names this project's database",
        );
    }
    Finding::ok(
        MIGRATIONS,
        format!("all {} migration(s) in {dir}/ are applied", files.len()),
    )
}

/// The finding for a connection that failed, with the fix for its cause.
fn refused(
    err: &postgres::Error,
    target: &str,
    host: &str,
    where_set: &str,
    tls: &TlsSettings,
) -> Finding {
    let code = err.code();
    let (detail, fix) = if let Some((detail, fix)) = tls.refused(err, &reason(err), host, where_set)
    {
        (format!("{target}: {detail}"), fix)
    } else if code == Some(&SqlState::INVALID_CATALOG_NAME) {
        (
            format!("{target}: the database does not exist"),
            format!("{MIGRATE_UP} --create-database"),
        )
    } else if code == Some(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION)
        && reason(err).contains("client certificate")
    {
        (
            format!("{target}: {}", reason(err)),
            format!(
                "give the client certificate and its key as sslcert and sslkey in DATABASE_URL \
                 ({where_set})"
            ),
        )
    } else if code == Some(&SqlState::INVALID_PASSWORD)
        || code == Some(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION)
    {
        (
            format!("{target}: {}", reason(err)),
            format!("correct the user and password in DATABASE_URL ({where_set})"),
        )
    } else {
        (
            format!("cannot connect to {target}: {}", reason(err)),
            format!("start Postgres, or correct the host and port in DATABASE_URL ({where_set})"),
        )
    };
    Finding::fail(CONNECT, detail, fix)
}

/// The most specific message of `err`: the server's, or the I/O cause.
fn reason(err: &postgres::Error) -> String {
    if let Some(db) = err.as_db_error() {
        return db.message().to_string();
    }
    let mut reason = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        reason = cause.to_string();
        source = cause.source();
    }
    reason
}

/// `database shop on localhost:5432 as postgres`, never the password.
fn describe(config: &postgres::Config) -> String {
    let host = host(config);
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("(default user)");
    let database = config.get_dbname().unwrap_or(user);
    format!("database `{database}` on {host}:{port} as {user}")
}

/// The host `config` connects to first, for TLS messages.
fn host(config: &postgres::Config) -> String {
    match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(host)) => host.clone(),
        #[cfg(unix)]
        Some(postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_string(),
    }
}

/// Up to three items, then how many more.
fn list(items: &[impl AsRef<str>]) -> String {
    let shown: Vec<&str> = items.iter().take(3).map(AsRef::as_ref).collect();
    match items.len() {
        n if n > 3 => format!("{} and {} more", shown.join(", "), n - 3),
        _ => shown.join(", "),
    }
}
