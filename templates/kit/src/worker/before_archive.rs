//! Before the queue archives a listener task that failed for good: its
//! failure recorded (`super::failures`), and, for a run of an ordered
//! listener that moves on past a failure, its key moved on
//! (`super::ordering`). The consumer archives the task only once both are
//! done.

use std::collections::HashSet;
use std::sync::Arc;

use sqlx::PgPool;

use super::failures::{FailureHook, record};
use super::ordering::{End, ORDERED_HEADER, Ordering};
use super::task_names::listener_of;
use crate::queue::Consumer;
use crate::queue::message::TaskMessage;

/// What a run of an ordered listener that failed for good does to its
/// key: the task types of the ordered listeners, and of those among them
/// that move on past it (`OnFailure::MoveOn`), with their chains.
#[derive(Debug, Clone)]
pub(crate) struct OrderedFailures {
    /// Every ordered listener's task type.
    pub ordered: HashSet<String>,
    /// Those that move on past a run that failed for good.
    pub moving_on: HashSet<String>,
    /// Their chains.
    pub ordering: Ordering,
}

impl OrderedFailures {
    /// Whether the failure of `message` holds its key: a run of its chain,
    /// of an ordered listener that does not move on.
    fn holds_key(&self, message: &TaskMessage) -> bool {
        message.headers.contains_key(ORDERED_HEADER)
            && self.ordered.contains(&message.r#type)
            && !self.moving_on.contains(&message.r#type)
    }

    /// Moves the chain of `message` on, if it is a run of a listener that
    /// moves on (a run that is no longer its chain's head changes nothing).
    async fn past(&self, message: &TaskMessage) -> Result<(), String> {
        let (Some((_, listener)), Some(key)) = (
            listener_of(&message.r#type),
            message.headers.get(ORDERED_HEADER),
        ) else {
            return Ok(());
        };
        if !self.moving_on.contains(&message.r#type) {
            return Ok(());
        }
        self.ordering
            .move_on(
                &message.queue,
                listener,
                key,
                &message.id,
                None,
                End::Past,
                None,
            )
            .await
            .map(|_| ())
            .map_err(|err| format!("cannot move the key `{key}` on past the failed run: {err}"))
    }
}

/// Makes `consumer` archive a listener task only once its failure is
/// recorded in `pool`'s `listener_failures` (and `hook` called), and, for
/// a run of an ordered listener that moves on (`ordered`), its key moved
/// on.
pub(crate) fn record_before_archive(
    consumer: &mut Consumer,
    pool: PgPool,
    hook: Option<FailureHook>,
    ordered: Option<OrderedFailures>,
) {
    consumer.before_archive(Arc::new(move |message, error| {
        let (pool, hook, ordered) = (pool.clone(), hook.clone(), ordered.clone());
        Box::pin(async move {
            let holds_key = ordered
                .as_ref()
                .is_some_and(|ordered| ordered.holds_key(&message));
            record(&pool, hook.as_ref(), &message, &error, holds_key).await?;
            match &ordered {
                Some(ordered) => ordered.past(&message).await,
                None => Ok(()),
            }
        })
    }));
}
