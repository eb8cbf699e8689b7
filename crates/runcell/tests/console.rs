//! The operator's console (`GET /console`) in a real browser: Debian's chromium, headless,
//! driven by chromedriver through plain W3C WebDriver calls. Against a real `runcell serve`
//! with an ordinary key, an admin key and network approval, the test signs in, approves one
//! waiting run and denies another from the page, and finds the runs, a session and a running
//! sandbox where the page shows them. A screenshot of each tab is saved under
//! `target/console-screenshots/`.
//!
//! Without chromium and chromedriver the test says SKIP and passes, unless
//! RUNCELL_REQUIRE_BROWSER is set (scripts/test.sh installs both and sets it).

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const KEY_A: &str = "console-key-a-0123456789";
const BOSS: &str = "console-admin-key-0123456789";
/// Where approved runs may connect (nothing listens there: the runs here do not connect,
/// they only ask for network and so wait for approval).
const DESTINATION: &str = "127.0.0.2:9";
/// How long the page may take to show something: protection against a hang, not a
/// measurement.
const WITHIN: Duration = Duration::from_secs(30);
/// W3C WebDriver's key for an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Chromium's binary: the real one behind Debian's wrapper script where it is there.
fn chromium() -> Option<&'static str> {
    ["/usr/lib/chromium/chromium", "/usr/bin/chromium"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

/// chromedriver on a free loopback port, and one browser session in it.
struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::blocking::Client,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start(chromium: &str) -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let mut browser = Browser {
            driver,
            base,
            session: String::new(),
            http,
            _profile: tempfile::tempdir().unwrap(),
        };
        let deadline = Instant::now() + WITHIN;
        loop {
            let ready = browser
                .http
                .get(format!("{}/status", browser.base))
                .send()
                .ok()
                .and_then(|r| r.json::<Value>().ok())
                .is_some_and(|v| v["value"]["ready"] == true);
            if ready {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = browser._profile.path().to_str().unwrap().to_string();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--disable-extensions", "--no-first-run",
                    format!("--user-data-dir={profile}"), "--window-size=1280,900",
                ],
            },
        }}});
        let v = browser
            .call("POST", "/session", caps)
            .unwrap_or_else(|e| panic!("no browser session: {e}"));
        browser.session = v["sessionId"].as_str().unwrap().to_string();
        browser
    }

    /// One WebDriver command: its `value`, or the error it answered.
    fn call(&self, method: &str, path: &str, body: Value) -> Result<Value, String> {
        let url = if path == "/session" {
            format!("{}/session", self.base)
        } else {
            format!("{}/session/{}{path}", self.base, self.session)
        };
        let req = match method {
            "GET" => self.http.get(url),
            "DELETE" => self.http.delete(url),
            _ => self.http.post(url).json(&body),
        };
        let res = req.send().map_err(|e| e.to_string())?;
        let ok = res.status().is_success();
        let v: Value = res.json().map_err(|e| e.to_string())?;
        if ok {
            Ok(v["value"].clone())
        } else {
            Err(format!("{}", v["value"]))
        }
    }

    fn open(&self, url: &str) {
        self.call("POST", "/url", json!({ "url": url })).unwrap();
    }

    fn find_all(&self, css: &str) -> Vec<String> {
        self.call(
            "POST",
            "/elements",
            json!({"using": "css selector", "value": css}),
        )
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e[ELEMENT].as_str().map(str::to_string))
        .collect()
    }

    fn text_of(&self, element: &str) -> Option<String> {
        self.call("GET", &format!("/element/{element}/text"), Value::Null)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
    }

    fn attribute(&self, element: &str, name: &str) -> Option<String> {
        self.call(
            "GET",
            &format!("/element/{element}/attribute/{name}"),
            Value::Null,
        )
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
    }

    /// The visible text of the page, for a failure's message.
    fn page_text(&self) -> String {
        self.find_all("body")
            .first()
            .and_then(|b| self.text_of(b))
            .unwrap_or_default()
    }

    /// Waits for an element matching `css` whose visible text satisfies `ok`; returns the
    /// element and its text.
    fn wait_for(&self, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> (String, String) {
        let deadline = Instant::now() + WITHIN;
        loop {
            for e in self.find_all(css) {
                if let Some(t) = self.text_of(&e) {
                    if ok(&t) {
                        return (e, t);
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "the page never showed {what} ({css}); it shows:\n{}",
                self.page_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Clicks the first element matching `css` (again while the page replaces it).
    fn click(&self, css: &str) {
        let deadline = Instant::now() + WITHIN;
        loop {
            let clicked = self.find_all(css).first().map(|e| {
                self.call("POST", &format!("/element/{e}/click"), json!({}))
                    .is_ok()
            });
            if clicked == Some(true) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cannot click {css}; the page shows:\n{}",
                self.page_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn type_into(&self, css: &str, text: &str) {
        let (e, _) = self.wait_for(css, css, |_| true);
        self.call("POST", &format!("/element/{e}/clear"), json!({}))
            .unwrap();
        self.call(
            "POST",
            &format!("/element/{e}/value"),
            json!({ "text": text }),
        )
        .unwrap();
    }

    fn tab(&self, name: &str) {
        self.click(&format!("#tabs button[data-tab=\"{name}\"]"));
    }

    fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.call("GET", "/screenshot", Value::Null).unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, bytes).unwrap();
        eprintln!("screenshot: {}", path.display());
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.call("DELETE", "", Value::Null);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// `target/console-screenshots` (of CARGO_TARGET_DIR, or of the target directory this test
/// binary was built in: target/debug/deps/console-...).
fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().unwrap();
            exe.ancestors().nth(3).unwrap().to_path_buf()
        });
    target.join("console-screenshots")
}

fn api(s: &common::ServeProcess, key: &str, method: &str, path: &str, body: Value) -> (u16, Value) {
    let client = reqwest::blocking::Client::new();
    let req = match method {
        "GET" => client.get(s.url(path)),
        _ => client.post(s.url(path)).json(&body),
    };
    let res = req
        .header("authorization", format!("Bearer {key}"))
        .timeout(Duration::from_secs(180))
        .send()
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().unwrap_or(Value::Null))
}

fn sha256(code: &str) -> String {
    Sha256::digest(code.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A run asking for network, in a thread (it waits for a decision): its status and answer.
fn networked_run(
    s: &std::sync::Arc<common::ServeProcess>,
    code: &str,
) -> std::thread::JoinHandle<(u16, Value)> {
    let s = s.clone();
    let body = json!({"language": "python", "code": code, "network": {"allow": [DESTINATION]}});
    std::thread::spawn(move || api(&s, KEY_A, "POST", "/v1/execute", body))
}

#[test]
fn the_console_approves_and_denies_runs_and_shows_runs_sessions_and_sandboxes() {
    let browser_bin = chromium();
    if browser_bin.is_none() || !common::have("/usr/bin/chromedriver") {
        assert!(
            std::env::var_os("RUNCELL_REQUIRE_BROWSER").is_none(),
            "RUNCELL_REQUIRE_BROWSER is set but chromium or chromedriver is missing"
        );
        eprintln!("SKIP: the console's browser test needs chromium and chromium-driver");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("runcell.toml");
    std::fs::write(
        &config,
        format!(
            "[[api_keys]]\nid = \"team-a\"\nkey = \"{KEY_A}\"\n\
             [[api_keys]]\nid = \"boss\"\nkey = \"{BOSS}\"\nadmin = true\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let s = std::sync::Arc::new(common::ServeProcess::start(
        &[
            "--pool",
            "python=0",
            "--config",
            config.to_str().unwrap(),
            "--allow-net",
            DESTINATION,
            "--net-approval",
            "--net-approval-timeout",
            "5m",
        ],
        &[],
    ));

    // Something for the page to show: a session with one call, and a one-shot run.
    let (status, session) = api(
        &s,
        KEY_A,
        "POST",
        "/v1/sessions",
        json!({"language": "python"}),
    );
    assert!(status == 200 || status == 201, "{status} {session}");
    let session_id = session["id"].as_str().unwrap().to_string();
    let (status, v) = api(
        &s,
        KEY_A,
        "POST",
        &format!("/v1/sessions/{session_id}/execute"),
        json!({"code": "x = 41\nprint(x + 1)"}),
    );
    assert_eq!((status, v["stdout"].as_str()), (200, Some("42\n")), "{v}");
    let plain = "print('console plain run')";
    let (status, v) = api(
        &s,
        KEY_A,
        "POST",
        "/v1/execute",
        json!({"language": "python", "code": plain}),
    );
    assert_eq!(status, 200, "{v}");

    let b = Browser::start(browser_bin.unwrap());
    b.open(&s.url("/console"));

    // An ordinary key is refused, and the page says why.
    b.type_into("#key", KEY_A);
    b.click("#login-button");
    b.wait_for("#login-error", "the refusal of a non-admin key", |t| {
        t.contains("not an admin key")
    });
    b.screenshot("01-non-admin-key-refused");

    b.type_into("#key", BOSS);
    b.click("#login-button");
    b.wait_for("#status", "the live status", |t| t.contains("Live"));

    // Approve: the run goes on and runs.
    let approved_code = "print('approved from the console')";
    let run = networked_run(&s, approved_code);
    let (row, text) = b.wait_for("#approvals tbody tr[data-id]", "a waiting run", |t| {
        t.contains("team-a")
    });
    assert!(
        text.contains("python") && text.contains(DESTINATION),
        "{text}"
    );
    assert!(text.contains(&sha256(approved_code)[..16]), "{text}");
    let first_id = b.attribute(&row, "data-id").unwrap();
    b.screenshot("02-approvals");
    b.click(&format!(
        "#approvals tbody tr[data-id=\"{first_id}\"] button.approve"
    ));
    let (status, v) = run.join().unwrap();
    assert_eq!(status, 200, "{v}");
    assert_ne!(v["error"]["category"], "approval_denied", "{v}");
    assert_eq!(v["stdout"], "approved from the console\n", "{v}");

    // Deny: its client gets 403 approval_denied.
    let denied_code = "print('denied from the console')";
    let run = networked_run(&s, denied_code);
    let (row, _) = b.wait_for(
        &format!("#approvals tbody tr[data-id]:not([data-id=\"{first_id}\"])"),
        "a second waiting run",
        |t| t.contains("team-a"),
    );
    let second_id = b.attribute(&row, "data-id").unwrap();
    b.click(&format!(
        "#approvals tbody tr[data-id=\"{second_id}\"] button.deny"
    ));
    let (status, v) = run.join().unwrap();
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["category"], "approval_denied", "{v}");
    b.wait_for("p[data-empty-for=\"approvals\"]", "an empty queue", |t| {
        t.contains("No run is waiting")
    });

    // Recent runs: each with its outcome, key id and code digest.
    b.tab("recent");
    for (code, outcome) in [
        (denied_code, "approval_denied"),
        (approved_code, "ok"),
        (plain, "ok"),
    ] {
        let hash = sha256(code);
        let (_, text) = b.wait_for(
            &format!("#recent tbody tr[data-sha256=\"{hash}\"]"),
            &format!("the run of {code:?}"),
            |t| t.contains(outcome),
        );
        assert!(
            text.contains("team-a") && text.contains(&hash[..16]),
            "{text}"
        );
    }
    b.screenshot("03-recent-runs");

    // Sessions: the test's session, with its owner's key id.
    b.tab("sessions");
    let (_, text) = b.wait_for(
        &format!("#sessions tbody tr[data-id=\"{session_id}\"]"),
        "the session",
        |t| t.contains("team-a"),
    );
    assert!(text.contains("python"), "{text}");
    b.screenshot("04-sessions");

    // Sandboxes: a run that sleeps shows while it runs; when its client goes away, its
    // sandbox is killed (docs/serve.md, "Shutdown and disconnects"): it leaves the list and
    // shows in the recent runs as cancelled.
    // Long enough for any machine to show it: the disconnect ends it.
    let sleeper_code = "import time\ntime.sleep(600)";
    let mut sleeper = std::net::TcpStream::connect(s.base.trim_start_matches("http://")).unwrap();
    let body = json!({"language": "python", "code": sleeper_code, "timeout": 900}).to_string();
    write!(
        sleeper,
        "POST /v1/execute HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {KEY_A}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        s.base.trim_start_matches("http://"),
        body.len()
    )
    .unwrap();
    b.tab("sandboxes");
    b.wait_for("#sandboxes tbody tr", "the sleeping run", |t| {
        t.contains("one-shot") && t.contains("team-a") && t.contains("python")
    });
    b.screenshot("05-sandboxes");
    drop(sleeper);
    b.wait_for("p[data-empty-for=\"sandboxes\"]", "no sandbox left", |t| {
        t.contains("No sandbox is running")
    });
    b.tab("recent");
    b.wait_for(
        &format!("#recent tbody tr[data-sha256=\"{}\"]", sha256(sleeper_code)),
        "the sleeping run, cancelled",
        |t| t.contains("cancelled") && t.contains("team-a"),
    );

    b.tab("pool");
    b.wait_for("#templates", "the templates", |t| t.contains("Forks"));
    b.screenshot("06-pool-and-templates");

    b.tab("metrics");
    b.wait_for("#executions tbody tr", "the runs by outcome", |t| {
        t.contains("ok")
    });
    // A few samples for the charts.
    b.wait_for(".chart[data-chart=\"running\"]", "three samples", |t| {
        t.split("over ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n >= 3)
    });
    b.screenshot("07-metrics");
    // The same in a dark colour scheme (Chromium's DevTools emulation; no screenshot where
    // the driver does not offer it).
    let dark = b.call(
        "POST",
        "/goog/cdp/execute",
        json!({"cmd": "Emulation.setEmulatedMedia", "params": {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}}),
    );
    if dark.is_ok() {
        b.tab("approvals");
        b.wait_for("p[data-empty-for=\"approvals\"]", "an empty queue", |t| {
            t.contains("No run is waiting")
        });
        b.tab("recent");
        b.wait_for("#recent tbody tr", "the recent runs", |t| {
            t.contains("team-a")
        });
        b.screenshot("08-recent-runs-dark");
    }

    // Signing out forgets the key.
    b.click("#logout");
    b.wait_for("#login", "the key prompt", |t| t.contains("Admin key"));
}
