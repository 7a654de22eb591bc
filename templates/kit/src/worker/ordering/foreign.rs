//! Other processes on a worker's queues that keep no chains of ordered
//! listeners: a Go asynq server, or an older kit worker that keeps none.
//! Such a process takes any task of the queue: a keyed event's task it
//! fans out to its own listeners without taking the event's turn
//! (the key's later events wait, and are looked at after a minute), and an
//! ordered run it completes without moving the chain on (the worker moves
//! it on after 10 s, `ordering`'s look at old heads) or archives without a
//! record. Its runs are out of the key's order. So a worker with ordered
//! listeners does not start while one consumes its queues (asynq's server
//! state, which the kit's workers mark, `ServerInfo::kit_chains`), and says
//! which; a worker that runs already reports one every 10 s.

use crate::queue::Client;
use crate::queue::message::{CHAINS_LAYOUT, ServerInfo};

/// The servers consuming one of `queues` that keep no chains of ordered
/// listeners as this worker does.
pub(crate) async fn foreign_consumers(
    client: &Client,
    queues: &[String],
) -> anyhow::Result<Vec<ServerInfo>> {
    Ok(client
        .servers()
        .await?
        .into_iter()
        .filter(|server| server.kit_chains != CHAINS_LAYOUT)
        .filter(|server| server.queues.keys().any(|queue| queues.contains(queue)))
        .collect())
}

/// `Err` naming the processes that consume one of `queues` and keep no
/// chains of ordered listeners ([`foreign_consumers`]).
pub(crate) async fn refuse_foreign_consumers(
    client: &Client,
    queues: &[String],
) -> anyhow::Result<()> {
    let foreign = foreign_consumers(client, queues).await?;
    if foreign.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = foreign.iter().map(describe).collect();
    anyhow::bail!(
        "this worker has ordered listeners, and {} consume its queues without keeping their \
         order (a Go asynq server, or a worker of the kit's template set 22 or earlier): {}. \
         Such a process runs a keyed event's listeners out of their key's order. Stop it, or give \
         it queues of its own (WORKER_QUEUES), then start this worker again",
        if foreign.len() == 1 {
            "a process that is not a worker of this template set does".to_string()
        } else {
            format!(
                "{} processes that are not workers of this template set",
                foreign.len()
            )
        },
        named.join("; ")
    )
}

/// `host:pid (server id) on queues a, b`, as asynqmon's Servers page names
/// a server.
fn describe(server: &ServerInfo) -> String {
    let mut queues: Vec<&str> = server.queues.keys().map(String::as_str).collect();
    queues.sort_unstable();
    format!(
        "{}:{} (server {}) on queue(s) {}",
        server.host,
        server.pid,
        server.server_id,
        queues.join(", ")
    )
}
