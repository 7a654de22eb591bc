//! The console: web pages that follow the outbox at work, from one event's
//! commit to every listener that ran it, and act on what failed.
//!
//! `outbox console` serves it (on 127.0.0.1 unless told otherwise), and
//! `gpkit dev` starts it beside the service. It is also an axum
//! [`Router`] that a service can nest under a path of its own, behind its
//! own authentication:
//!
//! ```no_run
//! use kit::console::Console;
//! use kit::config::Config;
//! use kit::worker::listeners::Listeners;
//!
//! # fn routes(config: Config) -> axum::Router {
//! let console = Console::new(config, Listeners::new()).read_only();
//! axum::Router::new().nest("/ops/outbox", console.router())
//! # }
//! ```
//!
//! The pages are rendered on the server (maud escapes every value: a
//! payload holding `<script>` shows as text), with a little JavaScript
//! for the live parts and every asset in the binary:
//!
//! - `overview`: the relay's lag and backlog, events committed and
//!   published per second, tasks processed and failed per second, each
//!   queue's size and latency, over the last minutes;
//! - `events`: events by id, name and time, or by a payload field within
//!   a time range, newest first, in pages; one event with its task in the
//!   queue and each listener's task and inbox record; (`cancelled`) its
//!   Cancel button, and the cancelled tasks recorded;
//! - `failures`: listener tasks waiting for a retry or archived, grouped
//!   by listener and error, to run again one by one or a group at a time;
//!   and (`replay`) the events matching a filter, delivered again; and
//!   (`recorded`) the failures recorded in Postgres that fell off the
//!   queue's archive, to send back;
//! - `failed_tasks`: the failed listener tasks the queue holds, which
//!   `failures` lists and `recorded` leaves out;
//! - `queues`: each queue's tasks by state, to pause or resume;
//! - `schedules`: each schedule's last and next tick, and the replica that
//!   leads;
//! - `later`: the events dispatched for later that wait, and for when;
//! - `traces`: under `gpkit dev`, one trace as a waterfall, from the
//!   request to every listener (the spans gpkit dev keeps);
//! - `guard`: the token, the CSRF check and the read-only mode;
//! - `serve`: [`serve`], on an address of its own;
//! - `page`: the layout and what every page shows alike.
//!
//! It reads the outbox and the queue as the `outbox` command does
//! ([`crate::operations`]) and writes only when asked to act: each action
//! is a POST, logged with what it matched.

mod cancelled;
mod events;
mod failed_tasks;
mod failures;
mod guard;
mod later;
mod overview;
mod page;
mod queues;
mod recorded;
mod replay;
mod schedules;
mod serve;
mod traces;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::get;

use crate::config::Config;
use crate::follow::Context;
use crate::worker::listeners::Listeners;

pub use serve::{ServeError, serve};

/// The console, to serve ([`serve`]) or to nest in a service's router
/// ([`Console::router`]).
pub struct Console {
    context: Context,
    options: Options,
}

/// How the console behaves, set with [`Console`]'s builder methods.
#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    /// No actions: the pages show, never change.
    pub(crate) read_only: bool,
    /// Payload fields whose values are never shown (personal data).
    pub(crate) masked_fields: Vec<String>,
    /// A link to an event's trace in the service's tracing backend, with
    /// `{trace_id}` where its id goes.
    pub(crate) trace_url: Option<String>,
    /// Every request must carry it (see `guard`).
    pub(crate) token: Option<String>,
    /// Where `gpkit dev` keeps the spans it receives (see `traces`).
    pub(crate) traces: Option<PathBuf>,
}

/// What every page's handler works with.
pub(crate) struct State {
    pub(crate) context: Context,
    pub(crate) options: Options,
    /// The secret every form carries back (see `guard`).
    pub(crate) csrf: String,
    /// The overview's figures over the last minutes.
    pub(crate) samples: Mutex<overview::Samples>,
}

impl Console {
    /// The console of the service configured by `config`, whose listeners
    /// are `listeners` (to find an event's listener tasks). Connects to
    /// Postgres and Valkey when a page first needs them.
    pub fn new(config: Config, listeners: Listeners) -> Self {
        Self {
            context: Context::new(config, listeners),
            options: Options::default(),
        }
    }

    /// The console of the `outbox` command's context.
    pub(crate) fn from_context(context: Context) -> Self {
        Self {
            context,
            options: Options::default(),
        }
    }

    /// No actions (retry, replay): the pages show what they show, without
    /// the buttons, and every POST is refused.
    pub fn read_only(mut self) -> Self {
        self.options.read_only = true;
        self
    }

    /// Never shows the values of these payload fields, at any depth (a
    /// customer's email, an address): they read `***`.
    pub fn mask_fields<I, S>(mut self, fields: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.options
            .masked_fields
            .extend(fields.into_iter().map(Into::into));
        self
    }

    /// Links each event's trace to the service's tracing backend:
    /// `template` with `{trace_id}` where the trace id goes, such as
    /// `https://jaeger.example.com/trace/{trace_id}`.
    pub fn trace_url(mut self, template: impl Into<String>) -> Self {
        self.options.trace_url = Some(template.into());
        self
    }

    /// Draws each event's trace from the spans `gpkit dev` keeps in `dir`
    /// (one JSON line a span; `gpkit dev` names it in
    /// `OUTBOX_CONSOLE_TRACES`).
    pub fn traces_from(mut self, dir: impl Into<PathBuf>) -> Self {
        self.options.traces = Some(dir.into());
        self
    }

    /// Refuses every request that does not carry `token` (401): as a
    /// bearer token, or once given as `?token=` a cookie of the browser.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.options.token = Some(token.into()).filter(|token| !token.is_empty());
        self
    }

    /// The pages, as a router to serve or to nest under a path (every link
    /// is relative to where it is nested).
    pub fn router(self) -> Router {
        let state = Arc::new(State {
            context: self.context,
            options: self.options,
            csrf: guard::new_secret(),
            samples: Mutex::new(overview::Samples::default()),
        });
        Router::new()
            .route("/", get(overview::page))
            .route("/overview.json", get(overview::figures_json))
            .route("/events", get(events::list))
            .route("/events/{id}", get(events::one))
            .route(
                "/events/{id}/cancel",
                axum::routing::post(cancelled::cancel),
            )
            .route(
                "/failures/send-back-cancelled",
                axum::routing::post(cancelled::send_back),
            )
            .route("/failures", get(failures::page))
            .route(
                "/failures/replay",
                get(replay::confirm).post(replay::replay),
            )
            .route(
                "/failures/send-back",
                get(recorded::confirm).post(recorded::send_back),
            )
            .route(
                "/failures/retry",
                get(failures::confirm).post(failures::retry),
            )
            .route("/traces/{id}", get(traces::page))
            .route("/queues", get(queues::page))
            .route("/schedules", get(schedules::page))
            .route("/later", get(later::page))
            .route("/queues/pause", axum::routing::post(queues::pause))
            .route("/assets/console.css", get(page::stylesheet))
            .route("/assets/console.js", get(page::script))
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                guard::check,
            ))
            .with_state(state)
    }
}

/// The address `outbox console` listens on unless told otherwise.
pub const DEFAULT_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9320);
