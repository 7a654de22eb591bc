//! Database migrations, compatible with [goose](https://github.com/pressly/goose).
//!
//! Migrations are goose SQL files in `migrations/` (`00001_create_users.sql`, each
//! with a `-- +goose Up` and an optional `-- +goose Down` section), and the applied
//! versions are kept in goose's `goose_db_version` table, so this tool and the goose
//! CLI can take turns on the same database. The `migrate` binary
//! (`src/bin/migrate.rs`) is a thin wrapper around [`cli::main`].
//!
//! What a service names is [`cli`] (the binary's code), [`testing::up`] (a
//! test database brought up to date) and the [`Error`] it returns. Inside the
//! kit: `parser` (goose's SQL file format, std only), `naming` (versions
//! from file names, timestamps, `create`'s snake case), `source` (finding
//! and reading the files), `store` (the version table), `lock` (the advisory
//! lock that serialises concurrent runs), `runner` (`up`, `down`, `redo`,
//! `reset`, `status`, ...), `files` (`create` and `fix`) and `validate`
//! (checking files without a database).

pub mod cli;
pub(crate) mod files;
pub(crate) mod lock;
pub(crate) mod naming;
pub(crate) mod parser;
pub(crate) mod runner;
pub(crate) mod source;
pub(crate) mod store;
pub mod testing;
pub(crate) mod validate;

pub use runner::Error;

/// The versions of the kit's own migrations (the outbox's, the inbox's),
/// in every project's `migrations/`. An upgrade of the kit can add one
/// older than a migration the database already has (one of the service's,
/// written after the kit's version was fixed): `up` applies such a kit
/// migration first instead of refusing it as missing, as goose's
/// `--allow-missing` would do for every file (the goose CLI itself needs
/// that flag for it).
pub(crate) const KIT_VERSIONS: &[i64] = &[
    20200101000100,
    20261130000000,
    20261205130000,
    20261205140000,
    20261205180000,
    20261206120000,
    20261207120000,
    20261208120000,
    20261208130000,
    20261208140000,
];
