//! Fan-out in sequence: the runs of a keyed event join their chains in
//! its key's order ([`FAN_OUT`]). An event whose earlier one was not
//! fanned out yet waits in Valkey ([`Waiting`]) and is fanned out right
//! after it; a key's last fanned-out number moves on past events that will
//! not come ([`MOVE_PAST`]); runs moved from the chains of an older layout
//! are appended to their chains ([`APPEND`]).

use prost::Message as _;

use crate::outbox::order::Place;
use crate::queue::{HandlerError, NewTask, QueueError};

use super::keys::Namespace;
use super::scripts::{APPEND, FAN_OUT, MOVE_PAST};
use super::waits::{RunArgs, Waiting};
use super::{EventRuns, ORDERED_HEADER, Ordering, millis, now_millis, parse};

impl Ordering {
    /// Fans out the keyed event at `place` to its ordered listeners
    /// (`event`), in its key's sequence ([`FAN_OUT`]): added to their
    /// chains now if the event before it was fanned out, else kept waiting
    /// until it is; then each waiting event that is next. `replay`: the
    /// task is a replay, whose runs join the end of the chains if the
    /// event was fanned out already.
    pub(crate) async fn fan_out(
        &self,
        place: &Place,
        event: &EventRuns,
        replay: bool,
    ) -> Result<(), HandlerError> {
        let mut headers = event.headers.clone();
        headers.insert(ORDERED_HEADER.into(), place.key.clone());
        let runs = event
            .runs
            .iter()
            .map(|run| {
                let task = NewTask::new(&run.task_type, &run.task_id, event.payload.clone())
                    .queue(&event.queue)
                    .headers(headers.clone());
                Ok(RunArgs {
                    listener: run.listener.clone(),
                    task_id: run.task_id.clone(),
                    message: self.run_task(task).to_message()?.encode_to_vec(),
                })
            })
            .collect::<Result<Vec<_>, QueueError>>()?;
        let keys = Namespace::of_queue(&event.queue);
        let next = self
            .fan_out_runs(&keys, place, &event.event_id.to_string(), &runs, replay)
            .await?;
        self.drain(&keys, place, next).await
    }

    /// Fans out `waiting`, the event at `place` in `queue` (moved from the
    /// chains of an older layout), as its own task would be.
    pub(crate) async fn fan_out_waiting(
        &self,
        queue: &str,
        place: &Place,
        waiting: &Waiting,
    ) -> Result<(), HandlerError> {
        let keys = Namespace::of_queue(queue);
        let next = self
            .fan_out_runs(&keys, place, &waiting.event_id, &waiting.runs, false)
            .await?;
        self.drain(&keys, place, next).await
    }

    /// Fans out `next`, the waiting event of `place`'s key that is next,
    /// and each one that is next after it, each with its runs' keys.
    async fn drain(
        &self,
        keys: &Namespace,
        place: &Place,
        mut next: Option<(i64, Waiting)>,
    ) -> Result<(), HandlerError> {
        while let Some((seq, waiting)) = next {
            let place = Place {
                seq,
                ..place.clone()
            };
            next = self
                .fan_out_runs(keys, &place, &waiting.event_id, &waiting.runs, false)
                .await?;
        }
        Ok(())
    }

    /// One call of [`FAN_OUT`]; the waiting event that is next now.
    async fn fan_out_runs(
        &self,
        keys: &Namespace,
        place: &Place,
        event_id: &str,
        runs: &[RunArgs],
        replay: bool,
    ) -> Result<Option<(i64, Waiting)>, HandlerError> {
        let mut script = FAN_OUT.prepare_invoke();
        self.delivery(keys, &mut script);
        script
            .key(keys.runs())
            .key(keys.heads())
            .key(keys.listeners())
            .key(keys.waiting())
            .key(keys.fanned(&place.key, place.epoch))
            .key(keys.waits(&place.key))
            .arg(place.seq)
            .arg(i32::from(replay))
            .arg(millis(self.numbers_kept))
            .arg(now_millis())
            .arg(place.epoch)
            .arg(&place.key)
            .arg(event_id);
        for run in runs {
            script
                .key(keys.chain(&run.listener, &place.key))
                .key(keys.keys_of(&run.listener))
                .key(keys.task(&run.task_id))
                .arg(&run.listener)
                .arg(&run.task_id)
                .arg(&run.message);
        }
        let (delivered, next): (i64, Option<(i64, Vec<u8>)>) = match script
            .invoke_async::<redis::Value>(&mut self.queue.connection())
            .await
            .map_err(QueueError::from)?
        {
            redis::Value::Array(values) => {
                let mut values = values.into_iter();
                let delivered: i64 = parse(values.next().unwrap_or(redis::Value::Int(0)))?;
                let next = match (values.next(), values.next()) {
                    (Some(seq), Some(entry)) => Some((parse(seq)?, parse(entry)?)),
                    _ => None,
                };
                (delivered, next)
            }
            other => {
                return Err(QueueError::UnexpectedReply(format!(
                    "the fan-out script returned {other:?}"
                ))
                .into());
            }
        };
        self.delivered(delivered);
        Ok(match next {
            Some((seq, entry)) => match Waiting::decode(&entry) {
                Some(waiting) => Some((seq, waiting)),
                None => {
                    tracing::error!(
                        key = place.key,
                        seq,
                        "a waiting event's entry in Valkey does not read; it is left where it is"
                    );
                    None
                }
            },
            None => None,
        })
    }

    /// Moves the last fanned-out number of `key` in `epoch`, in `queue`,
    /// on to `number` (unless it is later already) and fans out the waiting
    /// events that follow it ([`MOVE_PAST`]).
    pub(super) async fn move_past(
        &self,
        queue: &str,
        key: &str,
        epoch: i64,
        number: i64,
    ) -> Result<(), HandlerError> {
        let keys = Namespace::of_queue(queue);
        let reply: Vec<redis::Value> = MOVE_PAST
            .key(keys.fanned(key, epoch))
            .key(keys.waits(key))
            .arg(number)
            .arg(millis(self.numbers_kept))
            .arg(epoch)
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(QueueError::from)?;
        let next = match reply.as_slice() {
            [seq, entry] => {
                let seq: i64 = parse(seq.clone())?;
                let entry: Vec<u8> = parse(entry.clone())?;
                Waiting::decode(&entry).map(|waiting| (seq, waiting))
            }
            _ => None,
        };
        let place = Place {
            key: key.to_string(),
            seq: number,
            epoch,
        };
        self.drain(&keys, &place, next).await
    }

    /// Appends `runs` (each with its key) to the ends of their chains in
    /// `queue`, in their order, unless there already ([`APPEND`]): runs
    /// moved from the chains of an older layout.
    pub(super) async fn append(
        &self,
        queue: &str,
        runs: &[(String, RunArgs)],
    ) -> Result<(), QueueError> {
        let keys = Namespace::of_queue(queue);
        for batch in runs.chunks(100) {
            let mut script = APPEND.prepare_invoke();
            self.delivery(&keys, &mut script);
            script
                .key(keys.runs())
                .key(keys.heads())
                .key(keys.listeners())
                .arg(now_millis());
            for (key, run) in batch {
                script
                    .key(keys.chain(&run.listener, key))
                    .key(keys.keys_of(&run.listener))
                    .key(keys.task(&run.task_id))
                    .arg(&run.listener)
                    .arg(key)
                    .arg(&run.task_id)
                    .arg(&run.message);
            }
            let delivered: i64 = script.invoke_async(&mut self.queue.connection()).await?;
            self.delivered(delivered);
        }
        Ok(())
    }
}
