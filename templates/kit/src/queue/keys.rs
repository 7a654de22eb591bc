//! The names of asynq's keys in Valkey.
//!
//! Every key of a queue carries the queue name in braces, `asynq:{<queue>}:`,
//! so that all of them hash to one cluster slot and one Lua script may touch
//! them together. The layout is Go asynq's (`internal/base/base.go`).
//! Besides the queues: the server state asynqmon shows, and the channel
//! asynqmon publishes cancellations on.

use chrono::{DateTime, Utc};

/// The set of all queue names, read by asynqmon and the asynq CLI.
pub(crate) const ALL_QUEUES: &str = "asynq:queues";

/// Sorted set of the server-info keys of running workers, scored by expiry.
pub(crate) const ALL_SERVERS: &str = "asynq:servers";

/// Sorted set of the workers keys of running workers, scored by expiry.
pub(crate) const ALL_WORKERS: &str = "asynq:workers";

/// The pub/sub channel on which asynqmon and Go's
/// `Inspector.CancelProcessing` publish the id of a task to cancel.
pub(crate) const CANCEL_CHANNEL: &str = "asynq:cancel";

/// `asynq:servers:{<host>:<pid>:<server id>}`: a worker's `ServerInfo`.
pub(crate) fn server_info(host: &str, pid: u32, server_id: &str) -> String {
    format!("asynq:servers:{{{host}:{pid}:{server_id}}}")
}

/// `asynq:workers:{<host>:<pid>:<server id>}`: a hash of the `WorkerInfo`
/// of each task the worker runs, by task id.
pub(crate) fn workers(host: &str, pid: u32, server_id: &str) -> String {
    format!("asynq:workers:{{{host}:{pid}:{server_id}}}")
}

/// `asynq:{<queue>}:`, the prefix of every key of a queue.
pub(crate) fn queue_prefix(queue: &str) -> String {
    format!("asynq:{{{queue}}}:")
}

/// `asynq:{<queue>}:gpkit:cancelled-before`, the ids of listener tasks
/// cancelled before the fan-out made them (`outbox cancel`), scored by the
/// time of the cancel: the fan-out's enqueue leaves them out.
pub(crate) fn cancelled_before(queue: &str) -> String {
    format!("asynq:{{{queue}}}:gpkit:cancelled-before")
}

/// `asynq:{<queue>}:t:<id>`, the hash holding a task's `msg` and `state`.
pub(crate) fn task(queue: &str, id: &str) -> String {
    format!("asynq:{{{queue}}}:t:{id}")
}

/// [`task`] for an id as Valkey holds it, bytes that need not be UTF-8
/// (a Go producer's id is any string of bytes).
pub(crate) fn task_of(queue: &str, id: &[u8]) -> Vec<u8> {
    let mut key = format!("asynq:{{{queue}}}:t:").into_bytes();
    key.extend_from_slice(id);
    key
}

/// The list of pending task ids (pushed left, popped right).
pub(crate) fn pending(queue: &str) -> String {
    format!("asynq:{{{queue}}}:pending")
}

/// The list of ids being processed.
pub(crate) fn active(queue: &str) -> String {
    format!("asynq:{{{queue}}}:active")
}

/// Sorted set of active ids, scored by lease expiry (Unix seconds).
pub(crate) fn lease(queue: &str) -> String {
    format!("asynq:{{{queue}}}:lease")
}

/// Exists while the queue is paused (by asynqmon or the CLI).
pub(crate) fn paused(queue: &str) -> String {
    format!("asynq:{{{queue}}}:paused")
}

/// Sorted set of ids scheduled for later, scored by when they are due.
pub(crate) fn scheduled(queue: &str) -> String {
    format!("asynq:{{{queue}}}:scheduled")
}

/// Sorted set of ids waiting for a retry, scored by when they are due.
pub(crate) fn retry(queue: &str) -> String {
    format!("asynq:{{{queue}}}:retry")
}

/// Sorted set of ids that ran out of retries, scored by when they died.
pub(crate) fn archived(queue: &str) -> String {
    format!("asynq:{{{queue}}}:archived")
}

/// Sorted set of succeeded ids kept for their retention, scored by expiry.
pub(crate) fn completed(queue: &str) -> String {
    format!("asynq:{{{queue}}}:completed")
}

/// The set of a queue's group names (task aggregation, not used by this
/// kit; asynq's "run" script keeps it tidy).
pub(crate) fn all_groups(queue: &str) -> String {
    format!("asynq:{{{queue}}}:groups")
}

/// The sorted set of a group's tasks (task aggregation, not used by this
/// kit; Go services may group tasks).
pub(crate) fn group(queue: &str, group: &str) -> String {
    format!("asynq:{{{queue}}}:g:{group}")
}

/// `deferred:{<queue>}:woken`, the kit's own (not Go asynq's): a sorted
/// set of the ids of active tasks woken before their deferral was written,
/// scored by when (Unix s), so that the deferral sends them straight back
/// to pending. It shares the queue's hash tag, so scripts may touch it
/// with the queue's keys.
pub(crate) fn woken(queue: &str) -> String {
    format!("deferred:{{{queue}}}:woken")
}

/// Count of tasks processed on a day (UTC), as asynqmon charts them.
pub(crate) fn processed_on(queue: &str, day: DateTime<Utc>) -> String {
    format!("asynq:{{{queue}}}:processed:{}", day.format("%Y-%m-%d"))
}

/// Count of tasks that failed on a day (UTC).
pub(crate) fn failed_on(queue: &str, day: DateTime<Utc>) -> String {
    format!("asynq:{{{queue}}}:failed:{}", day.format("%Y-%m-%d"))
}

/// Count of tasks processed since the queue existed.
pub(crate) fn processed_total(queue: &str) -> String {
    format!("asynq:{{{queue}}}:processed")
}

/// Count of tasks that failed since the queue existed.
pub(crate) fn failed_total(queue: &str) -> String {
    format!("asynq:{{{queue}}}:failed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_go_asynq() {
        assert_eq!(task("default", "abc"), "asynq:{default}:t:abc");
        assert_eq!(pending("default"), "asynq:{default}:pending");
        assert_eq!(lease("critical"), "asynq:{critical}:lease");
        let day = "2026-01-02T03:04:05Z".parse().unwrap();
        assert_eq!(
            processed_on("default", day),
            "asynq:{default}:processed:2026-01-02"
        );
        assert_eq!(server_info("h", 7, "s"), "asynq:servers:{h:7:s}");
        assert_eq!(workers("h", 7, "s"), "asynq:workers:{h:7:s}");
    }

    /// The hash tag of `key`: what Valkey Cluster hashes to pick its slot.
    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').expect("a hash tag");
        let close = open + key[open..].find('}').expect("a closed hash tag");
        &key[open + 1..close]
    }

    #[test]
    fn every_key_a_script_touches_shares_its_queues_slot() {
        // Every key of a queue that scripts are given carries its tag.
        let day = "2026-01-02T03:04:05Z".parse().unwrap();
        for key in [
            task("shop", "id"),
            group("shop", "g"),
            pending("shop"),
            active("shop"),
            lease("shop"),
            scheduled("shop"),
            retry("shop"),
            archived("shop"),
            completed("shop"),
            paused("shop"),
            woken("shop"),
            processed_on("shop", day),
            failed_on("shop", day),
            processed_total("shop"),
            failed_total("shop"),
        ] {
            assert_eq!(hash_tag(&key), "shop", "{key}");
        }
        assert_eq!(
            hash_tag(&server_info("h", 7, "s")),
            hash_tag(&workers("h", 7, "s"))
        );
    }
}
