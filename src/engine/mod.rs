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
pub mod cargo_toml;
pub mod journal;
pub mod line_endings;
pub mod lock;
pub mod manifest;
pub mod plan;
pub mod project;
pub mod project_path;
pub mod reconcile;
pub mod regions;
pub mod released;
pub mod templates;
pub mod update;
pub mod user_code;
