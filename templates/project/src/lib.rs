//! The service as a library, so that binaries and tests share one code path.

pub mod config;
pub mod database;
pub mod dispatch;
pub mod migrate;
pub mod outbox;
pub mod routes;
pub mod startup;
pub mod telemetry;
