//! Every key a Lua script of the kit touches is passed in KEYS (Valkey's
//! rule: proxies, serverless offerings and a cluster's strict modes refuse
//! a script that touches another key, midway through it). Checked twice:
//!
//! - in the source of every script (the queue's, the chains of ordered
//!   listeners', the limits', the scheduler's): each key a `redis.call`
//!   names is `KEYS[...]`, or a name bound to one (a local, or a local
//!   function's parameter that every call gives one);
//! - in what a server of the test's own saw (`MONITOR`) while the ordered
//!   listeners went through everything the protocol test does: each key a
//!   command inside a script touched (as the server names them, `COMMAND
//!   GETKEYS`) was one of the script's KEYS.

#![cfg(feature = "worker")]

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use redis::Script;

/// Every script of the kit, by module and name.
fn every_script() -> Vec<(String, &'static Script)> {
    let mut all = Vec::new();
    for (module, scripts) in [
        ("queue", crate::queue::scripts::all()),
        ("ordering", crate::worker::ordering::scripts::all()),
        ("limits", crate::worker::limits::scripts()),
        ("scheduler lease", crate::scheduler::lease::scripts()),
        ("scheduler progress", crate::scheduler::progress::scripts()),
    ] {
        for (name, script) in scripts {
            all.push((format!("{module} {name}"), script));
        }
    }
    all
}

/// A script's Lua source. `redis::Script` keeps it private but shows it
/// in its `Debug` form, as an escaped string.
fn source(script: &Script) -> String {
    let debug = format!("{script:?}");
    let start = debug.find("code: \"").expect("the code in Debug") + 7;
    let end = debug.find("\", hash:").expect("the hash in Debug");
    debug[start..end]
        .replace("\\n", "\n")
        .replace("\\t", "\t")
        .replace("\\\"", "\"")
        .replace("\\'", "'")
        .replace("\\\\", "\\")
}

/// The arguments of the call that begins right after `open` (an opening
/// parenthesis) in `code`, split on the commas at its top level.
fn arguments(code: &str, open: usize) -> Vec<String> {
    let (mut depth, mut quote, mut args, mut current) = (0, None, Vec::new(), String::new());
    for c in code[open..].chars() {
        match (quote, c) {
            (Some(q), c) if c == q => {
                quote = None;
                current.push(c);
            }
            (Some(_), c) => current.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                current.push(c);
            }
            (None, '(' | '{' | '[') => {
                depth += 1;
                if depth > 1 {
                    current.push(c);
                }
            }
            (None, ')' | '}' | ']') => {
                depth -= 1;
                if depth == 0 {
                    args.push(current.trim().to_string());
                    return args;
                }
                current.push(c);
            }
            (None, ',') if depth == 1 => args.push(std::mem::take(&mut current).trim().to_string()),
            (None, c) => current.push(c),
        }
    }
    args
}

/// Splits `text` on its top-level commas.
fn top_level(text: &str) -> Vec<String> {
    arguments(&format!("({text})"), 0)
}

/// The names bound to keys in `code`: locals assigned `KEYS[...]`, and the
/// parameters of local functions that every call gives a key.
fn key_names(code: &str) -> HashSet<String> {
    let mut names = HashSet::new();
    for line in code.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("local ") else {
            continue;
        };
        let Some((left, right)) = rest.split_once('=') else {
            continue;
        };
        if left.contains('(') || right.starts_with('=') {
            continue;
        }
        for (name, value) in top_level(left).iter().zip(top_level(right)) {
            if value.starts_with("KEYS[") {
                names.insert(name.clone());
            }
        }
    }
    // Parameters, to a fixed point: a call may pass another parameter.
    let functions: Vec<(String, Vec<String>)> = code
        .match_indices("local function ")
        .filter_map(|(at, _)| {
            let rest = &code[at + "local function ".len()..];
            let open = rest.find('(')?;
            let name = rest[..open].trim().to_string();
            Some((name, arguments(rest, open)))
        })
        .collect();
    loop {
        let before = names.len();
        for (function, parameters) in &functions {
            let calls: Vec<Vec<String>> = code
                .match_indices(&format!("{function}("))
                .filter(|(at, _)| !code[..*at].ends_with("function "))
                .map(|(at, matched)| arguments(code, at + matched.len() - 1))
                .collect();
            for (i, parameter) in parameters.iter().enumerate() {
                let every_call_a_key = !calls.is_empty()
                    && calls.iter().all(|args| {
                        args.get(i)
                            .is_some_and(|arg| arg.starts_with("KEYS[") || names.contains(arg))
                    });
                if every_call_a_key {
                    names.insert(parameter.clone());
                }
            }
        }
        if names.len() == before {
            return names;
        }
    }
}

/// The keys of `code`'s `redis.call`s that are not passed in KEYS.
fn undeclared(code: &str) -> Vec<String> {
    let names = key_names(code);
    let code_calls = code.replace("redis.pcall(", "redis.call(");
    let mut found = Vec::new();
    for (at, matched) in code_calls.match_indices("redis.call(") {
        let args = arguments(&code_calls, at + matched.len() - 1);
        let command = args[0].trim_matches(['"', '\'']).to_uppercase();
        let keys = match command.as_str() {
            "TIME" | "PUBLISH" => 0..0,
            "RPOPLPUSH" | "LMOVE" => 1..3,
            "DEL" | "EXISTS" | "UNLINK" => 1..args.len(),
            _ => 1..2,
        };
        for key in &args[keys] {
            if !(key.starts_with("KEYS[") || names.contains(key)) {
                found.push(format!("{command} touches `{key}`"));
            }
        }
    }
    found
}

#[test]
fn every_key_a_script_touches_comes_through_keys() {
    let mut calls = 0;
    for (name, script) in every_script() {
        let code = source(script);
        calls += code.matches("redis.call(").count() + code.matches("redis.pcall(").count();
        assert_eq!(undeclared(&code), Vec::<String>::new(), "{name}:\n{code}");
    }
    assert!(calls > 100, "{calls} calls read");
}

#[test]
fn the_check_finds_a_key_built_inside_a_script() {
    let built = "local wait = ARGV[1] .. ':' .. ARGV[2]\nredis.call('LRANGE', wait, 0, -1)";
    assert_eq!(undeclared(built), vec!["LRANGE touches `wait`"]);
    let from_data = "local id = redis.call('LINDEX', KEYS[1], 0)\nredis.call('HGET', 'asynq:{q}:t:' .. id, 'msg')";
    assert_eq!(
        undeclared(from_data),
        vec!["HGET touches `'asynq:{q}:t:' .. id`"]
    );
    let passed = "local function f(task, id)\n  redis.call('HSET', task, 'a', id)\nend\nf(KEYS[2], ARGV[1])\nf(ARGV[3], ARGV[1])";
    assert_eq!(undeclared(passed), vec!["HSET touches `task`"]);
}

/// One command a server saw: its client (`lua` inside a script) and its
/// words, unescaped.
fn monitored(line: &str) -> Option<(String, Vec<Vec<u8>>)> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let client = line[open + 1..close].split_whitespace().nth(1)?.to_string();
    let mut words = Vec::new();
    let mut chars = line[close + 1..].bytes().peekable();
    while let Some(b) = chars.next() {
        if b != b'"' {
            continue;
        }
        let mut word = Vec::new();
        while let Some(b) = chars.next() {
            match b {
                b'"' => break,
                b'\\' => match chars.next()? {
                    b'n' => word.push(b'\n'),
                    b'r' => word.push(b'\r'),
                    b't' => word.push(b'\t'),
                    b'a' => word.push(7),
                    b'b' => word.push(8),
                    b'x' => {
                        let hex = [chars.next()?, chars.next()?];
                        word.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
                    }
                    other => word.push(other),
                },
                other => word.push(other),
            }
        }
        words.push(word);
    }
    Some((client, words))
}

/// The scripts of a cancel (`outbox cancel`) on the server at `addr`: a
/// waiting task deleted, a run taken out of its chain.
async fn cancel_steps_on(addr: &str) {
    let client = crate::queue::Client::connect(addr, None, 0).await.unwrap();
    let task = crate::queue::NewTask::new("listener:e:l", "cancelled", Vec::new()).queue("cancel");
    client.enqueue(&[task]).await.unwrap();
    client.delete_waiting("cancel", "cancelled").await.unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://unused/unused")
        .unwrap();
    crate::worker::ordering::Ordering::new(pool, client, vec!["cancel".into()], Default::default())
        .take_out("cancel", "l", "k", "cancelled")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_a_script_touched_on_a_server_was_one_of_its_keys() {
    // Arrange: a server of the test's own, and MONITOR on it.
    let server = super::support::OwnServer::start().await;
    let monitor_cli = Command::new("redis-cli").arg("--version").output().is_ok();
    if !super::support::require(
        "valkey-server or redis-server, and redis-cli",
        server.is_some() && monitor_cli,
        "gpkit's scripts/test installs both",
    ) {
        return;
    }
    let server = server.unwrap();
    let mut monitor = Command::new("redis-cli")
        .args(["-p", &server.port.to_string(), "monitor"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(monitor.stdout.take().unwrap());
    let reading =
        std::thread::spawn(move || lines.lines().map_while(Result::ok).collect::<Vec<_>>());

    // Act: everything the protocol test does, on that server.
    super::ordering_protocol::run_every_step_on(&server.addr()).await;
    cancel_steps_on(&server.addr()).await;
    monitor.kill().unwrap();
    monitor.wait().unwrap();
    let lines = reading.join().unwrap();

    // Assert
    let mut conn = server.redis().await;
    let shas: HashMap<String, String> = every_script()
        .into_iter()
        .map(|(name, script)| (script.get_hash().to_string(), name))
        .collect();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut declared: Option<(String, BTreeSet<Vec<u8>>)> = None;
    let mut undeclared = Vec::new();
    for line in &lines {
        let Some((client, words)) = monitored(line) else {
            continue;
        };
        if client != "lua" {
            declared = None;
            let command = String::from_utf8_lossy(&words[0]).to_uppercase();
            // The kit's scripts run by their hash; a test's own (EVAL) is
            // not looked at.
            if command == "EVALSHA" {
                let count: usize = String::from_utf8_lossy(&words[2]).parse().unwrap();
                let sha = String::from_utf8_lossy(&words[1]).into_owned();
                let name = shas.get(&sha).cloned().unwrap_or(sha);
                *seen.entry(name.clone()).or_default() += 1;
                declared = Some((name, words[3..3 + count].iter().cloned().collect()));
            }
            continue;
        }
        let Some((script, keys)) = declared.as_ref() else {
            continue;
        };
        let touched: Vec<Vec<u8>> = redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg(&words)
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        for key in touched {
            if !keys.contains(&key) {
                undeclared.push(format!(
                    "{script}: {} touched {}",
                    String::from_utf8_lossy(&words[0]),
                    String::from_utf8_lossy(&key)
                ));
            }
        }
    }
    assert_eq!(undeclared, Vec::<String>::new());
    for (name, _) in crate::worker::ordering::scripts::all() {
        assert!(
            seen.contains_key(&format!("ordering {name}")),
            "the workload never ran the ordering script {name}: {seen:?}"
        );
    }
}
