//! The scheduler state asynqmon's Schedulers page reads, in Go asynq's
//! layout: the leader's entries and, per entry, the ticks it enqueued.
//!
//! - `asynq:schedulers` (sorted set, score = expiry) lists the key
//!   `asynq:schedulers:{<scheduler id>}`, a list of `SchedulerEntry`
//!   messages, one per schedule; the leader rewrites it at each lease
//!   renewal, with an expiry of one lease TTL, and deletes it when it steps
//!   down, so the page shows the current leader's schedules.
//! - `asynq:scheduler_history:<entry id>` (sorted set, score = enqueue time)
//!   holds a `SchedulerEnqueueEvent` per tick enqueued, the last 1,000.
//!   Entry ids are UUIDv5 of the service and the schedule's name, so the
//!   history of a schedule carries on across leaders.
//!
//! The messages mirror `proto/asynq.proto` of hibiken/asynq v0.26, as
//! `crate::queue::message` does for the task and server state. Failures
//! here are logged, never fatal: the page is for people, the ticks are not
//! affected.

use std::sync::LazyLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use prost::Message as _;
use uuid::Uuid;

use super::spec::Spec;
use super::{Entry, Schedules, Tick};
use crate::queue::message::Timestamp;
use crate::queue::{Client, QueueError};

/// The sorted set of every scheduler's entries key.
pub(crate) const ALL_SCHEDULERS: &str = "asynq:schedulers";

/// How many enqueue events a schedule's history keeps.
const HISTORY_LENGTH: isize = 1000;

/// One schedule as asynqmon shows it (`asynq.SchedulerEntry`).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SchedulerEntry {
    #[prost(string, tag = "1")]
    pub(crate) id: String,
    #[prost(string, tag = "2")]
    pub(crate) spec: String,
    #[prost(string, tag = "3")]
    pub(crate) task_type: String,
    #[prost(bytes = "vec", tag = "4")]
    pub(crate) task_payload: Vec<u8>,
    #[prost(string, repeated, tag = "5")]
    pub(crate) enqueue_options: Vec<String>,
    #[prost(message, optional, tag = "6")]
    pub(crate) next_enqueue_time: Option<Timestamp>,
    #[prost(message, optional, tag = "7")]
    pub(crate) prev_enqueue_time: Option<Timestamp>,
}

/// One tick enqueued (`asynq.SchedulerEnqueueEvent`).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SchedulerEnqueueEvent {
    #[prost(string, tag = "1")]
    pub(crate) task_id: String,
    #[prost(message, optional, tag = "2")]
    pub(crate) enqueue_time: Option<Timestamp>,
}

/// This process's scheduler id, `host:pid:uuid` as Go's.
static SCHEDULER_ID: LazyLock<String> = LazyLock::new(|| {
    let host = hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into());
    format!("{host}:{}:{}", std::process::id(), Uuid::new_v4())
});

/// `asynq:schedulers:{<scheduler id>}`.
pub(crate) fn entries_key(scheduler_id: &str) -> String {
    format!("asynq:schedulers:{{{scheduler_id}}}")
}

/// `asynq:scheduler_history:<entry id>`.
pub(crate) fn history_key(entry_id: &str) -> String {
    format!("asynq:scheduler_history:{entry_id}")
}

/// The id asynqmon knows `schedule` by.
pub(crate) fn entry_id(schedule: &str) -> String {
    let name = format!("{}/{schedule}", env!("CARGO_PKG_NAME"));
    Uuid::new_v5(&Uuid::NAMESPACE_OID, name.as_bytes()).to_string()
}

/// The entry of one schedule, now.
fn entry(schedule: &Entry, spec: &Spec) -> SchedulerEntry {
    let now = Utc::now();
    let cron = if schedule.time_zone == "UTC" {
        schedule.cron.to_string()
    } else {
        format!("CRON_TZ={} {}", schedule.time_zone, schedule.cron)
    };
    SchedulerEntry {
        id: entry_id(schedule.name),
        spec: cron,
        task_type: schedule.task_type(),
        task_payload: Vec::new(),
        enqueue_options: Vec::new(),
        next_enqueue_time: spec.next_after(now).map(Timestamp::from),
        prev_enqueue_time: spec.latest(now, 1).first().copied().map(Timestamp::from),
    }
}

/// Writes this leader's entries, expiring after `ttl`.
pub(crate) async fn write_entries(
    queue: &Client,
    schedules: &Schedules,
    specs: &[Spec],
    ttl: Duration,
) {
    let key = entries_key(&SCHEDULER_ID);
    let encoded: Vec<Vec<u8>> = schedules
        .all()
        .iter()
        .zip(specs)
        .map(|(schedule, spec)| entry(schedule, spec).encode_to_vec())
        .collect();
    let ttl_secs = ttl.as_secs().max(1);
    let expiry = Utc::now().timestamp() + i64::try_from(ttl_secs).unwrap_or(i64::MAX);
    let mut conn = queue.connection();
    let written = async {
        // The list and its set entry are in different cluster slots: two
        // round trips.
        let mut pipe = redis::pipe();
        pipe.cmd("DEL").arg(&key).ignore();
        if !encoded.is_empty() {
            pipe.cmd("LPUSH").arg(&key).arg(&encoded).ignore();
        }
        pipe.cmd("EXPIRE").arg(&key).arg(ttl_secs).ignore();
        pipe.query_async::<()>(&mut conn).await?;
        redis::cmd("ZADD")
            .arg(ALL_SCHEDULERS)
            .arg(expiry)
            .arg(&key)
            .query_async::<()>(&mut conn)
            .await
    };
    if let Err(err) = written.await {
        tracing::debug!(error = %err, "scheduler: failed to write the Schedulers page state");
    }
}

/// Removes this process's entries (when it stops leading).
pub(crate) async fn clear_entries(queue: &Client) {
    let key = entries_key(&SCHEDULER_ID);
    let mut conn = queue.connection();
    let cleared = async {
        redis::cmd("ZREM")
            .arg(ALL_SCHEDULERS)
            .arg(&key)
            .query_async::<()>(&mut conn)
            .await?;
        redis::cmd("DEL")
            .arg(&key)
            .query_async::<()>(&mut conn)
            .await
    };
    if let Err(err) = cleared.await {
        tracing::debug!(error = %err, "scheduler: failed to clear the Schedulers page state");
    }
}

/// Records that `tick` of `schedule` was enqueued now.
pub(crate) async fn record(queue: &Client, schedule: &Entry, tick: &Tick) {
    let now = Utc::now();
    let event = SchedulerEnqueueEvent {
        task_id: tick.id.to_string(),
        enqueue_time: Some(Timestamp::from(now)),
    };
    let key = history_key(&entry_id(schedule.name));
    let mut conn = queue.connection();
    let recorded = redis::pipe()
        .cmd("ZADD")
        .arg(&key)
        .arg(now.timestamp())
        .arg(event.encode_to_vec())
        .ignore()
        .cmd("ZREMRANGEBYRANK")
        .arg(&key)
        .arg(0)
        .arg(-HISTORY_LENGTH - 1)
        .ignore()
        .query_async::<()>(&mut conn)
        .await;
    if let Err(err) = recorded {
        tracing::debug!(error = %err, "scheduler: failed to record a tick for asynqmon");
    }
}

/// A scheduler that leads, as its state on Valkey says: its id
/// (`host:pid:uuid`), until when that state holds unless renewed, and its
/// schedules.
#[derive(Debug)]
pub(crate) struct Leading {
    pub(crate) scheduler_id: String,
    pub(crate) until: DateTime<Utc>,
    pub(crate) entries: Vec<SchedulerEntry>,
}

/// Every scheduler whose state has not expired, this service's and any
/// other's sharing the Valkey (Go asynq's included), as asynqmon lists them.
pub(crate) async fn leading(queue: &Client) -> Result<Vec<Leading>, QueueError> {
    let mut conn = queue.connection();
    let now = Utc::now().timestamp();
    let keys: Vec<(String, i64)> = redis::cmd("ZRANGEBYSCORE")
        .arg(ALL_SCHEDULERS)
        .arg(now)
        .arg("+inf")
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await?;
    let mut leading = Vec::new();
    for (key, until) in keys {
        let encoded: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await?;
        let entries = encoded
            .iter()
            .filter_map(|bytes| SchedulerEntry::decode(bytes.as_slice()).ok())
            .collect();
        let scheduler_id = key
            .strip_prefix("asynq:schedulers:{")
            .and_then(|rest| rest.strip_suffix('}'))
            .unwrap_or(&key)
            .to_string();
        leading.push(Leading {
            scheduler_id,
            until: DateTime::from_timestamp(until, 0).unwrap_or_default(),
            entries,
        });
    }
    Ok(leading)
}

/// The last tick enqueued for the schedule `entry_id`: its task id and
/// when, from its history.
pub(crate) async fn last_enqueued(
    queue: &Client,
    entry_id: &str,
) -> Result<Option<(String, DateTime<Utc>)>, QueueError> {
    let mut conn = queue.connection();
    let newest: Vec<Vec<u8>> = redis::cmd("ZRANGE")
        .arg(history_key(entry_id))
        .arg(-1)
        .arg(-1)
        .query_async(&mut conn)
        .await?;
    Ok(newest.first().and_then(|bytes| {
        let event = SchedulerEnqueueEvent::decode(bytes.as_slice()).ok()?;
        Some((event.task_id, event.enqueue_time?.to_datetime()?))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_go_asynqs() {
        assert_eq!(entries_key("h:1:u"), "asynq:schedulers:{h:1:u}");
        assert_eq!(history_key("e"), "asynq:scheduler_history:e");
    }

    /// Tags as in asynq.proto: SchedulerEntry id=1 spec=2 task_type=3
    /// task_payload=4 enqueue_options=5 next=6 prev=7; event task_id=1
    /// enqueue_time=2.
    #[test]
    fn messages_use_asynq_protos_tags() {
        let entry = SchedulerEntry {
            id: "i".into(),
            spec: "s".into(),
            task_type: "t".into(),
            task_payload: vec![1],
            enqueue_options: vec!["o".into()],
            next_enqueue_time: Some(Timestamp {
                seconds: 1,
                nanos: 0,
            }),
            prev_enqueue_time: Some(Timestamp {
                seconds: 2,
                nanos: 0,
            }),
        };
        // Each field: (tag << 3 | wire type 2), length, bytes.
        let expected: &[u8] = &[
            0x0a, 1, b'i', 0x12, 1, b's', 0x1a, 1, b't', 0x22, 1, 1, 0x2a, 1, b'o', 0x32, 2, 0x08,
            1, 0x3a, 2, 0x08, 2,
        ];
        assert_eq!(entry.encode_to_vec(), expected);
        let event = SchedulerEnqueueEvent {
            task_id: "x".into(),
            enqueue_time: None,
        };
        assert_eq!(event.encode_to_vec(), [0x0a, 1, b'x']);
    }
}
