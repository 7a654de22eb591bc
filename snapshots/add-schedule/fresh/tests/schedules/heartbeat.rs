//! The test of the `heartbeat` schedule: its job runs at one tick.
//!
//! `gpkit add schedule` wrote it with the schedule; it is yours to change:
//! assert on what the job writes.

use shop::schedules::heartbeat;

#[tokio::test]
async fn heartbeat_runs_its_job() {
    let db = kit::testing::TestDatabase::new().await;
    let at = "2026-01-01T00:00:00Z".parse().expect("a tick's time");

    kit::testing::run_job(db.pool(), heartbeat::Schedule, at)
        .await
        .expect("the job runs");
}
