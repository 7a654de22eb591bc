//! gpkit's command-line tests: one binary, one module per area.

mod add_event;
mod add_worker;
mod asynq_interop;
mod e2e;
mod event_e2e;
mod event_sequences;
mod example;
mod first_hour;
mod go_peers;
mod goose_interop;
mod help;
mod interrupted;
mod line_endings;
mod new_migration;
mod new_project;
mod prompts;
mod server_state_interop;
mod support;
mod template_set;
mod untrusted;
mod upgrade;
mod valkey_infra;
mod worker_e2e;
