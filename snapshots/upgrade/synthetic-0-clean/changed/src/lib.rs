//! The service as a library, so that binaries and tests share one code path.

// The kit's modules. gpkit keeps the lines between the markers up to date
// (`gpkit add`, `gpkit upgrade templates`); declare your own modules below.
// gpkit:begin modules
pub mod events;
pub mod routes;
pub mod settings;
pub mod startup;

pub use kit::{
    config, database, dispatch, env_file, migrate, outbox, signals, telemetry, trace_context,
};
// gpkit:end modules
