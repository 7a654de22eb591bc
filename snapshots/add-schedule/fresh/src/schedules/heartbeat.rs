//! The `heartbeat` schedule: runs the job `job:heartbeat` on every tick.

use kit::scheduler;

/// The schedule, registered in `super::register`.
pub struct Schedule;

impl scheduler::ScheduledJob for Schedule {
    const NAME: &'static str = "heartbeat";
    /// When it ticks: 5 cron fields (6 with seconds first), @hourly,
    /// @daily, @weekly, @monthly, or `@every <duration>`.
    const CRON: &'static str = "@every 30s";
    /// The IANA time zone `CRON` is read in. On the day a local time is
    /// skipped it runs once at the next valid time; on the day it repeats,
    /// once.
    const TIME_ZONE: &'static str = "UTC";
    /// Missed ticks (no leader, downtime) a new leader enqueues: 0 skips them.
    const CATCH_UP: u32 = 3;

    /// Runs once per tick, in a task of its own, retried on error; it may
    /// run again for the same tick after a crash, so make it idempotent on
    /// `ctx.tick.id`.
    async fn run(&self, ctx: scheduler::JobContext) -> anyhow::Result<()> {
        tracing::info!(tick = %ctx.tick.at, tick_id = %ctx.tick.id, "{}", Self::NAME);
        Ok(())
    }
}
