//! The service as a library, so that binaries and tests share one code path.

// The kit's modules. gpkit keeps the lines between the markers up to date
// (`gpkit add`, `gpkit upgrade templates`); declare your own modules below.
// gpkit:begin modules
pub mod config;
pub mod database;
pub mod dispatch;
pub mod env_file;
pub mod events;
pub mod listeners;
pub mod migrate;
pub mod operations;
pub mod orm;
pub mod outbox;
pub mod queue;
pub mod routes;
pub mod scheduler;
pub mod schedules;
pub mod signals;
pub mod startup;
pub mod telemetry;
pub mod trace_context;
pub mod worker;
// gpkit:end modules
