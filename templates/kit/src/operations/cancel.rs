//! `outbox cancel <event id> [--listener L]`, the console's Cancel and the
//! kit call [`cancel_event`]: an event's listener tasks, found by their ids
//! (`listener_task_id(event id, listener)`) in every queue of the service,
//! are cancelled.
//!
//! - A task waiting in pending, `:scheduled` or `:retry` is deleted (Go
//!   asynq's delete) and recorded in `listener_cancellations`.
//! - A running one is asked to stop: its id is published on `asynq:cancel`.
//!   A kit worker stops it, records it as cancelled and deletes its task
//!   (not retried); a Go asynq server retries it as a failure.
//! - A listener of an event not fanned out yet (not published, or its
//!   `event:` task waits) is recorded with state `before`: the fan-out
//!   leaves it out (`crate::worker::fan_out`), and it is looked for once
//!   more, for a fan-out that made it meanwhile.
//! - An archived or completed task is left as it is, and so is a task the
//!   queue does not have once the fan-out ran (gone): reported, not an
//!   error.
//! - A run of an ordered listener: its key moves on, as `outbox skip`
//!   moves it (the key's next run goes to the queue); one that waits behind
//!   its key's earlier runs is taken out of its key's order (recorded as
//!   `waiting`). An archived head that holds its key is left: `outbox skip`
//!   moves past it.
//!
//! An event dispatched for later (`kit::dispatch_at`) that is not due yet
//! has no task: its row in `outbox_later` is deleted, so none of its
//! listeners ever runs (reported as `later` for each). It is cancelled
//! whole: `--listener` on it is refused.
//!
//! A replay's tasks (`outbox replay`) have new ids and are not found here.

use std::process::ExitCode;

use serde::Serialize;
use uuid::Uuid;

use super::output::{self, Format};
use crate::config::Config;
use crate::follow::Context;
use crate::queue::{Client, DeleteOutcome};
use crate::worker::cancellations::{self, Cancelled};
use crate::worker::limits::{self, Limiter};
use crate::worker::listeners::Listeners;
use crate::worker::ordering::{End, Ordering};
use crate::worker::task_names::listener_task_id;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The event id (the envelope id)
    pub(crate) id: Uuid,
    /// Cancel this listener's task only
    #[arg(long)]
    pub(crate) listener: Option<String>,
    /// Do not ask for confirmation
    #[arg(long, short)]
    pub(crate) yes: bool,
}

/// What a cancel of an event's listener tasks did ([`cancel_event`];
/// `outbox cancel --format json` prints it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Cancellation {
    /// The event.
    pub event_id: Uuid,
    /// Its name.
    pub event_name: String,
    /// Tasks deleted before they ran again, with the state each was in
    /// (`pending`, `scheduled`, `retry`; `waiting` for an ordered run taken
    /// out of its key's order), recorded as cancelled; `later` for each
    /// listener of an event not due yet, whose row was deleted (nothing is
    /// recorded: no task existed); `before` for a listener of an event not
    /// fanned out yet, recorded so that the fan-out leaves it out.
    pub deleted: Vec<ListenerTask>,
    /// Running tasks asked to stop through `asynq:cancel` (state
    /// `active`).
    pub asked_to_stop: Vec<ListenerTask>,
    /// How many workers received each ask (the subscribers of
    /// `asynq:cancel`; 0 means no worker listens, and nothing stops).
    pub workers_listening: i64,
    /// Tasks left as they are: `archived` or `completed`.
    pub left: Vec<ListenerTask>,
    /// Listeners whose task no queue has (`state`: `missing`).
    pub not_found: Vec<ListenerTask>,
}

/// One listener task of the event, and the state it was found in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ListenerTask {
    /// The listener's name.
    pub listener: String,
    /// The queue.
    pub queue: String,
    /// The task id.
    pub task_id: String,
    /// The state it was in.
    pub state: String,
}

/// Cancels the listener tasks of the event `event_id` (of `listener`
/// alone, when given) in every queue of the service configured by
/// `config`, whose listeners are `listeners`: deletes those that wait,
/// asks those that run to stop, and says what it did with each (module
/// docs). An unknown event id, or a `listener` the event does not have, is
/// an error, and nothing is changed.
///
/// ```no_run
/// # async fn cancel(listeners: kit::worker::listeners::Listeners, id: uuid::Uuid) -> anyhow::Result<()> {
/// let config = kit::config::Config::from_env()?;
/// let done = kit::operations::cancel_event(config, listeners, id, Some("sendReceipt")).await?;
/// println!("{} deleted, {} asked to stop", done.deleted.len(), done.asked_to_stop.len());
/// # Ok(())
/// # }
/// ```
pub async fn cancel_event(
    config: Config,
    listeners: Listeners,
    event_id: Uuid,
    listener: Option<&str>,
) -> anyhow::Result<Cancellation> {
    let context = Context::new(config, listeners);
    let result = cancel(&context, event_id, listener).await;
    context.pool.close().await;
    result
}

/// The listeners of `event_name` to cancel: `listener` alone, or all;
/// an error for a listener the event does not have.
pub(crate) fn chosen(
    context: &Context,
    event_name: &str,
    listener: Option<&str>,
) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = context
        .listeners
        .of(event_name)
        .iter()
        .map(|l| l.name().to_string())
        .collect();
    match listener {
        None => Ok(names),
        Some(name) if names.iter().any(|n| n == name) => Ok(vec![name.to_string()]),
        Some(name) => anyhow::bail!(
            "`{name}` is not a listener of `{event_name}` in this service (its listeners: {}); \
             nothing was cancelled",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        ),
    }
}

/// The name and due time of `event_id` if it waits in `outbox_later` (it
/// has no task yet).
async fn waiting(
    context: &Context,
    event_id: Uuid,
) -> anyhow::Result<Option<(String, chrono::DateTime<chrono::Utc>)>> {
    Ok(
        sqlx::query_as("SELECT event_name, due_at FROM outbox_later WHERE event_id = $1")
            .bind(event_id)
            .fetch_optional(&context.pool)
            .await?,
    )
}

/// Cancels the waiting event `event_id` (`waiting`'s): deletes its row, so
/// that none of its listeners runs; refused for one listener alone.
async fn cancel_waiting(
    context: &Context,
    event_id: Uuid,
    (event_name, due_at): (String, chrono::DateTime<chrono::Utc>),
    listener: Option<&str>,
) -> anyhow::Result<Cancellation> {
    let names = chosen(context, &event_name, listener)?;
    if let Some(listener) = listener {
        return Err(one_listener_of_a_waiting_event(
            event_id,
            &event_name,
            due_at,
            listener,
        ));
    }
    let deleted = sqlx::query("DELETE FROM outbox_later WHERE event_id = $1")
        .bind(event_id)
        .execute(&context.pool)
        .await?
        .rows_affected();
    let queue = context.outbox_queues().join(",");
    let reported = |name: &String| ListenerTask {
        listener: name.clone(),
        queue: queue.clone(),
        task_id: listener_task_id(event_id, name).to_string(),
        state: "later".to_string(),
    };
    let mut done = Cancellation {
        event_id,
        event_name,
        deleted: Vec::new(),
        asked_to_stop: Vec::new(),
        workers_listening: 0,
        left: Vec::new(),
        not_found: Vec::new(),
    };
    // Moved into the outbox meanwhile (it fell due): its tasks are not
    // queued yet, or just so; reported as not found.
    if deleted == 0 {
        done.not_found = names.iter().map(reported).collect();
    } else {
        done.deleted = names.iter().map(reported).collect();
    }
    Ok(done)
}

/// Why `--listener` is refused on an event that waits for its time.
fn one_listener_of_a_waiting_event(
    event_id: Uuid,
    event_name: &str,
    due_at: chrono::DateTime<chrono::Utc>,
    listener: &str,
) -> anyhow::Error {
    anyhow::anyhow!(
        "event {event_id} ({event_name}) waits until {due_at} (dispatched for later) and is \
         cancelled whole; nothing was cancelled\n\
         help: leave out `--listener` to cancel the event, or cancel `{listener}`'s task once \
         the event is due"
    )
}

/// [`cancel_event`] through `context`.
pub(crate) async fn cancel(
    context: &Context,
    event_id: Uuid,
    listener: Option<&str>,
) -> anyhow::Result<Cancellation> {
    if let Some(waiting) = waiting(context, event_id).await? {
        return cancel_waiting(context, event_id, waiting, listener).await;
    }
    let event = context
        .event(event_id)
        .await
        .map_err(|err| err.context("nothing was cancelled"))?;
    let names = chosen(context, &event.name, listener)?;
    let client = context.queue().await?;
    let ordering = context.ordering().await?;
    let mut done = Cancellation {
        event_id,
        event_name: event.name.clone(),
        deleted: Vec::new(),
        asked_to_stop: Vec::new(),
        workers_listening: 0,
        left: Vec::new(),
        not_found: Vec::new(),
    };
    let payload = serde_json::to_vec(&event.envelope())?;
    let before_fan_out = not_fanned_out(context, client, &event).await?;
    let queues = context.all_queues();
    for name in &names {
        let task_id = listener_task_id(event_id, name).to_string();
        let slots = slots_of(context, client, &event.name, name, &payload);
        let task = |queue| Found {
            listener: name,
            queue,
            task_id: &task_id,
            event_name: &event.name,
            event_id,
            slots: slots.as_ref(),
        };
        let mut found = look(context, (client, &ordering), &queues, &task, &mut done).await?;
        if !found && let Some(queue) = &before_fan_out {
            // Its task is not made yet: a record the fan-out honours (it
            // leaves the listener out); then a look again, for a fan-out
            // that made it meanwhile.
            let tombstone = task(queue.as_str()).record(BEFORE, 0);
            cancellations::record(&context.pool, &[tombstone]).await?;
            let keep = context
                .config
                .worker
                .failure_retention(&context.config.outbox);
            cancellations::mark_before(client, context.outbox_queues(), &task_id, keep).await?;
            found = look(context, (client, &ordering), &queues, &task, &mut done).await?;
            if !found {
                done.deleted.push(task(queue.as_str()).reported(BEFORE));
                continue;
            }
        }
        if !found {
            done.not_found.push(ListenerTask {
                listener: name.clone(),
                queue: context.outbox_queues().join(","),
                task_id,
                state: crate::follow::tasks::MISSING.to_string(),
            });
        }
    }
    Ok(done)
}

/// The queue of `event`'s fan-out when it has not run yet: the relay has
/// not published the event, or its `event:` task waits (or runs) in an
/// outbox queue; `None` once it ran.
async fn not_fanned_out(
    context: &Context,
    client: &Client,
    event: &crate::follow::rows::EventRow,
) -> anyhow::Result<Option<String>> {
    let queues = context.outbox_queues();
    if event.published_at.is_none() {
        return Ok(queues.first().cloned());
    }
    for queue in queues {
        if let Some(info) = client.task_info(queue, &event.id.to_string()).await?
            && info.state != "completed"
        {
            return Ok(Some(queue.clone()));
        }
    }
    Ok(None)
}

/// The state recorded for a listener cancelled before the fan-out made
/// its task.
const BEFORE: &str = "before";

/// Looks for the task of `task` in every queue and cancels it there; true
/// when a queue had it. Each cancellation is recorded as soon as it is
/// done: an error on a later one leaves it recorded.
async fn look<'a>(
    context: &Context,
    (client, ordering): (&Client, &Ordering),
    queues: &'a [String],
    task: &impl Fn(&'a str) -> Found<'a>,
    done: &mut Cancellation,
) -> anyhow::Result<bool> {
    let mut found = false;
    for queue in queues {
        let task = task(queue);
        if let Some(record) = task.cancel(client, ordering, done).await? {
            cancellations::record(&context.pool, &[record]).await?;
        }
        found |= [&done.deleted, &done.asked_to_stop, &done.left]
            .iter()
            .any(|tasks| tasks.iter().any(|t| t.task_id == task.task_id));
    }
    Ok(found)
}

/// The concurrency limit of `listener` of `event_name` (`WORKER_LIMITS`
/// over its own, as the worker reads them) and the partition of the event
/// (`payload`, its envelope) in it; `None` without a concurrency limit.
fn slots_of(
    context: &Context,
    client: &Client,
    event_name: &str,
    listener: &str,
    payload: &[u8],
) -> Option<(Limiter, String)> {
    let definition = context
        .listeners
        .of(event_name)
        .iter()
        .find(|l| l.name() == listener)?;
    let overridden = limits::overrides_from_env().ok().and_then(|overrides| {
        overrides
            .get(&(event_name.to_string(), listener.to_string()))
            .copied()
    });
    let limits = overridden.unwrap_or_else(|| definition.limits());
    limits.concurrency?;
    let limiter = Limiter::new(client.clone(), event_name, listener, limits);
    Some((limiter, definition.partition_of(payload)))
}

/// One listener's task id in one queue.
struct Found<'a> {
    listener: &'a str,
    queue: &'a str,
    task_id: &'a str,
    event_name: &'a str,
    event_id: Uuid,
    /// Its listener's concurrency limit and the event's partition in it.
    slots: Option<&'a (Limiter, String)>,
}

impl Found<'_> {
    fn reported(&self, state: &str) -> ListenerTask {
        ListenerTask {
            listener: self.listener.to_string(),
            queue: self.queue.to_string(),
            task_id: self.task_id.to_string(),
            state: state.to_string(),
        }
    }

    /// Frees the concurrency slot the deleted task held (a waiter handed
    /// one, woken but not run yet). A failure is logged: the slot frees
    /// itself after its lease.
    async fn free_slot(&self) {
        if let Some((limiter, partition)) = self.slots
            && let Err(err) = limiter
                .free_deleted(partition, self.queue, self.task_id)
                .await
        {
            tracing::warn!(task = %self.task_id, error = %err, "could not free the concurrency slot of a cancelled task; it frees itself after its lease");
        }
    }

    fn record(&self, state: &str, retried: i32) -> Cancelled {
        Cancelled {
            task_id: self.task_id.to_string(),
            queue: self.queue.to_string(),
            event_id: Some(self.event_id),
            event_name: self.event_name.to_string(),
            listener: self.listener.to_string(),
            state: state.to_string(),
            retried,
        }
    }

    /// Cancels the task in this queue, if it is there (a run of an
    /// ordered listener: in its chain, or in the queue); what to record.
    async fn cancel(
        &self,
        client: &Client,
        ordering: &Ordering,
        done: &mut Cancellation,
    ) -> anyhow::Result<Option<Cancelled>> {
        let chain = ordering
            .run_of(self.task_id)
            .await?
            .filter(|run| run.queue == self.queue);
        let retried = client
            .task_info(self.queue, self.task_id)
            .await?
            .map_or(0, |info| info.retried);
        if let Some(run) = &chain
            && ordering
                .take_out(self.queue, &run.listener, &run.key, self.task_id)
                .await?
        {
            // It waited behind its key's earlier runs; a task of it that
            // waits for its turn in the queue goes too. One a worker has
            // (looking at its turn) is asked to stop; marked taken out, it
            // never runs or rejoins the key's order either way.
            if client.delete_waiting(self.queue, self.task_id).await? == DeleteOutcome::Active {
                let listening = client.publish_cancel(self.task_id).await?;
                done.workers_listening = done.workers_listening.max(listening);
                done.asked_to_stop.push(self.reported("waiting"));
            } else {
                self.free_slot().await;
                done.deleted.push(self.reported("waiting"));
            }
            return Ok(Some(self.record("waiting", retried)));
        }
        let outcome = client.delete_waiting(self.queue, self.task_id).await?;
        let record = match outcome {
            DeleteOutcome::Deleted(state) => {
                self.free_slot().await;
                done.deleted.push(self.reported(&state));
                Some(self.record(&state, retried))
            }
            DeleteOutcome::Active => {
                let listening = client.publish_cancel(self.task_id).await?;
                done.workers_listening = done.workers_listening.max(listening);
                done.asked_to_stop.push(self.reported("active"));
                // The worker that stops it records it and moves its key on.
                return Ok(None);
            }
            DeleteOutcome::Left(state) => {
                done.left.push(self.reported(&state));
                return Ok(None);
            }
            DeleteOutcome::Missing if chain.is_some() => {
                // A head the queue does not have: its key's order moves on.
                done.deleted.push(self.reported("waiting"));
                Some(self.record("waiting", retried))
            }
            DeleteOutcome::Missing => return Ok(None),
        };
        if let Some(run) = &chain {
            ordering
                .move_on(
                    self.queue,
                    &run.listener,
                    &run.key,
                    self.task_id,
                    None,
                    End::Past,
                    None,
                )
                .await
                .map_err(|err| anyhow::anyhow!("{err}"))?;
        }
        Ok(record)
    }
}

pub async fn run(context: &Context, args: &Args, format: Format) -> anyhow::Result<ExitCode> {
    let name = match waiting(context, args.id).await? {
        Some((name, due_at)) => {
            chosen(context, &name, args.listener.as_deref())?;
            if let Some(listener) = &args.listener {
                return Err(one_listener_of_a_waiting_event(
                    args.id, &name, due_at, listener,
                ));
            }
            format!("{name}, waiting until {due_at}")
        }
        None => {
            let event = context
                .event(args.id)
                .await
                .map_err(|err| err.context("nothing was cancelled"))?;
            chosen(context, &event.name, args.listener.as_deref())?;
            event.name
        }
    };
    let target = args
        .listener
        .as_ref()
        .map_or_else(String::new, |l| format!(" of listener `{l}` only"));
    let question = format!(
        "cancel the listener tasks{target} of event {} ({name})",
        args.id
    );
    if !output::confirm(&question, args.yes)? {
        eprintln!("nothing cancelled");
        return Ok(ExitCode::FAILURE);
    }
    let done = cancel(context, args.id, args.listener.as_deref()).await?;
    match format {
        Format::Json => output::print_json(&done)?,
        Format::Text => print_text(&done),
    }
    Ok(ExitCode::SUCCESS)
}

fn print_text(done: &Cancellation) {
    for task in &done.deleted {
        let how = match task.state.as_str() {
            "waiting" => "taken out of its key's order".to_string(),
            "later" => "will not run: the event, not due yet, was deleted".to_string(),
            state => format!("deleted from {state}"),
        };
        println!(
            "cancelled {}: task {} {how} (queue {})",
            task.listener, task.task_id, task.queue
        );
    }
    for task in &done.asked_to_stop {
        println!(
            "asked to stop {}: task {} is running (queue {}); {} worker(s) listening",
            task.listener, task.task_id, task.queue, done.workers_listening
        );
    }
    for task in &done.left {
        let why = if task.state == "archived" {
            "archived (failed for good): left as it is; `outbox skip` moves an ordered key past it"
        } else {
            "completed: left as it is"
        };
        println!(
            "left {}: task {} {why} (queue {})",
            task.listener, task.task_id, task.queue
        );
    }
    for task in &done.not_found {
        println!(
            "not found {}: task {} is in no queue (not queued yet by the relay or the fan-out, or gone)",
            task.listener, task.task_id
        );
    }
    println!(
        "event {} ({}): {} cancelled, {} asked to stop, {} left, {} not found",
        done.event_id,
        done.event_name,
        done.deleted.len(),
        done.asked_to_stop.len(),
        done.left.len(),
        done.not_found.len()
    );
}
