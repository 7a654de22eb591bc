//! The move of chains kept under `ordered:{<database>}:` (the older layout:
//! one namespace per database name, apart from the queue) into the
//! namespaces of the queues ([`super::keys`]). A worker moves them before it
//! consumes, under a lock of the database's, in their order: the keys' last
//! fanned-out numbers into each queue it consumes (once a queue: a mark
//! says so; the old numbers stay, for the workers of other queues, until
//! they expire), the chains' runs, then the events that wait; each old run
//! and waiting event goes once it is in the new keys, so a move cut short is
//! taken up again by the next worker that starts (and by each worker's look
//! after the chains, for runs an old worker left meanwhile).

use std::collections::BTreeMap;

use sqlx::PgPool;

use super::waits::{RunArgs, Waiting};
use super::{Ordering, StoredRun};
use crate::outbox::order::Place;
use crate::queue::{HandlerError, QueueError};

/// Runs looked at per round trip.
const BATCH: usize = 500;

/// The names of the older layout's keys of one database.
struct Old {
    prefix: String,
}

impl Old {
    /// The older layout's namespace of `pool`'s database (its user's name when the URL
    /// names none; braces and `%` percent-encoded).
    fn of_pool(pool: &PgPool) -> Self {
        let options = pool.connect_options();
        let database = options
            .get_database()
            .unwrap_or_else(|| options.get_username());
        let mut tag = String::with_capacity(database.len());
        for c in database.chars() {
            match c {
                '{' => tag.push_str("%7B"),
                '}' => tag.push_str("%7D"),
                '%' => tag.push_str("%25"),
                c => tag.push(c),
            }
        }
        Self {
            prefix: format!("ordered:{{{tag}}}:"),
        }
    }

    fn name(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    fn chain(&self, listener: &str, key: &str) -> String {
        self.name(&format!("chain:{}:{listener}:{key}", listener.len()))
    }

    fn fanned(&self, key: &str, epoch: i64) -> String {
        self.name(&format!("fan:{epoch}:{key}"))
    }

    /// The key, epoch and seq of a waiting event's list.
    fn waiting_event(&self, list: &str) -> Option<(String, i64, i64)> {
        let rest = list.strip_prefix(&self.prefix)?.strip_prefix("wait:")?;
        let (epoch, rest) = rest.split_once(':')?;
        let (seq, key) = rest.split_once(':')?;
        Some((key.to_string(), epoch.parse().ok()?, seq.parse().ok()?))
    }
}

impl Ordering {
    /// Moves what is left under the database's namespace (module docs);
    /// how many keys, runs and waiting events it moved.
    pub(crate) async fn move_from_database_namespace(&self) -> anyhow::Result<u64> {
        let old = Old::of_pool(&self.pool);
        let mut conn = self.queue.connection();
        let mut pipe = redis::pipe();
        pipe.hlen(old.name("runs")).zcard(old.name("waiting"));
        for queue in self.queues.iter() {
            pipe.exists(old.name(&format!("moved:{queue}")));
        }
        let (runs, waiting, moved): (i64, i64, Vec<bool>) = {
            let mut replies: Vec<redis::Value> = pipe
                .query_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
            let moved = replies
                .split_off(2)
                .into_iter()
                .map(super::parse)
                .collect::<Result<_, _>>()?;
            let waiting = super::parse(replies.pop().unwrap_or(redis::Value::Int(0)))?;
            let runs = super::parse(replies.pop().unwrap_or(redis::Value::Int(0)))?;
            (runs, waiting, moved)
        };
        let unmoved: Vec<&String> = self
            .queues
            .iter()
            .zip(&moved)
            .filter(|(_, moved)| !**moved)
            .map(|(queue, _)| queue)
            .collect();
        if unmoved.is_empty() && runs == 0 && waiting == 0 {
            return Ok(0);
        }
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('gpkit ordered chains of set 22'))")
            .execute(&mut *tx)
            .await?;
        let failed = |err: HandlerError| anyhow::anyhow!("{err}");
        let mut moved = 0u64;
        if !unmoved.is_empty() {
            moved += self
                .move_numbers(&old, &unmoved, &mut tx)
                .await
                .map_err(failed)?;
        }
        moved += self.move_runs(&old).await?;
        moved += self.move_waiting(&old).await.map_err(failed)?;
        let mut marks = redis::pipe();
        for queue in &unmoved {
            marks.set(old.name(&format!("moved:{queue}")), 1).ignore();
        }
        let () = marks
            .query_async(&mut conn)
            .await
            .map_err(QueueError::from)?;
        tx.commit().await?;
        if moved > 0 {
            tracing::info!(
                moved,
                "moved the chains of ordered listeners of template set 22 beside their queues"
            );
        }
        Ok(moved)
    }

    /// Each key's last fanned-out number, into `queues`.
    async fn move_numbers(
        &self,
        old: &Old,
        queues: &[&String],
        tx: &mut sqlx::PgConnection,
    ) -> Result<u64, HandlerError> {
        let keys: Vec<(String, i64)> = sqlx::query_as("SELECT key, epoch FROM outbox_keys")
            .fetch_all(&mut *tx)
            .await
            .map_err(anyhow::Error::from)?;
        let mut conn = self.queue.connection();
        let mut moved = 0;
        for batch in keys.chunks(BATCH) {
            let names: Vec<String> = batch
                .iter()
                .map(|(key, epoch)| old.fanned(key, *epoch))
                .collect();
            let numbers: Vec<Option<i64>> = redis::cmd("MGET")
                .arg(&names)
                .query_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
            for ((key, epoch), number) in batch.iter().zip(numbers) {
                let Some(number) = number else { continue };
                for queue in queues {
                    self.move_past(queue, key, *epoch, number).await?;
                }
                moved += 1;
            }
        }
        Ok(moved)
    }

    /// The chains' runs, each chain in its order, into its run's queue.
    async fn move_runs(&self, old: &Old) -> anyhow::Result<u64> {
        let mut conn = self.queue.connection();
        let mut moved = 0;
        // Passes over the hash until it is empty (an old worker may add
        // runs meanwhile); the runs moved leave it.
        for _ in 0..100 {
            let left: i64 = redis::cmd("HLEN")
                .arg(old.name("runs"))
                .query_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
            if left == 0 {
                break;
            }
            let mut cursor = "0".to_string();
            loop {
                let (next, pairs): (String, Vec<(String, Vec<u8>)>) = redis::cmd("HSCAN")
                    .arg(old.name("runs"))
                    .arg(&cursor)
                    .arg("COUNT")
                    .arg(BATCH)
                    .query_async(&mut conn)
                    .await
                    .map_err(QueueError::from)?;
                moved += self.move_chains_of(old, pairs).await?;
                if next == "0" {
                    break;
                }
                cursor = next;
            }
        }
        Ok(moved)
    }

    /// The chains of the runs `pairs` (task id, message), each moved whole
    /// in its order into its runs' queue; how many runs.
    async fn move_chains_of(
        &self,
        old: &Old,
        pairs: Vec<(String, Vec<u8>)>,
    ) -> anyhow::Result<u64> {
        if pairs.is_empty() {
            return Ok(0);
        }
        let mut conn = self.queue.connection();
        let mut chains = BTreeMap::new();
        let mut gone = Vec::with_capacity(pairs.len());
        for (id, message) in pairs {
            if let Some(run) = StoredRun::decode(&message) {
                chains.insert((run.listener, run.key), ());
            }
            gone.push(id);
        }
        let mut moved = 0;
        for (listener, key) in chains.into_keys() {
            let chain: Vec<String> = redis::cmd("LRANGE")
                .arg(old.chain(&listener, &key))
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
            if chain.is_empty() {
                continue;
            }
            let (messages, queues): (Vec<Option<Vec<u8>>>, Vec<Option<String>>) = redis::pipe()
                .cmd("HMGET")
                .arg(old.name("runs"))
                .arg(&chain)
                .cmd("HMGET")
                .arg(old.name("queues"))
                .arg(&chain)
                .query_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
            let mut by_queue: BTreeMap<String, Vec<(String, RunArgs)>> = BTreeMap::new();
            for ((id, message), queue) in chain.iter().zip(messages).zip(queues) {
                let (Some(message), Some(queue)) = (message, queue) else {
                    continue;
                };
                by_queue.entry(queue).or_default().push((
                    key.clone(),
                    RunArgs {
                        listener: listener.clone(),
                        task_id: id.clone(),
                        message,
                    },
                ));
            }
            for (queue, runs) in &by_queue {
                self.append(queue, runs).await?;
                moved += runs.len() as u64;
            }
            let () = redis::pipe()
                .del(old.chain(&listener, &key))
                .ignore()
                .srem(old.name(&format!("listeners:{key}")), &listener)
                .ignore()
                .query_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
            gone.extend(chain);
        }
        let () = redis::pipe()
            .cmd("HDEL")
            .arg(old.name("runs"))
            .arg(&gone)
            .ignore()
            .cmd("HDEL")
            .arg(old.name("queues"))
            .arg(&gone)
            .ignore()
            .cmd("ZREM")
            .arg(old.name("heads"))
            .arg(&gone)
            .ignore()
            .query_async(&mut conn)
            .await
            .map_err(QueueError::from)?;
        Ok(moved)
    }

    /// The events that wait, fanned out as a worker of this set would
    /// (after the numbers and the chains: one that is next joins the chains
    /// behind their runs).
    async fn move_waiting(&self, old: &Old) -> Result<u64, HandlerError> {
        let mut conn = self.queue.connection();
        let lists: Vec<String> = redis::cmd("ZRANGE")
            .arg(old.name("waiting"))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .map_err(QueueError::from)?;
        let mut moved = 0;
        for list in lists {
            let values: Vec<Vec<u8>> = redis::cmd("LRANGE")
                .arg(&list)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
            let Some((key, epoch, seq)) = old.waiting_event(&list) else {
                continue;
            };
            let mut values = values.into_iter();
            let event_id = values
                .next()
                .and_then(|id| String::from_utf8(id).ok())
                .unwrap_or_default();
            // Set 22's runs: chain, key's listeners, listener, task id,
            // queue, message.
            let rest: Vec<Vec<u8>> = values.collect();
            let mut by_queue: BTreeMap<String, Vec<RunArgs>> = BTreeMap::new();
            for run in rest.chunks(6) {
                let [_, _, listener, task_id, queue, message] = run else {
                    continue;
                };
                by_queue
                    .entry(String::from_utf8_lossy(queue).into_owned())
                    .or_default()
                    .push(RunArgs {
                        listener: String::from_utf8_lossy(listener).into_owned(),
                        task_id: String::from_utf8_lossy(task_id).into_owned(),
                        message: message.clone(),
                    });
            }
            let place = Place {
                key: key.clone(),
                seq,
                epoch,
            };
            for (queue, runs) in by_queue {
                let waiting = Waiting {
                    event_id: event_id.clone(),
                    runs,
                };
                self.fan_out_waiting(&queue, &place, &waiting).await?;
            }
            let () = redis::pipe()
                .del(&list)
                .ignore()
                .zrem(old.name("waiting"), &list)
                .ignore()
                .query_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
            moved += 1;
        }
        Ok(moved)
    }
}
