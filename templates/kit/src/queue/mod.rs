//! The task queue on Valkey, in Go asynq's wire format: a Go service built
//! on asynq and this service can share one Valkey and consume each other's
//! tasks, and asynqmon and the asynq CLI can inspect the queues.
//!
//! - [`Target`] and [`Connection`]: where Valkey is (a server over TCP or
//!   TLS, or a Sentinel group) and the one connection every command uses.
//! - [`Client`]: one shared, self-reconnecting connection; [`Client::enqueue`]
//!   writes a batch of [`NewTask`]s in one pipelined round trip, reporting
//!   per task whether it was [`EnqueueOutcome::Enqueued`] or a
//!   [`EnqueueOutcome::Duplicate`] of a task id already in the queue.
//! - [`Consumer`]: the worker's loop, running a handler per task type (see
//!   its module docs for leases, retries, shutdown, recovery, cancellation
//!   and the server state asynqmon shows).
//! - [`TaskInfo`], [`QueueCounts`] and [`Client::run_task`]: what the
//!   `outbox` command reads and does, as asynqmon would (module `inspect`).
//! - [`QueueWeights`]: `WORKER_QUEUES`, such as `default=1,critical=6`;
//!   [`QueueNames`]: `OUTBOX_QUEUES`, such as `shop,billing`.
//!
//! The storage layout ([`keys`]), the protobuf messages ([`message`]:
//! `TaskMessage`, `ServerInfo`, `WorkerInfo`) and the Lua scripts
//! ([`scripts`]) are Go asynq's, unchanged.
//!
//! # Why not the `asynq` crate
//!
//! The `asynq` crate (0.1.8) speaks the same format, but this module uses
//! only `redis` and `prost` and carries Go asynq's scripts itself:
//! - its `Client` opens a new TCP connection for every operation and has
//!   no batch enqueue, so a relay cannot publish a batch in one round trip;
//! - its `Server` stops only on Ctrl-C (not SIGTERM, nor a token), drops its
//!   abort channel at creation so `shutdown_timeout` aborts nothing, leases
//!   tasks for a fixed hour, and never extends a lease (its extend-lease
//!   script runs `SISMEMBER` on the lease sorted set: a WRONGTYPE error);
//!   a task cut short at shutdown is retried as a failure, not put back to
//!   pending; its recoverer waits 10·(n+1) s instead of Go's backoff, and it
//!   deletes completed tasks 7 days after their retention;
//! - it adds 51 crates to the project (174 → 225), against 15 for `redis`,
//!   `prost` and `tokio-util` together.
//!
//! What was worth reusing from it, its copy of Go's scripts and of
//! `asynq.proto`, is reused as source, with tests pinning both.

mod admin;
mod broker;
mod client;
mod completions;
mod connection;
mod consumer;
mod inspect;
pub(crate) mod keys;
pub(crate) mod message;
pub(crate) mod scripts;
pub(crate) mod wakeup;

pub(crate) use crate::config::QueueWeights;
pub(crate) use broker::{default_retry_delay, snoozes_of};
pub(crate) use client::{Client, EnqueueOutcome, NewTask};
pub(crate) use client::{DEFAULT_QUEUE, DEFAULT_TIMEOUT};
pub(crate) use connection::{Connection, Target};
pub use consumer::SkipRetry;
pub(crate) use consumer::{
    CancelVerdict, Consumer, ConsumerOptions, HandlerError, SNOOZES_HEADER, Task,
};
pub(crate) use inspect::{DeleteOutcome, QueueCounts, QueueStats, RunOutcome, TaskInfo};

/// Why a queue operation failed. Never contains the Valkey password.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// No connection could be made.
    #[error("cannot connect to Valkey at {addr}")]
    Connect {
        /// The address tried.
        addr: String,
        /// The client's error.
        #[source]
        source: redis::RedisError,
    },
    /// A configured address is not `host:port`.
    #[error("`{0}` is not a Valkey address; expected host:port, such as localhost:6379")]
    Address(String),
    /// `VALKEY_URL` has an unknown scheme.
    #[error(
        "VALKEY_URL is not a Valkey URL; expected redis://, rediss://, valkey:// or valkeys://"
    )]
    Url,
    /// The CA certificate could not be read.
    #[error("cannot read the CA certificate VALKEY_CA_CERT `{path}`")]
    CaCert {
        /// The certificate's path.
        path: String,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// A command failed. Its message includes Valkey's (a refused key
    /// says so): the error is logged on one line, so it has no source.
    #[error("Valkey command failed: {0}")]
    Redis(redis::RedisError),
    /// Valkey's reply has an unexpected shape.
    #[error("Valkey sent an unexpected reply: {0}")]
    UnexpectedReply(String),
    /// The task cannot be enqueued as it is.
    #[error("invalid task: {0}")]
    InvalidTask(String),
    /// A stored task does not decode as a `TaskMessage`.
    #[error("a task in queue `{queue}` is not a valid asynq TaskMessage")]
    Decode {
        /// The queue the task is in.
        queue: String,
        /// The decoding error.
        #[source]
        source: prost::DecodeError,
    },
    /// The consumer's options contradict each other.
    #[error("invalid consumer options: {0}")]
    Options(String),
}

impl From<redis::RedisError> for QueueError {
    fn from(err: redis::RedisError) -> Self {
        Self::Redis(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_command_says_what_valkey_answered_once() {
        let refused = redis::RedisError::from((
            redis::ErrorKind::Extension,
            "NOPERM",
            "this user has no permissions to access the 'deferred:{default}:woken' key".to_string(),
        ));

        let err = QueueError::from(refused);

        let text = err.to_string();
        assert!(text.starts_with("Valkey command failed: "), "{text}");
        assert!(text.contains("'deferred:{default}:woken' key"), "{text}");
        assert!(
            std::error::Error::source(&err).is_none(),
            "a chain printed with `{{:#}}` would repeat Valkey's answer"
        );
    }
}
