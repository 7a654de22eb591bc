//! The heartbeat: every `heartbeat_interval` it extends the leases of the
//! tasks held and writes the server state asynqmon shows (this worker's
//! `ServerInfo`, one `WorkerInfo` per running task), deleted at shutdown.

use std::sync::Arc;

use chrono::Utc;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use super::{ConsumerOptions, RunningConsumer};
use crate::queue::message::{CHAINS_LAYOUT, ServerInfo};

impl RunningConsumer {
    /// Every heartbeat interval until `stop`: writes the server state and
    /// extends the leases of running tasks. Deletes the server state when
    /// stopped.
    pub(super) async fn heartbeat(self: Arc<Self>, stop: CancellationToken) {
        loop {
            self.beat().await;
            tokio::select! {
                () = stop.cancelled() => break,
                () = sleep(self.options.heartbeat_interval) => {}
            }
        }
        if let Err(err) = self.client.clear_server_state(&self.server).await {
            tracing::warn!(error = %err, "could not clear the server state");
        }
    }

    /// One heartbeat, as Go asynq's `heartbeater.beat`.
    async fn beat(&self) {
        let workers = self.active.worker_infos(&self.server);
        let server = ServerInfo {
            active_worker_count: i32::try_from(workers.len()).unwrap_or(i32::MAX),
            ..self.server.clone()
        };
        let ttl = self.options.heartbeat_interval * 2;
        if let Err(err) = self.client.write_server_state(&server, &workers, ttl).await {
            tracing::warn!(error = %err, "could not write the server state");
        }

        let leased = self.active.leased_by_queue();
        if leased.is_empty() {
            return;
        }
        let until = Instant::now() + self.options.lease_duration;
        let until_utc = Utc::now() + self.options.lease_duration;
        match self.client.extend_leases(&leased, until_utc).await {
            Ok(()) => self.active.extend(&leased, until),
            Err(err) => tracing::warn!(error = %err, "could not extend task leases"),
        }
    }
}

/// This worker's identity and configuration, as Go asynq's heartbeater
/// reports them: host, pid, a new server id, concurrency, and the queues
/// with their weights as priorities.
pub(super) fn server_info(options: &ConsumerOptions) -> ServerInfo {
    let host = hostname::get()
        .ok()
        .and_then(|host| host.into_string().ok())
        .unwrap_or_else(|| "unknown-host".into());
    ServerInfo {
        host,
        pid: i32::try_from(std::process::id()).unwrap_or(0),
        server_id: uuid::Uuid::new_v4().to_string(),
        concurrency: i32::try_from(options.concurrency).unwrap_or(i32::MAX),
        queues: options
            .queues
            .weights()
            .map(|(name, weight)| (name.to_string(), i32::try_from(weight).unwrap_or(i32::MAX)))
            .collect(),
        strict_priority: false,
        status: "active".into(),
        start_time: Some(Utc::now().into()),
        active_worker_count: 0,
        kit_chains: CHAINS_LAYOUT,
    }
}
