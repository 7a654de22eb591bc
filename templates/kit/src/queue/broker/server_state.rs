//! The server state asynqmon's Servers page reads (Go asynq's
//! heartbeater writes it): this worker's `ServerInfo` and one `WorkerInfo`
//! per running task, written at each heartbeat with a TTL, read back, and
//! deleted at shutdown.

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use prost::Message as _;

use crate::queue::message::{ServerInfo, WorkerInfo};
use crate::queue::{Client, QueueError, keys, scripts};

impl Client {
    /// Writes this worker's `ServerInfo` and the `WorkerInfo` of each
    /// running task, expiring after `ttl` unless written again (Go asynq's
    /// `WriteServerState`).
    pub(in crate::queue) async fn write_server_state(
        &self,
        server: &ServerInfo,
        workers: &[WorkerInfo],
        ttl: Duration,
    ) -> Result<(), QueueError> {
        let pid = u32::try_from(server.pid).unwrap_or(0);
        let server_key = keys::server_info(&server.host, pid, &server.server_id);
        let workers_key = keys::workers(&server.host, pid, &server.server_id);
        let expiry = (Utc::now() + TimeDelta::from_std(ttl).unwrap_or(TimeDelta::MAX)).timestamp();
        let mut invocation = scripts::WRITE_SERVER_STATE.prepare_invoke();
        invocation
            .key(&server_key)
            .key(&workers_key)
            .arg(ttl.as_secs().max(1))
            .arg(server.encode_to_vec());
        for worker in workers {
            invocation.arg(&worker.task_id).arg(worker.encode_to_vec());
        }
        // Two commands, not one pipeline: the keys are in different cluster
        // slots.
        let mut conn = self.conn();
        redis::cmd("ZADD")
            .arg(keys::ALL_SERVERS)
            .arg(expiry)
            .arg(&server_key)
            .query_async::<()>(&mut conn)
            .await?;
        redis::cmd("ZADD")
            .arg(keys::ALL_WORKERS)
            .arg(expiry)
            .arg(&workers_key)
            .query_async::<()>(&mut conn)
            .await?;
        invocation.invoke_async::<()>(&mut conn).await?;
        Ok(())
    }

    /// The servers whose state has not expired: asynqmon's Servers page
    /// (Go's `Inspector.Servers()`).
    pub(crate) async fn servers(&self) -> Result<Vec<ServerInfo>, QueueError> {
        let mut conn = self.conn();
        let names: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(keys::ALL_SERVERS)
            .arg(Utc::now().timestamp())
            .arg("+inf")
            .query_async(&mut conn)
            .await?;
        if names.is_empty() {
            return Ok(Vec::new());
        }
        // One GET each: the keys are in different cluster slots.
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.get(name);
        }
        let infos: Vec<Option<Vec<u8>>> = pipe.query_async(&mut conn).await?;
        Ok(infos
            .into_iter()
            .flatten()
            .filter_map(|info| ServerInfo::decode(info.as_slice()).ok())
            .collect())
    }

    /// Removes this worker's server state (at shutdown).
    pub(in crate::queue) async fn clear_server_state(
        &self,
        server: &ServerInfo,
    ) -> Result<(), QueueError> {
        let pid = u32::try_from(server.pid).unwrap_or(0);
        let server_key = keys::server_info(&server.host, pid, &server.server_id);
        let workers_key = keys::workers(&server.host, pid, &server.server_id);
        let mut conn = self.conn();
        for (all, key) in [
            (keys::ALL_SERVERS, &server_key),
            (keys::ALL_WORKERS, &workers_key),
        ] {
            redis::cmd("ZREM")
                .arg(all)
                .arg(key)
                .query_async::<()>(&mut conn)
                .await?;
        }
        scripts::CLEAR_SERVER_STATE
            .key(&server_key)
            .key(&workers_key)
            .invoke_async::<()>(&mut conn)
            .await?;
        Ok(())
    }
}
