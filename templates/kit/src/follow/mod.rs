//! Following an event across both of its stores: its row in
//! `outbox_events` and its tasks in the queue (the relay's `event:` task,
//! and each listener's task after the fan-out). What the `outbox` command
//! ([`crate::operations`]) and the console ([`crate::console`]) read, and
//! the one [`Context`] they read it through.
//!
//! - `rows`: the SQL on `outbox_events`;
//! - `tasks`: from an event to its tasks in the queue;
//! - `time`: times given as `2h` (that long ago) or RFC 3339.

pub(crate) mod rows;
pub(crate) mod tasks;
pub(crate) mod time;

use std::sync::OnceLock;

use anyhow::Context as _;
use sqlx::PgPool;
use uuid::Uuid;

use self::rows::EventRow;
use crate::config::Config;
use crate::database;
use crate::queue::Client;
use crate::worker::listeners::Listeners;
use crate::worker::ordering::{Ordering, Standing};

/// What the `outbox` command's subcommands and the console work with.
pub(crate) struct Context {
    pub(crate) pool: PgPool,
    /// Connected at first use: `list` and `purge` work while Valkey is down.
    queue: OnceLock<Client>,
    pub(crate) config: Config,
    /// This service's listeners, to find an event's listener tasks.
    pub(crate) listeners: Listeners,
}

impl Context {
    /// Connects to Postgres and Valkey when first needed.
    pub(crate) fn new(config: Config, listeners: Listeners) -> Self {
        Self {
            pool: database::connect_lazy(&config.database),
            queue: OnceLock::new(),
            config,
            listeners,
        }
    }

    /// The queue, connected (and PINGed) the first time it is needed.
    pub(crate) async fn queue(&self) -> anyhow::Result<&Client> {
        if let Some(client) = self.queue.get() {
            return Ok(client);
        }
        let client = Client::from_config(&self.config.valkey)
            .await
            .context("this command needs Valkey")?;
        Ok(self.queue.get_or_init(|| client))
    }

    /// The chains of ordered listeners beside the queues this service's
    /// workers consume (`WORKER_QUEUES`; in Valkey, connected at first use).
    pub(crate) async fn ordering(&self) -> anyhow::Result<Ordering> {
        Ok(
            Ordering::of_service(self.pool.clone(), self.queue().await?.clone(), &self.config)
                // Runs it makes again from Postgres have their listeners' policies.
                .with_policies(self.listeners.task_policies()),
        )
    }

    /// The runs of `event` still waiting in their keys' order (`outbox
    /// show`, the console's event page).
    pub(crate) async fn ordered_runs(&self, event: &EventRow) -> anyhow::Result<Vec<Standing>> {
        let ordering = self.ordering().await?;
        Ok(ordering.standing_of(event.id, &event.metadata).await?)
    }

    /// The queues events go to (`OUTBOX_QUEUES`): where their event tasks
    /// and, after the fan-out, their listener tasks are.
    pub(crate) fn outbox_queues(&self) -> &[String] {
        self.config.outbox.queues.names()
    }

    /// Every queue of the service: `OUTBOX_QUEUES`, then the other queues
    /// of `WORKER_QUEUES`.
    pub(crate) fn all_queues(&self) -> Vec<String> {
        let mut queues = self.outbox_queues().to_vec();
        for queue in self.config.worker.queues.names() {
            if !queues.iter().any(|q| q == queue) {
                queues.push(queue.to_string());
            }
        }
        queues
    }

    /// The event `id`, or an error that says it is not in the table: one
    /// dispatched for later that is not due yet says so, and when it is
    /// due.
    pub(crate) async fn event(&self, id: Uuid) -> anyhow::Result<EventRow> {
        if let Some(event) = rows::by_ids(&self.pool, &[id]).await?.pop() {
            return Ok(event);
        }
        let waiting: Option<(String, chrono::DateTime<chrono::Utc>)> =
            sqlx::query_as("SELECT event_name, due_at FROM outbox_later WHERE event_id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        Err(match waiting {
            Some((name, due_at)) => anyhow::anyhow!(
                "event {id} ({name}) waits until {due_at}: dispatched for later, it enters \
                 outbox_events when it is due (`outbox cancel {id}` cancels it)"
            ),
            None => unknown(&[id]),
        })
    }
}

/// The error for ids that are not in `outbox_events`.
pub(crate) fn unknown(ids: &[Uuid]) -> anyhow::Error {
    let ids: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    anyhow::anyhow!(
        "no event {} in outbox_events (never stored, or purged after it was published)",
        ids.join(", ")
    )
}
