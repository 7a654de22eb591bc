//! The worker's look after the chains, every [`REQUEUE_AFTER`]: what is
//! left in the chains' older layouts is moved; the events that waited long are
//! looked at (`super::stale`); the service's record on its queues is kept
//! (`super::owner`); chains of listeners no worker orders are reported and
//! released (`super::orphans`); and each head that has been one for
//! [`REQUEUE_AFTER`] or more is looked at in the queue:
//!
//! - the queue no longer has its task (Valkey lost it): queued again;
//! - its task completed without the chain moving on (a process that is not
//!   a kit worker ran it, or the move was lost): the chain moves on;
//! - its task archived without a failure record (archived by such a
//!   process): its failure is recorded, and the key holds as for any
//!   failure (or moves on, for a listener told to);
//! - anything else: it is on its way, looked at again later.
//!
//! It also clears the hold of failure records whose task is no longer its
//! chain's head (moved past, released, or its chain lost), so that the
//! outbox's cleanup no longer keeps its key's events.

use std::time::Duration;

use prost::Message as _;
use tokio_util::sync::CancellationToken;

use super::keys::Namespace;
use super::ordered::Ordered;
use super::scripts::REQUEUE_HEAD;
use super::{End, Ordering, REQUEUE_AFTER, STALE_AFTER, StoredRun, millis, now_millis, parse};
use crate::queue::message::TaskMessage;
use crate::queue::{HandlerError, QueueError};
use crate::worker::failures;

/// The most heads looked at a queue a round, oldest first (each counts
/// as a head from then on, so that the next round looks at others).
pub(crate) const REQUEUE_BATCH: isize = 1_000;

impl Ordering {
    /// Looks at the heads that have been heads longer than `older_than`
    /// (module docs), of `ordered`'s listeners only; how many it looked at.
    pub(crate) async fn look_at_old_heads(
        &self,
        older_than: Duration,
        ordered: &Ordered,
    ) -> Result<usize, HandlerError> {
        self.look_at_old_heads_by(older_than, ordered, REQUEUE_BATCH)
            .await
    }

    /// [`Ordering::look_at_old_heads`], `batch` heads a queue at most.
    pub(crate) async fn look_at_old_heads_by(
        &self,
        older_than: Duration,
        ordered: &Ordered,
        batch: isize,
    ) -> Result<usize, HandlerError> {
        let mut looked = 0;
        for queue in self.queues.iter() {
            looked += self
                .look_at_old_heads_of(queue, older_than, ordered, batch)
                .await?;
        }
        Ok(looked)
    }

    async fn look_at_old_heads_of(
        &self,
        queue: &str,
        older_than: Duration,
        ordered: &Ordered,
        batch: isize,
    ) -> Result<usize, HandlerError> {
        let keys = Namespace::of_queue(queue);
        let mut conn = self.queue.connection();
        let now = now_millis();
        let ids: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(keys.heads())
            .arg("-inf")
            .arg(now - millis(older_than))
            .arg("LIMIT")
            .arg(0)
            .arg(batch)
            .query_async(&mut conn)
            .await
            .map_err(QueueError::from)?;
        if ids.is_empty() {
            return Ok(0);
        }
        let mut read = redis::pipe();
        read.cmd("HMGET").arg(keys.runs()).arg(&ids);
        for id in &ids {
            read.cmd("HMGET").arg(keys.task(id)).arg("state").arg("msg");
        }
        let mut replies: Vec<redis::Value> = read
            .query_async(&mut conn)
            .await
            .map_err(QueueError::from)?;
        let tasks: Vec<(Option<String>, Option<Vec<u8>>)> = replies
            .split_off(1)
            .into_iter()
            .map(parse)
            .collect::<Result<_, _>>()?;
        let runs: Vec<Option<Vec<u8>>> = parse(replies.pop().unwrap_or(redis::Value::Nil))?;
        // Loaded first: a pipeline's scripts are not loaded on NOSCRIPT.
        let mut requeue = redis::pipe();
        requeue.load_script(&REQUEUE_HEAD).ignore();
        let mut requeued = 0;
        // Heads looked at and left as they are count as heads from now on,
        // so that the next round looks at others.
        let mut rescored: Vec<&String> = Vec::new();
        let mut archived = Vec::new();
        for ((id, run), (state, message)) in ids.iter().zip(runs).zip(tasks) {
            let Some(run) = run.as_deref().and_then(StoredRun::decode) else {
                rescored.push(id);
                continue;
            };
            // Another version's listener: its chains are `super::orphans`'.
            if !ordered.names.contains(&run.listener) {
                rescored.push(id);
                continue;
            }
            match state.as_deref() {
                Some("completed") => {
                    tracing::warn!(task = %id, listener = run.listener, key = run.key, "the first run of an ordered key completed without moving its key on (a process that is not a kit worker of this set ran it?): moving on");
                    self.move_on(queue, &run.listener, &run.key, id, None, End::Done, None)
                        .await?;
                }
                Some("archived") => {
                    rescored.push(id);
                    let message = message
                        .as_deref()
                        .and_then(|message| TaskMessage::decode(message).ok());
                    if let Some(message) = message {
                        archived.push((id, run, message));
                    }
                }
                _ => {
                    let mut script = REQUEUE_HEAD.prepare_invoke();
                    self.delivery(&keys, &mut script);
                    script
                        .key(keys.heads())
                        .key(keys.chain(&run.listener, &run.key))
                        .key(keys.runs())
                        .key(keys.task(id))
                        .arg(id)
                        .arg(now);
                    requeue.invoke_script(&script);
                    requeued += 1;
                }
            }
        }
        if requeued > 0 {
            let delivered: Vec<i64> = requeue
                .query_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
            self.delivered(delivered.iter().sum());
        }
        if !archived.is_empty() {
            let ids: Vec<&String> = archived.iter().map(|(id, _, _)| *id).collect();
            let recorded: Vec<String> =
                sqlx::query_scalar("SELECT task_id FROM listener_failures WHERE task_id = ANY($1)")
                    .bind(&ids)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(anyhow::Error::from)?;
            for (id, run, message) in &archived {
                if !recorded.contains(id) {
                    self.record_foreign_archive(queue, run, id, message, ordered)
                        .await?;
                }
            }
        }
        if !rescored.is_empty() {
            let mut rescore = redis::cmd("ZADD");
            rescore.arg(keys.heads()).arg("XX");
            for id in &rescored {
                rescore.arg(now).arg(*id);
            }
            let () = rescore
                .query_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
        }
        Ok(ids.len())
    }

    /// A head `id` archived in `queue` that no worker of the kit recorded
    /// (a process that is not one archived it): its failure recorded, and
    /// moved past for a listener that moves on.
    async fn record_foreign_archive(
        &self,
        queue: &str,
        run: &StoredRun,
        id: &str,
        message: &TaskMessage,
        ordered: &Ordered,
    ) -> Result<(), HandlerError> {
        let moves_on = ordered.moving_on.contains(&run.listener);
        let error = format!(
            "{} (archived by a process that is not a kit worker of this set)",
            message.error_msg
        );
        failures::record(&self.pool, None, message, &error, !moves_on)
            .await
            .map_err(|err| anyhow::anyhow!(err))?;
        if moves_on {
            self.move_on(queue, &run.listener, &run.key, id, None, End::Past, None)
                .await?;
        }
        Ok(())
    }

    /// Clears the hold of the failure records whose task is no longer its
    /// chain's head, in any queue (one no worker consumes any more has no
    /// chains: its records hold nothing); how many it cleared.
    pub(crate) async fn clear_stale_holds(&self) -> anyhow::Result<u64> {
        let holding: Vec<(String, String)> =
            sqlx::query_as("SELECT queue, task_id FROM listener_failures WHERE holds_key")
                .fetch_all(&self.pool)
                .await?;
        let mut by_queue: std::collections::BTreeMap<&str, Vec<&String>> = Default::default();
        for (queue, task_id) in &holding {
            by_queue.entry(queue).or_default().push(task_id);
        }
        let mut cleared = 0;
        for (queue, holding) in by_queue {
            let scores: Vec<Option<f64>> = redis::cmd("ZMSCORE")
                .arg(Namespace::of_queue(queue).heads())
                .arg(&holding)
                .query_async(&mut self.queue.connection())
                .await
                .map_err(QueueError::from)?;
            let released: Vec<&String> = holding
                .iter()
                .zip(scores)
                .filter(|(_, score)| score.is_none())
                .map(|(id, _)| *id)
                .collect();
            if !released.is_empty() {
                cleared += failures::release(&self.pool, &released).await?;
            }
        }
        Ok(cleared)
    }
}

/// Every [`REQUEUE_AFTER`] until `stop`: the look after the chains (module
/// docs) of `ordering`'s queues, for the listeners `ordered`, as the
/// service `service` ([`super::owner`]).
pub(crate) async fn look_after_chains(
    ordering: Ordering,
    ordered: Ordered,
    service: String,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(REQUEUE_AFTER) => {}
        }
        let steps = async {
            if !ordered.names.is_empty() {
                if let Err(err) = ordering.own_queues(&service).await {
                    tracing::error!(error = %err, "another service's workers consume this worker's queues");
                }
                match super::foreign::foreign_consumers(&ordering.queue, &ordering.queues).await {
                    Ok(foreign) if !foreign.is_empty() => tracing::error!(
                        servers = foreign.len(),
                        "processes that keep no order of ordered listeners consume this worker's queues \
                         (a Go asynq server, or a worker of an earlier template set): they run keyed \
                         events' listeners out of their key's order; stop them"
                    ),
                    Ok(_) => {}
                    Err(err) => {
                        tracing::debug!(error = %err, "could not read the servers on this worker's queues")
                    }
                }
            }
            if let Err(err) = ordering.move_from_database_namespace().await {
                tracing::warn!(error = %err, "could not move the chains of ordered listeners of template set 22");
            }
            if let Err(err) = ordering.move_from_postgres().await {
                tracing::warn!(error = %err, "could not move the chains of ordered listeners from Postgres to Valkey");
            }
            if let Err(err) = ordering.heal_stale_waits(STALE_AFTER).await {
                tracing::warn!(error = %err, "could not look at the events of ordered keys that waited long");
            }
            match ordering.look_at_old_heads(REQUEUE_AFTER, &ordered).await {
                Ok(0) => {}
                Ok(heads) => tracing::debug!(heads, "looked at the old heads of ordered keys"),
                Err(err) => {
                    tracing::warn!(error = %err, "could not look at the old heads of ordered keys")
                }
            }
            if let Err(err) = ordering.clear_stale_holds().await {
                tracing::warn!(error = %err, "could not clear the holds of failures no longer first of their key");
            }
            if let Err(err) = ordering
                .release_orphans(&ordered, super::orphans::GRACE)
                .await
            {
                tracing::warn!(error = %err, "could not look at the chains of listeners no worker orders");
            }
        };
        tokio::select! {
            () = stop.cancelled() => break,
            () = steps => {}
        }
    }
}
