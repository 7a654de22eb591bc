//! The last tick enqueued of each schedule, kept on Valkey so that a new
//! leader knows where the schedules stood.
//!
//! - One hash, `scheduler:{<service>}:last_ticks`: a field per schedule,
//!   the Unix time of its latest tick enqueued. The leader records every
//!   tick it enqueues (a script keeps the greater of the two values, so a
//!   late write never moves a schedule back).
//! - A new leader's catch-up enqueues only ticks after a schedule's record.
//!   A schedule with no record has never ticked (the service's first start,
//!   or a schedule just added): it catches up on nothing, rather than on
//!   ticks from before it existed.
//!
//! The key carries the lease's hash tag, so it lives in the lease's slot on
//! Valkey Cluster.

use std::collections::HashMap;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use redis::Script;

use crate::queue::{Connection, QueueError};

/// Sets the field to the value if it is absent or smaller.
///
/// KEYS: the hash. ARGV: the schedule, the tick's Unix time.
static RECORD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local current = tonumber(redis.call("HGET", KEYS[1], ARGV[1]))
if current == nil or current < tonumber(ARGV[2]) then
    redis.call("HSET", KEYS[1], ARGV[1], ARGV[2])
end
return 0
"#,
    )
});

/// The hash of `service`: `scheduler:{<service>}:last_ticks`.
pub(crate) fn key(service: &str) -> String {
    format!("scheduler:{{{service}}}:last_ticks")
}

/// The record of one service's schedules.
#[derive(Clone)]
pub(crate) struct Progress {
    conn: Connection,
    key: String,
}

impl Progress {
    /// The record of `service`'s schedules on `conn`.
    pub(crate) fn new(conn: Connection, service: &str) -> Self {
        Self {
            conn,
            key: key(service),
        }
    }

    /// The latest tick recorded of each schedule that has one. A value
    /// that is not a Unix time (a hand-made field) counts as no record.
    pub(crate) async fn read(&self) -> Result<HashMap<String, DateTime<Utc>>, QueueError> {
        let mut conn = self.conn.clone();
        let fields: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&self.key)
            .query_async(&mut conn)
            .await?;
        Ok(fields
            .into_iter()
            .filter_map(|(schedule, at)| {
                let at = DateTime::from_timestamp(at.parse().ok()?, 0)?;
                Some((schedule, at))
            })
            .collect())
    }

    /// Records that `schedule`'s tick `at` is enqueued.
    pub(crate) async fn record(&self, schedule: &str, at: DateTime<Utc>) -> Result<(), QueueError> {
        let mut conn = self.conn.clone();
        RECORD
            .key(&self.key)
            .arg(schedule)
            .arg(at.timestamp())
            .invoke_async::<i64>(&mut conn)
            .await?;
        Ok(())
    }
}

/// Every script here, by name (the check that each passes every key it
/// touches in KEYS).
#[cfg(test)]
pub(crate) fn scripts() -> Vec<(&'static str, &'static Script)> {
    vec![("RECORD", &RECORD)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::Client;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(seconds, 0).unwrap()
    }

    /// Needs Valkey or Redis at `VALKEY_ADDR`, as the kit's integration
    /// tests do.
    #[tokio::test]
    async fn a_record_only_moves_forward_and_a_bad_value_counts_as_none() {
        let addr = std::env::var("VALKEY_ADDR").unwrap_or_else(|_| "127.0.0.1:6379".into());
        let client = Client::connect(&addr, None, 0)
            .await
            .expect("this test needs Valkey or Redis at VALKEY_ADDR (default 127.0.0.1:6379)");
        let service = format!("test_{}", uuid::Uuid::now_v7().simple());
        let progress = Progress::new(client.connection(), &service);
        assert!(progress.read().await.unwrap().is_empty(), "a first start");

        progress.record("beat", at(1_000)).await.unwrap();
        progress.record("beat", at(900)).await.unwrap();
        progress.record("other", at(5)).await.unwrap();
        let mut conn = client.connection();
        redis::cmd("HSET")
            .arg(key(&service))
            .arg("hand_made")
            .arg("soon")
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        let recorded = progress.read().await.unwrap();
        redis::cmd("DEL")
            .arg(key(&service))
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        assert_eq!(recorded.len(), 2, "{recorded:?}");
        assert_eq!(recorded["beat"], at(1_000), "a late write moved it back");
        assert_eq!(recorded["other"], at(5));
    }

    #[test]
    fn the_key_shares_the_leases_hash_tag() {
        assert_eq!(key("shop"), "scheduler:{shop}:last_ticks");
        assert_eq!(
            key("shop").split_once('}').map(|(tag, _)| tag),
            super::super::lease::key("shop")
                .split_once('}')
                .map(|(tag, _)| tag)
        );
    }
}
