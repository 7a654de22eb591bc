//! The outbox's contract by an older path: `kit::dispatch::Event` and the
//! rest are `kit::outbox`'s (and [`crate::prelude`]'s) names, kept here so
//! that a service's code that names them this way still compiles. The
//! documented `kit::dispatch` is the function, [`crate::dispatch()`].

pub use crate::outbox::{DispatchError, Dispatcher, Event, StoreError};
