//! Database migrations, compatible with [goose](https://github.com/pressly/goose).
//!
//! Migrations are goose SQL files in `migrations/` (`00001_create_users.sql`, each
//! with a `-- +goose Up` and an optional `-- +goose Down` section), and the applied
//! versions are kept in goose's `goose_db_version` table, so this tool and the goose
//! CLI can take turns on the same database. The `migrate` binary
//! (`src/bin/migrate.rs`) is a thin wrapper around [`cli::main`].
//!
//! * [`parser`]: goose's SQL file format, line by line (std only);
//! * [`naming`]: versions from file names, timestamps, `create`'s snake case (std only);
//! * [`source`]: finding and reading the migration files;
//! * [`store`]: the version table;
//! * [`lock`]: the advisory lock that serialises concurrent runs;
//! * [`runner`]: `up`, `down`, `redo`, `reset`, `status`, ... ([`Migrator`]);
//! * [`files`]: `create` and `fix`;
//! * [`validate`]: checking files without a database;
//! * [`testing`]: a helper for the project's tests;
//! * [`cli`]: the command line.

pub mod cli;
pub mod files;
pub mod lock;
pub mod naming;
pub mod parser;
pub mod runner;
pub mod source;
pub mod store;
pub mod testing;
pub mod validate;

pub use lock::LockOptions;
pub use parser::{Direction, ParseError, ParsedSql};
pub use runner::{Error, MigrationStatus, Migrator};
pub use source::Migration;
