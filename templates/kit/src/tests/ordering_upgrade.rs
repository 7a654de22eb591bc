//! Ordered keys in flight when a worker of template set 23 starts where one
//! of set 22 ran (its chains under `ordered:{<database>}:`, written here
//! as set 22's scripts wrote them), and the heads a process that is not a
//! kit worker completed; helpers the protocol workload shares.

#![cfg(feature = "worker")]

use std::collections::BTreeMap;
use std::time::Duration;

use prost::Message as _;
use sqlx::PgPool;

use super::ordering::{Placed, Running, SEEN, chains, ordered_ledger, publish_shuffled, seen};
use super::ordering_protocol::Case;
use super::support::{TestDatabase, TestQueue, eventually};
use crate::outbox::dispatch;
use crate::outbox::order::Place;
use crate::queue::NewTask;
use crate::worker::ordering::{ChainRun, EventRuns, Held, ORDERED_HEADER, Ordering};
use crate::worker::task_names::{listener_task_id, listener_task_type};

/// Set 22's namespace of `db`'s database.
fn old_prefix(db: &TestDatabase) -> String {
    let database = db.options.get_database().unwrap().to_string();
    format!("ordered:{{{database}}}:")
}

/// An event of the outbox: its envelope, from its row.
async fn envelope_of(pool: &PgPool, event_id: uuid::Uuid) -> crate::outbox::Envelope {
    let (name, payload, metadata, created_at): (
        String,
        serde_json::Value,
        serde_json::Value,
        chrono::DateTime<chrono::Utc>,
    ) = sqlx::query_as(
        "SELECT event_name, payload, metadata, created_at FROM outbox_events WHERE event_id = $1",
    )
    .bind(event_id)
    .fetch_one(pool)
    .await
    .unwrap();
    crate::outbox::Envelope {
        id: event_id,
        name,
        payload,
        metadata: serde_json::from_value(metadata).unwrap(),
        occurred_at: created_at,
    }
}

/// The task of `listener`'s run of `envelope`, a run of its key's chain.
fn run_task(queue: &TestQueue, envelope: &crate::outbox::Envelope, listener: &str) -> NewTask {
    let key = envelope.metadata["order_key"].clone();
    NewTask::new(
        listener_task_type(&envelope.name, listener),
        listener_task_id(envelope.id, listener).to_string(),
        serde_json::to_vec(envelope).unwrap(),
    )
    .queue(&queue.name)
    .headers([(ORDERED_HEADER.to_string(), key)].into())
    .max_retry(25)
    .timeout(Duration::from_secs(1800))
    .retention(Duration::from_secs(60))
}

/// What set 22 left of a key: `runs` (its events, in order) in `listener`'s
/// chain, the first its head, queued; the key's number `fanned`; and the
/// events `waiting` (each with its seq), waiting for earlier ones.
async fn write_set_22(
    db: &TestDatabase,
    queue: &TestQueue,
    listener: &str,
    runs: &[crate::outbox::Envelope],
    fanned: Option<(&Place, i64)>,
    waiting: &[(&crate::outbox::Envelope, i64)],
) {
    let old = old_prefix(db);
    let mut conn = queue.connection().await;
    let mut pipe = redis::pipe();
    for (at, envelope) in runs.iter().enumerate() {
        let task = run_task(queue, envelope, listener);
        let key = &envelope.metadata["order_key"];
        pipe.hset(
            format!("{old}runs"),
            &task.id,
            task.to_message().unwrap().encode_to_vec(),
        )
        .hset(format!("{old}queues"), &task.id, &queue.name)
        .rpush(
            format!("{old}chain:{}:{listener}:{key}", listener.len()),
            &task.id,
        )
        .sadd(format!("{old}listeners:{key}"), listener);
        if at == 0 {
            pipe.zadd(
                format!("{old}heads"),
                &task.id,
                chrono::Utc::now().timestamp_millis(),
            );
            for result in queue.client.enqueue(&[task]).await.unwrap() {
                result.unwrap();
            }
        }
    }
    if let Some((place, number)) = fanned {
        pipe.set(format!("{old}fan:{}:{}", place.epoch, place.key), number);
    }
    for (envelope, seq) in waiting {
        let place = Place::of(&envelope.metadata).unwrap();
        let list = format!("{old}wait:{}:{seq}:{}", place.epoch, place.key);
        let task = run_task(queue, envelope, listener);
        let chain = format!("{old}chain:{}:{listener}:{}", listener.len(), place.key);
        pipe.rpush(&list, envelope.id.to_string())
            .rpush(&list, chain)
            .rpush(&list, format!("{old}listeners:{}", place.key))
            .rpush(&list, listener)
            .rpush(&list, &task.id)
            .rpush(&list, &queue.name)
            .rpush(&list, task.to_message().unwrap().encode_to_vec())
            .zadd(
                format!("{old}waiting"),
                &list,
                chrono::Utc::now().timestamp_millis(),
            );
    }
    let () = pipe.query_async(&mut conn).await.unwrap();
}

/// Marks the outbox's rows of `ids` published (set 22's relay did).
async fn mark_published(pool: &PgPool, ids: &[uuid::Uuid]) {
    sqlx::query("UPDATE outbox_events SET published_at = now() WHERE event_id = ANY($1)")
        .bind(ids)
        .execute(pool)
        .await
        .unwrap();
}

/// The unpublished events of `pool`'s outbox, oldest first.
async fn unpublished(pool: &PgPool) -> Vec<uuid::Uuid> {
    sqlx::query_scalar(
        "SELECT event_id FROM outbox_events WHERE published_at IS NULL \
         ORDER BY (metadata ->> 'order_seq')::bigint",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Set 22's chain of `listener` for the events not published yet in the
/// protocol's case: fanned out (published, the key's number moved on), the
/// first the head (queued), the rest behind it.
pub(super) async fn leave_set_22_chains(
    db: &TestDatabase,
    pool: &PgPool,
    queue: &TestQueue,
    listener: &str,
) {
    let ids = unpublished(pool).await;
    let mut runs = Vec::new();
    for id in &ids {
        runs.push(envelope_of(pool, *id).await);
    }
    let last = Place::of(&runs.last().unwrap().metadata).unwrap();
    write_set_22(db, queue, listener, &runs, Some((&last, last.seq)), &[]).await;
    mark_published(pool, &ids).await;
}

/// With both workers stopped: two events of a key fanned out to `ledger`
/// alone, the first's run completed by a process that is not a kit worker
/// (its chain not moved on); the look at old heads moves the key on.
pub(super) async fn complete_a_head_as_go_would(case: &mut Case) {
    case.apply(super::ordering_protocol::Op::Kill { worker: 0 })
        .await;
    case.apply(super::ordering_protocol::Op::Kill { worker: 1 })
        .await;
    for _ in 0..2 {
        case.dispatch(2).await;
    }
    let ids = unpublished(&case.pool).await;
    mark_published(&case.pool, &ids).await;
    let ordering = case.ordering();
    let mut run_ids = Vec::new();
    for id in &ids {
        let envelope = envelope_of(&case.pool, *id).await;
        let run = fan_out_to(&ordering, case, &envelope, "ledger").await;
        run_ids.push(run);
    }
    // As a Go asynq server completes a task it ran.
    let mut conn = case.queue.connection().await;
    let () = redis::pipe()
        .lrem(
            crate::queue::keys::pending(&case.queue.name),
            0,
            &run_ids[0],
        )
        .hset(
            crate::queue::keys::task(&case.queue.name, &run_ids[0]),
            "state",
            "completed",
        )
        .zadd(
            crate::queue::keys::completed(&case.queue.name),
            &run_ids[0],
            chrono::Utc::now().timestamp() + 60,
        )
        .query_async(&mut conn)
        .await
        .unwrap();
    let ordered = listeners_ordered();
    ordering
        .look_at_old_heads(Duration::ZERO, &ordered)
        .await
        .unwrap();
    assert_eq!(
        case.queue.pending_ids().await,
        vec![run_ids[1].clone()],
        "the run behind the completed one is queued"
    );
    // Looked at again: on its way, left as it is.
    ordering
        .look_at_old_heads(Duration::ZERO, &ordered)
        .await
        .unwrap();
    assert_eq!(case.queue.pending_ids().await, vec![run_ids[1].clone()]);
}

/// The listeners the protocol's case orders.
fn listeners_ordered() -> crate::worker::ordering::Ordered {
    let mut ordered = crate::worker::ordering::Ordered::default();
    ordered.names.insert("ledger".into());
    ordered.names.insert("audit".into());
    ordered.moving_on.insert("audit".into());
    ordered
}

/// Fans `envelope` out to `listener` alone; its run's task id.
async fn fan_out_to(
    ordering: &Ordering,
    case: &Case,
    envelope: &crate::outbox::Envelope,
    listener: &str,
) -> String {
    let run = listener_task_id(envelope.id, listener).to_string();
    let event = EventRuns {
        event_id: envelope.id,
        queue: case.queue.name.clone(),
        payload: serde_json::to_vec(envelope).unwrap(),
        headers: BTreeMap::new(),
        runs: vec![ChainRun {
            listener: listener.to_string(),
            task_type: listener_task_type(&envelope.name, listener),
            task_id: run.clone(),
        }],
    };
    ordering
        .fan_out(&Place::of(&envelope.metadata).unwrap(), &event, false)
        .await
        .unwrap();
    run
}

/// A chain of a listener no worker orders (`gone`), released: its run is
/// in the queue, its chain gone.
pub(super) async fn release_a_gone_listeners_chain(case: &mut Case) {
    case.dispatch(0).await;
    let ids = unpublished(&case.pool).await;
    mark_published(&case.pool, &ids).await;
    let ordering = case.ordering();
    let envelope = envelope_of(&case.pool, ids[0]).await;
    let run = fan_out_to(&ordering, case, &envelope, "gone").await;
    let released = ordering
        .release_orphans(&listeners_ordered(), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(released, 1);
    assert!(case.queue.pending_ids().await.contains(&run));
    assert!(
        ordering
            .orphans(&listeners_ordered())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn chains_of_set_22_in_flight_move_beside_their_queue_and_run_in_order() {
    // Arrange: key 1's steps 1 to 5. A worker of set 22 ran step 1, fanned
    // out steps 2 and 3 (step 2 the head, queued; step 3 behind it), and
    // step 5, which waits for step 4; step 4 is not published yet. Then it
    // stopped.
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let queue = TestQueue::new().await;
    let mut steps = Vec::new();
    for n in 1..=5 {
        steps.push(dispatch(&db.pool, &Placed { key: 1, n }).await.unwrap());
    }
    sqlx::query("INSERT INTO seen (key, n) VALUES (1, 1)")
        .execute(&db.pool)
        .await
        .unwrap();
    let place = |n: usize| Place::of(&steps[n - 1].metadata).unwrap();
    write_set_22(
        &db,
        &queue,
        "ledger",
        &[steps[1].clone(), steps[2].clone()],
        Some((&place(3), 3)),
        &[(&steps[4], 5)],
    )
    .await;
    let published: Vec<uuid::Uuid> = [0, 1, 2, 4].iter().map(|&i| steps[i].id).collect();
    mark_published(&db.pool, &published).await;
    let chains = chains(&db.pool, &queue);

    // Act: the worker of set 23 moves them before it consumes; step 4 is
    // published.
    let moved = chains.move_from_database_namespace().await.unwrap();
    let running = Running::start(&queue, &db.pool, ordered_ledger());
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(22)).await;
    eventually(Duration::from_secs(20), "steps 2 to 5", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(5)
    })
    .await;
    running.stop().await;

    // Assert: in order, nothing lost, nothing left under the old names.
    assert_eq!(moved, 4, "a key's number, two runs, a waiting event");
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![1, 2, 3, 4, 5]));
    let mut conn = queue.connection().await;
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", old_prefix(&db)))
        .query_async(&mut conn)
        .await
        .unwrap();
    let old = old_prefix(&db);
    let mut left: Vec<&str> = left.iter().map(|name| &name[old.len()..]).collect();
    left.sort_unstable();
    // The number stays for the workers of other queues, until it expires.
    assert_eq!(
        left,
        vec![
            format!("fan:{}:order:1", place(3).epoch).as_str(),
            format!("moved:{}", queue.name).as_str()
        ]
    );
    assert_eq!(chains.move_from_database_namespace().await.unwrap(), 0);
    assert_eq!(chains.held().await.unwrap(), Held::default());
}
