//! The scheduler's leader lease on Valkey: one key that names the replica
//! leading, with an expiry.
//!
//! - Taking it is `SET key token NX PX ttl`: it succeeds only when no
//!   replica holds it. A replica that fails learns how long the lease has
//!   left, and tries again when it ends.
//! - The leader renews it well before it expires (every third of the TTL),
//!   beside its enqueues, never behind them, with a compare-and-renew
//!   script: the expiry is pushed back only while the key still holds this
//!   replica's token. A renewal that fails is tried again; when another
//!   replica holds the key, the leadership ends.
//! - The leader also counts the lease as lost, without asking Valkey, once
//!   its own clock says the TTL has run out since the last renewal was
//!   sent: a process paused past its lease stops enqueuing at once when it
//!   resumes.
//! - At shutdown the leader deletes the key (compare-and-delete), so
//!   another replica takes over at once rather than after the TTL.
//!
//! The key carries a hash tag, so it works on Valkey Cluster as on a
//! single server; the connection is the queue's (TLS, Sentinel, Cluster).

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use uuid::Uuid;

use crate::queue::{Connection, QueueError};

/// Renews the lease if it is still ours. Returns 1, or 0 when it is not.
///
/// KEYS: the lease. ARGV: our token, the TTL in milliseconds.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call("GET", KEYS[1]) == ARGV[1] then
    return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0
"#,
    )
});

/// Deletes the lease if it is still ours. Returns 1, or 0 when it is not.
///
/// KEYS: the lease. ARGV: our token.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call("GET", KEYS[1]) == ARGV[1] then
    return redis.call("DEL", KEYS[1])
end
return 0
"#,
    )
});

/// The lease key of `service`: `scheduler:{<service>}:leader`.
pub(crate) fn key(service: &str) -> String {
    format!("scheduler:{{{service}}}:leader")
}

/// One replica's handle on the lease.
#[derive(Clone)]
pub(crate) struct Lease {
    conn: Connection,
    key: String,
    token: String,
    ttl: Duration,
}

/// The outcome of [`Lease::acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// This replica leads now.
    Leading,
    /// Another replica leads, for at most this long without renewing.
    HeldFor(Duration),
}

impl Lease {
    /// The lease of `service`, held for `ttl` at a time. Each handle has a
    /// token of its own.
    pub(crate) fn new(conn: Connection, service: &str, ttl: Duration) -> Self {
        Self {
            conn,
            key: key(service),
            token: Uuid::new_v4().to_string(),
            ttl,
        }
    }

    /// How long a lease lasts without renewal.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Tries to take the lease.
    pub(crate) async fn acquire(&self) -> Result<Acquired, QueueError> {
        let mut conn = self.conn.clone();
        let (set, left): (Option<String>, i64) = redis::pipe()
            .cmd("SET")
            .arg(&self.key)
            .arg(&self.token)
            .arg("NX")
            .arg("PX")
            .arg(self.ttl_ms())
            .cmd("PTTL")
            .arg(&self.key)
            .query_async(&mut conn)
            .await?;
        if set.is_some() {
            return Ok(Acquired::Leading);
        }
        // -2: the key expired between the two commands; -1: no expiry,
        // which only a hand-made key has. Either way, try again soon.
        let left = u64::try_from(left).unwrap_or(0);
        Ok(Acquired::HeldFor(Duration::from_millis(left)))
    }

    /// Pushes the expiry back by the TTL if the lease is still ours.
    pub(crate) async fn renew(&self) -> Result<bool, QueueError> {
        let mut conn = self.conn.clone();
        let renewed: i64 = RENEW
            .key(&self.key)
            .arg(&self.token)
            .arg(self.ttl_ms())
            .invoke_async(&mut conn)
            .await?;
        Ok(renewed == 1)
    }

    /// Gives the lease up if it is still ours.
    pub(crate) async fn release(&self) -> Result<(), QueueError> {
        let mut conn = self.conn.clone();
        RELEASE
            .key(&self.key)
            .arg(&self.token)
            .invoke_async::<i64>(&mut conn)
            .await?;
        Ok(())
    }
}

/// Every script here, by name (the check that each passes every key it
/// touches in KEYS).
#[cfg(test)]
pub(crate) fn scripts() -> Vec<(&'static str, &'static Script)> {
    vec![("RENEW", &RENEW), ("RELEASE", &RELEASE)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_has_a_hash_tag_naming_the_service() {
        assert_eq!(key("shop"), "scheduler:{shop}:leader");
    }
}
