//! The service's events: one module per event, each a serde type that
//! implements `Event`, with its wire name. `gpkit add event` adds them
//! between the markers; dispatch them with `kit::dispatch`.

// gpkit:begin modules
pub mod order_placed;
// gpkit:end modules

/// The wire names of all events.
pub const ALL: &[&str] = &[
    // gpkit:begin registry
    order_placed::NAME,
    // gpkit:end registry
];
