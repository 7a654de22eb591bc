//! goose's SQL migration parser, ported line for line.
//!
//! A goose migration is one `.sql` file holding both directions:
//!
//! ```sql
//! -- +goose Up
//! CREATE TABLE post (id int PRIMARY KEY);
//!
//! -- +goose Down
//! DROP TABLE post;
//! ```
//!
//! [`parse`] returns the statements of *one* direction and whether they run in a
//! transaction. It is a faithful port of pressly/goose v3.27
//! `internal/sqlparser/parser.go`, quirks included, because "compatible" means that a
//! file goose accepts gives the same statements here and a file goose rejects is
//! rejected with the same message:
//!
//! * the file is read line by line (`\n`, with one trailing `\r` removed); a line of
//!   4 MiB or more is an error, and a UTF-8 BOM is *not* stripped;
//! * a line is an annotation when its trimmed text starts with `--` and it contains
//!   `+goose` (case-sensitive); the annotation name itself matches case-insensitively;
//! * outside `StatementBegin`/`StatementEnd` a statement ends at a line whose last
//!   word before any `--` word ends with `;`;
//! * comments and empty lines are skipped only *before* a statement starts;
//! * `NO TRANSACTION` anywhere in the file applies to both directions;
//! * `ENVSUB ON`/`OFF` switch `${VAR}` interpolation of the lines that follow
//!   (mfridman/interpolate semantics, see [`interpolate`]);
//! * lines of the other direction are discarded, so an unfinished statement there is
//!   not an error, but annotation and ENVSUB errors fail both directions.
//!
//! This file depends on `std` only, so gpkit's own conformance test can include it
//! with `#[path]` and run goose's corpus against it.

use std::borrow::Cow;
use std::fmt;

/// Longest line goose's `bufio.Scanner` accepts (its buffer size), in bytes.
pub(crate) const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

/// goose's pointer to its documentation, appended to most state errors.
const SEE_DOCS: &str = "see https://github.com/pressly/goose#sql-migrations";

/// Which half of a migration file to extract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Direction {
    /// The statements after `-- +goose Up`.
    Up,
    /// The statements after `-- +goose Down`.
    Down,
}

impl Direction {
    /// `"up"` or `"down"`, as goose prints it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Direction::Up => "up",
            Direction::Down => "down",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The statements of one direction of a migration file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ParsedSql {
    /// Each entry is sent to the database as one simple-protocol query.
    pub(crate) statements: Vec<String>,
    /// `false` when the file contains `-- +goose NO TRANSACTION`.
    pub(crate) use_tx: bool,
}

/// Why a file could not be parsed.
///
/// [`fmt::Display`] prints goose's own message, unchanged; [`ParseError::line`] adds
/// the 1-based line the problem was found on, when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    message: String,
    line: Option<usize>,
}

impl ParseError {
    fn new(message: impl Into<String>, line: Option<usize>) -> Self {
        Self {
            message: message.into(),
            line,
        }
    }

    /// goose's error message, word for word.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The 1-based line number: the offending line, or for an unfinished statement
    /// or block the line where it started. `None` for whole-file problems such as a
    /// missing `-- +goose Up`.
    pub fn line(&self) -> Option<usize> {
        self.line
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ParseError {}

/// Parses one direction of a goose SQL migration.
///
/// `env` looks up variables for `-- +goose ENVSUB ON` sections: `Some(value)` when
/// the variable is set (possibly to an empty string), `None` when it is unset. The
/// migration runner passes `process_env`.
pub(crate) fn parse(
    sql: &str,
    direction: Direction,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ParsedSql, ParseError> {
    Parser::new(direction, env).run(sql)
}

/// Looks a variable up in the process environment, for [`parse`]'s `env`.
pub(crate) fn process_env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|value| value.to_string_lossy().into_owned())
}

/// The parser's states. The numbers appear in goose's error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Start = 0,
    Up = 1,
    StatementBeginUp = 2,
    StatementEndUp = 3,
    Down = 4,
    StatementBeginDown = 5,
    StatementEndDown = 6,
}

impl State {
    fn number(self) -> u8 {
        self as u8
    }

    /// The direction whose lines this state collects, if any.
    fn direction(self) -> Option<Direction> {
        match self {
            State::Start => None,
            State::Up | State::StatementBeginUp | State::StatementEndUp => Some(Direction::Up),
            State::Down | State::StatementBeginDown | State::StatementEndDown => {
                Some(Direction::Down)
            }
        }
    }
}

/// The seven annotations goose understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Annotation {
    Up,
    Down,
    StatementBegin,
    StatementEnd,
    NoTransaction,
    EnvsubOn,
    EnvsubOff,
}

impl Annotation {
    const ALL: [(Annotation, &'static str); 7] = [
        (Annotation::Up, "Up"),
        (Annotation::Down, "Down"),
        (Annotation::StatementBegin, "StatementBegin"),
        (Annotation::StatementEnd, "StatementEnd"),
        (Annotation::NoTransaction, "NO TRANSACTION"),
        (Annotation::EnvsubOn, "ENVSUB ON"),
        (Annotation::EnvsubOff, "ENVSUB OFF"),
    ];
}

struct Parser<'e> {
    direction: Direction,
    env: &'e dyn Fn(&str) -> Option<String>,
    state: State,
    use_tx: bool,
    envsub: bool,
    /// The statement being collected; each line is followed by `\n`.
    buf: String,
    /// Line on which `buf` became non-empty.
    buf_start: usize,
    /// Line of the last `StatementBegin`, for the "missing StatementEnd" error.
    block_start: usize,
    statements: Vec<String>,
}

impl<'e> Parser<'e> {
    fn new(direction: Direction, env: &'e dyn Fn(&str) -> Option<String>) -> Self {
        Self {
            direction,
            env,
            state: State::Start,
            use_tx: true,
            envsub: false,
            buf: String::new(),
            buf_start: 0,
            block_start: 0,
            statements: Vec::new(),
        }
    }

    fn run(mut self, sql: &str) -> Result<ParsedSql, ParseError> {
        for (index, line) in scan_lines(sql).enumerate() {
            let number = index + 1;
            let line = line.map_err(|message| ParseError::new(message, Some(number)))?;
            self.line(line, number)?;
        }
        self.finish()
    }

    /// Feeds one line to the state machine, in the order of goose's loop body.
    fn line(&mut self, raw: &str, number: usize) -> Result<(), ParseError> {
        let err = |message: String| ParseError::new(message, Some(number));

        if self.state == State::Start && raw.trim().is_empty() {
            return Ok(());
        }

        if is_annotation(raw) {
            let annotation = extract_annotation(raw).map_err(|cause| {
                err(format!(
                    "failed to parse annotation line {}: {cause}",
                    go_quote(raw)
                ))
            })?;
            match annotation {
                Annotation::Up => {
                    if self.state != State::Start {
                        return Err(err(format!(
                            "duplicate '-- +goose Up' annotations; stateMachine={}, {SEE_DOCS}",
                            self.state.number()
                        )));
                    }
                    self.state = State::Up;
                    return Ok(());
                }
                Annotation::Down => {
                    if !matches!(self.state, State::Up | State::StatementEndUp) {
                        return Err(err(format!(
                            "must start with '-- +goose Up' annotation, stateMachine={}, {SEE_DOCS}",
                            self.state.number()
                        )));
                    }
                    let remaining = self.buf.trim();
                    if !remaining.is_empty() {
                        return Err(ParseError::new(
                            missing_semicolon(self.state, self.direction, remaining),
                            Some(self.buf_start),
                        ));
                    }
                    self.state = State::Down;
                    return Ok(());
                }
                Annotation::StatementBegin => {
                    self.state = match self.state {
                        State::Up | State::StatementEndUp => State::StatementBeginUp,
                        State::Down | State::StatementEndDown => State::StatementBeginDown,
                        other => {
                            return Err(err(format!(
                                "'-- +goose StatementBegin' must be defined after '-- +goose Up' or '-- +goose Down' annotation, stateMachine={}, {SEE_DOCS}",
                                other.number()
                            )));
                        }
                    };
                    self.block_start = number;
                    return Ok(());
                }
                Annotation::StatementEnd => {
                    self.state = match self.state {
                        State::StatementBeginUp => State::StatementEndUp,
                        State::StatementBeginDown => State::StatementEndDown,
                        _ => {
                            return Err(err(format!(
                                "'-- +goose StatementEnd' must be defined after '-- +goose StatementBegin', {SEE_DOCS}"
                            )));
                        }
                    };
                    // No early return: goose falls through to the code below, which
                    // emits the block. (When the block is still empty, this line is
                    // skipped as a leading comment instead, and the *next* line ends
                    // the block: goose's empty-block bug, reproduced on purpose.)
                }
                Annotation::NoTransaction => {
                    self.use_tx = false;
                    return Ok(());
                }
                Annotation::EnvsubOn => {
                    self.envsub = true;
                    return Ok(());
                }
                Annotation::EnvsubOff => {
                    self.envsub = false;
                    return Ok(());
                }
            }
        }

        // Comments and empty lines before a statement are dropped; once a statement
        // has started, everything up to its end is kept.
        if self.buf.is_empty() && (raw.trim().starts_with("--") || raw.is_empty()) {
            return Ok(());
        }

        let mut line = Cow::Borrowed(raw);
        if !matches!(self.state, State::StatementEndUp | State::StatementEndDown) {
            if self.envsub {
                let expanded = interpolate::interpolate(raw, self.env).map_err(|cause| {
                    err(format!("variable substitution failed: {cause}:\n{raw}"))
                })?;
                line = Cow::Owned(expanded);
            }
            if self.buf.is_empty() {
                self.buf_start = number;
            }
            self.buf.push_str(&line);
            self.buf.push('\n');
        }

        match self.state.direction() {
            None => {
                return Err(err(format!(
                    "failed to parse migration: unexpected state {} on line {}, {SEE_DOCS}",
                    self.state.number(),
                    go_quote(&line)
                )));
            }
            Some(wanted) if wanted != self.direction => {
                self.buf.clear();
                return Ok(());
            }
            Some(_) => {}
        }

        match self.state {
            State::Up | State::Down => {
                if ends_with_semicolon(&line) {
                    self.emit();
                }
            }
            State::StatementEndUp => {
                self.emit();
                self.state = State::Up;
            }
            State::StatementEndDown => {
                self.emit();
                self.state = State::Down;
            }
            State::Start | State::StatementBeginUp | State::StatementBeginDown => {}
        }
        Ok(())
    }

    fn emit(&mut self) {
        self.statements.push(self.buf.trim().to_owned());
        self.buf.clear();
    }

    fn finish(self) -> Result<ParsedSql, ParseError> {
        match self.state {
            State::Start => {
                return Err(ParseError::new(
                    format!(
                        "failed to parse migration: must start with '-- +goose Up' annotation, {SEE_DOCS}"
                    ),
                    None,
                ));
            }
            State::StatementBeginUp | State::StatementBeginDown => {
                return Err(ParseError::new(
                    "failed to parse migration: missing '-- +goose StatementEnd' annotation",
                    Some(self.block_start),
                ));
            }
            _ => {}
        }
        let remaining = self.buf.trim();
        if !remaining.is_empty() {
            return Err(ParseError::new(
                missing_semicolon(self.state, self.direction, remaining),
                Some(self.buf_start),
            ));
        }
        Ok(ParsedSql {
            statements: self.statements,
            use_tx: self.use_tx,
        })
    }
}

fn missing_semicolon(state: State, direction: Direction, remaining: &str) -> String {
    format!(
        "failed to parse migration: state {}, direction: {direction}: unexpected unfinished SQL query: {}: missing semicolon?",
        state.number(),
        go_quote(remaining)
    )
}

/// Splits like Go's `bufio.ScanLines` with goose's 4 MiB buffer: on `\n`, dropping
/// one `\r` before it; no empty line after a final `\n`; an error for a line that
/// does not fit the buffer.
fn scan_lines(sql: &str) -> impl Iterator<Item = Result<&str, String>> {
    let mut rest = sql;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let line = match rest.find('\n') {
            Some(end) => {
                let line = &rest[..end];
                rest = &rest[end + 1..];
                line
            }
            None => std::mem::take(&mut rest),
        };
        if line.len() >= MAX_LINE_BYTES {
            rest = "";
            return Some(Err(
                "failed to scan migration: bufio.Scanner: token too long".to_owned(),
            ));
        }
        Some(Ok(line.strip_suffix('\r').unwrap_or(line)))
    })
}

/// goose treats any comment line mentioning `+goose` as an annotation.
fn is_annotation(line: &str) -> bool {
    line.trim().starts_with("--") && line.contains("+goose")
}

/// goose's `extractAnnotation`: the error text is what goose wraps into
/// "failed to parse annotation line ...".
fn extract_annotation(line: &str) -> Result<Annotation, String> {
    if line.starts_with(' ') || line.starts_with('\t') {
        return Err(format!(
            "{} contains leading whitespace: invalid annotation",
            go_quote(line)
        ));
    }
    let cmd = line.replace("--", "").replacen("+goose", "", 1);
    if cmd.contains("+goose") {
        return Err(format!(
            "{} contains multiple '+goose' annotations: invalid annotation",
            go_quote(&cmd)
        ));
    }
    let cmd = cmd.trim();
    if cmd.is_empty() {
        return Err("empty annotation".to_owned());
    }
    Annotation::ALL
        .iter()
        .find(|(_, name)| equal_fold(name, cmd))
        .map(|(annotation, _)| *annotation)
        .ok_or_else(|| format!("{} not supported: invalid annotation", go_quote(cmd)))
}

/// Whether a line ends a statement: its last whitespace-separated word before the
/// first word starting with `--` ends with `;`. So `SELECT 1; -- c` ends one, but
/// `SELECT 1;-- c` does not (the word is `1;--`).
fn ends_with_semicolon(line: &str) -> bool {
    line.split_whitespace()
        .take_while(|word| !word.starts_with("--"))
        .last()
        .is_some_and(|word| word.ends_with(';'))
}

/// Go's `strings.EqualFold`, close enough for goose's seven ASCII annotation names
/// (it also folds `ſ` to `s` and the Kelvin sign to `k`, as Go does).
fn equal_fold(a: &str, b: &str) -> bool {
    let mut a = a.chars();
    let mut b = b.chars();
    loop {
        match (a.next(), b.next()) {
            (None, None) => return true,
            (Some(x), Some(y)) if fold_eq(x, y) => {}
            _ => return false,
        }
    }
}

fn fold_eq(x: char, y: char) -> bool {
    fn single(mut chars: impl Iterator<Item = char>) -> Option<char> {
        let first = chars.next()?;
        chars.next().is_none().then_some(first)
    }
    x == y
        || matches!((single(x.to_lowercase()), single(y.to_lowercase())), (Some(l), Some(r)) if l == r)
        || matches!((single(x.to_uppercase()), single(y.to_uppercase())), (Some(l), Some(r)) if l == r)
}

/// Go's `strconv.Quote` (`%q`), which goose uses in its messages: a double-quoted
/// string with `"` and `\` escaped, control and other non-printable characters as
/// `\n`, `\t`, `\x1b`, `\u00a0`, ...; printable Unicode is kept as is.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if is_go_printable(c) => out.push(c),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// An approximation of Go's `unicode.IsPrint` using only `std`: everything except
/// control characters, spaces other than U+0020, format characters, private-use
/// characters and noncharacters. (Unassigned code points are not detected.)
fn is_go_printable(c: char) -> bool {
    if c.is_ascii() {
        return (' '..='~').contains(&c);
    }
    let n = c as u32;
    let format = matches!(
        n,
        0x00AD
            | 0x0600..=0x0605
            | 0x061C
            | 0x06DD
            | 0x070F
            | 0x0890..=0x0891
            | 0x08E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    );
    let private_use = matches!(n, 0xE000..=0xF8FF | 0xF0000..=0xFFFFD | 0x100000..=0x10FFFD);
    let noncharacter = matches!(n, 0xFDD0..=0xFDEF) || (n & 0xFFFE) == 0xFFFE;
    !(c.is_control() || c.is_whitespace() || format || private_use || noncharacter)
}

/// `${VAR}` interpolation for `-- +goose ENVSUB ON`, a port of
/// github.com/mfridman/interpolate v0.0.2 (a fork of buildkite/interpolate).
///
/// * `$VAR`, `${VAR}`: the value, empty when unset;
/// * `${VAR:-default}`: the default when unset *or empty*; `${VAR-default}`: only
///   when unset (defaults may nest further expansions);
/// * `${VAR?message}`: error `$VAR: message` (or `$VAR: not set`) when unset;
/// * `${VAR:offset}`, `${VAR:offset:length}`: a byte substring, negative numbers
///   counting from the end;
/// * `\$` and `$$` give `$`, `\\` stays `\\`, `$(` stays `$(`, and a `$` at the very
///   end of the line is kept;
/// * any other `$` must start an identifier (`letter {letter | digit | _}`), so
///   `$1` is an error.
///
/// The whole line is parsed before anything is expanded, so a syntax error wins
/// over a `${VAR?}` error, as in the original.
///
/// One difference: expansions nested more than [`MAX_NESTING`](interpolate::MAX_NESTING) deep (`${A:-${B:-...}}`)
/// are an error. Go's growable stack takes any depth; here a crafted line of
/// 4 MiB would overflow the stack, and no migration needs that many.
pub(crate) mod interpolate {
    use std::fmt::Write as _;

    /// How deep `${...}` expansions may nest inside one another.
    pub(crate) const MAX_NESTING: usize = 100;

    /// Expands the variables in `input`, looking them up with `env`.
    pub(crate) fn interpolate(
        input: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<String, String> {
        let mut scanner = Scanner {
            input,
            pos: 0,
            depth: 0,
        };
        let expression = scanner.expression(None)?;
        let mut out = String::new();
        expand(&expression, env, &mut out)?;
        Ok(out)
    }

    enum Item {
        Text(String),
        Expansion(Expansion),
    }

    enum Expansion {
        /// `$VAR` or `${VAR}`.
        Variable(String),
        /// `${VAR:-default}`.
        EmptyDefault(String, Vec<Item>),
        /// `${VAR-default}`.
        UnsetDefault(String, Vec<Item>),
        /// `${VAR:offset}` or `${VAR:offset:length}`.
        Substring {
            name: String,
            offset: i64,
            length: Option<i64>,
        },
        /// `${VAR?message}`.
        Required(String, Vec<Item>),
    }

    /// Go prints the end-of-input rune (-1) with `%c` as U+FFFD.
    fn shown(c: Option<char>) -> char {
        c.unwrap_or('\u{FFFD}')
    }

    struct Scanner<'a> {
        input: &'a str,
        pos: usize,
        /// How many `${` the scanner is inside.
        depth: usize,
    }

    impl Scanner<'_> {
        fn rest(&self) -> &str {
            &self.input[self.pos..]
        }

        fn peek(&self) -> Option<char> {
            self.rest().chars().next()
        }

        fn next(&mut self) -> Option<char> {
            let c = self.peek()?;
            self.pos += c.len_utf8();
            Some(c)
        }

        /// Consumes characters up to (not including) the first one matching `stop`.
        /// Like the Go original it also stops at U+FFFD (Go's `RuneError`).
        fn scan_until(&mut self, stop: impl Fn(char) -> bool) -> &str {
            let start = self.pos;
            while let Some(c) = self.peek() {
                if c == '\u{FFFD}' || stop(c) {
                    break;
                }
                self.pos += c.len_utf8();
            }
            &self.input[start..self.pos]
        }

        fn expression(&mut self, stop: Option<char>) -> Result<Vec<Item>, String> {
            let mut items = Vec::new();
            while let Some(c) = self.peek() {
                if Some(c) == stop {
                    break;
                }
                let rest = self.rest();
                if rest.starts_with("\\\\") {
                    self.pos += 2;
                    items.push(Item::Text("\\\\".to_owned()));
                    continue;
                }
                if rest.starts_with("\\$") || rest.starts_with("$$") {
                    self.pos += 2;
                    items.push(Item::Text("$".to_owned()));
                    continue;
                }
                if rest.starts_with("$(") {
                    self.pos += 2;
                    items.push(Item::Text("$(".to_owned()));
                    continue;
                }
                if c == '$' && self.pos < self.input.len() - 1 {
                    items.push(Item::Expansion(self.expansion()?));
                    continue;
                }
                self.next();
                let mut text = c.to_string();
                text.push_str(self.scan_until(|r| r == '$' || r == '\\' || Some(r) == stop));
                items.push(Item::Text(text));
            }
            Ok(items)
        }

        fn expansion(&mut self) -> Result<Expansion, String> {
            let c = self.next();
            if c != Some('$') {
                return Err(format!(
                    "Expected expansion to start with $, got {}",
                    shown(c)
                ));
            }
            if self.peek() == Some('{') {
                return self.brace_expansion();
            }
            Ok(Expansion::Variable(self.identifier()?))
        }

        fn brace_expansion(&mut self) -> Result<Expansion, String> {
            let c = self.next();
            if c != Some('{') {
                return Err(format!(
                    "Expected brace expansion to start with {{, got {}",
                    shown(c)
                ));
            }
            let name = self.identifier()?;
            if self.peek() == Some('}') {
                self.next();
                return Ok(Expansion::Variable(name));
            }
            if self.depth == MAX_NESTING {
                return Err(format!(
                    "Expansions nested more than {MAX_NESTING} deep are not supported"
                ));
            }
            self.depth += 1;
            let expansion = self.operator(name)?;
            self.depth -= 1;
            let c = self.next();
            if c != Some('}') {
                return Err(format!(
                    "Expected brace expansion to end with }}, got {}",
                    shown(c)
                ));
            }
            Ok(expansion)
        }

        /// The operator after `${VAR` and what follows it, up to the closing brace.
        fn operator(&mut self, name: String) -> Result<Expansion, String> {
            Ok(match self.next() {
                Some(':') if self.peek() == Some('-') => {
                    self.next();
                    Expansion::EmptyDefault(name, self.expression(Some('}'))?)
                }
                Some(':') => self.substring(name)?,
                Some('-') => Expansion::UnsetDefault(name, self.expression(Some('}'))?),
                Some('?') => Expansion::Required(name, self.expression(Some('}'))?),
                other => return Err(format!("Expected an operator, got {}", shown(other))),
            })
        }

        fn substring(&mut self, name: String) -> Result<Expansion, String> {
            let offset = self.scan_until(|r| r == ':' || r == '}').to_owned();
            let offset = atoi(offset.trim()).map_err(|e| format!("Unable to parse offset: {e}"))?;
            if self.peek() == Some('}') {
                return Ok(Expansion::Substring {
                    name,
                    offset,
                    length: None,
                });
            }
            self.next();
            let length = self.scan_until(|r| r == '}').to_owned();
            let length = atoi(length.trim()).map_err(|e| format!("Unable to parse length: {e}"))?;
            Ok(Expansion::Substring {
                name,
                offset,
                length: Some(length),
            })
        }

        fn identifier(&mut self) -> Result<String, String> {
            let first = self.peek();
            if !first.is_some_and(char::is_alphabetic) {
                return Err(format!(
                    "Expected identifier to start with a letter, got {}",
                    shown(first)
                ));
            }
            Ok(self
                .scan_until(|r| !(r.is_alphabetic() || r.is_numeric() || r == '_'))
                .to_owned())
        }
    }

    /// Go's `strconv.Atoi`, with its error text.
    fn atoi(s: &str) -> Result<i64, String> {
        use std::num::IntErrorKind;
        s.parse::<i64>().map_err(|e| {
            let reason = match e.kind() {
                IntErrorKind::PosOverflow | IntErrorKind::NegOverflow => "value out of range",
                _ => "invalid syntax",
            };
            format!("strconv.Atoi: parsing {}: {reason}", super::go_quote(s))
        })
    }

    fn expand(
        items: &[Item],
        env: &dyn Fn(&str) -> Option<String>,
        out: &mut String,
    ) -> Result<(), String> {
        for item in items {
            match item {
                Item::Text(text) => out.push_str(text),
                Item::Expansion(expansion) => expand_one(expansion, env, out)?,
            }
        }
        Ok(())
    }

    fn expand_one(
        expansion: &Expansion,
        env: &dyn Fn(&str) -> Option<String>,
        out: &mut String,
    ) -> Result<(), String> {
        match expansion {
            Expansion::Variable(name) => out.push_str(&env(name).unwrap_or_default()),
            Expansion::EmptyDefault(name, default) => match env(name) {
                Some(value) if !value.is_empty() => out.push_str(&value),
                _ => expand(default, env, out)?,
            },
            Expansion::UnsetDefault(name, default) => match env(name) {
                Some(value) => out.push_str(&value),
                None => expand(default, env, out)?,
            },
            Expansion::Required(name, message) => match env(name) {
                Some(value) => out.push_str(&value),
                None => {
                    let mut text = String::new();
                    expand(message, env, &mut text)?;
                    if text.is_empty() {
                        text.push_str("not set");
                    }
                    let mut error = String::new();
                    let _ = write!(error, "${name}: {text}");
                    return Err(error);
                }
            },
            Expansion::Substring {
                name,
                offset,
                length,
            } => {
                let value = env(name).unwrap_or_default();
                out.push_str(&substring(&value, *offset, *length));
            }
        }
        Ok(())
    }

    /// buildkite's byte-based `${VAR:offset:length}`, clamped to the value.
    fn substring(value: &str, offset: i64, length: Option<i64>) -> String {
        let len = i64::try_from(value.len()).unwrap_or(i64::MAX);
        let mut from = offset;
        if from < 0 {
            from = from.saturating_add(len);
        }
        let from = from.clamp(0, len);
        let to = match length {
            None => len,
            Some(length) if length >= 0 => from.saturating_add(length),
            Some(length) => length.saturating_add(len).max(from),
        }
        .min(len);
        // Both bounds are within 0..=len here; a cut inside a UTF-8 sequence gives
        // U+FFFD where Go would keep the raw bytes.
        let bytes = &value.as_bytes()[from as usize..to as usize];
        String::from_utf8_lossy(bytes).into_owned()
    }
}
