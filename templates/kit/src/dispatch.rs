//! The project's contract for publishing events: the [`Event`] and
//! [`Dispatcher`] traits. The outbox provides the dispatcher the service
//! uses ([`crate::outbox::OutboxDispatcher`], and [`crate::dispatch()`]);
//! tests may provide their own.

pub use crate::outbox::{DispatchError, Dispatcher, Event, StoreError};
