//! The body of the load bench's listeners (gpkit's `scripts/bench/load`),
//! copied into the generated project as
//! `src/listeners/bench_done/load_listener.rs`. The listeners `first` and
//! `second` of `benchDone` call [`handle`] with their names, so that both
//! share one file of records per process.
//!
//! Each run first records its start: one line `<sent_at_us> <now_us>
//! <listener>` appended to `BENCH_RUNS_FILE` (or to
//! `<BENCH_RUNS_DIR>/listener-runs-<pid>.txt`; neither set: no record),
//! through one file per process, opened once in append mode, one write per
//! run. Then, by `BENCH_LISTENER`:
//! - `plain` (the default): nothing more;
//! - `once`: one row inserted into `load_bench_runs` in `ctx.once`, as a
//!   user's listener would write (the inbox record and the row in one
//!   transaction, once per event).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use kit::prelude::*;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Plain,
    Once,
}

struct Bench {
    variant: Variant,
    runs: Option<Mutex<File>>,
}

fn bench() -> &'static Bench {
    static BENCH: OnceLock<Bench> = OnceLock::new();
    BENCH.get_or_init(|| {
        let variant = match std::env::var("BENCH_LISTENER").as_deref() {
            Ok("plain") | Ok("") | Err(_) => Variant::Plain,
            Ok("once") => Variant::Once,
            Ok(other) => panic!("BENCH_LISTENER={other}: expected plain or once"),
        };
        let path = std::env::var_os("BENCH_RUNS_FILE")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("BENCH_RUNS_DIR").map(|dir| {
                    PathBuf::from(dir).join(format!("listener-runs-{}.txt", std::process::id()))
                })
            });
        let runs = path.map(|path| {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap_or_else(|err| panic!("opening {}: {err}", path.display()));
            Mutex::new(file)
        });
        Bench { variant, runs }
    })
}

/// One run of the listener `listener` for the event sent at `sent_at_us`.
pub async fn handle(
    listener: &'static str,
    sent_at_us: i64,
    ctx: ListenerContext,
) -> Result<(), ListenerError> {
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    let bench = bench();
    if let Some(runs) = &bench.runs {
        let line = format!("{sent_at_us} {now_us} {listener}\n");
        runs.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .write_all(line.as_bytes())?;
    }
    if bench.variant == Variant::Once {
        ctx.once(async |tx| {
            sqlx::query("INSERT INTO load_bench_runs (listener, sent_at_us) VALUES ($1, $2)")
                .bind(listener)
                .bind(sent_at_us)
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
        .await?;
    }
    Ok(())
}
