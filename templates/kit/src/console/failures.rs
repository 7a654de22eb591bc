//! The failures page: the listener tasks that failed and wait for a retry
//! or were archived, grouped by listener and error with their counts (as
//! ServicePulse and Wolverine group dead letters), each with its event.
//! One task, or a whole group after a page that says how many, runs again
//! with asynq's "run": the task moves to pending with its id, message and
//! count of failed runs, as `outbox retry-archived` and asynqmon do; as
//! `outbox retry-archived`, its count of snoozes starts again at 0 and it
//! takes its listener's retries and timeout now.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::State as Console;
use super::failed_tasks::{Failed, failed};
use super::guard::{self, CSRF_FIELD};
use super::page::{self, Depth, Section};
use crate::queue::RunOutcome;
use crate::worker::failures;

/// The failed tasks by listener (task type) and error.
fn groups(failed: Vec<Failed>) -> BTreeMap<(String, String), Vec<Failed>> {
    let mut groups: BTreeMap<(String, String), Vec<Failed>> = BTreeMap::new();
    for task in failed {
        groups
            .entry((task.task_type.clone(), task.error.clone()))
            .or_default()
            .push(task);
    }
    groups
}

/// What the page was sent back with after an action.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Done {
    #[serde(default)]
    retried: Option<usize>,
    #[serde(default)]
    replayed: Option<usize>,
    #[serde(default)]
    sent: Option<usize>,
    #[serde(default)]
    past_retention: Option<usize>,
}

/// `GET failures`.
pub(crate) async fn page(
    State(console): State<Arc<Console>>,
    Query(done): Query<Done>,
) -> Response {
    let failed = match failed(&console).await {
        Ok(failed) => failed,
        Err(err) => {
            return page::unavailable(Depth::Top, Section::Failures, &err);
        }
    };
    let total = failed.len();
    let ids: Vec<String> = failed.iter().map(|task| task.id.clone()).collect();
    let recorded = super::recorded::groups(&console, &ids).await;
    let cancelled = super::cancelled::latest(&console, 100).await;
    let groups = groups(failed);
    let actions = !console.options.read_only;
    let body = html! {
        @if let Some(n) = done.retried {
            p.done role="status" { (n) " task(s) put back to pending: they run again now." }
        }
        @if let Some(n) = done.replayed {
            p.done role="status" { (n) " event(s) replayed: their tasks are queued." }
        }
        @if let Some(n) = done.sent {
            p.done role="status" {
                (n) " recorded task(s) sent back to their queue: they run again now."
                @if let Some(past) = done.past_retention.filter(|past| *past > 0) {
                    " " (past) " could not be: their events are past the outbox's retention."
                }
            }
        }
        @if groups.is_empty() {
            p { "No listener task is failing: none waits for a retry, none is archived." }
        } @else {
            p { (total) " failed listener task(s) in " (groups.len()) " group(s)." }
            @for ((task_type, error), tasks) in &groups {
                section.group data-task-type=(task_type) {
                    h2 { code { (task_type) } " · " (tasks.len()) " task(s)" }
                    p { "Error: " code.error { (error) } }
                    @if actions && tasks.len() > 1 {
                        p {
                            a.button href=(confirm_link(task_type, error)) {
                                "Retry all " (tasks.len())
                            }
                        }
                    }
                    table.failed {
                        thead { tr { th { "state" } th { "when" } th { "retries" } th { "event" } th { "task" } @if actions { th { "" } } } }
                        tbody {
                            @for task in tasks {
                                tr {
                                    td { span class={ "state state-" (task.state) } { (task.state) } }
                                    td {
                                        @if task.state == "retry" { "next run " } @else { "archived " }
                                        (page::time(task.at))
                                    }
                                    td { (task.retried) }
                                    td {
                                        @match task.event_id {
                                            Some(id) => a href={ "events/" (id) } { code { (id) } },
                                            None => "-",
                                        }
                                    }
                                    td { code { (task.id) } " in " (task.queue) }
                                    @if actions {
                                        td { (retry_one(&console, task)) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    let body = html! {
        (body)
        @match &recorded {
            Ok(recorded) => (super::recorded::section(&console, recorded)),
            Err(err) => p.error role="alert" { "Postgres: the recorded failures cannot be read: " (err) },
        }
        @match &cancelled {
            Ok(cancelled) => (super::cancelled::section(&console, cancelled)),
            Err(err) => p.error role="alert" { "Postgres: the cancelled tasks cannot be read: " (err) },
        }
        @if actions {
            h2 { "Replay events" }
            p { "Deliver published events again, as " code { "outbox replay --name --since" } " does: to every listener, or to one." }
            (super::replay::form())
        }
    };
    page::layout(Depth::Top, Section::Failures, "Failures", body).into_response()
}

/// The button that runs one task again.
fn retry_one(console: &Console, task: &Failed) -> Markup {
    html! {
        form method="post" action="failures/retry" {
            input type="hidden" name=(CSRF_FIELD) value=(console.csrf);
            input type="hidden" name="queue" value=(task.queue);
            input type="hidden" name="id" value=(task.id);
            button type="submit" { "Retry" }
        }
    }
}

/// The page that confirms a group's retry.
fn confirm_link(task_type: &str, error: &str) -> String {
    let query = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("type", task_type)
        .append_pair("error", error)
        .finish();
    format!("failures/retry?{query}")
}

/// A group, as the confirmation and its form name it.
#[derive(Debug, Deserialize)]
pub(crate) struct Group {
    #[serde(rename = "type")]
    task_type: String,
    error: String,
}

/// `GET failures/retry?type=&error=`: how many tasks a group's retry
/// would run again, and the button that does it.
pub(crate) async fn confirm(
    State(console): State<Arc<Console>>,
    Query(group): Query<Group>,
) -> Response {
    let failed = match failed(&console).await {
        Ok(failed) => failed,
        Err(err) => {
            return page::unavailable(Depth::Nested, Section::Failures, &err);
        }
    };
    let count = failed
        .iter()
        .filter(|task| task.task_type == group.task_type && task.error == group.error)
        .count();
    let body = html! {
        p {
            "Run " strong data-count=(count) { (count) } " task(s) of " code { (group.task_type) }
            " that failed with " code.error { (group.error) } " again?"
        }
        @if console.options.read_only {
            p { "This console is read-only." }
        } @else {
            form method="post" action="retry" {
                input type="hidden" name=(CSRF_FIELD) value=(console.csrf);
                input type="hidden" name="type" value=(group.task_type);
                input type="hidden" name="error" value=(group.error);
                button type="submit" { "Retry " (count) " task(s)" }
                " "
                a href="../failures" { "Cancel" }
            }
        }
    };
    page::layout(Depth::Nested, Section::Failures, "Retry a group", body).into_response()
}

/// A retry's form: one task (`queue` and `id`) or a group (`type` and
/// `error`).
#[derive(Debug, Deserialize)]
pub(crate) struct Retry {
    #[serde(default)]
    csrf: Option<String>,
    #[serde(default)]
    queue: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default, rename = "type")]
    task_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// `POST failures/retry`: runs the task or the group again, logs what it
/// matched, and goes back to the failures page.
pub(crate) async fn retry(
    State(console): State<Arc<Console>>,
    Form(form): Form<Retry>,
) -> Response {
    if !guard::csrf_ok(&console, form.csrf.as_deref()) {
        return guard::csrf_refused();
    }
    let result = match (&form.queue, &form.id, &form.task_type, &form.error) {
        (Some(queue), Some(id), _, _) => retry_task(&console, queue, id).await,
        (_, _, Some(task_type), Some(error)) => retry_group(&console, task_type, error).await,
        _ => {
            return (
                StatusCode::BAD_REQUEST,
                page::plain(
                    "Bad request",
                    "Name a task (queue and id) or a group (type and error).",
                ),
            )
                .into_response();
        }
    };
    // Posted to `failures/retry`: back to the failures page, relative to it.
    match result {
        Ok(retried) => Redirect::to(&format!("../failures?retried={retried}")).into_response(),
        Err(err) => page::unavailable(Depth::Nested, Section::Failures, &err),
    }
}

async fn retry_task(console: &Console, queue: &str, id: &str) -> anyhow::Result<usize> {
    if !console.context.all_queues().iter().any(|q| q == queue) {
        anyhow::bail!("`{queue}` is not one of the service's queues");
    }
    let client = console.context.queue().await?;
    let outcome = failures::run_again(client, &console.context.listeners, queue, id).await?;
    let retried = usize::from(outcome == RunOutcome::Queued);
    if retried > 0 {
        failures::forget(&console.context.pool, &[id.to_string()]).await?;
    }
    tracing::info!(
        action = "retry",
        queue,
        task_id = id,
        retried,
        "console: retry one task"
    );
    Ok(retried)
}

async fn retry_group(console: &Console, task_type: &str, error: &str) -> anyhow::Result<usize> {
    let client = console.context.queue().await?;
    let mut retried = 0;
    let mut matched = 0;
    for task in failed(console).await? {
        if task.task_type == task_type && task.error == error {
            matched += 1;
            let outcome =
                failures::run_again(client, &console.context.listeners, &task.queue, &task.id)
                    .await?;
            if outcome == RunOutcome::Queued {
                retried += 1;
                failures::forget(&console.context.pool, std::slice::from_ref(&task.id)).await?;
            }
        }
    }
    tracing::info!(
        action = "retry",
        task_type,
        error,
        matched,
        retried,
        "console: retry a group of failed tasks"
    );
    Ok(retried)
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    fn task(task_type: &str, error: &str) -> Failed {
        Failed {
            queue: "default".into(),
            id: uuid::Uuid::new_v4().to_string(),
            task_type: task_type.into(),
            error: error.into(),
            state: "archived",
            at: Utc::now(),
            retried: 3,
            event_id: None,
        }
    }

    #[test]
    fn failures_are_grouped_by_listener_and_error() {
        let groups = groups(vec![
            task("listener:orderPlaced:email", "smtp down"),
            task("listener:orderPlaced:email", "smtp down"),
            task("listener:orderPlaced:email", "bad address"),
            task("listener:orderPlaced:audit", "smtp down"),
        ]);
        let counts: Vec<(&str, &str, usize)> = groups
            .iter()
            .map(|((t, e), tasks)| (t.as_str(), e.as_str(), tasks.len()))
            .collect();
        assert_eq!(
            counts,
            [
                ("listener:orderPlaced:audit", "smtp down", 1),
                ("listener:orderPlaced:email", "bad address", 1),
                ("listener:orderPlaced:email", "smtp down", 2),
            ]
        );
    }

    #[test]
    fn a_groups_confirmation_link_carries_its_type_and_error() {
        assert_eq!(
            confirm_link("listener:a:b", "x & y"),
            "failures/retry?type=listener%3Aa%3Ab&error=x+%26+y"
        );
    }
}
