//! Go asynq's Lua scripts, one per state change of a task.
//!
//! Each script is copied verbatim from hibiken/asynq `internal/rdb/rdb.go`
//! (the `asynq` crate 0.1.8 carries the same text in
//! `backend/rdb/redis_scripts.rs`), so that a task moves between states
//! exactly as a Go worker moves it. Copyright 2020 Kentaro Hibino, MIT
//! licence. Scripts run with EVALSHA; [`redis::Script`] falls back to
//! loading the script when the server does not know it yet.
//!
//! # Valkey Cluster
//!
//! A script runs on the node that owns the slot of its first key. Every
//! key a script touches is in that slot: the keys it gets through KEYS all
//! carry the queue's `{queue}` hash tag, and five scripts (DEQUEUE,
//! ARCHIVE, FORWARD, LIST_LEASE_EXPIRED, DELETE_EXPIRED_COMPLETED) also
//! build task (and group) keys from a prefix argument, as Go asynq does,
//! because the task ids are only known inside the script. Those prefixes
//! carry the same tag (guarded by a test in `keys`), so the keys are in the
//! same slot and the scripts run on Valkey Cluster and Redis Cluster; they
//! are not declared in KEYS (Go asynq issues #480, #951), which a server
//! that enforced declared keys would refuse.

use std::sync::LazyLock;

use redis::Script;

/// Adds a pending task unless its id exists. Returns 1, or 0 on conflict.
///
/// KEYS: task hash, pending list. ARGV: encoded message, task id, now (ns).
pub static ENQUEUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
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

/// Moves the oldest pending task to active under a lease, unless the queue
/// is paused. Returns the encoded message, or nil.
///
/// KEYS: pending, paused, active, lease. ARGV: lease expiry (Unix s), task
/// key prefix.
pub static DEQUEUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call("EXISTS", KEYS[2]) == 0 then
    local id = redis.call("RPOPLPUSH", KEYS[1], KEYS[3])
    if id then
        local key = ARGV[2] .. id
        redis.call("HSET", key, "state", "active")
        redis.call("HDEL", key, "pending_since")
        redis.call("ZADD", KEYS[4], ARGV[1], id)
        return redis.call("HGET", key, "msg")
    end
end
return nil
"#,
    )
});

/// Deletes a succeeded task that has no retention, counting it processed.
///
/// KEYS: active, lease, task hash, processed:<day>, processed.
/// ARGV: task id, stats expiry (Unix s), max int64.
pub static DONE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[2], ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if redis.call("DEL", KEYS[3]) == 0 then
  return redis.error_reply("NOT FOUND")
end
local n = redis.call("INCR", KEYS[4])
if tonumber(n) == 1 then
    redis.call("EXPIREAT", KEYS[4], ARGV[2])
end
local total = redis.call("GET", KEYS[5])
if tonumber(total) == tonumber(ARGV[3]) then
    redis.call("SET", KEYS[5], 1)
else
    redis.call("INCR", KEYS[5])
end
return redis.status_reply("OK")
"#,
    )
});

/// [`DONE`] for a task enqueued by Go with `asynq.Unique`: also releases
/// its uniqueness lock. KEYS: as [`DONE`], then the unique key.
pub static DONE_UNIQUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[2], ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if redis.call("DEL", KEYS[3]) == 0 then
  return redis.error_reply("NOT FOUND")
end
local n = redis.call("INCR", KEYS[4])
if tonumber(n) == 1 then
    redis.call("EXPIREAT", KEYS[4], ARGV[2])
end
local total = redis.call("GET", KEYS[5])
if tonumber(total) == tonumber(ARGV[3]) then
    redis.call("SET", KEYS[5], 1)
else
    redis.call("INCR", KEYS[5])
end
if redis.call("GET", KEYS[6]) == ARGV[1] then
  redis.call("DEL", KEYS[6])
end
return redis.status_reply("OK")
"#,
    )
});

/// Keeps a succeeded task in `:completed` until its retention expires.
///
/// KEYS: active, lease, completed, task hash, processed:<day>, processed.
/// ARGV: task id, stats expiry, completed-at + retention, encoded message,
/// max int64.
pub static MARK_AS_COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[2], ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if redis.call("ZADD", KEYS[3], ARGV[3], ARGV[1]) ~= 1 then
  return redis.error_reply("INTERNAL")
end
redis.call("HSET", KEYS[4], "msg", ARGV[4], "state", "completed")
local n = redis.call("INCR", KEYS[5])
if tonumber(n) == 1 then
    redis.call("EXPIREAT", KEYS[5], ARGV[2])
end
local total = redis.call("GET", KEYS[6])
if tonumber(total) == tonumber(ARGV[5]) then
    redis.call("SET", KEYS[6], 1)
else
    redis.call("INCR", KEYS[6])
end
return redis.status_reply("OK")
"#,
    )
});

/// [`MARK_AS_COMPLETE`] that also releases a Go uniqueness lock.
/// KEYS: as [`MARK_AS_COMPLETE`], then the unique key.
pub static MARK_AS_COMPLETE_UNIQUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[2], ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if redis.call("ZADD", KEYS[3], ARGV[3], ARGV[1]) ~= 1 then
  return redis.error_reply("INTERNAL")
end
redis.call("HSET", KEYS[4], "msg", ARGV[4], "state", "completed")
local n = redis.call("INCR", KEYS[5])
if tonumber(n) == 1 then
    redis.call("EXPIREAT", KEYS[5], ARGV[2])
end
local total = redis.call("GET", KEYS[6])
if tonumber(total) == tonumber(ARGV[5]) then
    redis.call("SET", KEYS[6], 1)
else
    redis.call("INCR", KEYS[6])
end
if redis.call("GET", KEYS[7]) == ARGV[1] then
  redis.call("DEL", KEYS[7])
end
return redis.status_reply("OK")
"#,
    )
});

/// Moves an active task to `:retry`, due at the given time; counts a
/// failure when ARGV[5] is 1.
///
/// KEYS: task hash, active, lease, retry, processed:<day>, failed:<day>,
/// processed, failed. ARGV: task id, encoded message, retry at (Unix s),
/// stats expiry, is failure (1/0), max int64.
pub static RETRY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
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

/// Moves an active task to `:archived` (out of retries), trimming archived
/// tasks older than the cutoff or beyond the maximum count.
///
/// KEYS: task hash, active, lease, archived, processed:<day>, failed:<day>,
/// processed, failed, task key prefix. ARGV: task id, encoded message, died
/// at (Unix s), cutoff (Unix s), max archive size, stats expiry, max int64.
pub static ARCHIVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call("LREM", KEYS[2], 0, ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[3], ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
redis.call("ZADD", KEYS[4], ARGV[3], ARGV[1])
local old = redis.call("ZRANGE", KEYS[4], "-inf", ARGV[4], "BYSCORE")
if #old > 0 then
    for _, id in ipairs(old) do
        redis.call("DEL", KEYS[9] .. id)
    end
    redis.call("ZREM", KEYS[4], unpack(old))
end
local extra = redis.call("ZRANGE", KEYS[4], 0, -ARGV[5])
if #extra > 0 then
    for _, id in ipairs(extra) do
        redis.call("DEL", KEYS[9] .. id)
    end
    redis.call("ZREM", KEYS[4], unpack(extra))
end
redis.call("HSET", KEYS[1], "msg", ARGV[2], "state", "archived")
local n = redis.call("INCR", KEYS[5])
if tonumber(n) == 1 then
    redis.call("EXPIREAT", KEYS[5], ARGV[6])
end
local m = redis.call("INCR", KEYS[6])
if tonumber(m) == 1 then
    redis.call("EXPIREAT", KEYS[6], ARGV[6])
end
local total = redis.call("GET", KEYS[7])
if tonumber(total) == tonumber(ARGV[7]) then
    redis.call("SET", KEYS[7], 1)
    redis.call("SET", KEYS[8], 1)
else
    redis.call("INCR", KEYS[7])
    redis.call("INCR", KEYS[8])
end
return redis.status_reply("OK")
"#,
    )
});

/// Puts an active task back at the head of the pending list, so that it is
/// the next one dequeued (used at shutdown).
///
/// KEYS: active, lease, pending, task hash. ARGV: task id.
pub static REQUEUE: LazyLock<Script> = LazyLock::new(|| {
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

/// Go asynq's `RunTask` (asynqmon's and the CLI's "run"): moves a task
/// waiting in `:scheduled`, `:retry` or `:archived` to pending, keeping
/// its message (so its retry count) as it is. Returns 1 when moved, 0 when
/// the task does not exist, -1 when it is active, -2 when already pending.
///
/// KEYS: task hash, pending, groups. ARGV: task id, queue key prefix,
/// group key prefix.
pub static RUN_TASK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call("EXISTS", KEYS[1]) == 0 then
	return 0
end
local state, group = unpack(redis.call("HMGET", KEYS[1], "state", "group"))
if state == "active" then
	return -1
elseif state == "pending" then
	return -2
elseif state == "aggregating" then
	local n = redis.call("ZREM", ARGV[3] .. group, ARGV[1])
	if n == 0 then
		return redis.error_reply("internal error: task id not found in zset " .. tostring(ARGV[3] .. group))
	end
	if redis.call("ZCARD", ARGV[3] .. group) == 0 then
		redis.call("SREM", KEYS[3], group)
	end
else
	local n = redis.call("ZREM", ARGV[2] .. state, ARGV[1])
	if n == 0 then
		return redis.error_reply("internal error: task id not found in zset " .. tostring(ARGV[2] .. state))
	end
end
redis.call("LPUSH", KEYS[2], ARGV[1])
redis.call("HSET", KEYS[1], "state", "pending")
return 1
"#,
    )
});

/// Moves up to 100 due tasks of `:scheduled` or `:retry` to pending.
/// Returns how many moved.
///
/// KEYS: source sorted set, pending. ARGV: now (Unix s), task key prefix,
/// now (ns), group key prefix.
pub static FORWARD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local ids = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", ARGV[1], "LIMIT", 0, 100)
for _, id in ipairs(ids) do
    local taskKey = ARGV[2] .. id
    local group = redis.call("HGET", taskKey, "group")
    if group and group ~= '' then
        redis.call("ZADD", ARGV[4] .. group, ARGV[1], id)
        redis.call("ZREM", KEYS[1], id)
        redis.call("HSET", taskKey,
                   "state", "aggregating")
    else
        redis.call("LPUSH", KEYS[2], id)
        redis.call("ZREM", KEYS[1], id)
        redis.call("HSET", taskKey,
                   "state", "pending",
                   "pending_since", ARGV[3])
    end
end
return table.getn(ids)
"#,
    )
});

/// Returns the encoded messages of active tasks whose lease expired before
/// the cutoff (their worker died).
///
/// KEYS: lease. ARGV: cutoff (Unix s), task key prefix.
pub static LIST_LEASE_EXPIRED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local res = {}
local ids = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", ARGV[1])
for _, id in ipairs(ids) do
    local key = ARGV[2] .. id
    local v = redis.call("HGET", key, "msg")
    if v then
        table.insert(res, v)
    end
end
return res
"#,
    )
});

/// Deletes up to a batch of completed tasks whose retention expired.
/// Returns how many were deleted.
///
/// KEYS: completed. ARGV: now (Unix s), task key prefix, batch size.
pub static DELETE_EXPIRED_COMPLETED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local ids = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", ARGV[1], "LIMIT", 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
    redis.call("DEL", ARGV[2] .. id)
    redis.call("ZREM", KEYS[1], id)
end
return table.getn(ids)
"#,
    )
});

/// Writes a server's `ServerInfo` and replaces its `WorkerInfo` hash, both
/// expiring after the TTL.
///
/// KEYS: server info, workers. ARGV: TTL (s), encoded server info, then
/// task id and encoded worker info pairs.
pub static WRITE_SERVER_STATE: LazyLock<Script> = LazyLock::new(|| {
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
pub static CLEAR_SERVER_STATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
redis.call("DEL", KEYS[1])
redis.call("DEL", KEYS[2])
return redis.status_reply("OK")
"#,
    )
});
