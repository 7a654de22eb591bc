//! The service's listeners: what the worker does when an event arrives.
//!
//! `gpkit add event <name> --listener <listener>` adds a module here and
//! registers it between the markers below; you can also register listeners
//! by hand, outside the markers. A listener may see an event more than once,
//! so make it idempotent on `ctx.event_id()`.

use kit::worker::listeners::Listeners;

// gpkit:begin modules
// gpkit:end modules

/// Registers every listener of the service.
pub fn register(listeners: &mut Listeners) {
    // gpkit:begin registrations
    // gpkit:end registrations
    // Keeps the parameter in use while no listener is registered.
    let _ = listeners;
}
