//! asynq's protobuf messages as stored in Valkey: the task
//! ([`TaskMessage`]), and the server state asynqmon's Servers page reads
//! ([`ServerInfo`], [`WorkerInfo`]).
//!
//! The structs mirror `proto/asynq.proto` of hibiken/asynq v0.26 (the
//! `TaskMessage` of the `asynq` crate 0.1.8 is the same), field for field
//! and tag for tag, so Go asynq workers, asynqmon and the asynq CLI read
//! what this module writes and the other way round. They are derived with
//! `prost` instead of generated at build time, so the build needs no
//! `protoc`; tests pin every tag.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};

/// asynq's internal task representation (`asynq.TaskMessage`), the value
/// of the `msg` field of a task hash. Times are Unix seconds, durations
/// whole seconds; zero means "not set".
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TaskMessage {
    /// The task type, such as `event:orderPlaced`.
    #[prost(string, tag = "1")]
    pub(crate) r#type: String,
    /// The payload, as the handler receives it.
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) payload: Vec<u8>,
    /// Key-value metadata for the handler (asynq's task headers).
    #[prost(btree_map = "string, string", tag = "15")]
    pub(crate) headers: BTreeMap<String, String>,
    /// The task id, unique in its queue.
    #[prost(string, tag = "3")]
    pub(crate) id: String,
    /// The queue the task belongs to.
    #[prost(string, tag = "4")]
    pub(crate) queue: String,
    /// Maximum number of retries.
    #[prost(int32, tag = "5")]
    pub(crate) retry: i32,
    /// Retries so far.
    #[prost(int32, tag = "6")]
    pub(crate) retried: i32,
    /// The error of the last failed run.
    #[prost(string, tag = "7")]
    pub(crate) error_msg: String,
    /// When the last run failed, in Unix seconds.
    #[prost(int64, tag = "11")]
    pub(crate) last_failed_at: i64,
    /// How long one run may take, in seconds.
    #[prost(int64, tag = "8")]
    pub(crate) timeout: i64,
    /// Unix time by which a run must finish.
    #[prost(int64, tag = "9")]
    pub(crate) deadline: i64,
    /// The uniqueness lock of a Go `asynq.Unique` task; empty otherwise.
    #[prost(string, tag = "10")]
    pub(crate) unique_key: String,
    /// The group of a Go aggregated task; empty otherwise.
    #[prost(string, tag = "14")]
    pub(crate) group_key: String,
    /// How long the task is kept in `:completed` after success, in seconds.
    #[prost(int64, tag = "12")]
    pub(crate) retention: i64,
    /// When the task completed, in Unix seconds.
    #[prost(int64, tag = "13")]
    pub(crate) completed_at: i64,
}

/// `google.protobuf.Timestamp`, as asynq.proto imports it.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub(crate) struct Timestamp {
    /// Seconds since the Unix epoch.
    #[prost(int64, tag = "1")]
    pub(crate) seconds: i64,
    /// Nanoseconds within that second.
    #[prost(int32, tag = "2")]
    pub(crate) nanos: i32,
}

impl Timestamp {
    /// The time it stands for, if it is one chrono can hold.
    pub(crate) fn to_datetime(self) -> Option<DateTime<Utc>> {
        DateTime::from_timestamp(self.seconds, u32::try_from(self.nanos).ok()?)
    }
}

impl From<DateTime<Utc>> for Timestamp {
    fn from(time: DateTime<Utc>) -> Self {
        Self {
            seconds: time.timestamp(),
            nanos: i32::try_from(time.timestamp_subsec_nanos()).unwrap_or(0),
        }
    }
}

/// One worker process as asynqmon's Servers page and Go's
/// `Inspector.Servers()` show it (`asynq.ServerInfo`).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ServerInfo {
    /// The host name of the server.
    #[prost(string, tag = "1")]
    pub(crate) host: String,
    /// The process id of the server.
    #[prost(int32, tag = "2")]
    pub(crate) pid: i32,
    /// A UUID, new at each start.
    #[prost(string, tag = "3")]
    pub(crate) server_id: String,
    /// How many tasks the server runs at once.
    #[prost(int32, tag = "4")]
    pub(crate) concurrency: i32,
    /// Queue name to priority (its weight).
    #[prost(map = "string, int32", tag = "5")]
    pub(crate) queues: HashMap<String, i32>,
    /// Whether higher-priority queues are always emptied first; never for this kit's worker.
    #[prost(bool, tag = "6")]
    pub(crate) strict_priority: bool,
    /// `active` while the server takes tasks.
    #[prost(string, tag = "7")]
    pub(crate) status: String,
    /// When the server started.
    #[prost(message, optional, tag = "8")]
    pub(crate) start_time: Option<Timestamp>,
    /// Tasks running now.
    #[prost(int32, tag = "9")]
    pub(crate) active_worker_count: i32,
    /// The kit's own, which Go asynq and asynqmon ignore: the layout of
    /// the ordered listeners' chains this worker keeps
    /// ([`CHAINS_LAYOUT`]), 0 for a server that keeps none of them (a Go
    /// asynq server, a worker of the kit's template set 22 or before).
    #[prost(uint32, tag = "100")]
    pub(crate) kit_chains: u32,
}

/// The layout of the ordered listeners' chains the kit's workers keep now:
/// beside each queue, in its hash slot (template set 23).
pub(crate) const CHAINS_LAYOUT: u32 = 2;

/// One running task of a server (`asynq.WorkerInfo`).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct WorkerInfo {
    /// The host name of the server running the task.
    #[prost(string, tag = "1")]
    pub(crate) host: String,
    /// The process id of the server running the task.
    #[prost(int32, tag = "2")]
    pub(crate) pid: i32,
    /// The `server_id` of that server's [`ServerInfo`].
    #[prost(string, tag = "3")]
    pub(crate) server_id: String,
    /// The id of the running task.
    #[prost(string, tag = "4")]
    pub(crate) task_id: String,
    /// The type of the running task.
    #[prost(string, tag = "5")]
    pub(crate) task_type: String,
    /// The payload of the running task.
    #[prost(bytes = "vec", tag = "6")]
    pub(crate) task_payload: Vec<u8>,
    /// The queue the task came from.
    #[prost(string, tag = "7")]
    pub(crate) queue: String,
    /// When the run started.
    #[prost(message, optional, tag = "8")]
    pub(crate) start_time: Option<Timestamp>,
    /// When the run must end.
    #[prost(message, optional, tag = "9")]
    pub(crate) deadline: Option<Timestamp>,
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// Splits an encoded message into (field number, wire type) pairs,
    /// independently of prost, to check the tags against asynq.proto.
    fn fields(mut bytes: &[u8]) -> Vec<(u64, u64)> {
        fn varint(bytes: &mut &[u8]) -> u64 {
            let mut value = 0;
            for shift in (0..64).step_by(7) {
                let byte = bytes[0];
                *bytes = &bytes[1..];
                value |= u64::from(byte & 0x7f) << shift;
                if byte & 0x80 == 0 {
                    break;
                }
            }
            value
        }
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let key = varint(&mut bytes);
            let (field, wire) = (key >> 3, key & 7);
            match wire {
                0 => {
                    varint(&mut bytes);
                }
                2 => {
                    let len = varint(&mut bytes) as usize;
                    bytes = &bytes[len..];
                }
                other => panic!("unexpected wire type {other}"),
            }
            out.push((field, wire));
        }
        out
    }

    #[test]
    fn every_field_has_the_tag_of_asynq_proto() {
        let message = TaskMessage {
            r#type: "t".into(),
            payload: vec![1],
            headers: BTreeMap::from([("k".into(), "v".into())]),
            id: "i".into(),
            queue: "q".into(),
            retry: 1,
            retried: 1,
            error_msg: "e".into(),
            last_failed_at: 1,
            timeout: 1,
            deadline: 1,
            unique_key: "u".into(),
            group_key: "g".into(),
            retention: 1,
            completed_at: 1,
        };
        let mut tags = fields(&message.encode_to_vec());
        tags.sort_unstable();
        // type=1 payload=2 id=3 queue=4 retry=5 retried=6 error_msg=7
        // timeout=8 deadline=9 unique_key=10 last_failed_at=11 retention=12
        // completed_at=13 group_key=14 headers=15
        let expected: Vec<(u64, u64)> = vec![
            (1, 2),
            (2, 2),
            (3, 2),
            (4, 2),
            (5, 0),
            (6, 0),
            (7, 2),
            (8, 0),
            (9, 0),
            (10, 2),
            (11, 0),
            (12, 0),
            (13, 0),
            (14, 2),
            (15, 2),
        ];
        assert_eq!(tags, expected);
    }

    #[test]
    fn decodes_what_it_encodes() {
        let message = TaskMessage {
            r#type: "event:orderPlaced".into(),
            payload: br#"{"id":"x"}"#.to_vec(),
            id: "x".into(),
            queue: "default".into(),
            retry: 25,
            timeout: 1800,
            retention: 86_400,
            ..TaskMessage::default()
        };
        let back = TaskMessage::decode(message.encode_to_vec().as_slice()).unwrap();
        assert_eq!(back, message);
    }

    #[test]
    fn server_and_worker_info_have_the_tags_of_asynq_proto() {
        let time = Some(Timestamp::from(Utc::now()));
        let server = ServerInfo {
            host: "h".into(),
            pid: 1,
            server_id: "s".into(),
            concurrency: 1,
            queues: HashMap::from([("default".into(), 1)]),
            strict_priority: true,
            status: "active".into(),
            start_time: time,
            active_worker_count: 1,
            kit_chains: 0,
        };
        let mut tags = fields(&server.encode_to_vec());
        tags.sort_unstable();
        let expected: Vec<(u64, u64)> = vec![
            (1, 2),
            (2, 0),
            (3, 2),
            (4, 0),
            (5, 2),
            (6, 0),
            (7, 2),
            (8, 2),
            (9, 0),
        ];
        assert_eq!(tags, expected);

        let worker = WorkerInfo {
            host: "h".into(),
            pid: 1,
            server_id: "s".into(),
            task_id: "t".into(),
            task_type: "y".into(),
            task_payload: vec![1],
            queue: "q".into(),
            start_time: time,
            deadline: time,
        };
        let mut tags = fields(&worker.encode_to_vec());
        tags.sort_unstable();
        let expected: Vec<(u64, u64)> = (1..=9)
            .map(|tag| (tag, if tag == 2 { 0 } else { 2 }))
            .collect();
        assert_eq!(tags, expected);
    }
}
