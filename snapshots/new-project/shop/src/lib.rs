//! The service as a library, so that binaries and tests share one code path.
//! The kit (`kit/`, imported as `kit`) is gpkit's; everything here is yours.

// The service's modules, and the kit's modules under the paths they had
// before the kit became a crate (`crate::config`, `crate::outbox`, ...), so
// that code written against them keeps compiling. gpkit keeps the lines
// between the markers up to date (`gpkit add`, `gpkit upgrade templates`);
// declare your own modules below.
// gpkit:begin modules
pub mod events;
pub mod listeners;
pub mod routes;
pub mod schedules;
pub mod settings;
pub mod startup;

pub use kit::{
    config, database, dispatch, env_file, migrate, outbox, signals, telemetry, trace_context,
};

pub use kit::{operations, queue, scheduler, worker};
// gpkit:end modules
