//! A schedule's tick in a test, without the worker or its leader:
//! [`run_job`] runs a job at a tick, [`dispatch_tick`] dispatches an event
//! schedule's event at a tick. Both take the worker's own path.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::scheduler::{ScheduledEvent, ScheduledJob, Schedules, Tick};

/// Runs `schedule`'s job for its tick due `at`, as the worker runs the
/// task the leader enqueues for it (the same payload, tick id and span).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # if !kit::testing::example_has_a_database() { return; }
/// use kit::scheduler::{JobContext, ScheduledJob};
///
/// struct Heartbeat;
/// impl ScheduledJob for Heartbeat {
///     const NAME: &'static str = "heartbeat";
///     const CRON: &'static str = "@every 30s";
///     const TIME_ZONE: &'static str = "UTC";
///     const CATCH_UP: u32 = 0;
///     async fn run(&self, ctx: JobContext) -> anyhow::Result<()> {
///         anyhow::ensure!(ctx.tick.schedule == "heartbeat");
///         Ok(())
///     }
/// }
///
/// let db = kit::testing::TestDatabase::new().await;
/// let at = "2026-12-04T02:30:00Z".parse().unwrap();
/// kit::testing::run_job(db.pool(), Heartbeat, at).await.unwrap();
/// # }
/// ```
pub async fn run_job<S: ScheduledJob>(
    pool: &PgPool,
    schedule: S,
    at: DateTime<Utc>,
) -> anyhow::Result<()> {
    let mut schedules = Schedules::new();
    schedules.job(schedule);
    let entry = &schedules.all()[0];
    crate::scheduler::run_job_tick(entry, &Tick::new(S::NAME, at), pool.clone())
        .await
        .map_err(|err| anyhow::anyhow!("the job `{}` failed at {at}: {err}", S::NAME))
}

/// Dispatches the event of `schedule`'s tick due `at` into the outbox, as
/// the leader does (the tick's id as the event id, nothing if it is there
/// already); returns whether it was new. [`super::TestDatabase::dispatched`]
/// then shows it, and a drain delivers it.
pub async fn dispatch_tick<S: ScheduledEvent>(
    pool: &PgPool,
    schedule: S,
    at: DateTime<Utc>,
) -> anyhow::Result<bool> {
    let mut schedules = Schedules::new();
    schedules.event(schedule);
    let entry = &schedules.all()[0];
    crate::scheduler::dispatch_event_tick(entry, &Tick::new(S::NAME, at), pool).await
}
