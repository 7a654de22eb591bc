//! The Lua scripts that change the chains in Valkey, each step one call
//! (the names of their keys: [`super::keys`]).
//!
//! The steps that make a head ([`FAN_OUT`], [`MOVE_ON`], [`APPEND`]) deliver
//! it in one of two ways, by their first three arguments: on a single
//! server the script enqueues the head's task itself
//! ([`crate::queue::scripts::ENQUEUE_FUNCTION`]) and returns its id; on a
//! cluster, whose queue keys are in other slots, it returns the head's task
//! message for the worker to enqueue. Either way a head is queued at most
//! once: the queue takes a task it has as a duplicate.
//!
//! Each run is kept as its task's message (`runs`, by task id) and its
//! queue (`queues`), the chain a list of task ids, the head first.

use std::sync::LazyLock;

use redis::Script;

use crate::queue::scripts::ENQUEUE_FUNCTION;

/// What every script that delivers heads begins with. KEYS[1]: the runs'
/// queues. ARGV: `1` to enqueue on the server (`0`: return the messages),
/// now (ns, the task's `pending_since`), the wake-up channel (or empty).
const DELIVER: &str = r"
local queues = KEYS[1]
local direct, now_ns, channel = ARGV[1] == '1', ARGV[2], ARGV[3]
local delivered = {}
-- Delivers the head `id`, its task message `task`.
local function deliver(id, task)
  if direct then
    asynq_enqueue(redis.call('HGET', queues, id), id, task, now_ns, channel)
    delivered[#delivered + 1] = id
  else
    delivered[#delivered + 1] = task
  end
end
-- Appends the runs of `args` from `from` on (6 values each: chain, the
-- key's listeners, listener, task id, queue, task message) to their
-- chains, unless a run of that task is there already; delivers those that
-- become heads.
local function append(runs, heads, now_ms, args, from)
  for i = from, #args, 6 do
    local chain, listeners, listener, id, queue, task =
      args[i], args[i + 1], args[i + 2], args[i + 3], args[i + 4], args[i + 5]
    if redis.call('HSETNX', runs, id, task) == 1 then
      redis.call('HSET', queues, id, queue)
      if redis.call('RPUSH', chain, id) == 1 then
        redis.call('ZADD', heads, now_ms, id)
        redis.call('SADD', listeners, listener)
        deliver(id, task)
      end
    end
  end
end
-- Fans out the waiting events that follow `fanned` (a number), each
-- right after the one before it; returns the last one fanned out.
local function drain(runs, heads, waiting, now_ms, wait_before, wait_after, fanned)
  while true do
    local wait = wait_before .. (fanned + 1) .. wait_after
    local args = redis.call('LRANGE', wait, 0, -1)
    if #args == 0 then return fanned end
    append(runs, heads, now_ms, args, 2)
    redis.call('DEL', wait)
    redis.call('ZREM', waiting, wait)
    fanned = fanned + 1
  end
end
";

/// A script of [`DELIVER`]'s kind: the enqueue function, the delivery, and
/// `body`.
fn delivering(body: &str) -> Script {
    Script::new(&format!("{ENQUEUE_FUNCTION}{DELIVER}{body}"))
}

/// The fan-out of a keyed event. KEYS: queues, runs, heads, the key's
/// last fanned-out number, waiting. ARGV: the delivery's three, seq,
/// replay (0/1), how long the number is kept (ms), now (ms), the waiting
/// list's name before and after the seq, the event id, then its runs (as
/// `append` takes them). The event is next (its seq follows the number):
/// its runs join their chains, then each waiting event that follows. It is
/// later: it waits in a list of its own (the event id, then its runs). It
/// was fanned out already: a replay's runs join the chains' ends, a
/// retry's chains' heads are delivered again.
pub(super) static FAN_OUT: LazyLock<Script> = LazyLock::new(|| {
    delivering(
        r"
local runs, heads, fanned_key, waiting = KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local seq, replay = tonumber(ARGV[4]), ARGV[5] == '1'
local kept, now_ms = tonumber(ARGV[6]), tonumber(ARGV[7])
local wait_before, wait_after = ARGV[8], ARGV[9]
local fanned = tonumber(redis.call('GET', fanned_key) or '0')
if seq <= fanned then
  if replay then
    append(runs, heads, now_ms, ARGV, 11)
  else
    for i = 11, #ARGV, 6 do
      local head = redis.call('LINDEX', ARGV[i], 0)
      if head then deliver(head, redis.call('HGET', runs, head)) end
    end
  end
  return delivered
end
if seq > fanned + 1 then
  local wait = wait_before .. seq .. wait_after
  if redis.call('EXISTS', wait) == 0 then
    redis.call('RPUSH', wait, ARGV[10], unpack(ARGV, 11))
    redis.call('ZADD', waiting, now_ms, wait)
  end
  return delivered
end
append(runs, heads, now_ms, ARGV, 11)
fanned = drain(runs, heads, waiting, now_ms, wait_before, wait_after, seq)
redis.call('SET', fanned_key, fanned, 'PX', kept)
return delivered
",
    )
});

/// A run is over: it leaves its chain and, if it was the head, the next
/// run is delivered. KEYS: queues, its chain, runs, heads, the key's
/// listeners. ARGV: the delivery's three, task id, now (ms), listener. A
/// run not in the chain (done already): the chain's head is delivered
/// again, in case a crash kept it out.
pub(super) static MOVE_ON: LazyLock<Script> = LazyLock::new(|| {
    delivering(
        r"
local chain, runs, heads, listeners = KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id, now_ms = ARGV[4], ARGV[5]
local head = redis.call('LINDEX', chain, 0)
if not head then return delivered end
if head ~= id then
  if redis.call('LREM', chain, 1, id) == 1 then
    redis.call('HDEL', runs, id)
    redis.call('HDEL', queues, id)
  else
    deliver(head, redis.call('HGET', runs, head))
  end
  return delivered
end
redis.call('LPOP', chain)
redis.call('HDEL', runs, id)
redis.call('HDEL', queues, id)
redis.call('ZREM', heads, id)
local next = redis.call('LINDEX', chain, 0)
if not next then
  redis.call('SREM', listeners, ARGV[6])
  return delivered
end
redis.call('ZADD', heads, now_ms, next)
deliver(next, redis.call('HGET', runs, next))
return delivered
",
    )
});

/// Moves a key's last fanned-out number on to a later one (unless it is
/// later already) and fans out the waiting events that follow it: past
/// earlier events that will not come (`super::stale`), or to a number moved
/// from Postgres (`super::from_postgres`). KEYS: queues, runs, heads, the number,
/// waiting. ARGV: the delivery's three, the number, how long it is kept
/// (ms), now (ms), the waiting list's name before and after the seq.
pub(super) static MOVE_PAST: LazyLock<Script> = LazyLock::new(|| {
    delivering(
        r"
local runs, heads, fanned_key, waiting = KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local fanned = math.max(tonumber(redis.call('GET', fanned_key) or '0'), tonumber(ARGV[4]))
fanned = drain(runs, heads, waiting, ARGV[6], ARGV[7], ARGV[8], fanned)
redis.call('SET', fanned_key, fanned, 'PX', ARGV[5])
return delivered
",
    )
});

/// Appends runs to their chains, unless there already (moved from
/// Postgres). KEYS: queues, runs, heads. ARGV: the delivery's three, now
/// (ms), then the runs (as `append` takes them).
pub(super) static APPEND: LazyLock<Script> = LazyLock::new(|| {
    delivering(
        r"
append(KEYS[2], KEYS[3], tonumber(ARGV[4]), ARGV, 5)
return delivered
",
    )
});

/// The heads older than a time. KEYS: heads, runs. ARGV: the time (ms),
/// now (ms), how many at most. Returns their task messages, and counts
/// them as heads from now on.
pub(super) static REQUEUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local tasks = {}
for _, id in ipairs(ids) do
  local task = redis.call('HGET', KEYS[2], id)
  if task then tasks[#tasks + 1] = task end
  redis.call('ZADD', KEYS[1], ARGV[2], id)
end
return tasks
",
    )
});
