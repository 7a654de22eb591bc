//! The envelope every event travels in, identical to the Go kit's:
//! `{"id", "name", "payload", "metadata", "occurred_at"}`.

use std::collections::BTreeMap;

use chrono::{DateTime, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use crate::trace_context::Metadata;

/// An event with its identity. The id is the event's idempotency key: the
/// queue task id, and what listeners deduplicate on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// The event id, unique per event: the idempotency key.
    pub id: Uuid,
    /// The event's wire name, lowerCamelCase (`orderPlaced`).
    pub name: String,
    /// The event, as its JSON serialisation.
    pub payload: serde_json::Value,
    /// Key-value context carried with the event, such as the trace context.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: Metadata,
    /// RFC 3339, microsecond precision (what Postgres stores).
    pub occurred_at: DateTime<Utc>,
}

impl Envelope {
    /// A new envelope with a fresh time-ordered id (UUIDv7), occurring now.
    pub fn new(name: impl Into<String>, payload: serde_json::Value) -> Self {
        Self {
            id: Uuid::now_v7(),
            name: name.into(),
            payload,
            metadata: Metadata::new(),
            occurred_at: Utc::now().trunc_subsecs(6),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_like_the_go_kit() {
        let mut envelope = Envelope::new("orderPlaced", serde_json::json!({"order_id": 7}));
        envelope.occurred_at = "2026-01-02T03:04:05.123456Z".parse().unwrap();
        let json = serde_json::to_value(&envelope).unwrap();
        assert_eq!(json["name"], "orderPlaced");
        assert_eq!(json["payload"]["order_id"], 7);
        assert_eq!(json["occurred_at"], "2026-01-02T03:04:05.123456Z");
        assert!(json.get("metadata").is_none(), "empty metadata is omitted");
        assert_eq!(json["id"], envelope.id.to_string());
        let back: Envelope = serde_json::from_value(json).unwrap();
        assert_eq!(back, envelope);
    }

    #[test]
    fn ids_are_time_ordered() {
        let first = Envelope::new("a", serde_json::Value::Null);
        let second = Envelope::new("a", serde_json::Value::Null);
        assert_eq!(first.id.get_version_num(), 7);
        assert!(first.id < second.id);
    }
}
