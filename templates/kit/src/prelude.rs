//! The names a service's code uses most, in one import:
//! `use kit::prelude::*;`.
//!
//! An event is a serde type with its wire name:
//!
//! ```
//! use kit::prelude::*;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, Serialize, Deserialize)]
//! pub struct OrderPlaced {
//!     pub order_id: uuid::Uuid,
//! }
//!
//! impl Event for OrderPlaced {
//!     const NAME: &'static str = "orderPlaced";
//! }
//! # assert_eq!(OrderPlaced::NAME, "orderPlaced");
//! ```
//!
//! A handler stores it with the business change that caused it, in one
//! transaction, with [`dispatch`]:
//!
//! ```no_run
//! use kit::prelude::*;
//! # #[derive(serde::Serialize)]
//! # pub struct OrderPlaced { pub order_id: uuid::Uuid }
//! # impl Event for OrderPlaced { const NAME: &'static str = "orderPlaced"; }
//!
//! async fn place_order(transactor: &Transactor, order_id: uuid::Uuid) -> anyhow::Result<()> {
//!     transactor
//!         .run(async |tx| {
//!             sqlx::query("INSERT INTO orders (id) VALUES ($1)")
//!                 .bind(order_id)
//!                 .execute(&mut *tx)
//!                 .await?;
//!             dispatch(&mut *tx, &OrderPlaced { order_id }).await?;
//!             Ok(())
//!         })
//!         .await
//! }
//! ```
#![cfg_attr(
    feature = "worker",
    doc = r#"
A listener runs in the worker, in a task of its own, and may see an event
more than once; its database work in `ctx.once` commits once per event,
and events it dispatches there commit with it:

```no_run
use kit::prelude::*;
# #[derive(Debug, serde::Serialize, serde::Deserialize)]
# pub struct OrderPlaced { pub order_id: uuid::Uuid }
# impl Event for OrderPlaced { const NAME: &'static str = "orderPlaced"; }
# #[derive(serde::Serialize)]
# pub struct InvoiceDue { pub order_id: uuid::Uuid }
# impl Event for InvoiceDue { const NAME: &'static str = "invoiceDue"; }

pub async fn handle(event: OrderPlaced, ctx: ListenerContext) -> Result<(), ListenerError> {
    ctx.once(async |tx| {
        sqlx::query("INSERT INTO invoices (order_id) VALUES ($1)")
            .bind(event.order_id)
            .execute(&mut *tx)
            .await?;
        dispatch(&mut *tx, &InvoiceDue { order_id: event.order_id }).await?;
        Ok(())
    })
    .await?;
    tracing::info!(event_id = %ctx.event_id(), "invoiced");
    Ok(())
}

let mut listeners = Listeners::new();
listeners.listen("invoice", handle);
```

A schedule dispatches an event, or runs a job, on every tick, once per tick
however many worker replicas run:

```
use kit::prelude::*;
use kit::scheduler::{JobContext, ScheduledJob};

pub struct NightlyReport;

impl ScheduledJob for NightlyReport {
    const NAME: &'static str = "nightly_report";
    const CRON: &'static str = "0 2 * * *";
    const TIME_ZONE: &'static str = "Europe/Paris";
    const CATCH_UP: u32 = 0;

    async fn run(&self, ctx: JobContext) -> anyhow::Result<()> {
        tracing::info!(tick = %ctx.tick.at, "nightly report");
        Ok(())
    }
}

let mut schedules = Schedules::new();
schedules.job(NightlyReport);
```
"#
)]

pub use crate::database::Transactor;
pub use crate::outbox::{DispatchError, Event, Unique};
pub use crate::outbox::{dispatch, dispatch_at, dispatch_in, dispatch_unique};
#[cfg(feature = "worker")]
pub use crate::scheduler::Schedules;
#[cfg(all(feature = "worker", feature = "seaorm"))]
pub use crate::worker::listeners::OrmListenerContext;
#[cfg(feature = "worker")]
pub use crate::worker::listeners::{
    Backoff, ListenerContext, ListenerError, ListenerOptions, Listeners, OnFailure, Rate,
    SkipRetry, Snooze,
};
