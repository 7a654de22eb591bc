//! The Lua scripts that change the chains in Valkey, each step one call
//! (the names of their keys: [`super::keys`]).
//!
//! Every key a script touches is passed in KEYS, as the queue's scripts
//! pass theirs (`crate::queue::scripts`): a script that would learn a key
//! from data returns what it found instead, and the worker makes the next
//! call with that key declared (the next waiting event of a key, the next
//! run of a chain not known when its head started). All of them are in the
//! queue's hash slot, so each step is one script on a Valkey cluster too,
//! and it moves the queue's tasks itself: a head is put in the queue by the
//! script that makes it.
//!
//! Each run is kept as its task's message (`runs`, by task id), a chain as
//! a list of task ids, the head first. A run's task hash (asynq's) carries
//! two fields of the kit's besides asynq's: `gpkit_turn`, the number of
//! times a worker began to run it as its chain's head (a fencing token:
//! only the run that holds the last one moves the chain on or commits its
//! work), `gpkit_done`, set when its run moved the chain on (a redelivery
//! of it then does not run the listener again), and `gpkit_cancelled`, set
//! when `outbox cancel` took it out of its chain ([`TAKE_OUT`]): it then
//! neither rejoins its chain nor runs, as a run that is done.

use std::sync::LazyLock;

use redis::Script;

/// What every script that delivers runs begins with. KEYS[1..3]: the
/// queue's pending list, scheduled set and woken set. ARGV[1..3]: now
/// (ns, the task's `pending_since`), the wake-up channel (or empty), the
/// queue's name.
const DELIVER: &str = r"
local pending, scheduled, woken = KEYS[1], KEYS[2], KEYS[3]
local now_ns, channel, queue = ARGV[1], ARGV[2], ARGV[3]
local delivered = 0
-- Puts the run `id` (task hash `task`, task message `msg`) in the queue:
-- enqueued as Go asynq's enqueue does unless the queue has it (or the
-- chains lost its message); true when it made the task. With `promote`, a
-- task the queue has waiting in scheduled (a run that waited for its turn
-- there) goes to pending now, and one still active is marked woken, so
-- that its deferral sends it to pending.
local function deliver(task, id, msg, promote)
  if redis.call('EXISTS', task) == 0 then
    if not msg then
      return false
    end
    redis.call('HSET', task, 'msg', msg, 'state', 'pending', 'pending_since', now_ns)
    redis.call('LPUSH', pending, id)
    delivered = delivered + 1
    return true
  elseif promote then
    local state = redis.call('HGET', task, 'state')
    if state == 'scheduled' and redis.call('ZREM', scheduled, id) == 1 then
      redis.call('RPUSH', pending, id)
      redis.call('HSET', task, 'state', 'pending', 'pending_since', now_ns)
      delivered = delivered + 1
    elseif state == 'active' then
      redis.call('ZADD', woken, tonumber(now_ns) / 1e9, id)
      redis.call('EXPIRE', woken, 3600)
    end
  end
  return false
end
-- How many tasks went to pending; their queue is published on the
-- wake-up channel.
local function woke()
  if delivered > 0 and channel ~= '' then
    redis.call('PUBLISH', channel, queue)
  end
  return delivered
end
";

/// A script of [`DELIVER`]'s kind: the delivery, then `body`.
fn delivering(body: &str) -> Script {
    Script::new(&format!("{DELIVER}{body}"))
}

/// Where the run of a task stands, as it starts. KEYS: its chain, its
/// task hash. ARGV: its task id. Returns `{0, token, next, rebuilt}` for
/// the head (a new fencing token, the run after it or "", and 1 when the
/// worker made its task again from the chain, `REQUEUE_HEAD`), `{n}` for a
/// run with n before it, `{-1}` for a run that moved its chain on already,
/// `{-2}` for a run in no chain (`{-1}` too for one cancelled, taken out
/// of its chain by [`TAKE_OUT`]).
pub(super) static TURN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local chain, task, id = KEYS[1], KEYS[2], ARGV[1]
if redis.call('LINDEX', chain, 0) == id then
  local token = 0
  if redis.call('EXISTS', task) == 1 then
    token = redis.call('HINCRBY', task, 'gpkit_turn', 1)
  end
  local rebuilt = redis.call('HEXISTS', task, 'gpkit_rebuilt')
  return {0, token, redis.call('LINDEX', chain, 1) or '', rebuilt}
end
local at = redis.call('LPOS', chain, id)
if at then
  return {at}
end
if redis.call('HEXISTS', task, 'gpkit_done') == 1 or redis.call('HEXISTS', task, 'gpkit_cancelled') == 1 then
  return {-1}
end
return {-2}
",
    )
});

/// A run in no chain joins its chain's end (sent back after it was moved
/// past, or its chain lost). KEYS: its chain, runs, heads, listeners, the
/// listener's keys, its task hash. ARGV: its task id, its task message, now
/// (ms), the listener, the key. Returns what [`TURN`] returns.
pub(super) static REJOIN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local chain, runs, heads, listeners, keys_of, task = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, msg, now_ms, listener, key = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local at = redis.call('LPOS', chain, id)
if not at then
  if redis.call('HEXISTS', task, 'gpkit_done') == 1 or redis.call('HEXISTS', task, 'gpkit_cancelled') == 1 then
    return {-1}
  end
  redis.call('HSET', runs, id, msg)
  at = redis.call('RPUSH', chain, id) - 1
  if at == 0 then
    redis.call('ZADD', heads, now_ms, id)
    redis.call('SADD', keys_of, key)
    redis.call('SADD', listeners, listener)
  end
end
if at > 0 then
  return {at}
end
local token = 0
if redis.call('EXISTS', task) == 1 then
  token = redis.call('HINCRBY', task, 'gpkit_turn', 1)
end
return {0, token, redis.call('LINDEX', chain, 1) or '', redis.call('HEXISTS', task, 'gpkit_rebuilt')}
",
    )
});

/// A run is over: it leaves its chain, and the next run is delivered.
/// KEYS: the delivery's three, its chain, runs, heads, listeners, the
/// listener's keys, its task hash, then the next run's task hash when the
/// caller knows it. ARGV: the delivery's three, its task id, its token
/// (`` for none: a run that failed for good, moved past by the recoverer or
/// an operator), `done` (it succeeded), `past` (it failed for good) or
/// `skip` (an operator moves past it: only once its task is archived, or
/// lost), now (ms), the listener, the key, the next run's id as the caller
/// knows it (or ""). Returns `{0}` when the run is not its chain's head or
/// its token is not the last (another run of it holds the turn: nothing
/// changes), `{2}` when a run to skip is not archived (it waits, runs or
/// is retried: nothing changes), else `{1, delivered}`, or `{1, 0, next}`
/// when the next run is not the one the caller named: the caller delivers
/// it ([`DELIVER_HEAD`]). A run moved past keeps no token: a run of it
/// still going can neither commit nor move the chain on.
pub(super) static MOVE_ON: LazyLock<Script> = LazyLock::new(|| {
    delivering(
        r"
local chain, runs, heads, listeners, keys_of, task = KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local id, token, how, now_ms, listener, key, expected = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10]
if redis.call('LINDEX', chain, 0) ~= id then
  return {0}
end
local exists = redis.call('EXISTS', task) == 1
if token ~= '' and (redis.call('HGET', task, 'gpkit_turn') or '0') ~= token then
  return {0}
end
if how == 'skip' and exists and redis.call('HGET', task, 'state') ~= 'archived' then
  return {2}
end
redis.call('LPOP', chain)
redis.call('HDEL', runs, id)
redis.call('ZREM', heads, id)
if exists then
  if how == 'done' then
    redis.call('HSET', task, 'gpkit_done', '1')
  else
    redis.call('HINCRBY', task, 'gpkit_turn', 1)
  end
end
local next = redis.call('LINDEX', chain, 0)
if not next then
  redis.call('SREM', keys_of, key)
  if redis.call('SCARD', keys_of) == 0 then
    redis.call('SREM', listeners, listener)
  end
  return {1, 0}
end
redis.call('ZADD', heads, now_ms, next)
if next == expected then
  deliver(KEYS[10], next, redis.call('HGET', runs, next), true)
  return {1, woke()}
end
return {1, 0, next}
",
    )
});

/// Delivers a chain's head, if it still is. KEYS: the delivery's three,
/// its chain, runs, its task hash. ARGV: the delivery's three, its task
/// id, `1` to promote it from scheduled ([`DELIVER`]). Returns how many
/// tasks went to pending.
pub(super) static DELIVER_HEAD: LazyLock<Script> = LazyLock::new(|| {
    delivering(
        r"
if redis.call('LINDEX', KEYS[4], 0) == ARGV[4] then
  deliver(KEYS[6], ARGV[4], redis.call('HGET', KEYS[5], ARGV[4]), ARGV[5] == '1')
end
return woke()
",
    )
});

/// The fan-out of a keyed event, in its key's sequence. KEYS: the
/// delivery's three, runs, heads, listeners, waiting, the key's last
/// fanned-out number, the key's waiting events, then per run three: its
/// chain, its listener's keys, its task hash. ARGV: the delivery's three,
/// seq, replay (0/1), how long the number is kept (ms), now (ms), epoch,
/// key, the event id, then per run three: listener, task id, task message.
///
/// The event is next (its seq follows the number): its runs join their
/// chains (a run that becomes a head is delivered), and its own entry among
/// the waiting events goes. It is later: it waits, as an entry of its id
/// and runs (unless one is there). It was fanned out already: a replay's
/// runs join the chains' ends; anything else (a fan-out run again) changes
/// nothing. Returns `{delivered, seq, entry}`: the waiting event that is
/// next now, its seq and its entry ([`super::waits`]), or `{delivered}`.
pub(super) static FAN_OUT: LazyLock<Script> = LazyLock::new(|| {
    delivering(
        r"
local runs, heads, listeners, waiting, fanned_key, waits = KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local seq, replay, kept, now_ms = tonumber(ARGV[4]), ARGV[5] == '1', ARGV[6], ARGV[7]
local epoch, key, event = ARGV[8], ARGV[9], ARGV[10]
local function append_all()
  for i = 0, (#KEYS - 9) / 3 - 1 do
    local chain, keys_of, task = KEYS[10 + 3 * i], KEYS[11 + 3 * i], KEYS[12 + 3 * i]
    local listener, id, msg = ARGV[11 + 3 * i], ARGV[12 + 3 * i], ARGV[13 + 3 * i]
    if redis.call('HSETNX', runs, id, msg) == 1 then
      if redis.call('RPUSH', chain, id) == 1 then
        redis.call('ZADD', heads, now_ms, id)
        redis.call('SADD', keys_of, key)
        redis.call('SADD', listeners, listener)
        deliver(task, id, msg, false)
      end
    end
  end
end
-- The waiting event after `number`, if there is one.
local function next_after(number)
  local entry = redis.call('HGET', waits, epoch .. ':' .. (number + 1))
  if entry then
    return {woke(), number + 1, entry}
  end
  return {woke()}
end
local fanned = tonumber(redis.call('GET', fanned_key) or '0')
if seq <= fanned then
  if replay then
    append_all()
  end
  return next_after(fanned)
end
if seq > fanned + 1 then
  local field = epoch .. ':' .. seq
  local entry = {string.len(event) .. ':' .. event}
  for i = 11, #ARGV do
    entry[#entry + 1] = string.len(ARGV[i]) .. ':' .. ARGV[i]
  end
  if redis.call('HSETNX', waits, field, table.concat(entry)) == 1 then
    redis.call('ZADD', waiting, now_ms, field .. ':' .. key)
  end
  return {woke()}
end
append_all()
local field = epoch .. ':' .. seq
if redis.call('HDEL', waits, field) == 1 then
  redis.call('ZREM', waiting, field .. ':' .. key)
end
redis.call('SET', fanned_key, seq, 'PX', kept)
return next_after(seq)
",
    )
});

/// Moves a key's last fanned-out number on to a later one (unless it is
/// later already): past earlier events that will not come
/// (`super::stale`), or to a number moved from elsewhere. KEYS: the
/// number, the key's waiting events. ARGV: the number, how long it is
/// kept (ms), epoch. Returns `{seq, entry}` of the waiting event that is
/// next now, or `{}`.
pub(super) static MOVE_PAST: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local fanned = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), tonumber(ARGV[1]))
redis.call('SET', KEYS[1], fanned, 'PX', ARGV[2])
local entry = redis.call('HGET', KEYS[2], ARGV[3] .. ':' .. (fanned + 1))
if entry then
  return {fanned + 1, entry}
end
return {}
",
    )
});

/// Queues a chain's head again if the queue does not have it (its task,
/// made again from the chain, is marked `gpkit_rebuilt`: it may have a
/// failure to forget when it succeeds), and counts it as a head from now
/// on (it looks again later). KEYS: the delivery's three, heads, its
/// chain, runs, its task hash. ARGV: the delivery's three, its task id, now
/// (ms). A task id that is no longer its chain's head leaves the heads.
/// Returns how many tasks went to pending.
pub(super) static REQUEUE_HEAD: LazyLock<Script> = LazyLock::new(|| {
    delivering(
        r"
local heads, chain, runs, task, id = KEYS[4], KEYS[5], KEYS[6], KEYS[7], ARGV[4]
if redis.call('LINDEX', chain, 0) ~= id then
  redis.call('ZREM', heads, id)
  return woke()
end
redis.call('ZADD', heads, ARGV[5], id)
if deliver(task, id, redis.call('HGET', runs, id), false) then
  redis.call('HSET', task, 'gpkit_rebuilt', '1')
end
return woke()
",
    )
});

/// Releases a chain: each of its runs goes to the queue (unless the queue
/// has it), and the chain goes, provided it still holds the runs read
/// before. KEYS: the delivery's three, the chain, runs, heads, listeners,
/// the listener's keys, then each run's task hash. ARGV: the delivery's
/// three, the listener, the key, then the runs' task ids, the head first.
/// Returns how many runs it released (0 when the chain changed).
pub(super) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    delivering(
        r"
local chain, runs, heads, listeners, keys_of = KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local listener, key = ARGV[4], ARGV[5]
local ids = redis.call('LRANGE', chain, 0, -1)
if #ids ~= #ARGV - 5 then
  return 0
end
for i, id in ipairs(ids) do
  if ARGV[5 + i] ~= id then
    return 0
  end
end
for i, id in ipairs(ids) do
  local task = KEYS[8 + i]
  -- A run of it still going holds its turn no longer.
  if redis.call('EXISTS', task) == 1 then
    redis.call('HINCRBY', task, 'gpkit_turn', 1)
  end
  deliver(task, id, redis.call('HGET', runs, id), true)
  redis.call('HDEL', runs, id)
  redis.call('ZREM', heads, id)
end
redis.call('DEL', chain)
redis.call('SREM', keys_of, key)
if redis.call('SCARD', keys_of) == 0 then
  redis.call('SREM', listeners, listener)
end
woke()
return #ids
",
    )
});

/// Takes a waiting event for a look at it (`super::stale`): its score
/// becomes now, if it was at most the cutoff still (another worker did not
/// take it meanwhile). KEYS: waiting. ARGV: the member, the cutoff (ms), now
/// (ms). Returns 1 when taken.
pub(super) static TAKE_WAIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) <= tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  return 1
end
return 0
",
    )
});

/// Records which service consumes a queue while its workers run: the
/// record is taken when there is none or it is this service's, and kept
/// `ttl` more. KEYS: the record. ARGV: this service's id, ttl (ms).
/// Returns "" when taken, else the other service's id.
pub(super) static OWN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local current = redis.call('GET', KEYS[1])
if current and current ~= ARGV[1] then
  return current
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ''
",
    )
});

/// Appends runs to their chains' ends, unless there already (runs moved
/// from the chains of an older layout, in their order); a run that
/// becomes a head is delivered. KEYS: the delivery's three, runs, heads,
/// listeners, then per run three: its chain, its listener's keys, its task
/// hash. ARGV: the delivery's three, now (ms), then per run four:
/// listener, key, task id, task message. Returns how many tasks went to
/// pending.
pub(super) static APPEND: LazyLock<Script> = LazyLock::new(|| {
    delivering(
        r"
local runs, heads, listeners, now_ms = KEYS[4], KEYS[5], KEYS[6], ARGV[4]
for i = 0, (#KEYS - 6) / 3 - 1 do
  local chain, keys_of, task = KEYS[7 + 3 * i], KEYS[8 + 3 * i], KEYS[9 + 3 * i]
  local listener, key, id, msg = ARGV[5 + 4 * i], ARGV[6 + 4 * i], ARGV[7 + 4 * i], ARGV[8 + 4 * i]
  if redis.call('HSETNX', runs, id, msg) == 1 then
    if redis.call('RPUSH', chain, id) == 1 then
      redis.call('ZADD', heads, now_ms, id)
      redis.call('SADD', keys_of, key)
      redis.call('SADD', listeners, listener)
      deliver(task, id, msg, false)
    end
  end
end
return woke()
",
    )
});

/// Takes a cancelled run that waits behind its chain's head out of the
/// chain (`outbox cancel`): it leaves the chain and the runs, and the runs
/// behind it keep their order; its task hash, if the queue has it, is
/// marked `gpkit_cancelled` ([`TURN`] and [`REJOIN`] then never let it in
/// again). KEYS: its chain, runs, its task hash. ARGV: its task id.
/// Returns 1 when taken out, 0 when it is in no chain, -1 when it is the
/// head (whose end is [`MOVE_ON`]'s).
pub(super) static TAKE_OUT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local chain, runs, task, id = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
if redis.call('LINDEX', chain, 0) == id then
  return -1
end
if redis.call('LREM', chain, 0, id) == 0 then
  return 0
end
redis.call('HDEL', runs, id)
if redis.call('EXISTS', task) == 1 then
  redis.call('HSET', task, 'gpkit_cancelled', '1')
end
return 1
",
    )
});

/// Every script, by name (the checks that each one passes every key it
/// touches in KEYS).
#[cfg(test)]
pub(crate) fn all() -> Vec<(&'static str, &'static Script)> {
    vec![
        ("TURN", &TURN),
        ("REJOIN", &REJOIN),
        ("MOVE_ON", &MOVE_ON),
        ("DELIVER_HEAD", &DELIVER_HEAD),
        ("FAN_OUT", &FAN_OUT),
        ("MOVE_PAST", &MOVE_PAST),
        ("REQUEUE_HEAD", &REQUEUE_HEAD),
        ("APPEND", &APPEND),
        ("RELEASE", &RELEASE),
        ("OWN", &OWN),
        ("TAKE_WAIT", &TAKE_WAIT),
        ("TAKE_OUT", &TAKE_OUT),
    ]
}
