//! The `orderPlaced` event.

use kit::prelude::*;
use serde::{Deserialize, Serialize};

/// The wire name, shared with Go services on the same queue.
pub const NAME: &str = "orderPlaced";

/// Describe what happened; the fields travel as the event's JSON payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: uuid::Uuid,
    pub total_cents: i64,
    pub note: Option<String>,
}

impl Event for OrderPlaced {
    const NAME: &'static str = NAME;
}
