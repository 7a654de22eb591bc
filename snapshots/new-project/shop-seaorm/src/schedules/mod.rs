//! The service's schedules: events dispatched, and jobs run, on every tick,
//! by the worker's scheduler (`kit::scheduler`), once per tick however
//! many worker replicas run.
//!
//! `gpkit add schedule <name>` adds a module here and registers it between
//! the markers below; you can also register schedules by hand, outside the
//! markers.

use kit::scheduler::Schedules;

// gpkit:begin modules
// gpkit:end modules

/// Registers every schedule of the service.
pub fn register(schedules: &mut Schedules) {
    // gpkit:begin registrations
    // gpkit:end registrations
    // Keeps the parameter in use while no schedule is registered.
    let _ = schedules;
}
