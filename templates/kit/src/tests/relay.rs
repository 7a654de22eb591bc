//! The relay against real Postgres and Valkey/Redis: committed events become
//! tasks exactly once, rolled-back ones never do.

#![cfg(feature = "worker")]

use super::support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde::Serialize;
use support::{TestDatabase, TestQueue};
use tokio_util::sync::CancellationToken;

use crate::database::Transactor;
use crate::dispatch::{Dispatcher, Event};
use crate::outbox::Envelope;
use crate::outbox::cleanup;
use crate::outbox::dispatcher::OutboxDispatcher;
use crate::outbox::relay::{Relay, RelayError, Round};
use crate::outbox::wake::{self, Wake};
use crate::queue::NewTask;
use crate::worker::metrics::{Metrics, RelayMetrics};

#[derive(Debug, Serialize)]
struct OrderPlaced {
    order_id: u32,
}

impl Event for OrderPlaced {
    const NAME: &'static str = "orderPlaced";
}

fn relay(db: &TestDatabase, queue: &TestQueue) -> Relay {
    let config = crate::testing::config("postgres://unused@localhost/unused");
    Relay::new(
        db.pool.clone(),
        queue.client.clone(),
        &config.outbox,
        Metrics::new().relay,
    )
    .with_queue(queue.name.clone())
}

/// Runs rounds until one claims nothing; returns the rounds that did work.
async fn drain(relay: &Relay) -> Vec<Round> {
    let mut rounds = Vec::new();
    loop {
        let round = relay.publish_batch().await.expect("a relay round");
        if round.claimed == 0 {
            return rounds;
        }
        rounds.push(round);
    }
}

async fn dispatch_events(db: &TestDatabase, count: u32) -> Vec<Envelope> {
    let dispatcher = OutboxDispatcher::new();
    let transactor = Transactor::new(db.pool.clone());
    transactor
        .run(async |tx| {
            let mut envelopes = Vec::new();
            for order_id in 0..count {
                envelopes.push(
                    dispatcher
                        .dispatch(&mut *tx, &OrderPlaced { order_id })
                        .await?,
                );
            }
            Ok::<_, anyhow::Error>(envelopes)
        })
        .await
        .expect("dispatch the events")
}

async fn unpublished(db: &TestDatabase) -> i64 {
    let (count,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM outbox_events WHERE published_at IS NULL")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    count
}

#[tokio::test]
async fn a_thousand_committed_events_become_a_thousand_tasks() {
    // Arrange
    let db = TestDatabase::migrated().await;
    let queue = TestQueue::new().await;
    // Ten transactions, committed one after the other, of 100 events each.
    let mut envelopes = Vec::new();
    for _ in 0..10 {
        envelopes.extend(dispatch_events(&db, 100).await);
    }

    // Act
    let rounds = drain(&relay(&db, &queue)).await;

    // Assert: full batches of 100, each id queued once, in commit order
    // across the transactions and within each.
    assert_eq!(rounds.len(), 10);
    assert!(
        rounds
            .iter()
            .all(|r| r.claimed == 100 && r.published == 100 && r.duplicates == 0)
    );
    let expected: Vec<String> = envelopes.iter().map(|e| e.id.to_string()).collect();
    let queued = queue.pending_ids().await;
    assert_eq!(queued.len(), expected.len());
    assert!(queued == expected, "the tasks are not in commit order");
    assert_eq!(unpublished(&db).await, 0);
}

/// Keyset claiming: a full round makes the next claim start after its last
/// row; a row whose transaction commits late, below that point, is found
/// once a round comes back short and the claim starts from the beginning.
#[tokio::test]
async fn an_event_committed_late_below_the_relays_position_is_still_published() {
    // Arrange: a transaction takes the lowest row id and stays open.
    let db = TestDatabase::migrated().await;
    let queue = TestQueue::new().await;
    let relay = relay(&db, &queue);
    let mut late = db.pool.begin().await.unwrap();
    let late_event = OutboxDispatcher::new()
        .dispatch(&mut *late, &OrderPlaced { order_id: 9_999 })
        .await
        .unwrap();
    dispatch_events(&db, 250).await;

    // Act and assert: two full rounds, then the late commit.
    assert_eq!(relay.publish_batch().await.unwrap().claimed, 100);
    assert_eq!(relay.publish_batch().await.unwrap().claimed, 100);
    late.commit().await.unwrap();
    // Resumed after the second batch: the 50 rows above it, a short round.
    assert_eq!(relay.publish_batch().await.unwrap().claimed, 50);
    // So the next claim starts from the beginning, and finds the late row.
    assert_eq!(relay.publish_batch().await.unwrap().claimed, 1);
    assert_eq!(unpublished(&db).await, 0);
    assert!(
        queue
            .pending_ids()
            .await
            .contains(&late_event.id.to_string())
    );
}

/// `OUTBOX_QUEUES=shop,billing`: each event reaches both queues, so a
/// second service consuming `billing` sees every event of this one. A
/// queue that already has a task counts it as a duplicate, not a loss.
#[tokio::test]
async fn every_event_reaches_each_queue_of_outbox_queues() {
    // Arrange: an event already in the second queue (as after a crash
    // between one queue's enqueue and the mark).
    let db = TestDatabase::migrated().await;
    let shop = TestQueue::new().await;
    let billing = TestQueue::new().await;
    let envelopes = dispatch_events(&db, 150).await;
    let relay = relay(&db, &shop).with_queues(vec![shop.name.clone(), billing.name.clone()]);
    let first = envelopes[0].id.to_string();
    let earlier = NewTask::new("event:orderPlaced", first.clone(), b"{}".to_vec())
        .queue(billing.name.as_str());
    billing.client.enqueue(&[earlier]).await.unwrap()[0]
        .as_ref()
        .expect("the earlier task is queued");

    // Act
    let rounds = drain(&relay).await;

    // Assert: every event in each queue once, in commit order; one duplicate.
    let expected: Vec<String> = envelopes.iter().map(|e| e.id.to_string()).collect();
    assert_eq!(shop.pending_ids().await, expected);
    assert_eq!(billing.pending_ids().await, expected);
    let published: usize = rounds.iter().map(|r| r.published).sum();
    let duplicates: usize = rounds.iter().map(|r| r.duplicates).sum();
    assert_eq!((published, duplicates), (150, 1));
    assert_eq!(unpublished(&db).await, 0);
}

/// A round in which some enqueues fail marks only the events that reached
/// every queue; a later round publishes them, the queue that has them
/// already reporting duplicates.
#[tokio::test]
async fn events_that_did_not_reach_every_queue_stay_unpublished() {
    // Arrange: a second queue whose every task is refused before anything
    // is written (a blank name), beside a good one.
    let db = TestDatabase::migrated().await;
    let shop = TestQueue::new().await;
    let billing = TestQueue::new().await;
    let envelopes = dispatch_events(&db, 20).await;
    let broken = relay(&db, &shop).with_queues(vec![shop.name.clone(), " ".to_string()]);

    // Act
    let failed = broken.publish_batch().await;

    // Assert: an error, nothing marked, the tasks that did reach `shop` kept.
    assert!(
        matches!(
            failed,
            Err(RelayError::Queue {
                claimed: 20,
                published: 0,
                ..
            })
        ),
        "{failed:?}"
    );
    assert_eq!(unpublished(&db).await, 20);
    let expected: Vec<String> = envelopes.iter().map(|e| e.id.to_string()).collect();
    assert_eq!(shop.pending_ids().await, expected);

    // With both queues good, the next rounds publish every event to both.
    let fixed = relay(&db, &shop).with_queues(vec![shop.name.clone(), billing.name.clone()]);
    let rounds = drain(&fixed).await;
    let published: usize = rounds.iter().map(|r| r.published).sum();
    let duplicates: usize = rounds.iter().map(|r| r.duplicates).sum();
    assert_eq!((published, duplicates), (20, 20));
    assert_eq!(billing.pending_ids().await, expected);
    assert_eq!(shop.pending_ids().await, expected);
    assert_eq!(unpublished(&db).await, 0);
}

#[tokio::test]
async fn a_rolled_back_dispatch_leaves_no_row_and_no_task() {
    let db = TestDatabase::migrated().await;
    let queue = TestQueue::new().await;
    let dispatcher = OutboxDispatcher::new();
    let result: Result<(), anyhow::Error> = Transactor::new(db.pool.clone())
        .run(async |tx| {
            dispatcher
                .dispatch(&mut *tx, &OrderPlaced { order_id: 1 })
                .await?;
            anyhow::bail!("out of stock")
        })
        .await;
    assert!(result.is_err());

    let rounds = drain(&relay(&db, &queue)).await;

    assert!(rounds.is_empty());
    assert!(queue.pending_ids().await.is_empty());
}

#[tokio::test]
async fn an_event_queued_before_a_crash_is_not_queued_twice() {
    // Arrange: the task reached the queue, but the mark was lost (as when
    // the relay dies between enqueue and commit).
    let db = TestDatabase::migrated().await;
    let queue = TestQueue::new().await;
    let envelopes = dispatch_events(&db, 3).await;
    let relay = relay(&db, &queue);
    drain(&relay).await;
    sqlx::query("UPDATE outbox_events SET published_at = NULL")
        .execute(&db.pool)
        .await
        .unwrap();

    // Act
    let rounds = drain(&relay).await;

    // Assert: the second round saw duplicates, marked them, queued nothing new.
    assert_eq!(
        rounds,
        vec![Round {
            claimed: 3,
            published: 3,
            duplicates: 3
        }]
    );
    assert_eq!(queue.pending_ids().await.len(), envelopes.len());
    assert_eq!(unpublished(&db).await, 0);
}

#[tokio::test]
async fn concurrent_relays_never_queue_an_event_twice() {
    // Arrange
    let db = TestDatabase::migrated().await;
    let queue = TestQueue::new().await;
    let envelopes = dispatch_events(&db, 3_000).await;

    // Act: three relays drain the same table at once.
    let relays: Vec<_> = (0..3)
        .map(|_| {
            let relay = relay(&db, &queue);
            tokio::spawn(async move { drain(&relay).await })
        })
        .collect();
    let mut published = 0;
    for relay in relays {
        published += relay
            .await
            .unwrap()
            .iter()
            .map(|r| r.published)
            .sum::<usize>();
    }

    // Assert
    assert_eq!(published, envelopes.len());
    let ids = queue.pending_ids().await;
    assert_eq!(ids.len(), envelopes.len());
    let unique: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), envelopes.len());
    assert_eq!(unpublished(&db).await, 0);
}

/// `Relay::run` claims the next batch while the current one is enqueued:
/// three running relays drain a backlog, each event queued once, and one
/// alone queues them in commit order.
#[tokio::test]
async fn running_relays_that_claim_ahead_queue_each_event_once_and_in_order() {
    for relays in [1, 3] {
        // Arrange
        let db = TestDatabase::migrated().await;
        let queue = TestQueue::new().await;
        let mut envelopes = Vec::new();
        for _ in 0..20 {
            envelopes.extend(dispatch_events(&db, 100).await);
        }

        // Act
        let stop = CancellationToken::new();
        let running: Vec<_> = (0..relays)
            .map(|_| tokio::spawn(relay(&db, &queue).run(stop.clone())))
            .collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while unpublished(&db).await > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the backlog was not drained"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
        for relay in running {
            relay.await.unwrap();
        }

        // Assert
        let expected: Vec<String> = envelopes.iter().map(|e| e.id.to_string()).collect();
        let queued = queue.pending_ids().await;
        let unique: BTreeSet<&String> = queued.iter().collect();
        assert_eq!(unique.len(), expected.len(), "{relays} relays");
        assert_eq!(
            queued.len(),
            expected.len(),
            "{relays} relays: an event was queued twice"
        );
        if relays == 1 {
            assert!(queued == expected, "the tasks are not in commit order");
        }
    }
}

#[tokio::test]
async fn cleanup_deletes_only_published_rows_past_the_retention() {
    let db = TestDatabase::migrated().await;
    let queue = TestQueue::new().await;
    dispatch_events(&db, 5).await;
    drain(&relay(&db, &queue)).await;
    dispatch_events(&db, 2).await;
    sqlx::query("UPDATE outbox_events SET published_at = now() - interval '2 hours' WHERE id <= 3")
        .execute(&db.pool)
        .await
        .unwrap();

    let deleted = cleanup::delete_expired(&db.pool, std::time::Duration::from_secs(3600))
        .await
        .unwrap();

    assert_eq!(deleted, 3);
    let (left,): (i64,) = sqlx::query_as("SELECT count(*) FROM outbox_events")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        left, 4,
        "2 recently published and 2 unpublished rows remain"
    );
}

/// Starts `relay` and waits until its first round, an empty one, is done:
/// with a poll interval of 30 s, only a wake-up can make it publish within
/// the test after that.
async fn start_sleepy_relay(
    (relay, metrics): (Relay, RelayMetrics),
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let running = tokio::spawn(relay.run(stop.clone()));
    let started = Instant::now();
    while metrics.rounds.get() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the relay never finished its first round"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running
}

/// Waits until a relay is subscribed to the wake-up channel, so that a
/// wake-up published from now on reaches it.
async fn wait_for_a_subscriber(queue: &TestQueue) {
    let mut conn = queue.connection().await;
    let started = Instant::now();
    loop {
        let (_, subscribers): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(wake::CHANNEL)
            .query_async(&mut conn)
            .await
            .unwrap();
        if subscribers > 0 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the relay never subscribed to the wake-up channel"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A relay polling every 30 s, and its metrics.
fn sleepy_relay(db: &TestDatabase, queue: &TestQueue) -> (Relay, RelayMetrics) {
    let mut config = crate::testing::config("postgres://unused@localhost/unused");
    config.outbox.poll_interval = Duration::from_secs(30);
    let metrics = Metrics::new().relay;
    let relay = Relay::new(
        db.pool.clone(),
        queue.client.clone(),
        &config.outbox,
        metrics.clone(),
    )
    .with_queue(queue.name.clone());
    (relay, metrics)
}

/// Commits one event with `transactor` and returns how long it took to
/// reach the queue.
async fn commit_to_queue(transactor: &Transactor, queue: &TestQueue) -> Duration {
    let dispatcher = OutboxDispatcher::new();
    let started = Instant::now();
    transactor
        .run(async |tx| {
            dispatcher
                .dispatch(&mut *tx, &OrderPlaced { order_id: 1 })
                .await?;
            Ok::<_, anyhow::Error>(())
        })
        .await
        .unwrap();
    while queue.pending_ids().await.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the event never reached the queue"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

#[tokio::test]
async fn a_commit_wakes_the_relay_of_its_own_process_at_once() {
    let db = TestDatabase::migrated().await;
    let queue = TestQueue::new().await;
    let stop = CancellationToken::new();
    let relay = sleepy_relay(&db, &queue);
    let wake = Wake::local(relay.0.waker());
    let running = start_sleepy_relay(relay, &stop).await;
    let transactor = Transactor::new(db.pool.clone()).after_events(move || wake.signal());

    let latency = commit_to_queue(&transactor, &queue).await;

    assert!(
        latency < Duration::from_secs(2),
        "took {latency:?} with a 30 s poll interval"
    );
    stop.cancel();
    running.await.unwrap();
}

/// Under a stream of commits, each waking the relay, its rounds start at
/// least `GATHER` apart, so that a round carries the events of a few
/// milliseconds (and costs its round trips once for them), while every
/// event still reaches the queue within milliseconds.
#[tokio::test]
async fn a_stream_of_commits_is_gathered_into_rounds_a_few_milliseconds_apart() {
    let db = TestDatabase::migrated().await;
    let queue = TestQueue::new().await;
    let stop = CancellationToken::new();
    let (relay, metrics) = sleepy_relay(&db, &queue);
    let wake = Wake::local(relay.waker());
    let running = start_sleepy_relay((relay, metrics.clone()), &stop).await;
    let transactor = Transactor::new(db.pool.clone()).after_events(move || wake.signal());
    let rounds_before = metrics.rounds.get();

    // Commits one after the other, each waking the relay: far more of them
    // than `GATHER` intervals pass while they run.
    let started = Instant::now();
    let commits = 300;
    for order_id in 0..commits {
        transactor
            .run(async |tx| {
                OutboxDispatcher::new()
                    .dispatch(&mut *tx, &OrderPlaced { order_id })
                    .await?;
                Ok::<_, anyhow::Error>(())
            })
            .await
            .unwrap();
    }
    while queue.pending_ids().await.len() < commits as usize {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the events never reached the queue"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();

    let rounds = metrics.rounds.get() - rounds_before;
    let most =
        (elapsed.as_secs_f64() / crate::outbox::relay::GATHER.as_secs_f64()).ceil() as u64 + 2;
    assert!(
        rounds <= most,
        "{rounds} rounds for {commits} commits in {elapsed:?}: more than one per {:?}",
        crate::outbox::relay::GATHER
    );
    stop.cancel();
    running.await.unwrap();
}

#[tokio::test]
async fn a_published_wake_up_reaches_the_relay_of_another_process() {
    let db = TestDatabase::migrated().await;
    let queue = TestQueue::new().await;
    let stop = CancellationToken::new();
    let relay = sleepy_relay(&db, &queue);
    let subscriber = tokio::spawn(wake::forward_published(
        queue.client.clone(),
        relay.0.waker(),
        stop.clone(),
    ));
    let running = start_sleepy_relay(relay, &stop).await;
    wait_for_a_subscriber(&queue).await;
    // The committing side knows nothing of the relay: only the channel.
    let wake = Wake::publishing(queue.client.clone());
    let transactor = Transactor::new(db.pool.clone()).after_events(move || wake.signal());

    let latency = commit_to_queue(&transactor, &queue).await;

    assert!(
        latency < Duration::from_secs(2),
        "took {latency:?} with a 30 s poll interval"
    );
    stop.cancel();
    running.await.unwrap();
    subscriber.await.unwrap();
}

/// A scheduler's event tick goes into the outbox under the tick's id, so
/// that replicas that both fire it store it once: a second insert of the
/// same event writes nothing, and says so.
#[tokio::test]
async fn insert_unless_present_stores_an_event_once_and_says_whether_it_was_new() {
    let db = TestDatabase::migrated().await;
    let envelope = Envelope::new("orderPlaced", serde_json::json!({ "order_id": 1 }));

    let first = crate::outbox::Store
        .insert_unless_present(&db.pool, &envelope)
        .await
        .expect("the first insert");
    let again = crate::outbox::Store
        .insert_unless_present(&db.pool, &envelope)
        .await
        .expect("the second insert");

    assert!(first, "the first insert stores a new row");
    assert!(!again, "the second finds the row there");
    let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM outbox_events WHERE event_id = $1")
        .bind(envelope.id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

/// A claim that finds nothing past the relay's position starts again from
/// the beginning in the same round: a late commit below the position goes
/// out in that round, not one round later.
#[tokio::test]
async fn a_round_that_finds_nothing_past_its_position_claims_from_the_beginning_at_once() {
    // Arrange: a transaction takes the lowest row id and stays open.
    let db = TestDatabase::migrated().await;
    let queue = TestQueue::new().await;
    let relay = relay(&db, &queue);
    let mut late = db.pool.begin().await.unwrap();
    let late_event = OutboxDispatcher::new()
        .dispatch(&mut *late, &OrderPlaced { order_id: 9_999 })
        .await
        .unwrap();
    dispatch_events(&db, 200).await;
    assert_eq!(relay.publish_batch().await.unwrap().claimed, 100);
    assert_eq!(relay.publish_batch().await.unwrap().claimed, 100);

    // Act: the late commit, below the position the full rounds left.
    late.commit().await.unwrap();
    let round = relay.publish_batch().await.unwrap();

    // Assert
    assert_eq!(round.claimed, 1, "the late row, in the same round");
    assert_eq!(unpublished(&db).await, 0);
    assert!(
        queue
            .pending_ids()
            .await
            .contains(&late_event.id.to_string())
    );
}

/// Under a steady backlog the claim past the relay's position never comes
/// back empty, so every `RESCAN_EVERY` full rounds it starts from the
/// beginning: a late commit below the position goes out then, not after
/// the whole backlog.
#[tokio::test]
async fn under_a_steady_backlog_the_claim_starts_from_the_beginning_every_rescan_every_rounds() {
    use crate::outbox::relay::RESCAN_EVERY;

    // Arrange: one event per round; a transaction takes the lowest row id.
    let db = TestDatabase::migrated().await;
    let queue = TestQueue::new().await;
    let mut config = crate::testing::config("postgres://unused@localhost/unused");
    config.outbox.batch_size = 1;
    let relay = Relay::new(
        db.pool.clone(),
        queue.client.clone(),
        &config.outbox,
        Metrics::new().relay,
    )
    .with_queue(queue.name.clone());
    let mut late = db.pool.begin().await.unwrap();
    let late_event = OutboxDispatcher::new()
        .dispatch(&mut *late, &OrderPlaced { order_id: 9_999 })
        .await
        .unwrap();
    dispatch_events(&db, RESCAN_EVERY + 5).await;
    assert_eq!(relay.publish_batch().await.unwrap().claimed, 1);

    // Act: the late commit, then as many full rounds as make a rescan.
    late.commit().await.unwrap();
    for _ in 0..RESCAN_EVERY {
        assert_eq!(relay.publish_batch().await.unwrap().claimed, 1);
    }

    // Assert: the first round's event, RESCAN_EVERY - 1 more past the
    // position, then the late one, found by the rescan.
    let queued = queue.pending_ids().await;
    let late_at = queued
        .iter()
        .position(|id| *id == late_event.id.to_string());
    assert_eq!(late_at, Some(RESCAN_EVERY as usize));
}

/// The worker's cleanup task deletes expired rows as it starts, and ends
/// when shut down, also while it waits for its next run.
#[tokio::test]
async fn cleanup_runs_as_it_starts_and_stops_when_shut_down() {
    // Arrange: 3 rows published past the retention.
    let db = TestDatabase::migrated().await;
    let queue = TestQueue::new().await;
    dispatch_events(&db, 3).await;
    drain(&relay(&db, &queue)).await;
    sqlx::query("UPDATE outbox_events SET published_at = now() - interval '2 hours'")
        .execute(&db.pool)
        .await
        .unwrap();
    let count = async || -> i64 {
        let (count,): (i64,) = sqlx::query_as("SELECT count(*) FROM outbox_events")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        count
    };

    // Act: an hour between runs, so only the first one can delete.
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(cleanup::run(
        db.pool.clone(),
        Duration::from_secs(3600),
        Duration::from_secs(3600),
        shutdown.clone(),
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while count().await > 0 {
        assert!(Instant::now() < deadline, "the cleanup deleted nothing");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();

    // Assert
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the cleanup ends when shut down")
        .unwrap();
}
