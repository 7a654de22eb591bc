//! Applying and rolling back migrations: the commands of the goose CLI.
//!
//! [`Migrator`] follows goose's *legacy* semantics (the ones its CLI uses):
//!
//! * the current version is the most recently applied one (by row id);
//! * `up` applies every file newer than the highest version in the table; an
//!   older file that was never applied ("missing", e.g. merged late) is an error
//!   unless [`Migrator::allow_missing`] is set, in which case it is applied first;
//!   one of the kit's own migrations ([`super::KIT_VERSIONS`]) is always applied
//!   first, since an upgrade of the kit adds it where it falls;
//! * `down`, `redo` and `down-to` act on the most recently applied version;
//!   `reset` rolls back every applied file in descending version order;
//! * each migration and its version row commit in one transaction, except
//!   `-- +goose NO TRANSACTION` files, which run statement by statement in
//!   autocommit;
//! * every statement is sent as-is with the simple query protocol, so a statement
//!   may hold several SQL commands or a whole `DO $$ ... $$` body.
//!
//! Before anything is applied, all files of the run are parsed, so a malformed file
//! fails the run with nothing changed. While it works, a command holds the advisory
//! lock from [`super::lock`] on its connection (`version` does not need it).
//!
//! Progress is reported through a `Logger` in goose's words (`OK   <file> (<dur>)`,
//! `goose: successfully migrated database to version: N`, ...); the default logger
//! writes to stderr as goose does.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::NaiveDateTime;
use sqlx::{Connection, Executor as _, PgConnection};

use super::lock::{self, LockError, LockOptions};
use super::parser::{Direction, ParsedSql, go_quote};
use super::source::{self, DiscoveryError, LoadError, Migration};
use super::store::{self, VersionStore};

/// Receives each log line.
pub(crate) type Logger = Arc<dyn Fn(&str) + Send + Sync>;

/// What can go wrong while migrating.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The migration directory or a file name is wrong.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// A migration file could not be read or parsed; nothing was applied.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A statement or the version update failed; that migration was rolled back
    /// (unless it is a NO TRANSACTION migration, whose earlier statements stay).
    #[error("ERROR {file}: failed to run SQL migration: {step}: {error}")]
    Run {
        /// The migration file name.
        file: String,
        /// What was being done, in goose's words.
        step: String,
        /// The database error.
        error: sqlx::Error,
    },
    /// Unapplied migrations older than the database version, without
    /// `--allow-missing`.
    #[error("{}", missing_message(*.db_max, .missing))]
    Missing {
        /// The highest version in the version table.
        db_max: i64,
        /// The unapplied older migrations, ascending.
        missing: Vec<Migration>,
    },
    /// Nothing to apply (`up-by-one`), or the version table has no rows.
    #[error("no next version found")]
    NoNextVersion,
    /// The current version has no migration file (or is 0, for `down`).
    #[error("migration {0}: no current version found")]
    NoCurrentVersion(i64),
    /// The advisory lock could not be taken.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// Reading or writing the version table failed.
    #[error("version table: {0}")]
    Database(#[from] sqlx::Error),
}

fn missing_message(db_max: i64, missing: &[Migration]) -> String {
    let listed: Vec<String> = missing
        .iter()
        .map(|m| format!("version {}: {}", m.version, m.path.display()))
        .collect();
    format!(
        "error: found {} missing migrations before current version {db_max}:\n\t{}",
        missing.len(),
        listed.join("\n\t")
    )
}

/// One line of `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MigrationStatus {
    /// The migration version.
    pub(crate) version: i64,
    /// The file name.
    pub(crate) file_name: String,
    /// Whether the version's latest row is applied.
    pub(crate) applied: bool,
    /// When it was applied (`None` if pending, or if an old table has no time).
    pub(crate) applied_at: Option<NaiveDateTime>,
}

/// Runs migration commands from one directory against one version table.
#[derive(Clone)]
pub(crate) struct Migrator {
    dir: PathBuf,
    store: VersionStore,
    allow_missing: bool,
    /// Versions applied even when missing: the kit's own.
    kit_versions: HashSet<i64>,
    lock: LockOptions,
    log: Logger,
}

impl Migrator {
    /// A migrator for the files in `dir`, using the `goose_db_version` table.
    pub(crate) fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            store: VersionStore::new("goose_db_version"),
            allow_missing: false,
            kit_versions: super::KIT_VERSIONS.iter().copied().collect(),
            lock: LockOptions::default(),
            log: Arc::new(|line| eprintln!("{line}")),
        }
    }

    /// Uses another version table (possibly schema-qualified).
    pub(crate) fn table(mut self, table: impl Into<String>) -> Self {
        self.store = VersionStore::new(table);
        self
    }

    /// Applies missing (out-of-order) migrations instead of failing.
    pub(crate) fn allow_missing(mut self, allow: bool) -> Self {
        self.allow_missing = allow;
        self
    }

    /// Which versions are the kit's own (applied even when missing); the
    /// kit's tests name their own.
    #[cfg(test)]
    pub(crate) fn kit_versions(mut self, versions: impl IntoIterator<Item = i64>) -> Self {
        self.kit_versions = versions.into_iter().collect();
        self
    }

    /// Changes how long to wait for the advisory lock (the kit's tests wait
    /// less than a run does).
    #[cfg(test)]
    pub(crate) fn lock_options(mut self, options: LockOptions) -> Self {
        self.lock = options;
        self
    }

    /// Sends log lines somewhere other than stderr.
    pub(crate) fn logger(mut self, log: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.log = Arc::new(log);
        self
    }

    fn log(&self, line: &str) {
        (self.log)(line);
    }

    /// `up`: applies all pending migrations. Returns the resulting version.
    pub(crate) async fn up(&self, conn: &mut PgConnection) -> Result<i64, Error> {
        self.lock(conn).await?;
        let result = self.apply_up(conn, i64::MAX, false).await;
        self.unlock(conn, result).await
    }

    /// `up-to V`: applies pending migrations with a version up to `target`.
    pub(crate) async fn up_to(&self, conn: &mut PgConnection, target: i64) -> Result<i64, Error> {
        self.lock(conn).await?;
        let result = self.apply_up(conn, target, false).await;
        self.unlock(conn, result).await
    }

    /// `up-by-one`: applies the next pending migration; [`Error::NoNextVersion`]
    /// when there is none.
    pub(crate) async fn up_by_one(&self, conn: &mut PgConnection) -> Result<i64, Error> {
        self.lock(conn).await?;
        let result = self.apply_up(conn, i64::MAX, true).await;
        self.unlock(conn, result).await
    }

    /// `down`: rolls back the current (most recently applied) migration.
    pub(crate) async fn down(&self, conn: &mut PgConnection) -> Result<(), Error> {
        self.lock(conn).await?;
        let result = self.roll_back_current(conn, false).await;
        self.unlock(conn, result).await
    }

    /// `redo`: rolls back the current migration and applies it again.
    pub(crate) async fn redo(&self, conn: &mut PgConnection) -> Result<(), Error> {
        self.lock(conn).await?;
        let result = self.roll_back_current(conn, true).await;
        self.unlock(conn, result).await
    }

    /// `down-to V`: rolls back migrations, most recent first, until the current
    /// version is `target` or lower. `down-to 0` rolls back everything.
    pub(crate) async fn down_to(&self, conn: &mut PgConnection, target: i64) -> Result<(), Error> {
        self.lock(conn).await?;
        let result = self.roll_back_to(conn, target).await;
        self.unlock(conn, result).await
    }

    /// `reset`: rolls back every applied migration, highest version first.
    pub(crate) async fn reset(&self, conn: &mut PgConnection) -> Result<(), Error> {
        self.lock(conn).await?;
        let result = self.roll_back_all(conn).await;
        self.unlock(conn, result).await
    }

    /// `status`: whether each migration file is applied, logged as goose's table.
    pub(crate) async fn status(
        &self,
        conn: &mut PgConnection,
    ) -> Result<Vec<MigrationStatus>, Error> {
        self.lock(conn).await?;
        let result = self.read_status(conn).await;
        self.unlock(conn, result).await
    }

    /// `version`: the current (most recently applied) version, logged as
    /// `goose: version N`. Creates the version table if needed; takes no lock.
    pub(crate) async fn version(&self, conn: &mut PgConnection) -> Result<i64, Error> {
        let current = self.current_version(conn).await?;
        self.log(&format!("goose: version {current}"));
        Ok(current)
    }

    async fn lock(&self, conn: &mut PgConnection) -> Result<(), Error> {
        lock::acquire(conn, self.lock, || {
            self.log("goose: another migration is running; waiting for its lock")
        })
        .await?;
        Ok(())
    }

    /// Releases the lock and passes `result` through.
    async fn unlock<T>(
        &self,
        conn: &mut PgConnection,
        result: Result<T, Error>,
    ) -> Result<T, Error> {
        if let Err(error) = lock::release(conn).await {
            self.log(&format!(
                "goose: failed to release the migration lock: {error}"
            ));
        }
        result
    }

    async fn roll_back_current(&self, conn: &mut PgConnection, reapply: bool) -> Result<(), Error> {
        let migrations = source::collect(&self.dir)?;
        let current = self.current_version(conn).await?;
        let migration = find(&migrations, current)?;
        let down = migration.parse(Direction::Down)?;
        let up = if reapply {
            Some(migration.parse(Direction::Up)?)
        } else {
            None
        };
        self.run(conn, migration, &down, Direction::Down).await?;
        if let Some(up) = up {
            self.run(conn, migration, &up, Direction::Up).await?;
        }
        Ok(())
    }

    async fn roll_back_to(&self, conn: &mut PgConnection, target: i64) -> Result<(), Error> {
        let migrations = source::collect(&self.dir)?;
        self.store.ensure(conn).await?;
        let applied = store::applied_versions(&self.store.list(conn).await?);
        let mut parsed = parse_all(
            migrations
                .iter()
                .filter(|m| m.version > target && applied.contains(&m.version)),
            Direction::Down,
        )?;
        loop {
            let current = self.current_version(conn).await?;
            if current == 0 {
                self.log(&format!(
                    "goose: no migrations to run. current version: {current}"
                ));
                return Ok(());
            }
            let Ok(migration) = find(&migrations, current) else {
                self.log(&format!(
                    "goose: migration file not found for current version ({current}), error: no current version found"
                ));
                return Err(Error::NoCurrentVersion(current));
            };
            if migration.version <= target {
                self.log(&format!(
                    "goose: no migrations to run. current version: {current}"
                ));
                return Ok(());
            }
            let sql = match parsed.remove(&migration.version) {
                Some(sql) => sql,
                None => migration.parse(Direction::Down)?,
            };
            self.run(conn, migration, &sql, Direction::Down).await?;
        }
    }

    async fn roll_back_all(&self, conn: &mut PgConnection) -> Result<(), Error> {
        let migrations = source::collect(&self.dir)?;
        self.store.ensure(conn).await?;
        let applied = store::applied_versions(&self.store.list(conn).await?);
        let targets: Vec<&Migration> = migrations
            .iter()
            .rev()
            .filter(|m| applied.contains(&m.version))
            .collect();
        let mut parsed = parse_all(targets.iter().copied(), Direction::Down)?;
        for migration in targets {
            let sql = parsed
                .remove(&migration.version)
                .expect("every target was parsed");
            self.run(conn, migration, &sql, Direction::Down).await?;
        }
        Ok(())
    }

    async fn read_status(&self, conn: &mut PgConnection) -> Result<Vec<MigrationStatus>, Error> {
        let migrations = source::collect(&self.dir)?;
        self.store.ensure(conn).await?;
        let mut statuses = Vec::with_capacity(migrations.len());
        for migration in &migrations {
            let latest = self.store.latest(conn, migration.version).await?;
            let (applied, applied_at) = match latest {
                Some((at, true)) => (true, at),
                _ => (false, None),
            };
            statuses.push(MigrationStatus {
                version: migration.version,
                file_name: migration.file_name(),
                applied,
                applied_at,
            });
        }
        for line in format_status(&statuses).lines() {
            self.log(line);
        }
        Ok(statuses)
    }

    /// Creates the version table if needed and returns the current version.
    async fn current_version(&self, conn: &mut PgConnection) -> Result<i64, Error> {
        if self.store.ensure(conn).await? {
            return Ok(0);
        }
        store::current_version(&self.store.list(conn).await?).ok_or(Error::NoNextVersion)
    }

    async fn apply_up(
        &self,
        conn: &mut PgConnection,
        target: i64,
        by_one: bool,
    ) -> Result<i64, Error> {
        let migrations: Vec<Migration> = source::collect(&self.dir)?
            .into_iter()
            .filter(|m| m.version <= target)
            .collect();
        // Like goose's EnsureDBVersion: creates the table, fails on an empty one.
        self.current_version(conn).await?;
        let rows = self.store.list(conn).await?;
        let db_max = rows.iter().map(|row| row.version).max().unwrap_or(0);
        let known: HashSet<i64> = rows.iter().map(|row| row.version).collect();

        let (kit_missing, missing): (Vec<Migration>, Vec<Migration>) = migrations
            .iter()
            .filter(|m| !known.contains(&m.version) && m.version < db_max)
            .cloned()
            .partition(|m| self.kit_versions.contains(&m.version));
        if !missing.is_empty() && !self.allow_missing {
            return Err(Error::Missing { db_max, missing });
        }
        for migration in &kit_missing {
            self.log(&format!(
                "migrate: {} is the kit's, older than the database's version {db_max} \
                 (an upgrade added it): applied first",
                migration.file_name()
            ));
        }
        let mut pending = kit_missing;
        if self.allow_missing {
            pending.extend(missing);
            pending.sort_by_key(|m| m.version);
        }
        pending.extend(migrations.into_iter().filter(|m| m.version > db_max));
        if by_one {
            pending.truncate(1);
        }

        let mut parsed = parse_all(pending.iter(), Direction::Up)?;
        for migration in &pending {
            let sql = parsed
                .remove(&migration.version)
                .expect("every pending migration was parsed");
            self.run(conn, migration, &sql, Direction::Up).await?;
            if by_one {
                return Ok(migration.version);
            }
        }
        if let Some(last) = pending.last() {
            self.log(&format!(
                "goose: successfully migrated database to version: {}",
                last.version
            ));
            return Ok(last.version);
        }
        let current = self.current_version(conn).await?;
        self.log(&format!(
            "goose: no migrations to run. current version: {current}"
        ));
        if by_one {
            return Err(Error::NoNextVersion);
        }
        Ok(current)
    }

    /// Runs one direction of one migration and records it in the version table.
    async fn run(
        &self,
        conn: &mut PgConnection,
        migration: &Migration,
        sql: &ParsedSql,
        direction: Direction,
    ) -> Result<(), Error> {
        let started = Instant::now();
        if sql.use_tx {
            let mut tx = conn
                .begin()
                .await
                .map_err(run_error(migration, "failed to begin transaction".into()))?;
            let result = self.execute(&mut tx, migration, sql, direction).await;
            if let Err(error) = result {
                // Dropping the transaction would roll back too; doing it here keeps
                // the connection clean for the unlock that follows.
                let _ = tx.rollback().await;
                return Err(error);
            }
            tx.commit()
                .await
                .map_err(run_error(migration, "failed to commit transaction".into()))?;
        } else {
            self.execute(conn, migration, sql, direction).await?;
        }
        let took = go_duration(started.elapsed());
        let verb = if sql.statements.is_empty() {
            "EMPTY"
        } else {
            "OK  "
        };
        self.log(&format!("{verb} {} ({took})", migration.file_name()));
        Ok(())
    }

    /// The statements, then the version-table update, on `conn` (a transaction or
    /// an autocommit connection).
    async fn execute(
        &self,
        conn: &mut PgConnection,
        migration: &Migration,
        sql: &ParsedSql,
        direction: Direction,
    ) -> Result<(), Error> {
        for statement in &sql.statements {
            // A `&str` with no bound arguments goes out as a simple-protocol Query,
            // as goose's pgx driver sends it. (`sqlx::raw_sql` does the same but its
            // future cannot be proven `Send`, which would stop callers spawning us.)
            conn.execute(statement.as_str()).await.map_err(run_error(
                migration,
                format!(
                    "failed to execute SQL query {}",
                    go_quote(&without_comment_lines(statement))
                ),
            ))?;
        }
        match direction {
            Direction::Up => self
                .store
                .insert(conn, migration.version)
                .await
                .map_err(run_error(
                    migration,
                    "failed to insert new goose version".into(),
                )),
            Direction::Down => self
                .store
                .delete(conn, migration.version)
                .await
                .map_err(run_error(
                    migration,
                    "failed to delete goose version".into(),
                )),
        }
    }
}

/// Parses `direction` of each migration, failing on the first bad file.
fn parse_all<'a>(
    migrations: impl Iterator<Item = &'a Migration>,
    direction: Direction,
) -> Result<HashMap<i64, ParsedSql>, LoadError> {
    migrations
        .map(|m| Ok((m.version, m.parse(direction)?)))
        .collect()
}

fn find(migrations: &[Migration], version: i64) -> Result<&Migration, Error> {
    migrations
        .iter()
        .find(|m| m.version == version)
        .ok_or(Error::NoCurrentVersion(version))
}

/// goose's `clearStatement` for error messages: drops comment and blank lines.
fn without_comment_lines(statement: &str) -> String {
    statement
        .lines()
        .filter(|line| !line.starts_with("--") && !line.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// goose's status table: a header, then `<applied at or Pending> -- <file>` per
/// file, with times in Go's ANSIC layout (`Mon Jan  2 15:04:05 2006`).
pub(crate) fn format_status(statuses: &[MigrationStatus]) -> String {
    let mut out = String::from(
        "    Applied At                  Migration\n    =======================================\n",
    );
    for status in statuses {
        let applied_at = match (status.applied, status.applied_at) {
            (false, _) => "Pending".to_owned(),
            (true, Some(at)) => at.format("%a %b %e %H:%M:%S %Y").to_string(),
            (true, None) => "(no timestamp)".to_owned(),
        };
        out.push_str(&format!("    {applied_at:<24} -- {}\n", status.file_name));
    }
    out
}

/// A duration as goose logs it: rounded like its `truncateDuration`, printed like
/// Go's `time.Duration.String` (`1.23ms`, `45.6µs`, `2.5s`, `1m3.01s`).
pub(crate) fn go_duration(elapsed: Duration) -> String {
    let nanos = elapsed.as_nanos();
    let step = match nanos {
        n if n > 1_000_000_000 => 10_000_000,
        n if n > 1_000_000 => 10_000,
        n if n > 1_000 => 10,
        _ => 1,
    };
    let nanos = (nanos + step / 2) / step * step;
    match nanos {
        0 => "0s".to_owned(),
        n if n < 1_000 => format!("{n}ns"),
        n if n < 1_000_000 => format!("{}µs", decimal(n, 1_000)),
        n if n < 1_000_000_000 => format!("{}ms", decimal(n, 1_000_000)),
        n => {
            let minutes = n / 60_000_000_000;
            let seconds = decimal(n % 60_000_000_000, 1_000_000_000);
            match (minutes / 60, minutes % 60) {
                (0, 0) => format!("{seconds}s"),
                (0, m) => format!("{m}m{seconds}s"),
                (h, m) => format!("{h}h{m}m{seconds}s"),
            }
        }
    }
}

/// `value / unit` with the fraction's trailing zeros removed.
fn decimal(value: u128, unit: u128) -> String {
    let whole = value / unit;
    let fraction = value % unit;
    if fraction == 0 {
        return whole.to_string();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{fraction:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// How a database error while running `migration` is reported: with the
/// file and the step, in goose's words.
fn run_error(migration: &Migration, step: String) -> impl FnOnce(sqlx::Error) -> Error {
    let file = migration.file_name();
    move |error| Error::Run { file, step, error }
}
