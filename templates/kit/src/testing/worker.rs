//! The real worker in a test, on a test Valkey: [`TestWorker`], for tests
//! that want the queue itself (asynq's format, task headers, trace
//! context) rather than the in-process drain.

use std::time::Duration;

use anyhow::Context as _;
use sqlx::PgPool;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::config::Config;
use crate::queue::Client;
use crate::scheduler::Schedules;
use crate::worker::listeners::Listeners;
use crate::worker::task_names::listener_task_id;

/// How often [`TestWorker::wait_until_delivered`] looks.
const POLL: Duration = Duration::from_millis(50);

/// The worker (`kit::worker::run`: relay, consumer, fan-out, scheduler)
/// running in the test's runtime until [`Self::stop`].
///
/// ```no_run
/// # // Needs Postgres and a Valkey (VALKEY_ADDR) of the test's own.
/// # async fn example(register: fn(&mut kit::prelude::Listeners)) {
/// use std::time::Duration;
///
/// let db = kit::testing::TestDatabase::new().await;
/// let mut config = db.config();
/// config.valkey.addr = std::env::var("VALKEY_ADDR").ok();
/// let worker = kit::testing::TestWorker::start(
///     config,
///     kit::testing::listeners(register),
///     kit::scheduler::Schedules::new(),
/// )
/// .await;
/// // ... dispatch events ...
/// worker.wait_until_delivered(Duration::from_secs(10)).await.unwrap();
/// worker.stop().await.unwrap();
/// # }
/// ```
pub struct TestWorker {
    pool: PgPool,
    queue: Client,
    queues: Vec<String>,
    listeners: Vec<(String, String)>,
    stop: oneshot::Sender<()>,
    running: JoinHandle<anyhow::Result<()>>,
}

impl std::fmt::Debug for TestWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestWorker")
            .field("queues", &self.queues)
            .field("listeners", &self.listeners)
            .finish_non_exhaustive()
    }
}

impl TestWorker {
    /// Starts the worker with `config`, `listeners` and `schedules`.
    ///
    /// # Panics
    ///
    /// When Postgres or Valkey cannot be reached.
    pub async fn start(config: Config, listeners: Listeners, schedules: Schedules) -> Self {
        let pool = crate::database::connect_lazy(&config.database);
        let queue = Client::from_config(&config.valkey)
            .await
            .unwrap_or_else(|err| {
                panic!(
                    "the test worker cannot reach Valkey ({}): {err}",
                    config
                        .valkey
                        .addr
                        .as_deref()
                        .unwrap_or("VALKEY_ADDR not set")
                )
            });
        let names = listeners
            .all()
            .map(|listener| (listener.event().to_string(), listener.name().to_string()))
            .collect();
        let queues = config.outbox.queues.names().to_vec();
        let (stop, stopped) = oneshot::channel::<()>();
        let running = tokio::spawn(async move {
            crate::worker::run(&config, listeners, schedules, async move {
                let _ = stopped.await;
            })
            .await
        });
        Self {
            pool,
            queue,
            queues,
            listeners: names,
            stop,
            running,
        }
    }

    /// Waits until every event in the outbox is published and each of its
    /// listeners' tasks has completed, at most `timeout`; events
    /// dispatched for later and due within `timeout` are waited for too
    /// (those due after it are not: they are not late). An archived
    /// listener task ends the wait with its error; at the timeout, the
    /// error names every event and listener still pending and the state
    /// of its task.
    pub async fn wait_until_delivered(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        let due_by = chrono::Utc::now()
            + chrono::Duration::from_std(timeout).unwrap_or(chrono::Duration::MAX);
        loop {
            let mut pending = self.waiting_due_by(due_by).await?;
            pending.extend(self.pending().await?);
            if pending.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "after {timeout:?}, {} deliveries are still pending:\n  {}",
                    pending.len(),
                    pending.join("\n  ")
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The events dispatched for later and due by `due_by` that still
    /// wait, a line each.
    async fn waiting_due_by(
        &self,
        due_by: chrono::DateTime<chrono::Utc>,
    ) -> anyhow::Result<Vec<String>> {
        let waiting: Vec<(Uuid, String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
            "SELECT event_id, event_name, due_at FROM outbox_later WHERE due_at <= $1 \
             ORDER BY due_at, id",
        )
        .bind(due_by)
        .fetch_all(&self.pool)
        .await
        .context("failed to read the events for later")?;
        Ok(waiting
            .into_iter()
            .map(|(event_id, name, due_at)| {
                format!("`{name}` {event_id}: due at {due_at}, not in the outbox yet")
            })
            .collect())
    }

    /// What is not delivered yet, a line each; an error for an archived
    /// listener task.
    async fn pending(&self) -> anyhow::Result<Vec<String>> {
        let events: Vec<(Uuid, String, bool)> = sqlx::query_as(
            "SELECT event_id, event_name, published_at IS NOT NULL FROM outbox_events ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await
        .context("failed to read the outbox")?;
        let mut pending = Vec::new();
        for (event_id, name, published) in events {
            if !published {
                pending.push(format!("`{name}` {event_id}: not published yet"));
                continue;
            }
            for (_, listener) in self.listeners.iter().filter(|(event, _)| *event == name) {
                let task_id = listener_task_id(event_id, listener).to_string();
                let mut state = None;
                for queue in &self.queues {
                    if let Some(info) = self.queue.task_info(queue, &task_id).await? {
                        state = Some(info);
                        break;
                    }
                }
                match state {
                    Some(info) if info.state == "completed" => {}
                    Some(info) if info.state == "archived" => anyhow::bail!(
                        "listener `{listener}` of `{name}` {event_id} was archived: {}",
                        info.last_error.unwrap_or_default()
                    ),
                    Some(info) => pending.push(format!(
                        "listener `{listener}` of `{name}` {event_id}: {}{}",
                        info.state,
                        info.last_error
                            .map(|error| format!(", last error: {error}"))
                            .unwrap_or_default()
                    )),
                    None => pending.push(format!(
                        "listener `{listener}` of `{name}` {event_id}: not queued yet"
                    )),
                }
            }
        }
        Ok(pending)
    }

    /// Stops the worker as SIGTERM would, and returns how it ended.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.pool.close().await;
        self.running.await.context("the worker panicked")?
    }
}
