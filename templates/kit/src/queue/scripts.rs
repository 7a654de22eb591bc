//! Go asynq's Lua scripts, one per state change of a task.
//!
//! The scripts are hibiken/asynq's (`internal/rdb/rdb.go`; the `asynq`
//! crate 0.1.8 carries the same text in `backend/rdb/redis_scripts.rs`),
//! so that a task moves between states exactly as a Go worker moves it,
//! with the same keys and fields. Copyright 2020 Kentaro Hibino, MIT
//! licence. Two are the kit's own, for the limits on listeners: [`DEFER`]
//! and [`PROMOTE`], which leave tasks in the states Go's scripts leave
//! them in. Scripts run with EVALSHA; [`redis::Script`] falls back to
//! loading the script when the server does not know it yet.
//!
//! # Every key through KEYS
//!
//! Every key a script touches is passed in KEYS; none is built inside a
//! script (`crate::tests::script_keys` checks each `redis.call`, and what a
//! server saw the scripts touch). Five of Go
//! asynq's scripts build task keys from a prefix because they learn the
//! task ids inside the script (its issues #480, #951); here those state
//! changes take two steps: the ids are read first, then a script that is
//! given their keys checks that each task is still where it was read and
//! moves only those (`DEQUEUE`, `FORWARD`, `DELETE_EXPIRED`,
//! `TRIM_ARCHIVED`, `RUN_TASK`). Listing expired leases needs no script.
//! All keys of a queue carry its `{queue}` hash tag, so each script runs on
//! the one node of a Valkey Cluster that owns the queue's slot.

use std::sync::LazyLock;

use redis::Script;

/// Adds a pending task unless its id exists. Returns 1, or 0 on conflict.
/// Given a third key, the sorted set of ids cancelled before the fan-out
/// ([`keys::cancelled_before`](super::keys::cancelled_before)), it returns
/// -1 and adds nothing when the id is in it: checked in the same step as
/// the enqueue, so a cancel is either seen here or finds the task.
///
/// KEYS: task hash, pending list[, cancelled set]. ARGV: encoded message,
/// task id, now (ns).
pub(crate) static ENQUEUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if KEYS[3] and redis.call("ZSCORE", KEYS[3], ARGV[2]) then
    return -1
end
if redis.call("EXISTS", KEYS[1]) == 1 then
    return 0
end
redis.call("HSET", KEYS[1],
           "msg", ARGV[1],
           "state", "pending",
           "pending_since", ARGV[3])
redis.call("LPUSH", KEYS[2], ARGV[2])
return 1
"#,
    )
});

/// Moves the oldest pending tasks to active under a lease, unless the queue
/// is paused: as many of the `expected` ids (the oldest pending ones, as
/// the last dequeue saw them, oldest first; their hashes are `KEYS[5..]`)
/// as are still the oldest when their turn comes (read once, with the
/// oldest as many pending ids as there are expected ones). Each ends
/// exactly as Go asynq's DEQUEUE leaves one task (moved from the tail of
/// pending to the head of active, leased, `state` active, no
/// `pending_since`); the list moves and the lease are one call each for the
/// batch, which leaves the lists in the order one `RPOPLPUSH` per task
/// leaves them. An expected id that is no longer the oldest (another
/// consumer took it) is skipped. Returns `{ids, messages, oldest}`: the ids
/// moved, their messages, and the ids of up to `ARGV[2]` oldest pending
/// tasks now, newest first (`LRANGE`'s order). All three are empty when the
/// queue is paused; `oldest` is empty when nothing is pending. A task
/// whose hash cannot be written (a key of another type) ends the call with
/// the error, left in active without a lease as Go's script leaves it; the
/// tasks before it stay taken and leased, for recovery to run.
///
/// KEYS: pending, paused, active, lease, then the task hash of each
/// expected id. ARGV: lease expiry (Unix s), how many pending ids to
/// report, then the expected ids.
pub(crate) static DEQUEUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call("EXISTS", KEYS[2]) == 1 then
    return {{}, {}, {}}
end
local ids, messages, taken, leases = {}, {}, {}, {}
-- The oldest pending ids, newest first: the script takes from the end.
local oldest = {}
if #ARGV > 2 then
    oldest = redis.call("LRANGE", KEYS[1], -(#ARGV - 2), -1)
end
local last, failure = #oldest, nil
for i = 3, #ARGV do
    if last == 0 then
        break
    end
    if oldest[last] == ARGV[i] then
        -- Off pending below whatever its hash holds: Go's script has moved
        -- a task to active before it writes the hash.
        table.insert(taken, ARGV[i])
        last = last - 1
        local written = redis.pcall("HSET", KEYS[i + 2], "state", "active")
        if type(written) == "table" and written.err then
            failure = written
            break
        end
        redis.call("HDEL", KEYS[i + 2], "pending_since")
        table.insert(ids, ARGV[i])
        table.insert(messages, redis.call("HGET", KEYS[i + 2], "msg") or "")
        table.insert(leases, ARGV[1])
        table.insert(leases, ARGV[i])
    end
end
if #taken > 0 then
    -- The taken ids are the last #taken of pending, oldest last: what one
    -- RPOPLPUSH per id, oldest first, leaves.
    redis.call("LTRIM", KEYS[1], 0, -(#taken + 1))
    redis.call("LPUSH", KEYS[3], unpack(taken))
end
if #leases > 0 then
    redis.call("ZADD", KEYS[4], unpack(leases))
end
if failure then
    return failure
end
return {ids, messages, redis.call("LRANGE", KEYS[1], -tonumber(ARGV[2]), -1)}
"#,
    )
});

/// Moves succeeded tasks on, each exactly as Go asynq's `done` or
/// `markAsComplete` script moves one (deleted, or kept in `:completed`
/// for its retention; a Go uniqueness lock released), in one call for a
/// batch of tasks of one queue (first every task off active and its
/// lease, and the kept ones into `:completed` in one `ZADD`, then each
/// task's hash), and counts them processed (the day's and
/// the total counter, once for the batch; the total starts again from the
/// batch's count where Go's would pass the largest int64). A task no longer
/// active is left alone. Returns, per task, 1 when it moved and 0 when it was not
/// active (Go's `NOT FOUND`).
///
/// KEYS: active, lease, completed, `processed:<day>`, processed, then per
/// task its hash and its unique key (its hash again when it has none).
/// ARGV: stats expiry (Unix s), max int64, then per task: its id, the
/// expiry of its retention (Unix s; 0 for none: deleted), the encoded
/// message to keep ("" for none), and 1 when it has a unique key.
pub(crate) static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local moved, count, active, kept = {}, 0, {}, {}
local tasks = (#ARGV - 2) / 4
-- First off active and the lease, and the kept ones into `:completed` in
-- one call, as Go's script moves a task before it writes its hash.
-- Retentions stay the strings they came as: a Lua number passed to a
-- command is formatted again (and parsed back by the command).
for i = 0, tasks - 1 do
    local id = ARGV[3 + 4 * i]
    active[i] = redis.call("LREM", KEYS[1], 0, id) ~= 0
        and redis.call("ZREM", KEYS[2], id) ~= 0
    if active[i] and ARGV[4 + 4 * i] ~= "0" then
        table.insert(kept, ARGV[4 + 4 * i])
        table.insert(kept, id)
    end
end
if #kept > 0 then
    redis.call("ZADD", KEYS[3], unpack(kept))
end
for i = 0, tasks - 1 do
    local id = ARGV[3 + 4 * i]
    local ok = active[i]
    if ok then
        if ARGV[4 + 4 * i] == "0" then
            ok = redis.call("DEL", KEYS[6 + 2 * i]) ~= 0
        else
            redis.call("HSET", KEYS[6 + 2 * i], "msg", ARGV[5 + 4 * i], "state", "completed")
        end
    end
    if ok then
        if ARGV[6 + 4 * i] == "1" and redis.call("GET", KEYS[7 + 2 * i]) == id then
            redis.call("DEL", KEYS[7 + 2 * i])
        end
        count = count + 1
        table.insert(moved, 1)
    else
        table.insert(moved, 0)
    end
end
-- The counters once for the batch, as Go's scripts count one task each.
if count > 0 then
    local n = redis.call("INCRBY", KEYS[4], count)
    if tonumber(n) == count then
        redis.call("EXPIREAT", KEYS[4], ARGV[1])
    end
    local total = redis.call("GET", KEYS[5])
    if total and tonumber(total) > tonumber(ARGV[2]) - count then
        redis.call("SET", KEYS[5], count)
    else
        redis.call("INCRBY", KEYS[5], count)
    end
end
return moved
"#,
    )
});

/// Moves an active task to `:retry`, due at the given time; counts a
/// failure when `ARGV[5]` is 1. A task whose lease runs past the lease
/// cutoff is left alone (`LEASED`): the recoverer read its lease as expired,
/// but another worker has taken the task since.
///
/// KEYS: task hash, active, lease, retry, `processed:<day>`, `failed:<day>`,
/// processed, failed. ARGV: task id, encoded message, retry at (Unix s),
/// stats expiry, is failure (1/0), max int64, lease cutoff (Unix s; max
/// int64 for none).
pub(crate) static RETRY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local leased = redis.call("ZSCORE", KEYS[3], ARGV[1])
if leased and tonumber(leased) > tonumber(ARGV[7]) then
  return redis.error_reply("LEASED by another worker")
end
if redis.call("LREM", KEYS[2], 0, ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[3], ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
redis.call("ZADD", KEYS[4], ARGV[3], ARGV[1])
redis.call("HSET", KEYS[1], "msg", ARGV[2], "state", "retry")
if tonumber(ARGV[5]) == 1 then
    local n = redis.call("INCR", KEYS[5])
    if tonumber(n) == 1 then
        redis.call("EXPIREAT", KEYS[5], ARGV[4])
    end
    local m = redis.call("INCR", KEYS[6])
    if tonumber(m) == 1 then
        redis.call("EXPIREAT", KEYS[6], ARGV[4])
    end
    local total = redis.call("GET", KEYS[7])
    if tonumber(total) == tonumber(ARGV[6]) then
        redis.call("SET", KEYS[7], 1)
        redis.call("SET", KEYS[8], 1)
    else
        redis.call("INCR", KEYS[7])
        redis.call("INCR", KEYS[8])
    end
end
return redis.status_reply("OK")
"#,
    )
});

/// Moves an active task to `:archived` (out of retries). Returns the
/// number of archived tasks and the score of the oldest, so that the caller
/// knows whether [`TRIM_ARCHIVED`] has work to do. A task whose lease runs
/// past the lease cutoff is left alone (`LEASED`), as in [`RETRY`].
///
/// KEYS: task hash, active, lease, archived, `processed:<day>`, `failed:<day>`,
/// processed, failed. ARGV: task id, encoded message, died at (Unix s),
/// stats expiry, max int64, lease cutoff (Unix s; max int64 for none).
pub(crate) static ARCHIVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local leased = redis.call("ZSCORE", KEYS[3], ARGV[1])
if leased and tonumber(leased) > tonumber(ARGV[6]) then
  return redis.error_reply("LEASED by another worker")
end
if redis.call("LREM", KEYS[2], 0, ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[3], ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
redis.call("ZADD", KEYS[4], ARGV[3], ARGV[1])
redis.call("HSET", KEYS[1], "msg", ARGV[2], "state", "archived")
local n = redis.call("INCR", KEYS[5])
if tonumber(n) == 1 then
    redis.call("EXPIREAT", KEYS[5], ARGV[4])
end
local m = redis.call("INCR", KEYS[6])
if tonumber(m) == 1 then
    redis.call("EXPIREAT", KEYS[6], ARGV[4])
end
local total = redis.call("GET", KEYS[7])
if tonumber(total) == tonumber(ARGV[5]) then
    redis.call("SET", KEYS[7], 1)
    redis.call("SET", KEYS[8], 1)
else
    redis.call("INCR", KEYS[7])
    redis.call("INCR", KEYS[8])
end
local oldest = redis.call("ZRANGE", KEYS[4], 0, 0, "WITHSCORES")
return {redis.call("ZCARD", KEYS[4]), tonumber(oldest[2])}
"#,
    )
});

/// Deletes the given archived tasks that are older than the cutoff or
/// beyond the maximum count (Go asynq trims the same way in its archive
/// script: it keeps the newest max − 1). The excess is counted again
/// before each task, so that tasks deleted meanwhile (asynqmon) or by this
/// script do not make it delete more. Returns how many were deleted.
///
/// KEYS: archived, then the task hash of each id. ARGV: cutoff (Unix s),
/// max archive size, then the ids.
pub(crate) static TRIM_ARCHIVED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local deleted = 0
for i = 3, #ARGV do
    local id = ARGV[i]
    local excess = redis.call("ZCARD", KEYS[1]) - tonumber(ARGV[2])
    local score = redis.call("ZSCORE", KEYS[1], id)
    local rank = redis.call("ZRANK", KEYS[1], id)
    if score and (tonumber(score) <= tonumber(ARGV[1]) or rank <= excess) then
        redis.call("DEL", KEYS[i - 1])
        redis.call("ZREM", KEYS[1], id)
        deleted = deleted + 1
    end
end
return deleted
"#,
    )
});

/// Puts an active task back at the head of the pending list, so that it is
/// the next one dequeued (used at shutdown).
///
/// KEYS: active, lease, pending, task hash. ARGV: task id.
pub(crate) static REQUEUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[2], ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
redis.call("RPUSH", KEYS[3], ARGV[1])
redis.call("HSET", KEYS[4], "state", "pending")
return redis.status_reply("OK")
"#,
    )
});

/// The kit's own: defers an active task (not a failure; a listener's limit
/// is reached, or it snoozed) to `:scheduled`, due at the given time, exactly as Go
/// asynq's schedule leaves a task there (`state` scheduled, the message
/// unchanged), off active and its lease, no counter touched. A task woken
/// while it was still active (its id in the woken set, see [`PROMOTE`])
/// goes to the head of pending instead, as [`FORWARD`] leaves a task, and
/// the script returns 1; else 0. A snooze gives the task's message with its
/// count of snoozes one up (a header), written in the same step; a plain
/// deferral gives "" and leaves the message unchanged.
///
/// KEYS: task hash, active, lease, scheduled, pending, woken. ARGV: task
/// id, due (Unix s), now (ns), the new message or "".
pub(crate) static DEFER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call("LREM", KEYS[2], 0, ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[3], ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if ARGV[4] ~= "" then
    redis.call("HSET", KEYS[1], "msg", ARGV[4])
end
if redis.call("ZREM", KEYS[6], ARGV[1]) == 1 then
    redis.call("RPUSH", KEYS[5], ARGV[1])
    redis.call("HSET", KEYS[1], "state", "pending", "pending_since", ARGV[3])
    return 1
end
redis.call("ZADD", KEYS[4], ARGV[2], ARGV[1])
redis.call("HSET", KEYS[1], "state", "scheduled")
return 0
"#,
    )
});

/// The kit's own: wakes deferred tasks. Each task still in `:scheduled`,
/// in no group and scored at most its bound (when it has one), moves to
/// the head of pending (as `REQUEUE` puts a task back: the next dequeue
/// takes it), its hash left as [`FORWARD`] leaves one: 1. A task still
/// active is, when marking is asked for, added to the woken set (its
/// deferral, on its way, then sends it to pending): 2. One pending, or
/// scheduled in a group (the forwarder's) or past its bound (deferred
/// again, later), is left alone: 3. Anything else (no such task, or
/// retried, archived, completed meanwhile): 0. Woken marks older than the
/// cutoff are dropped first.
///
/// KEYS: scheduled, pending, woken, then the hash of each task. ARGV: now
/// (Unix s), now (ns), woken cutoff (Unix s), mark active tasks (1/0),
/// then per task its id and its bound (Unix s; "" for none).
pub(crate) static PROMOTE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
redis.call("ZREMRANGEBYSCORE", KEYS[3], "-inf", ARGV[3])
local results, marked = {}, false
for j = 0, (#ARGV - 4) / 2 - 1 do
    local id, bound = ARGV[5 + 2 * j], ARGV[6 + 2 * j]
    local state, group = unpack(redis.call("HMGET", KEYS[4 + j], "state", "group"))
    local score = redis.call("ZSCORE", KEYS[1], id)
    if state == "scheduled" and (group or "") == "" and score
        and (bound == "" or tonumber(score) <= tonumber(bound)) then
        redis.call("ZREM", KEYS[1], id)
        redis.call("RPUSH", KEYS[2], id)
        redis.call("HSET", KEYS[4 + j], "state", "pending", "pending_since", ARGV[2])
        table.insert(results, 1)
    elseif state == "active" and ARGV[4] == "1" then
        redis.call("ZADD", KEYS[3], ARGV[1], id)
        marked = true
        table.insert(results, 2)
    elseif state == "active" or state == "pending" or state == "scheduled"
        or state == "aggregating" then
        table.insert(results, 3)
    else
        table.insert(results, 0)
    end
end
if marked then
    redis.call("EXPIRE", KEYS[3], 3600)
end
return results
"#,
    )
});

/// Go asynq's `RunTask` (asynqmon's and the CLI's "run"): moves a task
/// waiting in `:scheduled`, `:retry`, `:archived` (or a group) to pending,
/// keeping its message (so its retry count) as it is, provided its state
/// and group are still the ones read before (they name `KEYS[4]`). The
/// kit's own addition: given a new message, the task's message is replaced
/// by it in the same step, provided the stored one is still the one it was
/// made from (the kit's send-back, which resets the count of snoozes and
/// writes the listener's current policy). Returns 1 when moved, 0 when the
/// task does not exist, -1 when it is active, -2 when already pending, -3
/// when its state (or its message, when replaced) changed since it was
/// read.
///
/// KEYS: task hash, pending, groups, the sorted set the task waits in (its
/// state's, or its group's when aggregating). ARGV: task id, state, group,
/// the new message or "", the message read.
pub(crate) static RUN_TASK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call("EXISTS", KEYS[1]) == 0 then
	return 0
end
local state, group, msg = unpack(redis.call("HMGET", KEYS[1], "state", "group", "msg"))
if state == "active" then
	return -1
elseif state == "pending" then
	return -2
elseif state ~= ARGV[2] or (group or "") ~= ARGV[3] then
	return -3
elseif ARGV[4] ~= "" and msg ~= ARGV[5] then
	return -3
end
if redis.call("ZREM", KEYS[4], ARGV[1]) == 0 then
	return redis.error_reply("internal error: task id not found in zset " .. tostring(KEYS[4]))
end
if state == "aggregating" and redis.call("ZCARD", KEYS[4]) == 0 then
	redis.call("SREM", KEYS[3], group)
end
if ARGV[4] ~= "" then
	redis.call("HSET", KEYS[1], "msg", ARGV[4])
end
redis.call("LPUSH", KEYS[2], ARGV[1])
redis.call("HSET", KEYS[1], "state", "pending")
return 1
"#,
    )
});

/// Go asynq's `DeleteTask` (asynqmon's and the CLI's "delete") for a task
/// waiting in pending, `:scheduled` or `:retry`, provided its state is
/// still the one read before (it names `KEYS[2]`): the task leaves that
/// list or set, its uniqueness lock (if it still holds it) is released and
/// its hash deleted. Returns 1 when deleted, 0 when the task does not
/// exist, -1 when it is active, -3 when its state changed since it was
/// read.
///
/// KEYS: task hash, the list or set it waits in, its unique key (its hash
/// again when it has none). ARGV: task id, state, unique key ("" for none).
pub(crate) static DELETE_WAITING: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local state = redis.call("HGET", KEYS[1], "state")
if not state then
    return 0
elseif state == "active" then
    return -1
elseif state ~= ARGV[2] then
    return -3
end
local removed
if state == "pending" then
    removed = redis.call("LREM", KEYS[2], 0, ARGV[1])
else
    removed = redis.call("ZREM", KEYS[2], ARGV[1])
end
if removed == 0 then
    return redis.error_reply("internal error: task id not found in " .. tostring(KEYS[2]))
end
if ARGV[3] ~= "" and redis.call("GET", KEYS[3]) == ARGV[1] then
    redis.call("DEL", KEYS[3])
end
return redis.call("DEL", KEYS[1])
"#,
    )
});

/// The kit's own: deletes an active task whose run was cancelled (a kit
/// worker does not retry it): off active and its lease, its hash deleted.
/// Nothing is counted: the run neither succeeded nor failed.
///
/// KEYS: active, lease, task hash. ARGV: task id.
pub(crate) static DELETE_ACTIVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
redis.call("ZREM", KEYS[2], ARGV[1])
redis.call("DEL", KEYS[3])
return redis.status_reply("OK")
"#,
    )
});

/// Moves the given tasks of `:scheduled` or `:retry` that are due to
/// pending (or to their group, when they have one: Go asynq's task
/// aggregation), skipping any no longer there or whose group is not the
/// one read before. Returns how many moved.
///
/// KEYS: source sorted set, pending, then for each task its hash and its
/// group's sorted set (its hash again when it has no group). ARGV: now
/// (Unix s), now (ns), then for each task its id and group ("" for none).
pub(crate) static FORWARD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local moved = 0
for i = 1, (#ARGV - 2) / 2 do
    local id = ARGV[2 * i + 1]
    local expected = ARGV[2 * i + 2]
    local score = redis.call("ZSCORE", KEYS[1], id)
    local group = redis.call("HGET", KEYS[2 * i + 1], "group") or ""
    if score and tonumber(score) <= tonumber(ARGV[1]) and group == expected then
        if group ~= "" then
            redis.call("ZADD", KEYS[2 * i + 2], ARGV[1], id)
            redis.call("ZREM", KEYS[1], id)
            redis.call("HSET", KEYS[2 * i + 1],
                       "state", "aggregating")
        else
            redis.call("LPUSH", KEYS[2], id)
            redis.call("ZREM", KEYS[1], id)
            redis.call("HSET", KEYS[2 * i + 1],
                       "state", "pending",
                       "pending_since", ARGV[2])
        end
        moved = moved + 1
    end
end
return moved
"#,
    )
});

/// Deletes the given completed tasks whose retention has passed. Returns
/// how many were deleted.
///
/// KEYS: completed, then the task hash of each id. ARGV: now (Unix s), then
/// the ids.
pub(crate) static DELETE_EXPIRED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local deleted = 0
for i = 2, #ARGV do
    local score = redis.call("ZSCORE", KEYS[1], ARGV[i])
    if score and tonumber(score) <= tonumber(ARGV[1]) then
        redis.call("DEL", KEYS[i])
        redis.call("ZREM", KEYS[1], ARGV[i])
        deleted = deleted + 1
    end
end
return deleted
"#,
    )
});

/// Writes a server's `ServerInfo` and replaces its `WorkerInfo` hash, both
/// expiring after the TTL.
///
/// KEYS: server info, workers. ARGV: TTL (s), encoded server info, then
/// task id and encoded worker info pairs.
pub(crate) static WRITE_SERVER_STATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
redis.call("SETEX", KEYS[1], ARGV[1], ARGV[2])
redis.call("DEL", KEYS[2])
for i = 3, table.getn(ARGV)-1, 2 do
	redis.call("HSET", KEYS[2], ARGV[i], ARGV[i+1])
end
redis.call("EXPIRE", KEYS[2], ARGV[1])
return redis.status_reply("OK")
"#,
    )
});

/// Deletes a server's state at shutdown. KEYS: server info, workers.
pub(crate) static CLEAR_SERVER_STATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
redis.call("DEL", KEYS[1])
redis.call("DEL", KEYS[2])
return redis.status_reply("OK")
"#,
    )
});

/// Every script here, by name (the check that each passes every key it
/// touches in KEYS: `crate::tests::script_keys`).
#[cfg(test)]
pub(crate) fn all() -> Vec<(&'static str, &'static Script)> {
    vec![
        ("ENQUEUE", &ENQUEUE),
        ("DEQUEUE", &DEQUEUE),
        ("COMPLETE", &COMPLETE),
        ("RETRY", &RETRY),
        ("ARCHIVE", &ARCHIVE),
        ("TRIM_ARCHIVED", &TRIM_ARCHIVED),
        ("REQUEUE", &REQUEUE),
        ("DEFER", &DEFER),
        ("PROMOTE", &PROMOTE),
        ("RUN_TASK", &RUN_TASK),
        ("DELETE_WAITING", &DELETE_WAITING),
        ("DELETE_ACTIVE", &DELETE_ACTIVE),
        ("FORWARD", &FORWARD),
        ("DELETE_EXPIRED", &DELETE_EXPIRED),
        ("WRITE_SERVER_STATE", &WRITE_SERVER_STATE),
        ("CLEAR_SERVER_STATE", &CLEAR_SERVER_STATE),
    ]
}
