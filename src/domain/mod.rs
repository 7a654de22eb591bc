//! The naming and domain rules gpkit's answers follow, independent of
//! files: project and identifier names ([`names`]), events, their fields
//! and listeners ([`events`]), goose migration file names and versions
//! ([`migration`]), and schedules with their timing specs ([`schedule`]).

pub mod events;
pub mod migration;
pub mod names;
pub mod schedule;
