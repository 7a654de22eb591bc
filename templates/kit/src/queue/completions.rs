//! The acknowledgements of succeeded tasks, written in batches.
//!
//! A task that succeeded hands its message to [`Completions`] and waits for
//! the answer. One writer sends every completion waiting at that moment in
//! one [`scripts::COMPLETE`](super::scripts::COMPLETE) call per queue, and
//! the completions that come meanwhile make the next batch (two batches may
//! be on their way at once). An idle
//! worker's completion goes at once, alone; a busy worker's share a round
//! trip and a script call, which is what Valkey spends its time on.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::message::TaskMessage;
use super::{Client, QueueError};

/// The most completions one batch takes.
const MAX_BATCH: usize = 128;
/// The most batches written at the same time.
const MAX_IN_FLIGHT: usize = 2;

/// What a waiting task is told: whether it was still active (and is now
/// completed), or why the write failed.
type Answer = Result<bool, QueueError>;

/// One completion waiting for the writer.
struct Request {
    message: Arc<TaskMessage>,
    answer: oneshot::Sender<Answer>,
}

/// The handle through which tasks are completed; the writer runs until
/// the handle is dropped.
pub(super) struct Completions {
    requests: mpsc::UnboundedSender<Request>,
}

impl Completions {
    /// Starts the writer, which completes tasks through `client`.
    pub(super) fn start(client: Client) -> Self {
        let (requests, received) = mpsc::unbounded_channel();
        tokio::spawn(write(client, received));
        Self { requests }
    }

    /// Completes the task of `message` with the next batch. `Ok(false)`:
    /// the task was no longer active, and was left as it is.
    pub(super) async fn complete(&self, message: &Arc<TaskMessage>) -> Answer {
        let (answer, answered) = oneshot::channel();
        let request = Request {
            message: Arc::clone(message),
            answer,
        };
        let stopped = || QueueError::UnexpectedReply("the completion writer stopped".into());
        self.requests.send(request).map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

/// The writer: takes every request waiting and writes them, with up to
/// [`MAX_IN_FLIGHT`] batches on their way at once (so that a completion
/// does not wait a whole round trip for the batch before it), until every
/// handle is dropped.
async fn write(client: Client, mut received: mpsc::UnboundedReceiver<Request>) {
    let mut in_flight = JoinSet::new();
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        tokio::select! {
            taken = received.recv_many(&mut batch, MAX_BATCH), if in_flight.len() < MAX_IN_FLIGHT => {
                if taken == 0 {
                    break;
                }
                in_flight.spawn(write_batch(client.clone(), std::mem::take(&mut batch)));
            }
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
        }
    }
    while in_flight.join_next().await.is_some() {}
}

/// Writes one batch, one script call per queue, and answers each request.
async fn write_batch(client: Client, batch: Vec<Request>) {
    let mut by_queue: BTreeMap<String, Vec<Request>> = BTreeMap::new();
    for request in batch {
        let queue = request.message.queue.clone();
        by_queue.entry(queue).or_default().push(request);
    }
    for (queue, requests) in by_queue {
        let messages: Vec<&TaskMessage> = requests.iter().map(|r| &*r.message).collect();
        match client.complete(&queue, &messages).await {
            Ok(moved) => {
                for (request, moved) in requests.into_iter().zip(moved) {
                    // A task that stopped waiting (shutdown) needs no answer.
                    let _ = request.answer.send(Ok(moved));
                }
            }
            Err(err) => {
                for request in requests {
                    let _ = request.answer.send(Err(copy(&err)));
                }
            }
        }
    }
}

/// The same failure for another waiting task (`QueueError` is not `Clone`:
/// some of its variants hold I/O errors, which no write returns).
fn copy(err: &QueueError) -> QueueError {
    match err {
        QueueError::Redis(err) => QueueError::Redis(err.clone()),
        other => QueueError::UnexpectedReply(other.to_string()),
    }
}
