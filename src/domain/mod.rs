//! The naming and domain rules gpkit's answers follow, independent of
//! files: project and identifier names ([`names`]), events, their fields
//! and listeners ([`events`]) and how listeners run ([`listener_options`],
//! their retry policy in [`retry_flags`]), goose migration file names and
//! versions ([`migration`]), schedules with their timing specs
//! ([`schedule`]), and the kit's API changes that an upgrade carries user
//! code across ([`api_changes`] for set 6's, [`kit_api`] for those
//! `scripts/kit-api` declares), what a service's own code names of the
//! kit's old paths and of its dependencies ([`code_uses`]), and values
//! written into URLs ([`url_part`]).
pub(crate) mod api_changes;
pub(crate) mod code_uses;
pub mod events;
pub(crate) mod kit_api;
pub(crate) mod listener_options;
pub(crate) mod migration;
pub mod names;
pub(crate) mod retry_flags;
pub(crate) mod schedule;
pub(crate) mod url_part;
