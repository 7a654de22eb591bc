//! The naming and domain rules gpkit's answers follow, independent of
//! files: project and identifier names ([`names`]), events, their fields
//! and listeners ([`events`]), and goose migration file names and
//! versions ([`migration`]).

pub mod events;
pub mod migration;
pub mod names;
