//! The transactional outbox: events are stored in `outbox_events` in the
//! same transaction as the business change that caused them, and published
//! to the queue afterwards by the relay.
//!
//! - [`Envelope`]: the event as it travels: id, name, payload, metadata, time.
//! - `Store`: the SQL on `outbox_events` (the relay's side: `claims`).
//! - [`Event`] and [`Dispatcher`]: the contract for publishing events.
//! - [`dispatch()`]: stores an event through the kit's `Dispatcher`
//!   (`dispatcher::OutboxDispatcher`), backed by the store;
//!   [`dispatch_at()`] and [`dispatch_in()`] store one for later
//!   (`later`: `outbox_later`, and the worker's move of due events);
//!   [`dispatch_unique()`] stores one unless its key is held ([`Unique`],
//!   `unique`: `outbox_unique`).
//! - `Executor` (feature `seaorm`): what an event can be stored on: a
//!   SeaORM transaction or connection, or a sqlx connection or pool.
//! - `relay` (feature `worker`): moves committed rows to the queue.
//! - `cleanup` (feature `worker`): deletes published rows after the retention.
//! - `wake` (feature `worker`): wakes relays right after a commit, instead
//!   of at the next poll; a service builds its transactor with
//!   `kit::transactor`.

#[cfg(feature = "worker")]
mod claims;
#[cfg(feature = "worker")]
pub(crate) mod cleanup;
mod contract;
pub(crate) mod dispatcher;
mod envelope;
#[cfg(feature = "seaorm")]
mod executor;
pub(crate) mod later;
pub(crate) mod order;
#[cfg(feature = "worker")]
pub(crate) mod relay;
mod store;
mod unique;
// Public only for the older path `kit::outbox::wake::transactor`: the
// service's transactor is `kit::transactor`.
#[cfg(feature = "worker")]
#[doc(hidden)]
pub mod wake;

#[cfg(feature = "worker")]
pub(crate) use claims::{ClaimedEvent, NOT_HELD};
pub use contract::{DispatchError, Dispatcher, Event, StoreError};
pub use dispatcher::{dispatch, dispatch_at, dispatch_in, dispatch_unique};
pub use envelope::{Envelope, Metadata};
#[cfg(feature = "seaorm")]
pub use executor::Executor;
pub(crate) use store::Store;
pub use unique::Unique;

/// The schema the outbox needs: the Up statements of
/// `migrations/20200101000100_outbox.sql`, separated by blank lines. A test
/// checks that the two agree.
#[cfg(test)]
pub(crate) const MIGRATION_SQL: &str = "\
CREATE TABLE outbox_events (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id uuid NOT NULL UNIQUE,
    event_name text NOT NULL,
    payload jsonb NOT NULL,
    metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);

CREATE INDEX outbox_events_unpublished_idx ON outbox_events (id) WHERE published_at IS NULL;";
