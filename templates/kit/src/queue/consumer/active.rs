//! [`ActiveTasks`]: the tasks a consumer holds, from dequeue until their
//! final write, with their leases, what asynqmon shows of those that run,
//! and how to cancel each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::queue::message::{ServerInfo, TaskMessage, WorkerInfo};

/// One task this consumer holds: its lease, what asynqmon shows of it once
/// it runs, and how to cancel it.
struct ActiveTask {
    message: Arc<TaskMessage>,
    /// When it started and its deadline; `None` while it waits for a slot.
    running: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// The local instant the lease is valid until.
    lease: watch::Sender<Instant>,
    cancel: CancellationToken,
    /// Set when its final write first failed: the lease is no longer
    /// extended.
    settling: bool,
}

/// The tasks this consumer holds, by (queue, id), from dequeue until their
/// final write.
#[derive(Default)]
pub(super) struct ActiveTasks(Mutex<HashMap<(String, String), ActiveTask>>);

impl ActiveTasks {
    /// A task just dequeued, leased until `lease_until`.
    pub(super) fn hold(
        &self,
        message: &Arc<TaskMessage>,
        lease_until: Instant,
    ) -> (watch::Receiver<Instant>, CancellationToken) {
        let (lease, receiver) = watch::channel(lease_until);
        let cancel = CancellationToken::new();
        let task = ActiveTask {
            message: Arc::clone(message),
            running: None,
            lease,
            cancel: cancel.clone(),
            settling: false,
        };
        let key = (message.queue.clone(), message.id.clone());
        self.0.lock().expect("active tasks").insert(key, task);
        (receiver, cancel)
    }

    /// The task has a slot and starts now, with `deadline`.
    pub(super) fn run(&self, message: &TaskMessage, deadline: DateTime<Utc>) {
        let key = (message.queue.clone(), message.id.clone());
        if let Some(task) = self.0.lock().expect("active tasks").get_mut(&key) {
            task.running = Some((Utc::now(), deadline));
        }
    }

    pub(super) fn finish(&self, message: &TaskMessage) {
        let key = (message.queue.clone(), message.id.clone());
        self.0.lock().expect("active tasks").remove(&key);
    }

    /// Stops extending the lease of `message`'s task (its final write
    /// failed: it gets until the lease's end).
    pub(super) fn stop_extending(&self, message: &TaskMessage) {
        let key = (message.queue.clone(), message.id.clone());
        if let Some(task) = self.0.lock().expect("active tasks").get_mut(&key) {
            task.settling = true;
        }
    }

    /// The ids whose lease still holds, grouped by queue, but for tasks
    /// whose final write failed. An expired lease is not extended (Go: the
    /// task belongs to the recoverer by then).
    pub(super) fn leased_by_queue(&self) -> Vec<(String, Vec<String>)> {
        let now = Instant::now();
        let mut grouped: HashMap<String, Vec<String>> = HashMap::new();
        for ((queue, id), task) in self.0.lock().expect("active tasks").iter() {
            if !task.settling && *task.lease.borrow() > now {
                grouped.entry(queue.clone()).or_default().push(id.clone());
            }
        }
        grouped.into_iter().collect()
    }

    pub(super) fn extend(&self, leased: &[(String, Vec<String>)], until: Instant) {
        let map = self.0.lock().expect("active tasks");
        for (queue, ids) in leased {
            for id in ids {
                if let Some(task) = map.get(&(queue.clone(), id.clone())) {
                    task.lease.send_replace(until);
                }
            }
        }
    }

    /// One `WorkerInfo` per task that has started (not those waiting for
    /// a slot), for the server state.
    pub(super) fn worker_infos(&self, server: &ServerInfo) -> Vec<WorkerInfo> {
        self.0
            .lock()
            .expect("active tasks")
            .values()
            .filter_map(|task| Some((task, task.running?)))
            .map(|(task, (started, deadline))| WorkerInfo {
                host: server.host.clone(),
                pid: server.pid,
                server_id: server.server_id.clone(),
                task_id: task.message.id.clone(),
                task_type: task.message.r#type.clone(),
                task_payload: task.message.payload.clone(),
                queue: task.message.queue.clone(),
                start_time: Some(started.into()),
                deadline: Some(deadline.into()),
            })
            .collect()
    }

    /// Cancels the task `id` (in whichever queue), running or waiting for
    /// a slot, if this consumer holds it.
    pub(super) fn cancel(&self, id: &str) {
        for ((_, task_id), task) in self.0.lock().expect("active tasks").iter() {
            if task_id == id {
                task.cancel.cancel();
            }
        }
    }
}
