//! A database of one test's own, migrated: [`TestDatabase`].
//!
//! The migrations are applied once per set of migrations, not once per
//! test: the first test to need a set builds a template database named by
//! a hash of `migrations/` (`<database>_tpl_<hash>`), under a Postgres
//! advisory lock that holds across test processes (each `tests/*.rs` is a
//! process of its own, and nextest runs each test as one). Every test then
//! gets `CREATE DATABASE ... TEMPLATE` of it, which copies files instead of
//! running SQL, and drops it when the [`TestDatabase`] is dropped. A
//! changed migration hashes differently and so makes a new template: a
//! stale schema is never reused. A template whose build died half-way is
//! not marked as a template yet (`datistemplate`), and is built again.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context as _;
use sha2::{Digest, Sha256};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection, PgPool};

use crate::config::Config;
use crate::database::Transactor;

/// How long a test waits for its Postgres server to answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The variables that name the test server, in the order they are read.
pub(super) const SERVER_VARIABLES: [&str; 2] = ["TEST_DATABASE_URL", "DATABASE_URL"];

/// A database created for one test, with every migration applied, and
/// dropped (`WITH (FORCE)`) when the value is dropped, also when the test
/// fails.
///
/// The server is the one `TEST_DATABASE_URL` names, else `DATABASE_URL`
/// (any database on it: the test's own is created beside it). With
/// `gpkit dev` running, `export $(gpkit dev --print-env)` sets it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # if !kit::testing::example_has_a_database() { return; }
/// let db = kit::testing::TestDatabase::new().await;
/// let (tables,): (i64,) = sqlx::query_as(
///     "SELECT count(*) FROM information_schema.tables WHERE table_name = 'outbox_events'",
/// )
/// .fetch_one(db.pool())
/// .await
/// .unwrap();
/// assert_eq!(tables, 1);
/// # }
/// ```
pub struct TestDatabase {
    /// `None` only while the database is dropped.
    pool: Option<PgPool>,
    url: String,
    name: String,
    admin: PgConnectOptions,
}

impl std::fmt::Debug for TestDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDatabase")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl TestDatabase {
    /// A new database with the project's migrations (`migrations/` of the
    /// package under test) applied.
    ///
    /// # Panics
    ///
    /// When no server is named or it cannot be reached, or a migration
    /// fails: the message says which, and how to fix it.
    pub async fn new() -> Self {
        Self::with_migrations(default_migrations()).await
    }

    /// A new database with the migrations in `dir` applied.
    ///
    /// # Panics
    ///
    /// As [`Self::new`].
    pub async fn with_migrations(dir: impl AsRef<Path>) -> Self {
        match Self::create(dir.as_ref()).await {
            Ok(db) => db,
            Err(err) => panic!("{err:#}"),
        }
    }

    async fn create(dir: &Path) -> anyhow::Result<Self> {
        let (variable, url) = server_url()?;
        let admin = PgConnectOptions::from_str(&url).with_context(|| {
            format!("{variable} is not a Postgres URL (postgres://user@host:5432/database)")
        })?;
        let shown = crate::config::redact_url(&url);
        let mut conn = connect(&admin).await.with_context(|| {
            format!(
                "cannot reach the test Postgres server at {shown} ({variable})\n\
                 help: start it (`gpkit dev` in the project, then `export $(gpkit dev --print-env)` \
                 here), or point TEST_DATABASE_URL at a server of yours"
            )
        })?;
        let template = template_name(&admin, &migrations_hash(dir)?);
        ensure_template(&mut conn, &admin, &template, dir).await?;

        let name = format!("test_{}", uuid::Uuid::now_v7().simple());
        conn.execute(format!(r#"CREATE DATABASE "{name}" TEMPLATE "{template}""#).as_str())
            .await
            .with_context(|| format!("failed to create the test database from `{template}`"))?;
        conn.close().await.ok();
        let options = admin.clone().database(&name);
        let pool = PgPoolOptions::new()
            .max_connections(5)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_with(options)
            .await
            .with_context(|| format!("failed to connect to the test database `{name}`"))?;
        let mut url = url::Url::parse(&url).context("the server URL")?;
        url.set_path(&name);
        Ok(Self {
            pool: Some(pool),
            url: url.to_string(),
            name,
            admin,
        })
    }

    /// A pool of up to 5 connections to the database.
    pub fn pool(&self) -> &PgPool {
        self.pool
            .as_ref()
            .expect("the pool lives as long as the database")
    }

    /// The database's URL, for a configuration: [`Self::config`] uses it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A transactor on [`Self::pool`], with no after-commit hook.
    pub fn transactor(&self) -> Transactor {
        Transactor::new(self.pool().clone())
    }

    /// [`super::config()`] on this database.
    pub fn config(&self) -> Config {
        super::config(&self.url)
    }

    /// [`super::settings()`] on this database: the service's settings type,
    /// inferred from where it goes (`Application::build(&db.settings())`).
    pub fn settings<S: From<Config>>(&self) -> S {
        S::from(self.config())
    }

    /// What the outbox holds now, in the order it was dispatched: see
    /// [`super::Dispatched`].
    ///
    /// # Panics
    ///
    /// When the outbox cannot be read.
    pub async fn dispatched(&self) -> super::Dispatched {
        super::Dispatched::read(self.pool()).await
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // The pool's connections close with its last handle; those a clone
        // still holds are ended below. (`DROP ... WITH (FORCE)` alone would
        // signal them and then sleep 100 ms before it looks again.)
        drop(self.pool.take());
        let admin = self.admin.clone();
        let name = std::mem::take(&mut self.name);
        // Drop runs inside the test's runtime, which cannot block on async
        // work; a thread with a runtime of its own can.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let mut conn = connect(&admin).await?;
                end_sessions(&mut conn, &name).await?;
                conn.execute(format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#).as_str())
                    .await?;
                conn.close().await?;
                anyhow::Ok(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("warning: failed to drop the test database");
        }
    }
}

/// Ends every session on the database `name` and waits (at most a second)
/// until they are gone.
async fn end_sessions(conn: &mut PgConnection, name: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
        )
        .bind(name)
        .fetch_one(&mut *conn)
        .await?;
        if left == 0 || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The server's URL and the variable it came from.
fn server_url() -> anyhow::Result<(&'static str, String)> {
    SERVER_VARIABLES
        .iter()
        .find_map(|name| {
            std::env::var(name)
                .ok()
                .filter(|url| !url.is_empty())
                .map(|url| (*name, url))
        })
        .ok_or_else(|| {
            anyhow::anyhow!(
                "this test needs a Postgres server, and neither TEST_DATABASE_URL nor \
                 DATABASE_URL is set\n\
                 help: with `gpkit dev` running in the project, run \
                 `export $(gpkit dev --print-env)` and the tests again; or set \
                 TEST_DATABASE_URL=postgres://postgres@localhost:5432/postgres \
                 (each test creates a database of its own on that server)"
            )
        })
}

/// A connection, given [`CONNECT_TIMEOUT`] to answer.
async fn connect(options: &PgConnectOptions) -> anyhow::Result<PgConnection> {
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(options)).await {
        Ok(conn) => Ok(conn?),
        Err(_) => anyhow::bail!("no answer within {}s", CONNECT_TIMEOUT.as_secs()),
    }
}

/// `migrations/` of the package under test (cargo runs its tests there and
/// sets `CARGO_MANIFEST_DIR`); without one, the migrations beside the kit
/// (in gpkit's repository, the project template's).
fn default_migrations() -> PathBuf {
    let package = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_default()
        .join("migrations");
    if package.is_dir() {
        return package;
    }
    let kit = Path::new(env!("CARGO_MANIFEST_DIR"));
    [kit.join("../migrations"), kit.join("../project/migrations")]
        .into_iter()
        .find(|dir| dir.is_dir())
        .unwrap_or(package)
}

/// SHA-256 of every `.sql` file's name and bytes in `dir`, in name order,
/// as 16 hex digits.
fn migrations_hash(dir: &Path) -> anyhow::Result<String> {
    let entries = std::fs::read_dir(dir).with_context(|| {
        format!(
            "failed to read the migrations in `{}`\n\
             help: run the tests from the project (cargo does), or name the folder with \
             `TestDatabase::with_migrations`",
            dir.display()
        )
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "sql"))
        .collect();
    files.sort();
    let mut hash = Sha256::new();
    for file in &files {
        let bytes =
            std::fs::read(file).with_context(|| format!("failed to read `{}`", file.display()))?;
        hash.update(file.file_name().unwrap_or_default().as_encoded_bytes());
        hash.update([0]);
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(&bytes);
    }
    Ok(hash.finalize()[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect())
}

/// `<database>_tpl_<hash>`, within Postgres's 63 bytes.
fn template_name(admin: &PgConnectOptions, hash: &str) -> String {
    let database: String = admin
        .get_database()
        .unwrap_or("postgres")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(63 - 5 - hash.len())
        .collect();
    format!("{database}_tpl_{hash}")
}

/// Builds `template` from `dir` unless it is built already, under an
/// advisory lock that other test processes wait on.
async fn ensure_template(
    conn: &mut PgConnection,
    admin: &PgConnectOptions,
    template: &str,
    dir: &Path,
) -> anyhow::Result<()> {
    if is_built(conn, template).await? == Some(true) {
        return Ok(());
    }
    let key = lock_key(template);
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(key)
        .execute(&mut *conn)
        .await?;
    let built = build_template(conn, admin, template, dir).await;
    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .execute(&mut *conn)
        .await;
    built?;
    unlocked?;
    Ok(())
}

/// `Some(true)` when `template` is built, `Some(false)` when a build of it
/// did not finish, `None` when there is none.
async fn is_built(conn: &mut PgConnection, template: &str) -> anyhow::Result<Option<bool>> {
    Ok(
        sqlx::query_scalar("SELECT datistemplate FROM pg_database WHERE datname = $1")
            .bind(template)
            .fetch_optional(conn)
            .await?,
    )
}

async fn build_template(
    conn: &mut PgConnection,
    admin: &PgConnectOptions,
    template: &str,
    dir: &Path,
) -> anyhow::Result<()> {
    match is_built(conn, template).await? {
        // Another process built it while this one waited for the lock.
        Some(true) => return Ok(()),
        Some(false) => {
            conn.execute(format!(r#"DROP DATABASE "{template}" WITH (FORCE)"#).as_str())
                .await?;
        }
        None => {}
    }
    conn.execute(format!(r#"CREATE DATABASE "{template}""#).as_str())
        .await
        .with_context(|| format!("failed to create the template database `{template}`"))?;
    let mut migrating = connect(&admin.clone().database(template)).await?;
    let migrated = crate::migrate::runner::Migrator::new(dir)
        .logger(|_| {})
        .up(&mut migrating)
        .await;
    migrating.close().await.ok();
    migrated.with_context(|| {
        format!(
            "a migration in `{}` failed on a new database\n\
             help: fix the migration; the tests build the schema again once it changes",
            dir.display()
        )
    })?;
    conn.execute(format!(r#"ALTER DATABASE "{template}" IS_TEMPLATE true"#).as_str())
        .await?;
    Ok(())
}

/// The advisory lock key of `template`: its name's first 8 bytes of
/// SHA-256.
fn lock_key(template: &str) -> i64 {
    let digest = Sha256::digest(template.as_bytes());
    i64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_migration_changes_the_hash() {
        let dir = std::env::temp_dir().join(format!("kit-hash-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("1_a.sql"), "-- +goose Up\nSELECT 1;\n").unwrap();
        std::fs::write(dir.join("notes.txt"), "not a migration").unwrap();
        let first = migrations_hash(&dir).unwrap();
        std::fs::write(dir.join("notes.txt"), "still not one").unwrap();
        assert_eq!(migrations_hash(&dir).unwrap(), first);
        std::fs::write(dir.join("1_a.sql"), "-- +goose Up\nSELECT 2;\n").unwrap();
        let second = migrations_hash(&dir).unwrap();
        assert_ne!(second, first);
        std::fs::write(dir.join("2_b.sql"), "").unwrap();
        assert_ne!(migrations_hash(&dir).unwrap(), second);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn template_names_fit_postgres() {
        let admin = PgConnectOptions::new().database(&"x".repeat(80));
        let name = template_name(&admin, "0123456789abcdef");
        assert!(name.len() <= 63, "{name}");
        assert!(name.ends_with("_tpl_0123456789abcdef"));
        let admin = PgConnectOptions::new().database("shop-dev");
        assert_eq!(template_name(&admin, "ab"), "shopdev_tpl_ab");
    }
}
