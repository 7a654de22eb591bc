//! gpkit's command-line tests: one binary, one module per area.

mod add_event;
mod add_worker;
mod asynq_interop;
mod browser;
mod console;
mod deploy;
mod dev;
mod doctor;
mod e2e;
mod event_e2e;
mod event_sequences;
mod example;
mod figures;
mod first_hour;
mod go_peers;
mod goose_interop;
mod guarantees;
mod help;
mod inbox_e2e;
mod interrupted;
mod kit_migrations;
mod line_endings;
mod metrics;
mod new_migration;
mod new_project;
mod outbox_ops;
mod own_postgres;
mod postgres_tls;
mod prompts;
mod release_fixtures;
mod schedule;
mod seaorm;
mod secrets;
mod server_state_interop;
mod sql;
mod support;
mod template_set;
mod test_ca;
mod tracing_export;
mod untrusted;
mod upgrade;
mod valkey_infra;
mod worker_e2e;
mod worker_ops;

/// The projects several tests share, each generated and built once per run
/// (a `OnceLock` in its module), in the order the tests first ask for them,
/// and last the one of a long test late in the run's order (inbox_e2e's),
/// so that it starts without waiting for its build.
/// In scripts/test's full run a thread of its own builds them all from the
/// run's first build on (`e2e::cargo_lock`): the first tests in the run's
/// order (asynq_interop's) wait minutes on Go's recoverer while no other
/// test asks for a build, and the chain of builds would stand idle.
const SHARED_PROJECTS: &[fn()] = &[
    || {
        asynq_interop::project();
    },
    || {
        outbox_ops::built();
    },
    || {
        e2e::built_project();
    },
    || {
        valkey_infra::project();
    },
    || {
        schedule::scheduled_project();
    },
    || {
        server_state_interop::project_with_an_endless_listener();
    },
    || {
        inbox_e2e::project();
    },
];
