//! The task as stored in Valkey: asynq's `TaskMessage` protobuf.
//!
//! The struct mirrors `proto/asynq.proto` of hibiken/asynq (the same file
//! the `asynq` crate 0.1.8 ships), field for field and tag for tag, so Go
//! asynq workers, asynqmon and the asynq CLI read what this module writes
//! and the other way round. It is derived with `prost` instead of generated
//! at build time, so the build needs no `protoc`; a test pins every tag.

use std::collections::BTreeMap;

/// asynq's internal task representation (`asynq.TaskMessage`), the value
/// of the `msg` field of a task hash. Times are Unix seconds, durations
/// whole seconds; zero means "not set".
#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskMessage {
    /// The task type, such as `event:orderPlaced`.
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(bytes = "vec", tag = "2")]
    pub payload: Vec<u8>,
    #[prost(btree_map = "string, string", tag = "15")]
    pub headers: BTreeMap<String, String>,
    #[prost(string, tag = "3")]
    pub id: String,
    #[prost(string, tag = "4")]
    pub queue: String,
    /// Maximum number of retries.
    #[prost(int32, tag = "5")]
    pub retry: i32,
    /// Retries so far.
    #[prost(int32, tag = "6")]
    pub retried: i32,
    #[prost(string, tag = "7")]
    pub error_msg: String,
    #[prost(int64, tag = "11")]
    pub last_failed_at: i64,
    /// How long one run may take, in seconds.
    #[prost(int64, tag = "8")]
    pub timeout: i64,
    /// Unix time by which a run must finish.
    #[prost(int64, tag = "9")]
    pub deadline: i64,
    /// The uniqueness lock of a Go `asynq.Unique` task; empty otherwise.
    #[prost(string, tag = "10")]
    pub unique_key: String,
    #[prost(string, tag = "14")]
    pub group_key: String,
    /// How long the task is kept in `:completed` after success, in seconds.
    #[prost(int64, tag = "12")]
    pub retention: i64,
    #[prost(int64, tag = "13")]
    pub completed_at: i64,
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
}
