//! Ordered listeners beside their neighbours on one Valkey: two services
//! whose databases share a name, a service started on another's queue, and
//! a process on the queue that keeps no order (a Go asynq server, or a
//! worker of an earlier template set).

#![cfg(feature = "worker")]

use std::time::Duration;

use prost::Message as _;
use sqlx::PgPool;

use super::ordering::{Placed, SEEN, ordered_ledger, record, seen, worker};
use super::support::{self, OwnPostgres, TestDatabase, TestQueue, eventually, valkey_addr};
use crate::queue::SkipRetry;
use crate::queue::message::ServerInfo;
use crate::worker::listeners::{ListenerContext, ListenerOptions, Listeners};
use crate::worker::ordering::{Held, Ordering};

/// The chains of `pool`'s service on `queue`.
fn chains(pool: &PgPool, queue: &TestQueue) -> Ordering {
    Ordering::new(
        pool.clone(),
        queue.client.clone(),
        vec![queue.name.clone()],
        Duration::from_secs(60),
    )
}

/// Publishes every unpublished row of `pool`'s outbox to `queue`.
async fn publish(pool: &PgPool, queue: &TestQueue) {
    super::ordering::publish_shuffled(pool, queue, &mut fastrand::Rng::with_seed(9)).await;
}

#[tokio::test]
async fn two_services_whose_databases_share_a_name_keep_their_keys_apart() {
    // Arrange: two services on Postgres servers of their own, each with a
    // database named `shop`, on one Valkey, each with a queue of its own.
    // Service A's listener refuses its key 1's first step, which holds the
    // key; service B's events of key 1 (its own key 1) come after.
    let (a, b) = (OwnPostgres::start(), OwnPostgres::start());
    if !support::require(
        "PostgreSQL's initdb and pg_ctl",
        a.is_some() && b.is_some(),
        "gpkit's scripts/test installs Debian's postgresql",
    ) {
        return;
    }
    let (a, b) = (a.unwrap(), b.unwrap());
    let (pool_a, pool_b) = (a.migrated("shop").await, b.migrated("shop").await);
    for pool in [&pool_a, &pool_b] {
        sqlx::query(SEEN).execute(pool).await.unwrap();
    }
    let (queue_a, queue_b) = (TestQueue::new().await, TestQueue::new().await);
    let mut refusing = Listeners::new();
    refusing.listen_with(
        "ledger",
        ListenerOptions::new().ordered(),
        |event: Placed, context: ListenerContext| async move {
            if event.n == 1 {
                return Err(SkipRetry("step 1 is refused".into()).into());
            }
            record(&context, event.key, event.n).await
        },
    );
    for n in 1..=3 {
        for pool in [&pool_a, &pool_b] {
            crate::outbox::dispatch(pool, &Placed { key: 1, n })
                .await
                .unwrap();
        }
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let running = [
        tokio::spawn(
            worker(queue_a.client.clone(), &queue_a, &pool_a, refusing)
                .run(stop.clone().cancelled_owned()),
        ),
        tokio::spawn(
            worker(queue_b.client.clone(), &queue_b, &pool_b, ordered_ledger())
                .run(stop.clone().cancelled_owned()),
        ),
    ];

    // Act
    publish(&pool_a, &queue_a).await;
    publish(&pool_b, &queue_b).await;
    eventually(
        Duration::from_secs(20),
        "service B's three steps",
        || async { seen(&pool_b).await.get(&1).map(Vec::len) == Some(3) },
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "service A's key 1 held",
        || async { chains(&pool_a, &queue_a).held().await.unwrap().blocked_keys == 1 },
    )
    .await;
    stop.cancel();
    for worker in running {
        worker.await.unwrap().unwrap();
    }

    // Assert: B's key did not wait for A's, and A's still does.
    assert_eq!(seen(&pool_b).await.get(&1), Some(&vec![1, 2, 3]));
    assert_eq!(seen(&pool_a).await.get(&1), None);
    assert_eq!(
        chains(&pool_a, &queue_a).held().await.unwrap(),
        Held {
            blocked_keys: 1,
            waiting_runs: 2,
            waiting_events: 0
        }
    );
    assert_eq!(
        chains(&pool_b, &queue_b).held().await.unwrap(),
        Held::default()
    );
}

/// The configuration of a worker of the service on `db` that consumes
/// `queue`.
fn config(db: &TestDatabase, queue: &str) -> crate::config::Config {
    let mut config = crate::testing::config(&db.url());
    config.valkey.addr = Some(valkey_addr());
    config.outbox.queues = queue.parse().unwrap();
    config.worker.queues = queue.parse().unwrap();
    config.scheduler.enabled = false;
    config
}

/// Runs a worker of `config` with an ordered listener until `stop`.
fn run_worker(
    config: crate::config::Config,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    tokio::spawn(async move {
        crate::worker::run(
            &config,
            ordered_ledger(),
            crate::scheduler::Schedules::new(),
            stop.cancelled_owned(),
        )
        .await
    })
}

#[tokio::test]
async fn a_worker_does_not_start_on_a_queue_another_services_workers_consume() {
    // Arrange: service A's worker consumes a queue.
    let (db_a, db_b) = (
        TestDatabase::migrated().await,
        TestDatabase::migrated().await,
    );
    let queue = TestQueue::new().await;
    let stop = tokio_util::sync::CancellationToken::new();
    let a = run_worker(config(&db_a, &queue.name), stop.clone());
    let record = format!("ordered:{{{}}}:service", queue.name);
    let mut conn = queue.connection().await;
    eventually(Duration::from_secs(20), "service A's record", || async {
        let recorded: Option<String> = redis::cmd("GET")
            .arg(&record)
            .query_async(&mut conn.clone())
            .await
            .unwrap();
        recorded.is_some()
    })
    .await;

    // Act: service B's worker starts on it.
    let b = tokio::time::timeout(
        Duration::from_secs(20),
        crate::worker::run(
            &config(&db_b, &queue.name),
            ordered_ledger(),
            crate::scheduler::Schedules::new(),
            std::future::pending(),
        ),
    )
    .await
    .expect("service B's worker stops at once");
    stop.cancel();
    a.await.unwrap().unwrap();
    let _ = &mut conn;

    // Assert
    let refused = format!("{:#}", b.unwrap_err());
    let id_of = |db: &TestDatabase| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, uuid::Uuid>("SELECT id FROM outbox_service")
                .fetch_one(&pool)
                .await
                .unwrap()
                .to_string()
        }
    };
    let (id_a, id_b) = (id_of(&db_a).await, id_of(&db_b).await);
    assert!(
        refused.contains(&format!(
            "queue `{}` is consumed by the workers of another service (id {id_a}; this one is {id_b})",
            queue.name
        )),
        "{refused}"
    );
}

#[tokio::test]
async fn a_worker_with_ordered_listeners_does_not_start_beside_a_process_that_keeps_no_order() {
    // Arrange: a server on the queue that keeps no chains, as a Go asynq
    // server writes its state (asynqmon's Servers page).
    let db = TestDatabase::migrated().await;
    let queue = TestQueue::new().await;
    let go = ServerInfo {
        host: "go-host".into(),
        pid: 4242,
        server_id: "go-server".into(),
        concurrency: 10,
        queues: [(queue.name.clone(), 1)].into(),
        status: "active".into(),
        ..ServerInfo::default()
    };
    let key = crate::queue::keys::server_info("go-host", 4242, "go-server");
    let mut conn = queue.connection().await;
    let () = redis::pipe()
        .zadd(
            crate::queue::keys::ALL_SERVERS,
            &key,
            chrono::Utc::now().timestamp() + 60,
        )
        .ignore()
        .set(&key, go.encode_to_vec())
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();

    // Act
    let refused = tokio::time::timeout(
        Duration::from_secs(20),
        crate::worker::run(
            &config(&db, &queue.name),
            ordered_ledger(),
            crate::scheduler::Schedules::new(),
            std::future::pending(),
        ),
    )
    .await
    .expect("the worker stops at once");
    let () = redis::pipe()
        .zrem(crate::queue::keys::ALL_SERVERS, &key)
        .ignore()
        .del(&key)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let alone = run_worker(config(&db, &queue.name), stop.clone());
    eventually(Duration::from_secs(20), "the worker's record", || async {
        let recorded: Option<String> = redis::cmd("GET")
            .arg(format!("ordered:{{{}}}:service", queue.name))
            .query_async(&mut conn.clone())
            .await
            .unwrap();
        recorded.is_some()
    })
    .await;
    stop.cancel();

    // Assert: refused, naming it; started once it was gone.
    let refused = format!("{:#}", refused.unwrap_err());
    assert!(
        refused.contains(&format!(
            "go-host:4242 (server go-server) on queue(s) {}",
            queue.name
        )),
        "{refused}"
    );
    alone.await.unwrap().unwrap();
}
