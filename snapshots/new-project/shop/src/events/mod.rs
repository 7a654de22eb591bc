//! The service's events: one module per event, each a serde type that
//! implements `Event`, with its wire name. `gpkit add event` adds them
//! between the markers; dispatch them with `kit::dispatch`.

// gpkit:begin modules
// gpkit:end modules

/// The wire names of all events.
pub const ALL: &[&str] = &[
    // gpkit:begin registry
    // gpkit:end registry
];
