//! The move of what the chains in Postgres still hold into Valkey: an older
//! layout kept the chains of ordered listeners in Postgres
//! (`outbox_keys.fanned_out`, `outbox_key_waits`, `ordered_runs`); a worker
//! moves them before it consumes, and again with its loop of old heads
//! (in case an older worker left some meanwhile).

use std::collections::BTreeMap;

use sqlx::types::Json;
use uuid::Uuid;

use prost::Message as _;

use super::{ChainRun, EventRuns, ORDERED_HEADER, Ordering, RunArgs};
use crate::outbox::order::Place;
use crate::queue::{HandlerError, NewTask};

/// An event waiting in `outbox_key_waits`: key, seq, queue, event id,
/// payload, headers, and its runs' listeners, task types and task ids.
type Wait = (
    String,
    i64,
    String,
    Uuid,
    Vec<u8>,
    Json<BTreeMap<String, String>>,
    Vec<String>,
    Vec<String>,
    Vec<String>,
);
/// A run in `ordered_runs`: listener, key, task id, task type, queue,
/// payload, headers.
type Run = (
    String,
    String,
    String,
    String,
    String,
    Vec<u8>,
    Json<BTreeMap<String, String>>,
);

impl Ordering {
    /// Moves what the chains in Postgres still hold (an older layout kept
    /// them there: `outbox_keys.fanned_out`, `outbox_key_waits`,
    /// `ordered_runs`) into Valkey, under a lock of the database's, in
    /// their order; the rows go once Valkey has them. A run already in
    /// Valkey is not added twice. Returns how many rows it moved. The
    /// worker calls it before it consumes (a head in the queue must find
    /// its chain) and with its loop of old heads.
    pub(crate) async fn move_from_postgres(&self) -> anyhow::Result<u64> {
        let mut tx = self.pool.begin().await?;
        let held: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM outbox_keys WHERE fanned_out > 0) \
             OR EXISTS (SELECT 1 FROM outbox_key_waits) OR EXISTS (SELECT 1 FROM ordered_runs)",
        )
        .fetch_one(&mut *tx)
        .await?;
        if !held {
            return Ok(0);
        }
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('gpkit ordered chains to Valkey'))")
            .execute(&mut *tx)
            .await?;
        let fanned: Vec<(String, i64)> = sqlx::query_as(
            "SELECT key, fanned_out FROM outbox_keys WHERE fanned_out > 0 FOR UPDATE",
        )
        .fetch_all(&mut *tx)
        .await?;
        let waits: Vec<Wait> = sqlx::query_as(
            "DELETE FROM outbox_key_waits RETURNING key, seq, queue, event_id, payload, headers, \
             listeners, task_types, task_ids",
        )
        .fetch_all(&mut *tx)
        .await?;
        let waiting_events = waits.len();
        let runs: Vec<Run> = sqlx::query_as(
            "WITH gone AS (DELETE FROM ordered_runs RETURNING *) \
             SELECT listener, key, task_id, task_type, queue, payload, headers FROM gone \
             ORDER BY listener, key, position",
        )
        .fetch_all(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM ordered_keys")
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE outbox_keys SET fanned_out = 0 WHERE fanned_out > 0")
            .execute(&mut *tx)
            .await?;
        // In their order: the numbers (in each queue this worker fans
        // out), then the chains, then the events that wait for earlier ones
        // (fanned out as a worker would, so that one that is next joins the
        // chains behind their runs).
        let failed = |err: HandlerError| anyhow::anyhow!("{err}");
        for queue in self.queues.iter() {
            for (key, number) in &fanned {
                self.move_past(queue, key, 0, *number)
                    .await
                    .map_err(failed)?;
            }
        }
        let mut by_queue: BTreeMap<&str, Vec<(String, RunArgs)>> = BTreeMap::new();
        for (listener, key, task_id, task_type, queue, payload, Json(headers)) in &runs {
            let mut headers = headers.clone();
            headers.insert(ORDERED_HEADER.into(), key.clone());
            let task = NewTask::new(task_type, task_id, payload.clone())
                .queue(queue)
                .headers(headers);
            let message = self.run_task(task).to_message()?.encode_to_vec();
            by_queue.entry(queue).or_default().push((
                key.clone(),
                RunArgs {
                    listener: listener.clone(),
                    task_id: task_id.clone(),
                    message,
                },
            ));
        }
        for (queue, runs) in by_queue {
            self.append(queue, &runs).await?;
        }
        for (key, seq, queue, event_id, payload, Json(headers), listeners, task_types, task_ids) in
            waits
        {
            let runs = listeners
                .into_iter()
                .zip(task_types)
                .zip(task_ids)
                .map(|((listener, task_type), task_id)| ChainRun {
                    listener,
                    task_type,
                    task_id,
                })
                .collect();
            let event = EventRuns {
                event_id,
                queue,
                payload,
                headers,
                runs,
            };
            let place = Place { key, seq, epoch: 0 };
            self.fan_out(&place, &event, false).await.map_err(failed)?;
        }
        tx.commit().await?;
        let moved = fanned.len() + waiting_events + runs.len();
        tracing::info!(
            keys = fanned.len(),
            waiting_events,
            runs = runs.len(),
            "moved the chains of ordered listeners from Postgres to Valkey"
        );
        Ok(u64::try_from(moved).unwrap_or(u64::MAX))
    }
}
