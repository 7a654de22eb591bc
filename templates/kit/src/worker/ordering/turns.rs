//! One run at a time: where a run of a chain stands as its task starts
//! ([`Turn`], taken by [`TURN`], or by [`REJOIN`] for a run in no chain),
//! and its chain moving on when it is over ([`End`], [`MOVE_ON`]), which
//! puts the next run in the queue; a cancelled run that waits behind
//! the head taken out of its chain ([`TAKE_OUT`]).

use prost::Message as _;

use crate::queue::{HandlerError, NewTask, QueueError, Task};

use super::keys::Namespace;
use super::scripts::{DELIVER_HEAD, MOVE_ON, REJOIN, TAKE_OUT, TURN};
use super::{End, Moved, Ordering, Turn, now_millis, parse};

impl Ordering {
    /// Where the run of `task` (its task id, in its queue), of `listener`'s
    /// chain for `key`, stands as it starts ([`TURN`]); a run in no chain
    /// joins its chain's end ([`REJOIN`]).
    pub(crate) async fn turn(
        &self,
        listener: &str,
        key: &str,
        task: &Task,
    ) -> Result<Turn, HandlerError> {
        let keys = Namespace::of_queue(&task.queue);
        let reply: Vec<redis::Value> = TURN
            .key(keys.chain(listener, key))
            .key(keys.task(&task.id))
            .arg(&task.id)
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(QueueError::from)?;
        match turn_of(reply)? {
            Some(turn) => Ok(turn),
            None => {
                let message = self
                    .run_task(
                        NewTask::new(&task.task_type, &task.id, task.payload.clone())
                            .queue(&task.queue)
                            .headers(task.headers.clone()),
                    )
                    .to_message()?
                    .encode_to_vec();
                let reply: Vec<redis::Value> = REJOIN
                    .key(keys.chain(listener, key))
                    .key(keys.runs())
                    .key(keys.heads())
                    .key(keys.listeners())
                    .key(keys.keys_of(listener))
                    .key(keys.task(&task.id))
                    .arg(&task.id)
                    .arg(message)
                    .arg(now_millis())
                    .arg(listener)
                    .arg(key)
                    .invoke_async(&mut self.queue.connection())
                    .await
                    .map_err(QueueError::from)?;
                tracing::info!(
                    task = %task.id,
                    listener,
                    key,
                    "a run of an ordered listener was in no chain (sent back after it was moved past, \
                     or its chain was lost): it joins its key's order at the end"
                );
                Ok(match turn_of(reply)? {
                    Some(Turn::After(_)) | None => Turn::Rejoined,
                    Some(turn) => turn,
                })
            }
        }
    }

    /// The run of `task_id` in `queue`, of `listener`'s chain for `key`,
    /// is over ([`MOVE_ON`]) as `end` says: it leaves its chain and the next
    /// run goes to the queue. `token`: the run's ([`Turn::Now`]), or `None`
    /// for one moved past for an operator or the recoverer. `next`: the run
    /// after it as the turn saw it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn move_on(
        &self,
        queue: &str,
        listener: &str,
        key: &str,
        task_id: &str,
        token: Option<i64>,
        end: End,
        next: Option<&str>,
    ) -> Result<Moved, HandlerError> {
        let keys = Namespace::of_queue(queue);
        let mut script = MOVE_ON.prepare_invoke();
        self.delivery(&keys, &mut script);
        script
            .key(keys.chain(listener, key))
            .key(keys.runs())
            .key(keys.heads())
            .key(keys.listeners())
            .key(keys.keys_of(listener))
            .key(keys.task(task_id))
            .arg(task_id)
            .arg(token.map_or_else(String::new, |token| token.to_string()))
            .arg(end.as_str())
            .arg(now_millis())
            .arg(listener)
            .arg(key)
            .arg(next.unwrap_or_default());
        if let Some(next) = next {
            script.key(keys.task(next));
        }
        let reply: Vec<redis::Value> = script
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(QueueError::from)?;
        let mut reply = reply.into_iter();
        let int = |value: Option<redis::Value>| -> Result<i64, QueueError> {
            parse(value.unwrap_or(redis::Value::Int(0)))
        };
        match int(reply.next())? {
            0 => return Ok(Moved::Superseded),
            2 => return Ok(Moved::NotFailed),
            _ => {}
        }
        self.delivered(int(reply.next())?);
        if let Some(other) = reply.next() {
            // The next run is not the one the turn saw: delivered apart.
            let other: String = parse(other)?;
            self.deliver_head(&keys, listener, key, &other, true)
                .await?;
        }
        Ok(Moved::On)
    }

    /// Takes the cancelled run `task_id`, which waits behind the head of
    /// `listener`'s chain for `key` in `queue`, out of the chain
    /// ([`TAKE_OUT`]), its task marked so that it never runs: true when it
    /// did; false when the run is the head
    /// (ended with [`Ordering::move_on`]) or in no chain.
    pub(crate) async fn take_out(
        &self,
        queue: &str,
        listener: &str,
        key: &str,
        task_id: &str,
    ) -> Result<bool, QueueError> {
        let keys = Namespace::of_queue(queue);
        let taken: i64 = TAKE_OUT
            .key(keys.chain(listener, key))
            .key(keys.runs())
            .key(keys.task(task_id))
            .arg(task_id)
            .invoke_async(&mut self.queue.connection())
            .await?;
        Ok(taken == 1)
    }

    /// Delivers the head `task_id` of `listener`'s chain for `key`
    /// ([`DELIVER_HEAD`]), promoting it from scheduled when asked.
    async fn deliver_head(
        &self,
        keys: &Namespace,
        listener: &str,
        key: &str,
        task_id: &str,
        promote: bool,
    ) -> Result<(), QueueError> {
        let mut script = DELIVER_HEAD.prepare_invoke();
        self.delivery(keys, &mut script);
        let delivered: i64 = script
            .key(keys.chain(listener, key))
            .key(keys.runs())
            .key(keys.task(task_id))
            .arg(task_id)
            .arg(i32::from(promote))
            .invoke_async(&mut self.queue.connection())
            .await?;
        self.delivered(delivered);
        Ok(())
    }
}

/// The [`Turn`] of a reply of [`TURN`] or [`REJOIN`]; `None` for a run in
/// no chain.
fn turn_of(reply: Vec<redis::Value>) -> Result<Option<Turn>, QueueError> {
    let mut reply = reply.into_iter();
    let at: i64 = parse(reply.next().unwrap_or(redis::Value::Int(-2)))?;
    Ok(match at {
        0 => {
            let token: i64 = parse(reply.next().unwrap_or(redis::Value::Int(0)))?;
            let next: String = reply.next().map(parse).transpose()?.unwrap_or_default();
            let rebuilt: i64 = reply.next().map(parse).transpose()?.unwrap_or(0);
            Some(Turn::Now {
                token,
                next: (!next.is_empty()).then_some(next),
                rebuilt: rebuilt == 1,
            })
        }
        -1 => Some(Turn::Done),
        -2 => None,
        before => Some(Turn::After(before)),
    })
}
