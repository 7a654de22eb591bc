//! The tests' SQL: [`psql`] runs a statement as `psql -At -c` would and
//! returns what psql would print, through a connection each test thread
//! keeps per database URL (a URL that asks for TLS still gets a psql).
//!
//! A psql process per query, and the server backend it forks, cost about
//! 60 CPU-seconds over the suite's 2,200 queries (most of them in the
//! loops that wait for a condition), measured with process accounting on
//! a full run. libtest runs each test on a thread of its own, so a
//! thread's connections are its test's, and they close when it ends.

use std::cell::RefCell;
use std::collections::HashMap;
use std::process::Command;

use postgres::{Client, NoTls, SimpleQueryMessage};

thread_local! {
    /// This thread's connections, by the URL they were opened with.
    static CLIENTS: RefCell<Connections> = RefCell::new(Connections::default());
}

/// A thread's connections, closed when the thread ends.
#[derive(Default)]
struct Connections(HashMap<String, Client>);

impl Drop for Connections {
    /// Closes the connections on a thread of their own: a client's drop
    /// runs its runtime, whose thread-local context may already be gone
    /// while this thread's are destroyed.
    fn drop(&mut self) {
        let clients = std::mem::take(&mut self.0);
        if !clients.is_empty() {
            std::thread::spawn(move || drop(clients));
        }
    }
}

/// Runs `sql` on `url` and returns psql's unaligned, tuples-only output
/// (`psql -At -c`): a line per row of every statement, its columns
/// joined by `|`, NULL as nothing, trimmed. The statements run as one
/// query string, as `-c` sends them (one implicit transaction, unless it
/// says otherwise). Panics on an error, as `-v ON_ERROR_STOP=1` fails.
pub fn psql(url: &str, sql: &str) -> String {
    query(url, sql).unwrap_or_else(|err| panic!("psql failed: {err}\n(on {url}: {sql})"))
}

/// [`psql`], its error returned: the server's message, or why it could not
/// be reached.
///
/// A connection the server closed since it was last used (a database
/// dropped, a server restarted) is opened again, once, when the query
/// fails on it before the server answered.
pub fn query(url: &str, sql: &str) -> Result<String, String> {
    if wants_tls(url) {
        return through_psql(url, sql);
    }
    CLIENTS.with_borrow_mut(|Connections(clients)| {
        let mut reopened = false;
        loop {
            let client = match clients.get_mut(url) {
                Some(client) if !client.is_closed() => client,
                _ => {
                    let client = Client::connect(url, NoTls)
                        .map_err(|err| format!("cannot connect: {err}"))?;
                    clients
                        .entry(url.to_string())
                        .insert_entry(client)
                        .into_mut()
                }
            };
            match client.simple_query(sql) {
                Ok(messages) => return Ok(unaligned(&messages)),
                Err(err) if !reopened && err.as_db_error().is_none() && client.is_closed() => {
                    clients.remove(url);
                    reopened = true;
                }
                Err(err) => {
                    return Err(err
                        .as_db_error()
                        .map_or(err.to_string(), |db| format!("ERROR: {}", db.message())));
                }
            }
        }
    })
}

/// Whether `url` asks for TLS (`sslmode=require` and stricter), which
/// these connections do not speak: psql runs such a query.
fn wants_tls(url: &str) -> bool {
    ["require", "verify-ca", "verify-full"]
        .iter()
        .any(|mode| url.contains(&format!("sslmode={mode}")))
}

/// [`query`] by a psql process.
fn through_psql(url: &str, sql: &str) -> Result<String, String> {
    let output = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-Atc", sql])
        .output()
        .map_err(|err| format!("cannot run psql: {err}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).trim().to_string());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// Forgets this thread's connection to `url`, if any (before its database
/// is dropped).
pub fn forget(url: &str) {
    CLIENTS.with_borrow_mut(|Connections(clients)| clients.remove(url));
}

/// The rows of `messages` as psql's `-At` prints them.
fn unaligned(messages: &[SimpleQueryMessage]) -> String {
    let mut lines = Vec::new();
    for message in messages {
        if let SimpleQueryMessage::Row(row) = message {
            let columns: Vec<&str> = (0..row.len()).map(|i| row.get(i).unwrap_or("")).collect();
            lines.push(columns.join("|"));
        }
    }
    lines.join("\n").trim().to_string()
}
