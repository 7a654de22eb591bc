//! The console (`outbox console`) in a real headless browser, against a
//! running worker on real Postgres and Redis: the project of
//! `outbox_ops`, built once for both, whose `audit` listener refuses
//! orders while the table `refused` has a row.
//!
//! An event appears on the Events page and its page lists each listener's
//! run; a refused one appears under Failures, and once the cause is gone
//! "Retry" runs it again and its page says it succeeded; a queue paused
//! from the Queues page holds its tasks until resumed. The token and
//! the CSRF secret refuse requests without them, and a payload holding a
//! `<script>` shows as text without running; an unknown event is a 404
//! and a malformed search a 400 that says what to fix. Each step keeps a
//! screenshot in `target/screenshots/` for people to look at. Apart: an
//! address others can reach is refused without a token, a read-only
//! console refuses actions, and a Postgres that is down is named (503).
//! And on its default address (loopback), a console masks the fields
//! `--mask` names, and each of its four forms that act is refused without
//! the console's CSRF secret, with a wrong one or from another site.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::browser::{Browser, ENTER, screenshot_path};
use crate::e2e::{Database, migrate, psql};
use crate::example::request_with_headers;
use crate::outbox_ops::{built, runs};
use crate::worker_e2e::{RedisServer, Worker, free_port, wait_until};

/// The console's token in this test.
const TOKEN: &str = "s3cret-console-token";

/// `outbox console`, stopped when dropped.
pub(crate) struct Console {
    child: Child,
    addr: String,
}

impl Console {
    /// `outbox` (a project's binary) serving its console with the token
    /// [`TOKEN`] on a free port, once it answers.
    pub(crate) fn start(outbox: &std::path::Path, database_url: &str, redis: &RedisServer) -> Self {
        Self::start_with(outbox, database_url, redis, &[])
    }

    /// [`Console::start`], with `args` after `console --addr <addr>`.
    fn start_with(
        outbox: &std::path::Path,
        database_url: &str,
        redis: &RedisServer,
        args: &[&str],
    ) -> Self {
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new(outbox)
            .args(["console", "--addr", &addr])
            .args(args)
            .env_clear()
            .env("DATABASE_URL", database_url)
            .env("VALKEY_ADDR", redis.addr())
            .env("WORKER_QUEUES", "default=1")
            .env("OUTBOX_CONSOLE_TOKEN", TOKEN)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let console = Self { child, addr };
        wait_until(Duration::from_secs(30), "the console answers", || {
            request_with_headers(&console.addr, "GET", "/", None, &[]).is_some()
        });
        console
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    /// `POST path` of the form `form` with the token and `headers`: the
    /// status and the page.
    fn post_form(&self, path: &str, form: &str, headers: &[(&str, &str)]) -> (u16, String) {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&self.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let extra: String = headers
            .iter()
            .map(|(name, value)| format!("{name}: {value}\r\n"))
            .collect();
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
             Authorization: Bearer {TOKEN}\r\n{extra}\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
            self.addr,
            form.len()
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = response
            .split_once("\r\n\r\n")
            .map_or("", |(_, body)| body)
            .to_string();
        (status, body)
    }

    /// `GET path` with the token: the status and the page.
    pub(crate) fn get(&self, path: &str) -> (u16, String) {
        let bearer = format!("Bearer {TOKEN}");
        request_with_headers(&self.addr, "GET", path, None, &[("Authorization", &bearer)])
            .unwrap_or_else(|| panic!("the console did not answer GET {path}"))
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Clicks the first element `css` selects, and waits until the page it
/// leads to shows `text` (a click returns before the next page has
/// loaded); that page's text.
fn click_for(browser: &Browser, css: &str, text: &str) -> String {
    browser.click(css);
    let mut page = String::new();
    wait_until(
        Duration::from_secs(10),
        &format!("{css} leads to {text:?}"),
        || {
            page = browser.text();
            page.contains(text)
        },
    );
    page
}

/// Waits until the page at `url`, loaded again each time, shows `text`.
fn wait_for_text(browser: &Browser, url: &str, text: &str) -> String {
    let mut page = String::new();
    wait_until(
        Duration::from_secs(30),
        &format!("{url} shows {text:?}"),
        || {
            browser.open(url);
            page = browser.text();
            page.contains(text)
        },
    );
    page
}

#[test]
#[ignore = "builds a generated project"]
fn the_console_follows_an_event_to_its_listeners_and_retries_a_failure() {
    let (project, bins) = built();
    let Some(browser) = Browser::start(1100) else {
        return;
    };
    let db = Database::create("gpkit_console");
    migrate(project, &db, &["up"]);
    psql(
        &db.url(),
        "CREATE TABLE listener_runs (listener text NOT NULL, event_id uuid NOT NULL, \
         order_id bigint NOT NULL); CREATE TABLE refused (x int); \
         INSERT INTO outbox_events (event_id, event_name, payload) VALUES (gen_random_uuid(), \
         'orderPlaced', '{\"order_id\": 1, \"note\": \"<script>window.marker = 1</script>\"}')",
    );
    let redis = RedisServer::start();
    let metrics = format!("127.0.0.1:{}", free_port());
    let env = [
        ("WORKER_QUEUES", "default=1"),
        ("WORKER_METRICS_ADDR", metrics.as_str()),
        ("OUTBOX_POLL_INTERVAL", "100ms"),
    ];
    let _worker = Worker::start_binary(&bins.join("worker"), &db, &redis, &env);
    let console = Console::start(&bins.join("outbox"), &db.url(), &redis);
    wait_until(Duration::from_secs(60), "both listeners ran", || {
        runs(&db) == "audit:1 email:1"
    });

    // The token: refused without it, over HTTP and in the browser.
    let (status, body) = request_with_headers(&console.addr, "GET", "/events", None, &[]).unwrap();
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("OUTBOX_CONSOLE_TOKEN"), "{body}");
    browser.open(&console.url("events"));
    assert!(
        browser.text().contains("needs its token"),
        "{}",
        browser.text()
    );
    // Given once in the address, it becomes the browser's cookie.
    browser.open(&console.url(&format!("events?token={TOKEN}")));

    // The event on the Events page, and its page with each listener's run.
    let events = wait_for_text(&browser, &console.url("events"), "orderPlaced");
    assert!(!events.contains("not yet"), "{events}");
    browser.click("table.events a");
    let event = browser.text();
    // A row per listener (innerText puts a tab between cells).
    for expected in ["audit\tcompleted", "email\tcompleted"] {
        assert!(event.contains(expected), "{expected}: {event}");
    }
    // Each listener's retry policy, the kit's default here.
    assert_eq!(
        event
            .matches("retries:25,timeout:30m,backoff:asynq")
            .count(),
        2,
        "{event}"
    );
    // The payload's script is text on the page, and never ran.
    assert!(
        event.contains("<script>window.marker = 1</script>"),
        "{event}"
    );
    assert_eq!(
        browser.run("return typeof window.marker;"),
        "undefined",
        "the payload's script ran"
    );
    browser.screenshot(&screenshot_path("console-event"));

    // A refused order: its audit task is archived and shows under Failures.
    // Waited for as the queue's group (with its Retry button), not as the
    // text: the worker records the failure in Postgres before the queue
    // archives it, and the page shows that record meanwhile.
    psql(
        &db.url(),
        "INSERT INTO refused VALUES (1); \
         INSERT INTO outbox_events (event_id, event_name, payload) \
         VALUES (gen_random_uuid(), 'orderPlaced', '{\"order_id\": 2}')",
    );
    let failures = wait_for_text(
        &browser,
        &console.url("failures"),
        "1 failed listener task(s) in 1 group(s)",
    );
    assert!(failures.contains("order 2 refused"), "{failures}");
    assert!(
        failures.contains("listener:orderPlaced:audit · 1 task(s)"),
        "{failures}"
    );
    // The worker recorded it in Postgres before the queue archived it.
    assert_eq!(
        psql(
            &db.url(),
            "SELECT listener, error, attempts FROM listener_failures"
        ),
        "audit|order 2 refused (not retried)|1"
    );
    browser.screenshot(&screenshot_path("console-failures"));

    // A POST without the CSRF secret is refused, and changes nothing.
    let bearer = format!("Bearer {TOKEN}");
    let (status, body) = request_with_headers(
        &console.addr,
        "POST",
        "/failures/retry",
        None,
        &[
            ("Authorization", &bearer),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
    )
    .unwrap();
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("CSRF"), "{body}");
    assert_eq!(runs(&db), "audit:1 email:1,2");

    // Fixed, then retried from the page with the keyboard alone (Tab to
    // the button, Enter): audit runs for order 2.
    psql(&db.url(), "DELETE FROM refused");
    browser.tab_to("form[action='failures/retry'] button");
    browser.press(ENTER);
    let mut after = String::new();
    wait_until(Duration::from_secs(10), "the retry's page", || {
        after = browser.text();
        after.contains("put back to pending") || after.contains("Refused")
    });
    assert!(after.contains("1 task(s) put back to pending"), "{after}");
    wait_until(Duration::from_secs(30), "audit ran order 2", || {
        runs(&db) == "audit:1,2 email:1,2"
    });
    assert_eq!(
        psql(&db.url(), "SELECT count(*) FROM listener_failures"),
        "0",
        "the retried task's record is still kept"
    );
    let fixed = wait_for_text(
        &browser,
        &console.url("failures"),
        "No listener task is failing",
    );
    assert!(!fixed.contains("order 2 refused"), "{fixed}");

    // Paused from the Queues page, the queue holds a new event's task
    // (every worker, Go's too, skips a paused queue); resumed, it runs.
    browser.open(&console.url("queues"));
    browser.click("form[action='queues/pause'] button");
    wait_until(Duration::from_secs(10), "the queue shows paused", || {
        browser.text().contains("default\tpaused")
    });
    psql(
        &db.url(),
        "INSERT INTO outbox_events (event_id, event_name, payload) \
         VALUES (gen_random_uuid(), 'orderPlaced', '{\"order_id\": 3}')",
    );
    wait_until(
        Duration::from_secs(30),
        "the relay publishes order 3",
        || {
            psql(
                &db.url(),
                "SELECT count(*) FROM outbox_events WHERE published_at IS NULL",
            ) == "0"
        },
    );
    assert_eq!(
        redis.cli(&["LLEN", "asynq:{default}:pending"]).as_deref(),
        Some("1"),
        "the event task waits in the paused queue"
    );
    assert_eq!(runs(&db), "audit:1,2 email:1,2");
    browser.click("form[action='queues/pause'] button");
    wait_until(
        Duration::from_secs(30),
        "the resumed queue runs order 3",
        || runs(&db) == "audit:1,2,3 email:1,2,3",
    );
    browser.open(&console.url("queues"));
    assert!(
        browser.text().contains("default\trunning"),
        "{}",
        browser.text()
    );

    // Replayed by a filter from the failures page, to `audit` only: the
    // confirmation counts the three orders, and audit runs each again.
    browser.open(&console.url("failures"));
    browser.type_into(
        "form[action='failures/replay'] input[name=name]",
        "orderPlaced",
    );
    browser.type_into("form[action='failures/replay'] input[name=since]", "1h");
    browser.type_into(
        "form[action='failures/replay'] input[name=listener]",
        "audit",
    );
    let confirmation = click_for(
        &browser,
        "form[action='failures/replay'] button",
        "published event(s) named",
    );
    assert!(
        confirmation.contains("Replay 3 published event(s) named orderPlaced")
            && confirmation.contains("to listener audit only: 3 task(s)"),
        "{confirmation}"
    );
    browser.screenshot(&screenshot_path("console-replay"));
    assert_eq!(
        runs(&db),
        "audit:1,2,3 email:1,2,3",
        "the count replayed nothing"
    );
    click_for(
        &browser,
        "form[action='replay'] button",
        "3 event(s) replayed",
    );
    wait_until(
        Duration::from_secs(30),
        "audit ran each order again",
        || runs(&db) == "audit:1,1,2,2,3,3 email:1,2,3",
    );

    // A failure that fell off the queue's archive (asynq keeps 10,000 a
    // queue): the page shows its record from Postgres, and "Send back"
    // queues its task again once the listener is fixed.
    psql(
        &db.url(),
        "INSERT INTO refused VALUES (4); \
         INSERT INTO outbox_events (event_id, event_name, payload) \
         VALUES (gen_random_uuid(), 'orderPlaced', '{\"order_id\": 4}')",
    );
    wait_for_text(&browser, &console.url("failures"), "order 4 refused");
    let task_id = psql(&db.url(), "SELECT task_id FROM listener_failures");
    redis
        .cli(&["ZREM", "asynq:{default}:archived", &task_id])
        .unwrap();
    redis
        .cli(&["DEL", &format!("asynq:{{default}}:t:{task_id}")])
        .unwrap();
    let fallen = wait_for_text(
        &browser,
        &console.url("failures"),
        "Recorded, no longer in the queue",
    );
    assert!(
        fallen.contains("listener:orderPlaced:audit · 1 task(s)")
            && fallen.contains("order 4 refused"),
        "{fallen}"
    );
    browser.screenshot(&screenshot_path("console-recorded"));
    psql(&db.url(), "DELETE FROM refused");
    click_for(
        &browser,
        "section.recorded a.button",
        "Send back 1 recorded task(s)",
    );
    click_for(
        &browser,
        "form[action='send-back'] button",
        "1 recorded task(s) sent back to their queue",
    );
    wait_until(Duration::from_secs(30), "audit ran order 4", || {
        runs(&db) == "audit:1,1,2,2,3,3,4 email:1,2,3,4"
    });
    assert_eq!(
        psql(&db.url(), "SELECT count(*) FROM listener_failures"),
        "0"
    );

    // Bad input: an unknown event, a malformed search.
    let auth = [("Authorization", bearer.as_str())];
    let unknown = "/events/00000000-0000-7000-8000-000000000000";
    let (status, body) = request_with_headers(&console.addr, "GET", unknown, None, &auth).unwrap();
    assert_eq!(status, 404, "{body}");
    assert!(
        body.contains("no event 00000000-0000-7000-8000-000000000000"),
        "{body}"
    );
    let (status, body) =
        request_with_headers(&console.addr, "GET", "/events?id=42", None, &auth).unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("`42` is not an event id"), "{body}");

    // The overview, live: its figures and charts drawn by the page's
    // script once it has two samples to take rates from.
    browser.open(&console.url(""));
    wait_until(
        Duration::from_secs(20),
        "the overview's rates and charts",
        || {
            browser.run(
                "return document.querySelector('[data-figure=published_per_second]').textContent \
             + ' ' + document.querySelectorAll('svg polyline').length;",
            ) == "0.0 5"
        },
    );
    assert!(browser.text().contains("default"), "{}", browser.text());
    browser.screenshot(&screenshot_path("console-overview"));

    // A phone's width: no page is wider than the window (wide tables
    // scroll within themselves), and every section's link is in view.
    browser.resize(390, 844);
    for path in ["", "events", "failures", "queues", "schedules"] {
        browser.open(&console.url(path));
        let fits = browser.run(
            "return document.documentElement.scrollWidth <= window.innerWidth \
             && [...document.querySelectorAll('nav a')].every(a => \
                a.getBoundingClientRect().right <= window.innerWidth);",
        );
        assert_eq!(fits, true, "/{path} does not fit a 390 px window");
    }
    browser.open(&console.url("events"));
    browser.click("table.events a");
    assert_eq!(
        browser.run("return document.documentElement.scrollWidth <= window.innerWidth;"),
        true,
        "an event's page does not fit a 390 px window"
    );
    browser.screenshot(&screenshot_path("console-narrow"));
}

/// Refusals before any page: a console others could reach needs a token,
/// and a read-only one refuses every action.
#[test]
#[ignore = "builds a generated project"]
fn the_console_refuses_an_open_address_without_a_token_and_actions_when_read_only() {
    let (_, bins) = built();
    let open = Command::new(bins.join("outbox"))
        .args(["console", "--addr", &format!("0.0.0.0:{}", free_port())])
        .env_clear()
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:9/none")
        .env("VALKEY_ADDR", "127.0.0.1:9")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&open.stderr);
    assert_eq!(open.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("set OUTBOX_CONSOLE_TOKEN"), "{stderr}");

    let addr = format!("127.0.0.1:{}", free_port());
    let mut read_only = Command::new(bins.join("outbox"))
        .args(["console", "--read-only", "--addr", &addr])
        .env_clear()
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:9/none")
        .env("VALKEY_ADDR", "127.0.0.1:9")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(30), "the console answers", || {
        request_with_headers(&addr, "GET", "/assets/console.css", None, &[]).is_some()
    });
    let (status, body) = request_with_headers(
        &addr,
        "POST",
        "/failures/retry",
        None,
        &[("Content-Type", "application/x-www-form-urlencoded")],
    )
    .unwrap();
    // A Postgres that is down: the page says which, with 503.
    let (down, page) = request_with_headers(&addr, "GET", "/events", None, &[]).unwrap();
    let _ = read_only.kill();
    let _ = read_only.wait();
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("read-only"), "{body}");
    assert_eq!(down, 503, "{page}");
    assert!(page.contains("Postgres"), "{page}");
}

/// A store that stops answering: the page that needs it names it (503) and
/// the others still show; once it is back, the next load shows the page
/// again, with the same console process. Servers of the test's own.
#[test]
#[ignore = "builds a generated project"]
fn a_page_names_the_store_that_is_down_and_shows_again_once_it_is_back() {
    let (project, bins) = built();
    let postgres = crate::own_postgres::OwnPostgres::start(&[], None);
    let url = postgres.url("postgres");
    let migrated = Command::new(bins.join("migrate"))
        .arg("up")
        .current_dir(project)
        .env("DATABASE_URL", &url)
        .output()
        .unwrap();
    assert!(migrated.status.success(), "{migrated:?}");
    let mut redis = RedisServer::start();
    let console = Console::start(&bins.join("outbox"), &url, &redis);
    let status = |path: &str| console.get(path).0;
    assert_eq!(status("/events"), 200);
    assert_eq!(status("/failures"), 200);

    // Valkey down: the failures page says so; the events still show.
    redis.stop();
    let asked = std::time::Instant::now();
    let (code, page) = console.get("/failures");
    eprintln!("503 for Valkey after {:?}", asked.elapsed());
    assert_eq!(code, 503, "{page}");
    assert!(page.contains("Valkey"), "{page}");
    assert_eq!(status("/events"), 200);
    redis.restart();
    let valkey_back = wait_until(
        Duration::from_secs(30),
        "the failures page shows again",
        || status("/failures") == 200,
    );

    // Postgres down: the events page says so; back, it shows again.
    postgres.stop();
    let asked = std::time::Instant::now();
    let (code, page) = console.get("/events");
    eprintln!("503 for Postgres after {:?}", asked.elapsed());
    assert_eq!(code, 503, "{page}");
    assert!(page.contains("Postgres"), "{page}");
    postgres.start_again();
    let postgres_back = wait_until(
        Duration::from_secs(30),
        "the events page shows again",
        || status("/events") == 200,
    );
    eprintln!(
        "pages shown again {:.1} s after Valkey was back, {:.1} s after Postgres",
        valkey_back.as_secs_f64(),
        postgres_back.as_secs_f64()
    );
}

/// `outbox console` as an operator runs it on their machine, with no
/// address and no token: it listens on 127.0.0.1:9320, the default
/// address (this is the only test that uses that port), and serves there.
#[test]
#[ignore = "builds a generated project"]
fn without_an_address_the_console_listens_on_loopback() {
    let (_, bins) = built();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut console = Command::new(bins.join("outbox"))
        .arg("console")
        .env_clear()
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:9/none")
        .env("VALKEY_ADDR", "127.0.0.1:9")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log.reopen().unwrap())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let read_log = || std::fs::read_to_string(log.path()).unwrap();
    wait_until(Duration::from_secs(30), "the console listens", || {
        if let Some(exit) = console.try_wait().unwrap() {
            panic!(
                "the console exited ({exit}) when given no address:\n{}",
                read_log()
            );
        }
        read_log().contains("console listening on http://")
    });
    let answer = request_with_headers("127.0.0.1:9320", "GET", "/assets/console.css", None, &[]);
    let _ = console.kill();
    let _ = console.wait();
    let log = read_log();
    assert!(
        log.contains("console listening on http://127.0.0.1:9320/"),
        "{log}"
    );
    assert_eq!(answer.map(|(status, _)| status), Some(200));
}

/// `--mask email,card`: an event's page shows those fields' values as
/// `***` at any depth, and every other field as it is.
#[test]
#[ignore = "builds a generated project"]
fn the_console_masks_the_fields_mask_names_at_any_depth() {
    let (project, bins) = built();
    let db = Database::create("gpkit_console_mask");
    migrate(project, &db, &["up"]);
    let event = "0193a5c2-5b6e-7d1f-9a2b-3c4d5e6f7a8c";
    psql(
        &db.url(),
        &format!(
            "INSERT INTO outbox_events (event_id, event_name, payload, published_at) \
             VALUES ('{event}', 'orderPlaced', '{{\"order_id\": 7, \"email\": \"ann@example.com\", \
             \"billing\": {{\"card\": \"4111-1111\", \"city\": \"Lyon\"}}}}', now())"
        ),
    );
    let redis = RedisServer::start();
    let console = Console::start_with(
        &bins.join("outbox"),
        &db.url(),
        &redis,
        &["--mask", "email,card"],
    );
    let (status, page) = console.get(&format!("/events/{event}"));
    assert_eq!(status, 200, "{page}");
    assert!(
        !page.contains("ann@example.com") && !page.contains("4111-1111"),
        "a masked value is shown:\n{page}"
    );
    assert_eq!(page.matches("***").count(), 2, "{page}");
    assert!(page.contains("Lyon") && page.contains("order_id"), "{page}");
}

/// The CSRF secret the console put in a page's forms.
fn csrf_in(page: &str) -> String {
    let (_, after) = page
        .split_once(r#"name="csrf" value=""#)
        .unwrap_or_else(|| panic!("no CSRF field in the page:\n{page}"));
    after.split('"').next().unwrap().to_string()
}

/// Each of the four forms that act (retry, pause, send back, replay) is
/// refused (403) without the console's CSRF secret, with a wrong one, and
/// from another site, changing nothing; with the secret its pages carry,
/// the same forms are taken (the replay queues a task, the queue pauses).
#[test]
#[ignore = "builds a generated project"]
fn each_form_that_acts_is_refused_without_the_consoles_csrf_secret() {
    let (project, bins) = built();
    let db = Database::create("gpkit_console_csrf");
    migrate(project, &db, &["up"]);
    psql(
        &db.url(),
        "INSERT INTO outbox_events (event_id, event_name, payload, published_at) \
         VALUES (gen_random_uuid(), 'orderPlaced', '{\"order_id\": 1}', now())",
    );
    let redis = RedisServer::start();
    let console = Console::start(&bins.join("outbox"), &db.url(), &redis);
    // Each form with fields its handler takes.
    let forms = [
        (
            "/failures/retry",
            "type=listener%3AorderPlaced%3Aaudit&error=x",
        ),
        ("/queues/pause", "queue=default&paused=true"),
        (
            "/failures/send-back",
            "event=orderPlaced&listener=audit&error=x",
        ),
        (
            "/failures/replay",
            "name=orderPlaced&since=1h&listener=audit",
        ),
    ];
    let secret = csrf_in(&console.get("/queues").1);
    let first = if secret.starts_with('0') { '1' } else { '0' };
    let wrong = format!("{first}{}", &secret[1..]);
    let other_site = [("Origin", "http://evil.example")];
    let mut outcomes = Vec::new();
    for (path, form) in forms {
        for (how, form, headers) in [
            ("without the secret", form.to_string(), &[][..]),
            ("with a wrong one", format!("{form}&csrf={wrong}"), &[][..]),
            (
                "from another site",
                format!("{form}&csrf={secret}"),
                &other_site[..],
            ),
        ] {
            let (status, page) = console.post_form(path, &form, headers);
            let refused = status == 403
                && (page.contains("CSRF secret") || page.contains("sent from another site"));
            let outcome = if refused { "refused" } else { "TAKEN" };
            outcomes.push(format!("{path} {how}: {outcome} ({status})"));
        }
    }
    assert!(
        outcomes.iter().all(|o| o.contains(": refused")),
        "{}",
        outcomes.join("\n")
    );
    // Nothing changed: the queue runs, and nothing was queued.
    let paused = || redis.cli(&["EXISTS", "asynq:{default}:paused"]);
    let pending = || redis.cli(&["LLEN", "asynq:{default}:pending"]);
    assert_eq!(paused().as_deref(), Some("0"));
    assert_eq!(pending().as_deref(), Some("0"));

    // With the secret, the same forms are taken.
    for (path, form) in forms {
        let (status, page) = console.post_form(path, &format!("{form}&csrf={secret}"), &[]);
        assert_ne!(status, 403, "{path}: {page}");
    }
    assert_eq!(paused().as_deref(), Some("1"));
    assert_eq!(pending().as_deref(), Some("1"), "the replay's task");
}
