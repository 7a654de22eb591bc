//! The service as a library, so that binaries and tests share one code path.
//! The kit (`kit/`, imported as `kit`) is gpkit's; everything here is yours.

// The service's modules. gpkit keeps the lines between the markers up to
// date (`gpkit add`, `gpkit upgrade templates`); declare your own modules
// below.
// gpkit:begin modules
pub mod events;
pub mod listeners;
pub mod routes;
pub mod schedules;
pub mod settings;
pub mod startup;
// gpkit:end modules
