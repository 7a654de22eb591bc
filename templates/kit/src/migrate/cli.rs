//! The `migrate` command line: goose's commands, for Postgres and SQL files only.
//!
//! ```text
//! migrate [--dir migrations] [--table goose_db_version] [--allow-missing] <command>
//! ```
//!
//! The database comes from `DATABASE_URL` (or `--database-url`, or `.env`); its value
//! is never printed. `up --create-database` first creates the database when it does
//! not exist. `create`, `fix` and `validate` do not need a database. Log lines go to
//! stderr in goose's words; the exit code is 0 on success, 1 on failure and 2 on a
//! usage error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

use super::files;
use super::runner::Migrator;
use super::validate;

/// goose-compatible SQL migrations for Postgres.
#[derive(Parser)]
#[command(name = "migrate", version)]
struct Cli {
    /// Directory holding the migration files.
    #[arg(
        long,
        global = true,
        env = "GOOSE_MIGRATION_DIR",
        default_value = "migrations"
    )]
    dir: PathBuf,

    /// Version table, optionally schema-qualified.
    #[arg(
        long,
        global = true,
        env = "GOOSE_TABLE",
        default_value = "goose_db_version"
    )]
    table: String,

    /// Apply migrations older than the database version that were never applied,
    /// instead of failing.
    #[arg(long, global = true)]
    allow_missing: bool,

    /// Postgres connection URL.
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply all pending migrations.
    Up(CreateDatabase),
    /// Apply the next pending migration (fails if there is none).
    UpByOne(CreateDatabase),
    /// Apply pending migrations up to and including VERSION.
    UpTo {
        /// The last version to apply.
        version: i64,
        #[command(flatten)]
        create: CreateDatabase,
    },
    /// Roll back the most recently applied migration.
    Down,
    /// Roll back migrations until the current version is VERSION or lower.
    DownTo {
        /// The version to stop at (0 rolls back everything).
        version: i64,
    },
    /// Roll back the most recently applied migration, then apply it again.
    Redo,
    /// Roll back all applied migrations.
    Reset,
    /// Show which migrations are applied.
    Status,
    /// Print the current version.
    Version,
    /// Create a new migration file from the template.
    Create {
        /// What the migration does, e.g. "add users table".
        name: String,
        /// Migration type; only `sql` is supported.
        #[arg(default_value = "sql")]
        kind: String,
        /// Number the file sequentially (00001) instead of with a UTC timestamp.
        #[arg(short, long)]
        sequential: bool,
    },
    /// Rename timestamped migrations to sequential versions.
    Fix,
    /// Parse every migration file without touching a database.
    Validate {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
}

/// The `--create-database` flag of the `up` commands.
#[derive(Args)]
struct CreateDatabase {
    /// Create the database named in the URL first if it does not exist, from the
    /// server's `postgres` database (the role needs the CREATEDB privilege).
    #[arg(long)]
    create_database: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

/// Parses the command line, runs the command and returns the exit code;
/// an error is printed as `error: <error>` (as `kit::binary` prints one),
/// with exit code 1.
pub async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let migrator = Migrator::new(&cli.dir)
        .table(&cli.table)
        .allow_missing(cli.allow_missing);
    let database_url = cli.database_url;
    let connect = async || open(database_url.as_deref(), false).await;
    let connect_or_create =
        async |create: CreateDatabase| open(database_url.as_deref(), create.create_database).await;

    match cli.command {
        Command::Create {
            name,
            kind,
            sequential,
        } => {
            anyhow::ensure!(
                kind == "sql",
                "unsupported migration type {kind:?}: only sql migrations are supported"
            );
            let path = files::create(&cli.dir, &name, sequential)?;
            eprintln!("Created new file: {}", path.display());
        }
        Command::Fix => {
            for (old, new) in files::fix(&cli.dir)? {
                eprintln!("RENAMED {} => {}", base_name(&old), base_name(&new));
            }
        }
        Command::Validate { format } => return validate_command(&cli.dir, format),
        Command::Up(create) => {
            migrator.up(&mut connect_or_create(create).await?).await?;
        }
        Command::UpByOne(create) => {
            migrator
                .up_by_one(&mut connect_or_create(create).await?)
                .await?;
        }
        Command::UpTo { version, create } => {
            migrator
                .up_to(&mut connect_or_create(create).await?, version)
                .await?;
        }
        Command::Down => migrator.down(&mut connect().await?).await?,
        Command::DownTo { version } => migrator.down_to(&mut connect().await?, version).await?,
        Command::Redo => migrator.redo(&mut connect().await?).await?,
        Command::Reset => migrator.reset(&mut connect().await?).await?,
        Command::Status => {
            migrator.status(&mut connect().await?).await?;
        }
        Command::Version => {
            migrator.version(&mut connect().await?).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Connects to the database `database_url` names; with `create`, creates it
/// first if it does not exist.
async fn open(database_url: Option<&str>, create: bool) -> anyhow::Result<PgConnection> {
    let url =
        database_url.context("no database configured: set DATABASE_URL or pass --database-url")?;
    // Neither sqlx's errors nor these messages include the URL, so the password
    // stays private.
    let options = PgConnectOptions::from_str(url)
        .map_err(|error| anyhow::anyhow!("the database URL is not a Postgres URL: {error}"))?;
    let mut conn = match PgConnection::connect_with(&options).await {
        Ok(conn) => conn,
        Err(error) if has_code(&error, INVALID_CATALOG_NAME) => {
            let name = database_name(&options);
            if !create {
                anyhow::bail!(
                    "the database \"{name}\" does not exist; create it with \
                     `migrate up --create-database` (or `createdb {name}`)"
                );
            }
            create_database(&options, &name).await?;
            PgConnection::connect_with(&options)
                .await
                .map_err(|error| connect_failed(&options, &error))?
        }
        Err(error) => return Err(connect_failed(&options, &error)),
    };
    apply_database_defaults(&mut conn)
        .await
        .map_err(|error| anyhow::anyhow!("failed to read the database's settings: {error}"))?;
    Ok(conn)
}

/// Why connecting to the server of `options` failed, naming the host and
/// port; a certificate that does not verify gets what to check.
fn connect_failed(options: &PgConnectOptions, error: &sqlx::Error) -> anyhow::Error {
    let server = format!("{}:{}", options.get_host(), options.get_port());
    let text = error.to_string();
    if text.contains("certificate") {
        anyhow::anyhow!(
            "failed to connect to the database at {server}: the server's TLS certificate \
             does not verify: {text}; check that `sslrootcert` names the CA that signed it and \
             that the host in DATABASE_URL is a name the certificate was issued for"
        )
    } else {
        anyhow::anyhow!("failed to connect to the database at {server}: {text}")
    }
}

/// SQLSTATE `invalid_catalog_name`: the database does not exist.
const INVALID_CATALOG_NAME: &str = "3D000";
/// SQLSTATE `duplicate_database`.
const DUPLICATE_DATABASE: &str = "42P04";
/// SQLSTATE `insufficient_privilege`.
const INSUFFICIENT_PRIVILEGE: &str = "42501";

/// Whether `error` is a database error with SQLSTATE `code`.
fn has_code(error: &sqlx::Error, code: &str) -> bool {
    error
        .as_database_error()
        .and_then(|error| error.code())
        .is_some_and(|actual| actual == code)
}

/// The database `options` connect to: the one named, or as Postgres does
/// without one, the user's name.
fn database_name(options: &PgConnectOptions) -> String {
    options
        .get_database()
        .unwrap_or(options.get_username())
        .to_string()
}

/// Creates the database `name` on the server of `options`, through the
/// server's `postgres` maintenance database. Another process creating it at
/// the same time is not an error.
async fn create_database(options: &PgConnectOptions, name: &str) -> anyhow::Result<()> {
    let failed =
        |reason: String| anyhow::anyhow!("failed to create the database \"{name}\": {reason}");
    // Like `createdb`: the `postgres` database, or `template1` where there is none.
    let mut conn = match PgConnection::connect_with(&options.clone().database("postgres")).await {
        Ok(conn) => conn,
        Err(first) => PgConnection::connect_with(&options.clone().database("template1"))
            .await
            .map_err(|_| {
                failed(format!(
                    "cannot connect to the server's `postgres` database to create it ({first}); \
                     create it yourself, such as with `createdb {name}`"
                ))
            })?,
    };
    let quoted = format!("\"{}\"", name.replace('"', "\"\""));
    match sqlx::query(&format!("CREATE DATABASE {quoted}"))
        .execute(&mut conn)
        .await
    {
        Ok(_) => eprintln!("goose: created database \"{name}\""),
        // Made by someone else in the meantime.
        Err(error) if has_code(&error, DUPLICATE_DATABASE) => {}
        Err(error) => {
            let help = if has_code(&error, INSUFFICIENT_PRIVILEGE) {
                "; connect as a role with the CREATEDB privilege, or have the database created"
            } else {
                ""
            };
            return Err(failed(format!("{error}{help}")));
        }
    }
    conn.close().await.ok();
    Ok(())
}

/// Gives the session the `TimeZone` and `DateStyle` that goose's session gets.
///
/// sqlx starts every session with `TimeZone=UTC` and `DateStyle=ISO, MDY`, while
/// goose's driver (pgx) sends neither and gets the database's defaults. Both
/// settings change what a migration writes (`now()::date`, a timestamp or date
/// literal, the version table's `tstamp`), so the same file would give different
/// data depending on the tool that ran it. This applies the values set with
/// `ALTER DATABASE`/`ALTER ROLE ... SET` the way Postgres applies them to a plain
/// session: role in this database, then role, then database, then all. Server-wide
/// defaults (`postgresql.conf`) cannot be read back by an ordinary role; where only
/// those are set, the session keeps sqlx's values.
async fn apply_database_defaults(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    let settings: Vec<(String, String)> = sqlx::query_as(
        "SELECT DISTINCT ON (lower(split_part(setting, '=', 1))) \
             split_part(setting, '=', 1), substr(setting, strpos(setting, '=') + 1) \
         FROM pg_db_role_setting AS s, unnest(s.setconfig) AS setting \
         WHERE s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database())) \
           AND s.setrole IN (0, (SELECT oid FROM pg_roles WHERE rolname = session_user)) \
           AND lower(split_part(setting, '=', 1)) IN ('timezone', 'datestyle') \
         ORDER BY lower(split_part(setting, '=', 1)), s.setrole = 0, s.setdatabase = 0",
    )
    .fetch_all(&mut *conn)
    .await?;
    for (name, value) in settings {
        sqlx::query("SELECT set_config($1, $2, false)")
            .bind(name)
            .bind(value)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

fn validate_command(dir: &Path, format: Format) -> anyhow::Result<ExitCode> {
    let reports = validate::validate(dir)?;
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&reports)?),
        Format::Text => print!("{}", validate::render_text(&reports)),
    }
    Ok(if reports.iter().any(validate::FileReport::has_error) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn base_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |name| name.to_string_lossy().into_owned(),
    )
}
