//! The fencing token of a run of a chain: taken as the run starts
//! ([`super::Turn::Now`]), kept in its task's hash (`gpkit_turn`), and
//! checked before its work commits (`ctx.once`) and when it moves its
//! chain on. A worker that stalled past its lease (a VM pause, a clock
//! step, a process stopped) while another worker took its run over holds
//! an older token: its work rolls back and its chain stays as it is.

use crate::queue::{Client, QueueError};

use super::keys::Namespace;

/// The turn a run holds.
#[derive(Clone)]
pub(crate) struct Fence {
    client: Client,
    /// The run's task hash.
    task: String,
    token: i64,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("task", &self.task)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl Fence {
    /// The turn `token` of the run of `task_id` in `queue`.
    pub(crate) fn new(client: Client, queue: &str, task_id: &str, token: i64) -> Self {
        Self {
            client,
            task: Namespace::of_queue(queue).task(task_id),
            token,
        }
    }

    /// `Ok` while the run still holds the last turn; else [`Superseded`].
    pub(crate) async fn check(&self) -> Result<(), anyhow::Error> {
        let last: Option<i64> = redis::cmd("HGET")
            .arg(&self.task)
            .arg("gpkit_turn")
            .query_async(&mut self.client.connection())
            .await
            .map_err(QueueError::from)?;
        if last.unwrap_or(0) == self.token {
            Ok(())
        } else {
            Err(Superseded.into())
        }
    }
}

/// A run that no longer holds its turn: another worker took it over
/// after its lease ran out, or an operator moved its chain past it. Its
/// work is not committed, and its task is left to the run that holds it.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error(
    "this run of an ordered listener no longer holds its turn (another worker took it over after \
     its lease ran out, or it was moved past): its work is rolled back"
)]
pub(crate) struct Superseded;

impl Superseded {
    /// Whether `error` is, or was caused by, a [`Superseded`].
    pub(crate) fn is_in(error: &anyhow::Error) -> bool {
        error.chain().any(|cause| cause.is::<Superseded>())
    }
}
