//! The Lua scripts that change the limits' state in Valkey: take, free and
//! renew a concurrency slot, and take a rate turn.

use std::sync::LazyLock;

use redis::Script;

/// Takes a slot, or registers a waiter. The holders' expired leases are
/// dropped first. A member that holds a slot already (handed to it while
/// it waited, or its own run's, recovered) keeps it. Granted, the member
/// leaves the waiters, and the slots still free go to the oldest waiters.
/// Returns `{granted (1/0), µs waited since first registered (0 if not),
/// members handed a slot}`.
///
/// KEYS: holders, waiters. ARGV: member, limit, lease (µs), holders' TTL
/// (ms), waiters' TTL (ms).
pub(super) static TAKE_SLOT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit, lease = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
local held = redis.call("ZSCORE", KEYS[1], ARGV[1])
if held or redis.call("ZCARD", KEYS[1]) < limit then
    redis.call("ZADD", KEYS[1], now + lease, ARGV[1])
    local waited = 0
    local since = redis.call("ZSCORE", KEYS[2], ARGV[1])
    if since then
        waited = now - tonumber(since)
        redis.call("ZREM", KEYS[2], ARGV[1])
    end
    local handed = {}
    local free = limit - redis.call("ZCARD", KEYS[1])
    if free > 0 then
        handed = redis.call("ZRANGE", KEYS[2], 0, free - 1)
        for _, waiter in ipairs(handed) do
            redis.call("ZADD", KEYS[1], now + lease, waiter)
            redis.call("ZREM", KEYS[2], waiter)
        end
    end
    redis.call("PEXPIRE", KEYS[1], ARGV[4])
    return {1, math.floor(waited), handed}
end
redis.call("ZADD", KEYS[2], "NX", now, ARGV[1])
redis.call("PEXPIRE", KEYS[2], ARGV[5])
return {0, 0, {}}
"#,
    )
});

/// Frees a slot; the slots then free (this one, and any whose lease ran
/// out) go to the oldest waiters, leased for them. Returns the members
/// handed a slot.
///
/// KEYS: holders, waiters. ARGV: member, limit, lease (µs), holders' TTL
/// (ms).
pub(super) static FREE_SLOT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call("ZREM", KEYS[1], ARGV[1])
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
local handed = {}
local free = tonumber(ARGV[2]) - redis.call("ZCARD", KEYS[1])
if free > 0 then
    handed = redis.call("ZRANGE", KEYS[2], 0, free - 1)
    for _, waiter in ipairs(handed) do
        redis.call("ZADD", KEYS[1], now + tonumber(ARGV[3]), waiter)
        redis.call("ZREM", KEYS[2], waiter)
    end
    if #handed > 0 then
        redis.call("PEXPIRE", KEYS[1], ARGV[4])
    end
end
return handed
"#,
    )
});

/// Extends a held slot's lease; 0 when the member holds none (its lease
/// ran out and the slot was taken back).
///
/// KEYS: holders. ARGV: member, lease (µs), holders' TTL (ms).
pub(super) static RENEW_SLOT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local renewed = redis.call("ZADD", KEYS[1], "XX", "CH", now + tonumber(ARGV[2]), ARGV[1])
if renewed == 1 then
    redis.call("PEXPIRE", KEYS[1], ARGV[3])
end
return renewed
"#,
    )
});

/// A rate's turn: GCRA on Valkey's clock (µs) as a queue. `tat`, the
/// theoretical arrival time, is one interval past the last turn given; a
/// new turn is `max(now, tat - tolerance)` (now while the rate and burst
/// allow, else the first free turn), and moves `tat` one interval on. A
/// turn further off than the short wait is kept in the turns set and the
/// run told to wait for it; one within it is the run's at once (it sleeps
/// the rest). A run back for its turn gets it (within the short wait),
/// is told to wait the rest (earlier), or, more than the grace late, has
/// lost it and takes a new one. Turns not claimed within an hour are
/// dropped. Returns `{granted (1/0), µs until the turn (0 if now), µs
/// waited since first told to wait (granted runs only)}`.
///
/// KEYS: state (hash: tat), turns, since. ARGV: member, interval (µs),
/// tolerance (µs), grace (µs), short wait (µs), idle TTL (ms).
pub(super) static TAKE_TURN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, tolerance = tonumber(ARGV[2]), tonumber(ARGV[3])
local grace, short, ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local turn = tonumber(redis.call("ZSCORE", KEYS[2], ARGV[1]))
if turn and now > turn + grace then
    redis.call("ZREM", KEYS[2], ARGV[1])
    turn = nil
end
if not turn then
    local tat = tonumber(redis.call("HGET", KEYS[1], "tat")) or now
    if tat < now then
        tat = now
    end
    turn = math.max(now, tat - tolerance)
    redis.call("HSET", KEYS[1], "tat", tat + interval)
    redis.call("PEXPIRE", KEYS[1], math.ceil((tat + interval - now) / 1000) + ttl)
    if turn - now > short then
        redis.call("ZADD", KEYS[2], turn, ARGV[1])
        redis.call("ZADD", KEYS[3], "NX", now, ARGV[1])
        redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", now - 3600000000)
        redis.call("ZREMRANGEBYSCORE", KEYS[3], "-inf", now - ttl * 1000)
        local expiry = math.ceil((turn - now) / 1000) + ttl
        redis.call("PEXPIRE", KEYS[2], expiry)
        redis.call("PEXPIRE", KEYS[3], expiry)
        return {0, math.ceil(turn - now), 0}
    end
elseif turn - now > short then
    return {0, math.ceil(turn - now), 0}
else
    redis.call("ZREM", KEYS[2], ARGV[1])
end
local wait = math.max(0, math.ceil(turn - now))
local waited = 0
local since = tonumber(redis.call("ZSCORE", KEYS[3], ARGV[1]))
if since then
    waited = now - since + wait
    redis.call("ZREM", KEYS[3], ARGV[1])
end
return {1, wait, math.floor(waited)}
"#,
    )
});

/// Every script of the limits, by name (the check that each passes every
/// key it touches in KEYS).
#[cfg(test)]
pub(crate) fn scripts() -> Vec<(&'static str, &'static Script)> {
    vec![
        ("TAKE_SLOT", &TAKE_SLOT),
        ("FREE_SLOT", &FREE_SLOT),
        ("RENEW_SLOT", &RENEW_SLOT),
        ("TAKE_TURN", &TAKE_TURN),
    ]
}
