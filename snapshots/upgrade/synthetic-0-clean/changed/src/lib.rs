//! The service as a library, so that binaries and tests share one code path.

// The kit's modules. gpkit keeps the lines between the markers up to date
// (`gpkit add`, `gpkit upgrade templates`); declare your own modules below.
// gpkit:begin modules
pub mod events;
pub mod routes;
pub mod settings;
pub mod startup;

// The kit's modules under the paths they had before the kit became a crate
// (`crate::outbox`), for the code of yours that names them.
pub use kit::{config, database, telemetry, trace_context};
// gpkit:end modules
