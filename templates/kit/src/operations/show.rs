//! `outbox show <event_id>`: one event on one screen: its row (name,
//! times, payload, metadata, trace id), its task in each outbox queue and
//! each listener's task, with state, retries and last error, and the
//! listener's retry policy; for an ordered listener's run still in its
//! key's order, the runs it waits for.

use std::process::ExitCode;

use chrono::Utc;
use serde::Serialize;
use uuid::Uuid;

use super::output::{self, Format};
use crate::follow::Context;
use crate::follow::rows::EventRow;
use crate::follow::tasks::{self, EventTasks};
use crate::queue::TaskInfo;
use crate::worker::ordering::Standing;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The event id (the envelope id)
    pub(crate) id: Uuid,
}

/// The whole report (`--format json`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Shown {
    pub(crate) event: EventRow,
    pub(crate) trace_id: Option<String>,
    #[serde(flatten)]
    pub(crate) tasks: EventTasks,
    /// Its runs of ordered listeners not done yet.
    pub(crate) ordered_runs: Vec<Standing>,
}

pub async fn run(context: &Context, args: &Args, format: Format) -> anyhow::Result<ExitCode> {
    let event = context.event(args.id).await?;
    let tasks = tasks::of_event(context, &event).await?;
    let ordered_runs = context.ordered_runs(&event).await?;
    let shown = Shown {
        trace_id: event.trace_id().map(str::to_string),
        event,
        tasks,
        ordered_runs,
    };
    match format {
        Format::Json => output::print_json(&shown)?,
        Format::Text => print_text(&shown),
    }
    Ok(ExitCode::SUCCESS)
}

fn print_text(shown: &Shown) {
    let event = &shown.event;
    let age = (Utc::now() - event.created_at).to_std().unwrap_or_default();
    println!("event      {} {}", event.id, event.name);
    println!(
        "created    {} ({} ago)",
        output::time(event.created_at),
        output::age(age)
    );
    match event.published_at {
        Some(at) => println!("published  {}", output::time(at)),
        None => println!("published  not yet (waiting for the relay)"),
    }
    println!("trace id   {}", shown.trace_id.as_deref().unwrap_or("-"));
    println!("payload    {}", event.payload);
    println!(
        "metadata   {}",
        serde_json::to_string(&event.metadata).unwrap_or_default()
    );
    println!();
    for task in &shown.tasks.event_tasks {
        print_task("event task", task);
    }
    for listener in &shown.tasks.listener_tasks {
        print_task(&format!("listener {}", listener.listener), &listener.task);
        println!("{:<24} policy {}", "", listener.policy);
    }
    for run in &shown.ordered_runs {
        let what = format!("ordered {}", run.listener);
        match &run.waits_for {
            Some(head) if run.after > 0 => println!(
                "{what:<24} waits for {} earlier run(s) of key {} (the first: task {head}); task {}",
                run.after, run.key, run.task_id
            ),
            _ => println!(
                "{what:<24} the first of key {} to run; task {}",
                run.key, run.task_id
            ),
        }
    }
}

fn print_task(what: &str, task: &TaskInfo) {
    println!(
        "{what:<24} {:<10} queue {} task {}",
        task.state, task.queue, task.id
    );
    if task.retried > 0 || task.last_error.is_some() {
        println!(
            "{:<24} retried {}/{}, last failed {}: {}",
            "",
            task.retried,
            task.max_retry,
            output::maybe_time(task.last_failed_at),
            task.last_error.as_deref().unwrap_or("-")
        );
    }
    if let Some(at) = task.next_process_at {
        println!("{:<24} next run {}", "", output::time(at));
    }
    if let Some(at) = task.archived_at {
        println!("{:<24} archived {}", "", output::time(at));
    }
}
