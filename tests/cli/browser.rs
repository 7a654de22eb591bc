//! A real headless browser for the console's tests: Chromium driven by
//! `chromedriver` (both Debian packages, which `scripts/with-services`
//! installs) over the W3C WebDriver protocol, which is JSON over HTTP: a
//! few commands (open a page, find an element, read its text, click, run
//! a script, take a screenshot) on a plain TCP stream, no client crate.

use std::io::{BufRead as _, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{free_port, require_tool};
use crate::worker_e2e::wait_until;

/// WebDriver's key codes.
pub const TAB: &str = "\u{E004}";
pub const ENTER: &str = "\u{E007}";

/// The element reference's key in WebDriver's JSON.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// One browser session, ended (and its driver stopped) when dropped.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

impl Browser {
    /// Starts chromedriver on a free port and a headless Chromium session
    /// (a window of `width` x 900 pixels); `None` (the test returns) when
    /// they are not installed, which under CI fails instead
    /// ([`crate::support::require_tool`]).
    pub fn start(width: u32) -> Option<Self> {
        let chromium = require_tool("chromium")?;
        let port = free_port();
        let driver = Command::new(require_tool("chromedriver")?)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let mut browser = Self {
            driver,
            port,
            session: String::new(),
        };
        wait_until(Duration::from_secs(30), "chromedriver answers", || {
            browser
                .call("GET", "/status", None)
                .is_some_and(|v| v["value"]["ready"] == true)
        });
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", format!("--window-size={width},900")]
            }
        }}});
        let created = browser
            .call("POST", "/session", Some(capabilities))
            .expect("chromedriver answers");
        browser.session = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_string();
        Some(browser)
    }

    /// Opens `url` and waits for its load.
    pub fn open(&self, url: &str) {
        self.command("POST", "url", json!({ "url": url }));
    }

    /// The text of the page's body, as a person would read it.
    pub fn text(&self) -> String {
        self.run("return document.body.innerText;")
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Runs `script` (a function body) in the page; what it returns.
    pub fn run(&self, script: &str) -> Value {
        self.command(
            "POST",
            "execute/sync",
            json!({ "script": script, "args": [] }),
        )
    }

    /// The WebDriver id of the first element `css` selects, which must
    /// exist.
    fn find(&self, css: &str) -> String {
        let found = self.command(
            "POST",
            "element",
            json!({ "using": "css selector", "value": css }),
        );
        found[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {found}"))
            .to_string()
    }

    /// Clicks the first element `css` selects, which must exist.
    pub fn click(&self, css: &str) {
        let id = self.find(css);
        self.command("POST", &format!("element/{id}/click"), json!({}));
    }

    /// Types `text` into the first element `css` selects (an input).
    pub fn type_into(&self, css: &str, text: &str) {
        let id = self.find(css);
        self.command(
            "POST",
            &format!("element/{id}/value"),
            json!({ "text": text }),
        );
    }

    /// Presses and releases `key` (a WebDriver key code, such as
    /// [`TAB`] or [`ENTER`]) on whatever has the focus.
    pub fn press(&self, key: &str) {
        let actions = json!({ "actions": [{
            "type": "key",
            "id": "keyboard",
            "actions": [{ "type": "keyDown", "value": key }, { "type": "keyUp", "value": key }],
        }]});
        self.command("POST", "actions", actions);
    }

    /// Presses Tab until the focus is on the first element `css` selects,
    /// as a keyboard user would reach it; panics when 50 presses do not.
    /// The focused element must show its focus (an outline).
    pub fn tab_to(&self, css: &str) {
        let focused = format!(
            "return document.activeElement !== null && document.activeElement.matches({});",
            json!(css)
        );
        for _ in 0..50 {
            if self.run(&focused) == true {
                let outline =
                    self.run("return getComputedStyle(document.activeElement).outlineStyle;");
                assert_ne!(outline, "none", "{css} has the focus but shows no outline");
                return;
            }
            self.press(TAB);
        }
        panic!("50 presses of Tab never reached {css}");
    }

    /// Resizes the window to `width` x `height` pixels.
    pub fn resize(&self, width: u32, height: u32) {
        self.command(
            "POST",
            "window/rect",
            json!({ "width": width, "height": height }),
        );
    }

    /// Saves a screenshot of the window as a PNG at `path`.
    pub fn screenshot(&self, path: &Path) {
        use base64::Engine as _;
        let encoded = self.command("GET", "screenshot", Value::Null);
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap_or_default())
            .expect("a base64 PNG");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }

    /// A command of the session; its `value`, or a panic with WebDriver's
    /// error.
    fn command(&self, method: &str, path: &str, body: Value) -> Value {
        let body = (!body.is_null()).then_some(body);
        let reply = self
            .call(method, &format!("/session/{}/{path}", self.session), body)
            .unwrap_or_else(|| panic!("chromedriver did not answer {method} {path}"));
        if reply["value"]["error"].is_string() {
            panic!("{method} {path}: {}", reply["value"]);
        }
        reply["value"].clone()
    }

    /// One HTTP request to the driver; its JSON reply, `None` while it does
    /// not answer. The driver keeps the connection open after its reply
    /// (whatever `Connection: close` says), so the body is read to its
    /// `Content-Length`.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Option<Value> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .ok()?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.port,
            body.len()
        )
        .ok()?;
        let mut reader = std::io::BufReader::new(stream);
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).ok()?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().ok()?;
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).ok()?;
        serde_json::from_slice(&body).ok()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.call("DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Where a test keeps its screenshots: `target/screenshots/<name>.png`.
pub fn screenshot_path(name: &str) -> PathBuf {
    crate::support::repo()
        .join("target/screenshots")
        .join(format!("{name}.png"))
}
