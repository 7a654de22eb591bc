//! The failed listener tasks the queue holds: those waiting for a retry
//! and those archived, in every queue of the service. The failures page
//! lists them; the recorded failures leave them out.

use chrono::{DateTime, Utc};

use super::State as Console;
use crate::outbox::Envelope;

/// One failed listener task.
#[derive(Debug, Clone)]
pub(super) struct Failed {
    pub(super) queue: String,
    pub(super) id: String,
    /// `listener:<event>:<listener>`.
    pub(super) task_type: String,
    pub(super) error: String,
    /// `retry` or `archived`.
    pub(super) state: &'static str,
    /// When it runs next (retry) or was archived.
    pub(super) at: DateTime<Utc>,
    pub(super) retried: i32,
    pub(super) event_id: Option<uuid::Uuid>,
}

/// The failed listener tasks of every queue of the service.
pub(super) async fn failed(console: &Console) -> anyhow::Result<Vec<Failed>> {
    let context = &console.context;
    let client = context
        .queue()
        .await
        .map_err(|err| anyhow::anyhow!("Valkey: {err:#}"))?;
    let mut failed = Vec::new();
    for queue in context.all_queues() {
        let valkey = |err| anyhow::anyhow!("Valkey: {err}");
        let retry = client.retry_tasks(&queue).await.map_err(valkey)?;
        let archived = client.archived_tasks(&queue, None).await.map_err(valkey)?;
        let waiting = retry
            .into_iter()
            .map(|task| ("retry", task))
            .chain(archived.into_iter().map(|task| ("archived", task)));
        for (state, (message, at)) in waiting {
            if !message.r#type.starts_with("listener:") {
                continue;
            }
            let event_id = serde_json::from_slice::<Envelope>(&message.payload)
                .ok()
                .map(|envelope| envelope.id);
            failed.push(Failed {
                queue: queue.clone(),
                id: message.id,
                task_type: message.r#type,
                error: message.error_msg,
                state,
                at,
                retried: message.retried,
                event_id,
            });
        }
    }
    Ok(failed)
}

/// The ids of the failed listener tasks the queue holds.
pub(crate) async fn failed_ids(console: &Console) -> anyhow::Result<Vec<String>> {
    Ok(failed(console)
        .await?
        .into_iter()
        .map(|task| task.id)
        .collect())
}
