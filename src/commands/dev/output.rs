//! The output of `gpkit dev`: each line a process writes, prefixed by the
//! process's name (`server | ...`), on gpkit's standard output, in colour
//! only when that is a terminal (and `NO_COLOR` is not set); and gpkit's
//! own lines about a process, under the same prefix.

use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::sync::OnceLock;
use std::thread::JoinHandle;

/// The width names are padded to, so that the `|` line up.
const WIDTH: usize = 7;

/// Whether gpkit's output is in colour: standard output is a terminal and
/// `NO_COLOR` is not set.
pub(crate) fn colour() -> bool {
    static COLOUR: OnceLock<bool> = OnceLock::new();
    *COLOUR
        .get_or_init(|| std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none())
}

fn ansi(name: &str) -> &'static str {
    match name {
        "server" => "36",
        "worker" => "35",
        "migrate" => "33",
        _ => "32",
    }
}

/// Writes `text` as one line under `name`'s prefix.
pub(crate) fn line(name: &str, text: &str) {
    let prefix = if colour() {
        format!("\x1b[{}m{name:>WIDTH$} |\x1b[0m", ansi(name))
    } else {
        format!("{name:>WIDTH$} |")
    };
    let mut stdout = std::io::stdout().lock();
    // A closed stdout is no reason to stop the processes.
    let _ = writeln!(stdout, "{prefix} {text}");
    let _ = stdout.flush();
}

/// Copies `reader` line by line under `name`'s prefix until it closes
/// (bytes that are not UTF-8 are replaced).
pub(crate) fn pump(name: &str, reader: impl Read + Send + 'static) -> JoinHandle<()> {
    let name = name.to_string();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&buf);
                    line(&name, text.trim_end_matches(['\n', '\r']));
                }
            }
        }
    })
}
