//! The service's kit: everything gpkit writes and keeps up to date, as a
//! crate of its own. The service (`src/` beside this folder) calls it.
//!
//! - [`Transactor`] runs a unit of work in one transaction, and
//!   [`dispatch()`] stores an event in the outbox within it; (feature
//!   `worker`) `transactor()` builds the service's transactor, whose
//!   commits wake the outbox relay.
//! - [`config`]: typed configuration from the environment.
//! - [`database`]: the Postgres pool and the [`database::Transactor`].
//! - [`outbox`]: events stored with the business change ([`outbox::Event`],
//!   [`outbox::Dispatcher`]), and (feature `worker`) the relay that
//!   publishes them.
//! - [`migrate`]: goose-compatible migrations, the `migrate` binary's code.
//! - [`health`]: the `/healthz` and `/readyz` probes.
//! - [`binary`]: the start of each binary (`.env`, settings, logs, runtime).
//! - [`env_file`], [`signals`], [`telemetry`], [`trace_context`]: process
//!   plumbing shared by the binaries: logs, W3C trace context, and (with
//!   `OTEL_EXPORTER_OTLP_ENDPOINT`) spans exported over OTLP.
//! - [`testing`]: a configuration for tests.
//!
//! [`prelude`] holds the names a service uses most.
//!
//! Feature `worker`: `queue` (the asynq wire format), `worker` (listeners,
//! inbox, metrics), `scheduler`, `operations` (the `outbox` command) and
//! [`console`] (its web pages, `outbox console`).
//! Feature `seaorm`: `orm`, SeaORM transactions. Feature `mimalloc` (on by
//! default): mimalloc as the allocator of every binary (see [`binary`]).

#![deny(missing_docs)]

pub mod binary;
mod commit_hooks;
pub mod config;
#[cfg(feature = "worker")]
pub mod console;
pub mod database;
#[doc(hidden)]
pub mod dispatch;
pub mod env_file;
#[cfg(feature = "worker")]
pub(crate) mod follow;
pub mod health;
pub mod http_metrics;
pub mod migrate;
#[cfg(feature = "worker")]
pub mod operations;
#[cfg(feature = "seaorm")]
pub mod orm;
mod otlp;
pub mod outbox;
pub mod prelude;
#[cfg(feature = "worker")]
pub(crate) mod queue;
#[cfg(feature = "worker")]
mod replay;
#[cfg(feature = "worker")]
pub mod scheduler;
pub mod signals;
mod spans;
pub mod telemetry;
pub mod testing;
pub mod trace_context;
#[cfg(feature = "worker")]
pub mod worker;

pub use database::Transactor;
#[cfg(feature = "worker")]
pub use outbox::wake::transactor;
pub use outbox::{dispatch, dispatch_at, dispatch_in, dispatch_unique};

#[cfg(test)]
mod tests;
