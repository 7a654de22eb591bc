//! The project's contract for publishing events: the [`Event`] and
//! [`Dispatcher`] traits. A service stores an event with
//! [`crate::dispatch()`], through the outbox's own dispatcher; tests may
//! provide their own.

pub use crate::outbox::{DispatchError, Dispatcher, Event, StoreError};
