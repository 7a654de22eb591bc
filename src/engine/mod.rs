//! The engine every command shares: from what a project should contain to
//! the files on disk, all or nothing.
//!
//! - what a project should contain: [`blueprint`] renders the embedded
//!   [`templates`] for the [`manifest`]'s answers and components;
//! - what to do with each file: [`reconcile`] compares the blueprint with
//!   the [`project`] on disk (3-way, with [`regions`] in user files and
//!   [`cargo_toml`] merges, reading the service's own code with
//!   [`user_code`] for the re-exports and dependencies it needs; the base of an unpatched kit file comes from
//!   the [`released`] kits), and [`update`] turns the decisions into a
//!   [`plan`] with the new manifest;
//! - how it reaches the disk: [`plan`] applies all or nothing through the
//!   [`journal`], under the project's [`lock`], never through a link
//!   ([`project_path`]), keeping each file's [`line_endings`].

pub mod blueprint;
pub(crate) mod cargo_toml;
pub(crate) mod journal;
pub mod line_endings;
pub(crate) mod lock;
pub mod manifest;
pub(crate) mod plan;
pub(crate) mod project;
pub(crate) mod project_path;
pub(crate) mod reconcile;
pub mod regions;
pub mod released;
pub(crate) mod templates;
pub(crate) mod update;
pub(crate) mod user_code;
