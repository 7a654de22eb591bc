//! The kit's API changes that break a service's own code, and how an
//! upgrade carries that code across them: a rewrite where the new form is
//! certain, and otherwise a note that names the line and what to change.
//!
//! Template set 6 made the kit's API small: `kit::dispatch(executor,
//! &event)` replaces the `dispatcher` of `AppState` and
//! `OutboxDispatcher::new().dispatch(..)` (no trait to import), and
//! `ListenerContext`'s fields are behind methods (`ctx.event_id()`).
//! `Transactor::run` takes a closure that returns an `anyhow::Result`.

/// The template set whose API [`carry_to_set_6`] carries code to.
pub(crate) const SET_6: u32 = 6;

/// `ListenerContext` fields that are `Copy`: `ctx.event_id` becomes
/// `ctx.event_id()`.
const COPY_FIELDS: &[&str] = &["event_id", "occurred_at"];

/// `ListenerContext` fields whose accessors return a reference:
/// `&ctx.headers` and `ctx.headers` both become `ctx.headers()`.
const REF_FIELDS: &[&str] = &["headers", "listener", "metadata", "pool"];

/// What an upgrade does to one line of the user's code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LineNote {
    /// The line's number, from 1, before the rewrites (which change lines
    /// in place and may remove an import's line, never add one).
    pub(crate) line: usize,
    /// What changed, or what to change by hand.
    pub(crate) text: String,
    /// Whether the line was rewritten (otherwise it is left for the user).
    pub(crate) rewritten: bool,
}

/// A file's text carried to the set 6 API, with a note per line touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Carried {
    pub(crate) text: String,
    pub(crate) notes: Vec<LineNote>,
}

/// Carries Rust source written against the kit of sets 1-5 to the API of
/// set 6. Text that uses none of the changed API comes back as it was.
pub(crate) fn carry_to_set_6(text: &str) -> Carried {
    // `ctx` is a listener's context only in a file that names that type and
    // not a scheduled job's (`JobContext`, whose fields stay public).
    let listener_ctx = has_word(text, "ListenerContext") && !has_word(text, "JobContext");
    let mut notes = Vec::new();
    let mut lines: Vec<String> = Vec::new();
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let number = index + 1;
        let mut line = line.to_string();
        let before = line.clone();
        // Comments compile as they are: left alone.
        if !line.trim_start().starts_with("//") {
            line = rewrite_dispatch(&line);
            if listener_ctx {
                line = rewrite_context_fields(&line);
            }
        }
        if line != before {
            notes.push(LineNote {
                line: number,
                text: format!("`{}` -> `{}`", before.trim(), line.trim()),
                rewritten: true,
            });
        }
        if let Some(advice) = advice(&line) {
            notes.push(LineNote {
                line: number,
                text: advice,
                rewritten: false,
            });
        }
        lines.push(line);
    }
    drop_unused_imports(&mut lines, &mut notes);
    notes.sort_by_key(|note| note.line);
    Carried {
        text: lines.concat(),
        notes,
    }
}

/// The template set that made `OutboxDispatcher` private, which
/// [`carry_to_set_15`] carries code across.
pub(crate) const SET_15: u32 = 15;

/// Carries Rust source across set 15, which made `OutboxDispatcher` the
/// kit's own: a call on a new one becomes `kit::dispatch(`, also when the
/// call is a method chain over several lines (`OutboxDispatcher::new()`,
/// then `.dispatch(..)`, then `.await?`), which becomes one line; the
/// imports left unused go. Text that names no `OutboxDispatcher` comes
/// back as it was.
pub(crate) fn carry_to_set_15(text: &str) -> Carried {
    if !has_word(text, "OutboxDispatcher") {
        return Carried {
            text: text.to_string(),
            notes: Vec::new(),
        };
    }
    let source: Vec<&str> = text.split_inclusive('\n').collect();
    let mut notes = Vec::new();
    let mut lines: Vec<String> = Vec::new();
    let mut index = 0;
    while index < source.len() {
        let number = index + 1;
        let mut line = source[index].to_string();
        index += 1;
        let code = line.trim_end();
        let chained = index < source.len() && source[index].trim_start().starts_with(".dispatch(");
        if !code.trim_start().starts_with("//")
            && code.ends_with("OutboxDispatcher::new()")
            && chained
        {
            // The chain's next lines (`.dispatch(..)`, `.await?;`) join it.
            while index < source.len() && source[index].trim_start().starts_with('.') {
                line = format!("{}{}\n", line.trim_end(), source[index].trim());
                index += 1;
            }
        }
        let before = line.clone();
        line = rewrite_dispatch(&line);
        if line == before && index > number {
            // Joined for nothing (`MyOutboxDispatcher::new()`): as it was.
            line = source[number - 1..index].concat();
        } else if line != before {
            let lines_of = if index > number {
                format!("lines {number}-{index}")
            } else {
                format!("line {number}")
            };
            let was: Vec<&str> = source[number - 1..index].iter().map(|l| l.trim()).collect();
            notes.push(LineNote {
                line: number,
                text: format!("`{}` -> `{}` ({lines_of})", was.join(" "), line.trim()),
                rewritten: true,
            });
        }
        lines.push(line);
    }
    drop_unused_imports(&mut lines, &mut notes);
    notes.sort_by_key(|note| note.line);
    Carried {
        text: lines.concat(),
        notes,
    }
}

/// `state.dispatcher.dispatch(` and `OutboxDispatcher::new().dispatch(`
/// become `kit::dispatch(`.
fn rewrite_dispatch(line: &str) -> String {
    let mut line = line.to_string();
    for (call, receiver_chars) in [
        (".dispatcher.dispatch(", "."),
        ("OutboxDispatcher::new().dispatch(", ":"),
    ] {
        let mut from = 0;
        while let Some(found) = line[from..].find(call) {
            let at = from + found;
            from = at + call.len();
            let before = line[..at].chars().next_back();
            // `MyOutboxDispatcher::new()` is another type: left alone.
            if receiver_chars == ":" && before.is_some_and(is_ident) {
                continue;
            }
            // The receiver: `state`, `self.state`, `kit::outbox::`.
            let start = line[..at]
                .char_indices()
                .rev()
                .take_while(|(_, c)| is_ident(*c) || receiver_chars.contains(*c))
                .last()
                .map_or(at, |(i, _)| i);
            if receiver_chars == "." && start == at {
                continue; // `.dispatcher` continues a line: left to the advice
            }
            let rewritten = format!(
                "{}kit::dispatch({}",
                &line[..start],
                &line[at + call.len()..]
            );
            from = start + "kit::dispatch(".len();
            line = rewritten;
        }
    }
    line
}

/// `ctx.event_id` becomes `ctx.event_id()`, and `&ctx.headers` or
/// `ctx.headers` becomes `ctx.headers()`.
fn rewrite_context_fields(line: &str) -> String {
    let mut out = String::with_capacity(line.len() + 4);
    let mut rest = line;
    while let Some(at) = rest.find("ctx.") {
        let starts_word = rest[..at].chars().next_back().is_none_or(|c| !is_ident(c));
        let after = &rest[at + 4..];
        let field: String = after.chars().take_while(|c| is_ident(*c)).collect();
        let ends_field = !after[field.len()..].starts_with('(');
        let known = COPY_FIELDS.contains(&field.as_str()) || REF_FIELDS.contains(&field.as_str());
        if !(starts_word && ends_field && known) {
            out.push_str(&rest[..at + 4]);
            rest = &rest[at + 4..];
            continue;
        }
        let mut head = &rest[..at];
        if REF_FIELDS.contains(&field.as_str()) {
            head = head.strip_suffix('&').unwrap_or(head);
        }
        out.push_str(head);
        out.push_str(&format!("ctx.{field}()"));
        rest = &after[field.len()..];
    }
    out.push_str(rest);
    out
}

/// What a line still holds that set 6 no longer compiles, and the change.
fn advice(line: &str) -> Option<String> {
    let code = line.trim();
    if code.starts_with("//") {
        return None;
    }
    if code.contains(".dispatcher") {
        return Some(
            "`AppState` has no `dispatcher` in set 6: call `kit::dispatch(&mut *tx, &event)`"
                .to_string(),
        );
    }
    let turbofish = code.find("Ok::<_, ").map(|at| &code[at + 8..]);
    if let Some(error) = turbofish {
        let kept = ["anyhow::Error>", "ListenerError>"];
        if !kept.iter().any(|kept| error.starts_with(kept)) {
            return Some(
                "a `Transactor::run` closure returns `anyhow::Result` in set 6: write `Ok(..)` \
                 here, and handle the run's error as an `anyhow::Error`"
                    .to_string(),
            );
        }
    }
    None
}

/// Removes `Dispatcher` and `OutboxDispatcher` from `use` lines once the
/// file no longer names them (a rewritten `dispatch` call left them unused).
fn drop_unused_imports(lines: &mut [String], notes: &mut Vec<LineNote>) {
    let is_use = |line: &str| line.trim_start().starts_with("use ");
    let method_calls = lines
        .iter()
        .filter(|line| !is_use(line))
        .any(|line| line.replace("kit::dispatch(", "").contains(".dispatch("));
    for name in ["Dispatcher", "OutboxDispatcher"] {
        let named = lines
            .iter()
            .filter(|line| !is_use(line))
            .any(|line| has_word(line, name));
        // `Dispatcher` stays while a `.dispatch(` method call needs it.
        if named || (name == "Dispatcher" && method_calls) {
            continue;
        }
        for (index, line) in lines.iter_mut().enumerate() {
            if !is_use(line) || !has_word(line, name) {
                continue;
            }
            if let Some(new) = without_import(line, name) {
                notes.push(LineNote {
                    line: index + 1,
                    text: format!("`{}` -> `{}` (no longer used)", line.trim(), new.trim()),
                    rewritten: true,
                });
                *line = new;
            }
        }
    }
}

/// `line`, a one-line `use`, without `name`: `None` when it has another
/// form (left as it is; the compiler names an unused import).
fn without_import(line: &str, name: &str) -> Option<String> {
    let indent = &line[..line.len() - line.trim_start().len()];
    let body = line.trim().strip_prefix("use ")?.strip_suffix(';')?;
    let newline = if line.ends_with('\n') { "\n" } else { "" };
    if let Some(path) = body.strip_suffix(&format!("::{name}")) {
        return (!path.contains('{')).then(String::new);
    }
    let (path, group) = body.split_once("::{")?;
    let group = group.strip_suffix('}')?;
    if group.contains('{') {
        return None;
    }
    let items: Vec<&str> = group
        .split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .collect();
    if !items.contains(&name) {
        return None;
    }
    let kept: Vec<&str> = items.into_iter().filter(|item| *item != name).collect();
    Some(match kept.as_slice() {
        [] => String::new(),
        [one] => format!("{indent}use {path}::{one};{newline}"),
        many => format!("{indent}use {path}::{{{}}};{newline}", many.join(", ")),
    })
}

fn has_word(line: &str, word: &str) -> bool {
    line.match_indices(word).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + word.len()..].chars().next();
        before.is_none_or(|c| !is_ident(c)) && after.is_none_or(|c| !is_ident(c))
    })
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_outbox_dispatcher_over_several_lines_becomes_one_kit_dispatch() {
        let old = "\
use kit::dispatch::Dispatcher;
use kit::outbox::OutboxDispatcher;
use kit::worker::listeners::{ListenerContext, ListenerError};

async fn f(tx: &mut Tx, follow_up: &OrderPlaced) -> anyhow::Result<()> {
    OutboxDispatcher::new()
        .dispatch(&mut *tx, &follow_up)
        .await?;
    kit::outbox::OutboxDispatcher::new().dispatch(&mut *tx, &follow_up).await?;
    Ok(())
}
";
        let carried = carry_to_set_15(old);
        assert_eq!(
            carried.text,
            "\
use kit::worker::listeners::{ListenerContext, ListenerError};

async fn f(tx: &mut Tx, follow_up: &OrderPlaced) -> anyhow::Result<()> {
    kit::dispatch(&mut *tx, &follow_up).await?;
    kit::dispatch(&mut *tx, &follow_up).await?;
    Ok(())
}
"
        );
        let lines: Vec<usize> = carried.notes.iter().map(|n| n.line).collect();
        assert_eq!(lines, [1, 2, 6, 9], "{:?}", carried.notes);
        assert!(
            carried.notes[2].text.contains("(lines 6-8)"),
            "{:?}",
            carried.notes
        );
        // Nothing to carry: the text comes back as it was.
        let plain = "use kit::prelude::*;\nfn f() {}\n";
        assert_eq!(carry_to_set_15(plain).text, plain);
        let ours = "use kit::outbox::OutboxDispatcher;\nfn f() {\n    MyOutboxDispatcher::new()\n        .dispatch(x);\n    OutboxDispatcher::default();\n}\n";
        let carried = carry_to_set_15(ours);
        assert_eq!(carried.text, ours);
        assert!(carried.notes.is_empty(), "{:?}", carried.notes);
    }

    #[test]
    fn a_handler_of_set_5_dispatches_with_kit_dispatch() {
        let old = "\
use axum::Json;
use kit::dispatch::Dispatcher;

async fn place() {
            state.dispatcher.dispatch(&mut *tx, &event).await?;
}
";
        let carried = carry_to_set_6(old);
        assert_eq!(
            carried.text,
            "\
use axum::Json;

async fn place() {
            kit::dispatch(&mut *tx, &event).await?;
}
"
        );
        let lines: Vec<usize> = carried.notes.iter().map(|n| n.line).collect();
        assert_eq!(lines, [2, 5]);
        assert!(carried.notes.iter().all(|n| n.rewritten));
    }

    #[test]
    fn a_listener_reads_the_context_through_its_methods() {
        let old = "fn handle(event: E, ctx: ListenerContext) {\n    tracing::info!(event_id = \
                   %ctx.event_id, listener = %ctx.listener, pool = ?&ctx.pool, \
                   n = ctx.headers.len(), \"x\");\n";
        let carried = carry_to_set_6(old);
        assert_eq!(
            carried.text,
            "fn handle(event: E, ctx: ListenerContext) {\n    tracing::info!(event_id = \
             %ctx.event_id(), listener = %ctx.listener(), pool = ?ctx.pool(), \
             n = ctx.headers().len(), \"x\");\n"
        );
        assert_eq!(carried.notes.len(), 1);
    }

    #[test]
    fn code_on_the_new_api_and_other_names_are_left_alone() {
        let text = "\
use kit::prelude::ListenerContext;
let id = ctx.event_id();
// idempotent on `ctx.event_id`, `state.dispatcher.dispatch(..)`
let other = my_ctx.event_id;
let field = ctx.payload;
kit::dispatch(&mut *tx, &event).await?;
Ok::<_, anyhow::Error>(())
";
        let carried = carry_to_set_6(text);
        assert_eq!(carried.text, text);
        assert!(carried.notes.is_empty(), "{:?}", carried.notes);
    }

    #[test]
    fn a_scheduled_jobs_context_keeps_its_public_fields() {
        let text = "\
async fn run(&self, ctx: JobContext) -> anyhow::Result<()> {
    sqlx::query(\"SELECT 1\").execute(&ctx.pool).await?;
";
        let carried = carry_to_set_6(text);
        assert_eq!(carried.text, text);
        assert!(carried.notes.is_empty());
    }

    #[test]
    fn a_listener_of_older_sets_drops_its_dispatcher_imports() {
        let old = "\
use crate::dispatch::{Dispatcher, Event};
use crate::outbox::OutboxDispatcher;

    OutboxDispatcher::new().dispatch(&mut *tx, &Confirmed {}).await?;
";
        let carried = carry_to_set_6(old);
        assert_eq!(
            carried.text,
            "\
use crate::dispatch::Event;

    kit::dispatch(&mut *tx, &Confirmed {}).await?;
"
        );
    }

    #[test]
    fn a_type_of_the_users_named_like_the_dispatcher_is_left_alone() {
        let text = "    MyOutboxDispatcher::new().dispatch(&mut *tx, &event).await?;\n";
        assert_eq!(carry_to_set_6(text).text, text);
        let two = "a(state.dispatcher.dispatch(x), other.dispatcher.dispatch(y));\n";
        assert_eq!(
            carry_to_set_6(two).text,
            "a(kit::dispatch(x), kit::dispatch(y));\n"
        );
    }

    #[test]
    fn a_dispatcher_still_called_as_a_method_keeps_its_import() {
        let text = "\
use kit::dispatch::Dispatcher;
    my_dispatcher.dispatch(&mut *tx, &event).await?;
";
        assert_eq!(carry_to_set_6(text).text, text);
    }

    #[test]
    fn what_cannot_be_rewritten_is_named_with_the_change_to_make() {
        let text = "\
            state
                .dispatcher
                .dispatch(&mut *tx, &event)
            Ok::<_, sqlx::Error>(id)
";
        let carried = carry_to_set_6(text);
        assert_eq!(carried.text, text);
        let lines: Vec<(usize, bool)> = carried
            .notes
            .iter()
            .map(|n| (n.line, n.rewritten))
            .collect();
        assert_eq!(lines, [(2, false), (4, false)]);
        assert!(carried.notes[0].text.contains("kit::dispatch"));
        assert!(carried.notes[1].text.contains("anyhow::Result"));
    }
}
