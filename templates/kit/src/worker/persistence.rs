//! The start-up check of Valkey's persistence. Once the relay marks an
//! event published, the only copy of its task is in Valkey: a server that
//! restarts without persistence loses every queued and retrying task. The
//! worker reads `appendonly` and `save` with `CONFIG GET` and warns when
//! neither AOF nor snapshots are on. Where `CONFIG` is refused (managed
//! services, ACL users without `+config`), it says nothing.

use std::time::Duration;

use crate::queue::Client;

/// How long the check waits for Valkey.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// What the server persists, as far as it tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Persistence {
    /// `appendonly yes`: every write goes to the append-only file.
    pub(crate) append_only: bool,
    /// The `save` rules (`3600 1 300 100 60 10000`); empty: no snapshots.
    pub(crate) save: String,
}

impl Persistence {
    /// Whether a restart would lose everything queued.
    pub(crate) fn is_off(&self) -> bool {
        !self.append_only && self.save.trim().is_empty()
    }
}

/// The server's persistence settings; `None` where it refuses `CONFIG`.
pub(crate) async fn read(queue: &Client) -> Option<Persistence> {
    let settings = async {
        let append_only = queue.config_get("appendonly").await.ok()?;
        let save = queue.config_get("save").await.ok()?;
        Some(Persistence {
            append_only: append_only.eq_ignore_ascii_case("yes"),
            save,
        })
    };
    tokio::time::timeout(CHECK_TIMEOUT, settings)
        .await
        .ok()
        .flatten()
}

/// Logs a warning when Valkey persists nothing.
pub(crate) async fn warn_if_off(queue: &Client) {
    match read(queue).await {
        Some(persistence) if persistence.is_off() => tracing::warn!(
            "Valkey persists nothing (appendonly no, save \"\"): a restart of Valkey loses \
             every queued and retrying task, and their events never reach their listeners; \
             turn on AOF (appendonly yes, appendfsync everysec), see kit/docs/valkey.md"
        ),
        Some(_) => {}
        None => tracing::debug!("Valkey refused CONFIG GET; its persistence is not checked"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persistence_is_off_only_without_aof_and_snapshots() {
        let settings = |append_only, save: &str| Persistence {
            append_only,
            save: save.to_string(),
        };
        assert!(settings(false, "").is_off());
        assert!(!settings(true, "").is_off());
        assert!(!settings(false, "3600 1").is_off());
    }
}
