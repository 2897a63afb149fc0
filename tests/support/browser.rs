//! A real browser for the end-to-end tests: Debian's `chromium`, headless, driven over W3C
//! WebDriver by Debian's `chromedriver`, one of each per [`Browser`].
//!
//! ```ignore
//! let browser = Browser::start().await?;
//! browser.goto(&url).await?;
//! let prompt = browser.find_by_label("Prompt").await?;
//! browser.type_into(&prompt, "hello").await?;
//! browser.click(&browser.find_by_text("Send").await?).await?;
//! browser.wait_for_text("#answer", "hello", PATIENCE).await?;
//! browser.quit().await?;
//! ```
//!
//! A test finds elements the way a user would (by their text, by their label) or by CSS, acts
//! on them, and waits for what it expects with [`Browser::wait_for`]: up to a generous deadline,
//! never a fixed sleep. The page sees a [`DESKTOP`] viewport until [`Browser::set_window_size`]
//! says otherwise ([`PHONE`]).
//!
//! Nothing is left running: dropping the `Browser`, or the test process dying in any way, kills
//! chromedriver and every chromium process it started, and removes their files (see
//! [`WRAPPER`]). Nothing is skipped either: without `chromium` or `chromedriver`,
//! [`Browser::start`] fails naming the Debian packages to install, as `scripts/test` installs
//! them.
//!
//! Why no WebDriver crate: thirtyfour 0.38 turns on serde_json's `preserve_order`, and Cargo
//! unifies features across a build, so `cargo test --workspace` would walk JSON objects in
//! insertion order instead of alphabetically (the worker's `{{#each}}` tests fail, and the
//! binaries under test would differ from a release build). The dozen commands used here are JSON
//! over HTTP, through reqwest, which baton-cli already depends on.
//!
//! Included with `#[path]` by the tests that use it; it needs reqwest, rustls, serde_json,
//! tokio, tempfile, base64 and thiserror (dependencies or dev-dependencies of baton-cli).

#![allow(dead_code)]

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use reqwest::Method;
use serde_json::{Value, json};

/// A generous deadline for [`Browser::wait_for`]: what a test waits for normally comes within
/// milliseconds, but CI machines stall.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// How many more times chromedriver is started when the port it picked is taken on IPv4.
const PORT_TRIES: u32 = 5;

/// How long chromedriver gets to print its port and answer.
const START_DEADLINE: Duration = Duration::from_secs(30);
/// Bounds one WebDriver command; a page load is bounded tighter by the session (30 s).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between two looks at a condition.
const POLL: Duration = Duration::from_millis(50);
/// The key under which WebDriver serializes an element reference.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Runs chromedriver ("$@") in the process group this shell leads (the test spawns it with
/// `process_group(0)`; chromium and its helpers stay in that group) and kills the whole group
/// when the test process lets go of the shell's stdin: by [`Drop`], or by dying, since the kernel
/// closes a dead process's pipes. So a test that panics, aborts or is SIGKILLed leaves no browser
/// behind (the same lifeline as `coordinator/tests/support/redis_cluster.rs`, whose doc says why
/// not `PR_SET_PDEATHSIG`). The watcher runs in a session of its own so that it survives the
/// kill, and then removes the browser's folder ($1: its profile and temporary files), again
/// while a process killed in the middle of writing there makes that fail. (It cannot wait for
/// the group to be gone: the dead stay in it as zombies until init reaps them, which some
/// container inits never do.) chromium's crash handlers leave the group (`setsid`) but exit when
/// the chromium they watch dies. `kill -s KILL --`, because dash's `kill -KILL --` takes `--`
/// for a pid and kills nothing.
const WRAPPER: &str = r#"
dir=$1
shift
group=$$
exec 3<&0 </dev/null
"$@" 3<&- &
driver=$!
setsid sh -c '
    read -r _ <&3
    kill -s KILL -- "-$1" 2>/dev/null
    i=0
    until sleep 0.05 && rm -rf -- "$2" 2>/dev/null || [ "$i" -ge 100 ]; do i=$((i + 1)); done
' watcher "$group" "$dir" &
exec 3<&-
wait "$driver"
"#;

/// What the page sees as its viewport, in CSS pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSize {
    pub width: u32,
    pub height: u32,
    /// Emulate a phone: a touch screen, scrollbars that overlay, and the page's `<meta
    /// name="viewport">` honoured (without one, a page is laid out 980 pixels wide and shrunk, as
    /// on a real phone).
    pub mobile: bool,
}

/// A laptop screen; every browser starts with it.
pub const DESKTOP: WindowSize = WindowSize {
    width: 1366,
    height: 900,
    mobile: false,
};

/// A phone held upright (an iPhone 14's viewport).
pub const PHONE: WindowSize = WindowSize {
    width: 390,
    height: 844,
    mobile: true,
};

/// Why a browser could not do what a test asked.
#[derive(thiserror::Error)]
pub enum BrowserError {
    #[error(
        "`{program}` was not found on PATH. The browser tests drive a real headless chromium and \
         are never skipped: install the Debian packages `chromium` and `chromium-driver` (`sudo \
         apt-get install chromium chromium-driver`; scripts/test does it) or add the folder \
         holding `{program}` to PATH"
    )]
    Missing { program: &'static str },
    #[error("could not prepare chromedriver: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("chromedriver {problem}; its output:\n{log}")]
    Driver { problem: String, log: String },
    #[error("{doing}: {source}")]
    Http {
        doing: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{doing}: {error}: {message}")]
    WebDriver {
        doing: String,
        error: String,
        message: String,
    },
    #[error("{doing}: unexpected reply {reply}")]
    Reply { doing: String, reply: String },
    #[error("no element {what}")]
    NotFound { what: String },
    #[error("{count} elements {what}; expected one")]
    Ambiguous { what: String, count: usize },
    #[error("the element {what} shows {shown:?}")]
    Shows { what: String, shown: String },
    #[error("waited {timeout:?} for {what} in vain; last: {last}{console}")]
    Timeout {
        what: String,
        timeout: Duration,
        last: String,
        /// The page's console, which tells why a page did not do what was waited for.
        console: String,
    },
    #[error("could not write the screenshot {}: {source}", path.display())]
    Screenshot {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The sentence, not the variant, so that `.unwrap()` in a test reads well.
impl std::fmt::Debug for BrowserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// An element of the current page, as found by one of the `find` methods. It goes stale when
/// the page replaces it; find it again then.
#[derive(Debug, Clone)]
pub struct Element {
    id: String,
    /// How it was found, for error messages: "matching `#send`", "labelled \"Prompt\"".
    found: String,
}

/// A headless chromium with a WebDriver session, killed with everything it started on drop.
pub struct Browser {
    http: reqwest::Client,
    /// `http://127.0.0.1:<port>/session/<id>`
    session: String,
    driver: Driver,
}

impl Browser {
    /// Starts `chromedriver` on a port it picks itself (it prints it, so two tests never race for
    /// one), waits until it answers, and opens a session of a headless chromium with a
    /// [`DESKTOP`] viewport.
    pub async fn start() -> Result<Browser, BrowserError> {
        let chromedriver = find_program("chromedriver")?;
        let chromium = find_program("chromium")?;
        // Port 0 is chromedriver's pick on IPv6, then the same number on IPv4, where another
        // test's process may hold it: it then exits ("IPv4 port not available"), and another
        // start picks another port.
        let (driver, port) = {
            let mut tries = 0;
            loop {
                let driver = Driver::spawn(&chromedriver)?;
                match driver.wait_for_port().await {
                    Ok(port) => break (driver, port),
                    Err(_) if tries < PORT_TRIES && driver.log().contains("port not available") => {
                        tries += 1;
                    }
                    Err(error) => return Err(error),
                }
            }
        };
        // reqwest's rustls has no provider of its own in this workspace (ring everywhere, see
        // STACK.md); the client is built with one even for plain HTTP.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(COMMAND_TIMEOUT)
            .build()
            .expect("build an HTTP client");
        let base = format!("http://127.0.0.1:{port}");
        driver.wait_until_ready(&http, &base).await?;
        let profile = driver.dir.path().join("profile");
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "timeouts": {"implicit": 0, "pageLoad": 30_000, "script": 30_000},
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new",
                    // CI runs the tests as root, where chromium refuses to start sandboxed.
                    "--no-sandbox",
                    // Docker gives containers a 64 MB /dev/shm, too small for chromium.
                    "--disable-dev-shm-usage",
                    format!("--user-data-dir={}", profile.display()),
                    format!("--window-size={},{}", DESKTOP.width, DESKTOP.height),
                    "--lang=en-US",
                    "--no-first-run",
                    "--disable-background-networking",
                ],
            },
        }}});
        let doing = "open a WebDriver session";
        let reply = send(
            &http,
            Method::POST,
            &format!("{base}/session"),
            Some(capabilities),
            doing,
        )
        .await
        .map_err(|e| driver.explain(e))?;
        let Some(id) = reply["sessionId"].as_str() else {
            return Err(unexpected(doing, &reply));
        };
        let browser = Browser {
            http,
            session: format!("{base}/session/{id}"),
            driver,
        };
        browser.set_window_size(DESKTOP).await?;
        Ok(browser)
    }

    pub async fn goto(&self, url: &str) -> Result<(), BrowserError> {
        self.command(
            Method::POST,
            "url",
            json!({"url": url}),
            &format!("go to {url}"),
        )
        .await?;
        Ok(())
    }

    /// The address of the current page.
    pub async fn url(&self) -> Result<String, BrowserError> {
        let reply = self
            .command(Method::GET, "url", None, "read the URL")
            .await?;
        as_string(reply, "read the URL")
    }

    /// The one element matching a CSS selector.
    pub async fn find(&self, css: &str) -> Result<Element, BrowserError> {
        let found = format!("matching `{css}`");
        let doing = format!("find the element {found}");
        let reply = self
            .command(
                Method::POST,
                "element",
                json!({"using": "css selector", "value": css}),
                &doing,
            )
            .await
            .map_err(|e| not_found_as_such(e, &found))?;
        element(&reply, found).ok_or_else(|| unexpected(&doing, &reply))
    }

    /// Every element matching a CSS selector, in document order.
    pub async fn find_all(&self, css: &str) -> Result<Vec<Element>, BrowserError> {
        let found = format!("matching `{css}`");
        let doing = format!("find the elements {found}");
        let reply = self
            .command(
                Method::POST,
                "elements",
                json!({"using": "css selector", "value": css}),
                &doing,
            )
            .await?;
        elements(&reply, &found).ok_or_else(|| unexpected(&doing, &reply))
    }

    /// The one visible element whose text, with runs of white space as one space and trimmed,
    /// is `text`: the innermost one, so a button rather than the form holding it. Ambiguity is
    /// an error (two "Delete" buttons: find by CSS instead).
    pub async fn find_by_text(&self, text: &str) -> Result<Element, BrowserError> {
        self.find_one_by_script(FIND_BY_TEXT, text, format!("showing the text {text:?}"))
            .await
    }

    /// The one form control a user knows by `label`: the control of a `<label>` with that text
    /// (by `for=` or by nesting), or an element whose `aria-label` it is.
    pub async fn find_by_label(&self, label: &str) -> Result<Element, BrowserError> {
        self.find_one_by_script(FIND_BY_LABEL, label, format!("labelled {label:?}"))
            .await
    }

    pub async fn click(&self, element: &Element) -> Result<(), BrowserError> {
        let doing = format!("click the element {}", element.found);
        self.command(Method::POST, &element.path("click"), json!({}), &doing)
            .await?;
        Ok(())
    }

    /// Types `text` at the end of what the field holds, key by key, as a user would (`\n` is
    /// Enter).
    pub async fn type_into(&self, element: &Element, text: &str) -> Result<(), BrowserError> {
        let doing = format!("type into the element {}", element.found);
        self.command(
            Method::POST,
            &element.path("value"),
            json!({"text": text}),
            &doing,
        )
        .await?;
        Ok(())
    }

    /// Empties a text field.
    pub async fn clear(&self, element: &Element) -> Result<(), BrowserError> {
        let doing = format!("clear the element {}", element.found);
        self.command(Method::POST, &element.path("clear"), json!({}), &doing)
            .await?;
        Ok(())
    }

    /// The text the element shows (hidden parts left out, as a user reads it).
    pub async fn text_of(&self, element: &Element) -> Result<String, BrowserError> {
        let doing = format!("read the text of the element {}", element.found);
        let reply = self
            .command(Method::GET, &element.path("text"), None, &doing)
            .await?;
        as_string(reply, &doing)
    }

    /// What a form field holds (its `value` property).
    pub async fn value_of(&self, element: &Element) -> Result<String, BrowserError> {
        let doing = format!("read the value of the element {}", element.found);
        let reply = self
            .command(Method::GET, &element.path("property/value"), None, &doing)
            .await?;
        as_string(reply, &doing)
    }

    /// Runs `script` (a function body: `return` gives its result; `arguments[i]` are `args`) in
    /// the page and returns its result. Elements in `args` are [`Browser::element_arg`]s.
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Result<Value, BrowserError> {
        self.command(
            Method::POST,
            "execute/sync",
            json!({"script": script, "args": args}),
            "run a script in the page",
        )
        .await
    }

    /// `element` as an argument of [`Browser::execute`].
    pub fn element_arg(element: &Element) -> Value {
        json!({ELEMENT_KEY: element.id})
    }

    /// Calls `condition` until it gives `Some`, and returns that; an error from it counts as
    /// "not yet" (the element may not exist yet), and the last one is reported if `timeout`
    /// passes first, with `what` (say "the run to show `succeeded`") and the page's console.
    /// Fails at once if chromedriver died.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut condition: impl AsyncFnMut(&Browser) -> Result<Option<T>, BrowserError>,
    ) -> Result<T, BrowserError> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match condition(self).await {
                Ok(Some(value)) => return Ok(value),
                Ok(None) => "the condition did not hold".to_owned(),
                Err(error) => error.to_string(),
            };
            self.driver.check_alive()?;
            if Instant::now() >= deadline {
                let console = match self.console().await {
                    Ok(lines) if lines.is_empty() => String::new(),
                    Ok(lines) => format!("\nthe page's console:\n{}", lines.join("\n")),
                    Err(error) => format!("\n(the page's console could not be read: {error})"),
                };
                return Err(BrowserError::Timeout {
                    what: what.to_owned(),
                    timeout,
                    last,
                    console,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until the one element matching `css` shows exactly `expected`.
    pub async fn wait_for_text(
        &self,
        css: &str,
        expected: &str,
        timeout: Duration,
    ) -> Result<(), BrowserError> {
        let what = format!("the element matching `{css}` to show {expected:?}");
        self.wait_for(&what, timeout, async |browser| {
            let shown = browser.text_of(&browser.find(css).await?).await?;
            if shown == expected {
                Ok(Some(()))
            } else {
                Err(BrowserError::Shows {
                    what: format!("matching `{css}`"),
                    shown,
                })
            }
        })
        .await
    }

    /// Waits until the one element matching `css` shows text containing `needle`; that text.
    pub async fn wait_for_text_containing(
        &self,
        css: &str,
        needle: &str,
        timeout: Duration,
    ) -> Result<String, BrowserError> {
        let what = format!("the element matching `{css}` to show {needle:?}");
        self.wait_for(&what, timeout, async |browser| {
            let text = browser.text_of(&browser.find(css).await?).await?;
            Ok(text.contains(needle).then_some(text))
        })
        .await
    }

    /// The page's console messages (and uncaught errors) since the last call, one per line.
    pub async fn console(&self) -> Result<Vec<String>, BrowserError> {
        let doing = "read the page's console";
        let reply = self
            .command(Method::POST, "se/log", json!({"type": "browser"}), doing)
            .await?;
        let Some(entries) = reply.as_array() else {
            return Err(unexpected(doing, &reply));
        };
        Ok(entries
            .iter()
            .map(|entry| {
                let level = entry["level"].as_str().unwrap_or("?");
                let message = entry["message"].as_str().unwrap_or("?");
                format!("{level} {message}")
            })
            .collect())
    }

    /// Saves what the viewport shows as a PNG at `path`.
    pub async fn screenshot(&self, path: &Path) -> Result<(), BrowserError> {
        let doing = "take a screenshot";
        let reply = self.command(Method::GET, "screenshot", None, doing).await?;
        let png = reply
            .as_str()
            .and_then(|text| base64::engine::general_purpose::STANDARD.decode(text).ok())
            .ok_or_else(|| unexpected(doing, &reply))?;
        std::fs::write(path, png).map_err(|source| BrowserError::Screenshot {
            path: path.to_owned(),
            source,
        })
    }

    /// Makes the page's viewport exactly `size` (through chromium's device emulation: a
    /// headless window's size includes room for toolbars it does not show). Lasts across pages.
    pub async fn set_window_size(&self, size: WindowSize) -> Result<(), BrowserError> {
        let doing = format!("set the window to {}x{}", size.width, size.height);
        let params = json!({
            "width": size.width,
            "height": size.height,
            "deviceScaleFactor": 1,
            "mobile": size.mobile,
        });
        self.devtools("Emulation.setDeviceMetricsOverride", params, &doing)
            .await?;
        let touch = json!({"enabled": size.mobile, "maxTouchPoints": 5});
        self.devtools("Emulation.setTouchEmulationEnabled", touch, &doing)
            .await?;
        Ok(())
    }

    /// Renders pages as with the system's `dark` (or light) colour scheme, the
    /// `prefers-color-scheme` media feature. Lasts across pages.
    pub async fn set_color_scheme(&self, dark: bool) -> Result<(), BrowserError> {
        let scheme = if dark { "dark" } else { "light" };
        let params = json!({"features": [{"name": "prefers-color-scheme", "value": scheme}]});
        self.devtools(
            "Emulation.setEmulatedMedia",
            params,
            &format!("emulate the {scheme} colour scheme"),
        )
        .await?;
        Ok(())
    }

    /// Presses and releases each of `keys` in turn (WebDriver key values: `\u{E004}` is Tab,
    /// `\u{E015}` Arrow Down), wherever the focus is, as a user at the keyboard would.
    pub async fn press(&self, keys: &[&str]) -> Result<(), BrowserError> {
        let strokes: Vec<Value> = keys
            .iter()
            .flat_map(|key| {
                [
                    json!({"type": "keyDown", "value": key}),
                    json!({"type": "keyUp", "value": key}),
                ]
            })
            .collect();
        let actions = json!({"actions": [{"type": "key", "id": "keyboard", "actions": strokes}]});
        let doing = format!("press {keys:?}");
        self.command(Method::POST, "actions", actions, &doing)
            .await?;
        Ok(())
    }

    /// The `id` (or, without one, the `data-step-id`) of the element that has the focus; `None`
    /// when it is the page itself.
    pub async fn focused(&self) -> Result<Option<String>, BrowserError> {
        let value = self
            .execute(
                "const e = document.activeElement;
                 if (!e || e === document.body) return null;
                 return e.id || e.getAttribute('data-step-id') || e.outerHTML.slice(0, 80);",
                vec![],
            )
            .await?;
        Ok(value.as_str().map(str::to_owned))
    }

    /// A Chrome DevTools Protocol command, through chromedriver.
    async fn devtools(
        &self,
        command: &str,
        params: Value,
        doing: &str,
    ) -> Result<Value, BrowserError> {
        let body = json!({"cmd": command, "params": params});
        self.command(Method::POST, "goog/cdp/execute", body, doing)
            .await
    }

    /// Closes the session, so chromium exits on its own; then chromedriver is killed as on drop.
    pub async fn quit(self) -> Result<(), BrowserError> {
        send(
            &self.http,
            Method::DELETE,
            &self.session,
            None,
            "quit the session",
        )
        .await
        .map(drop)
    }

    /// What chromedriver printed so far.
    pub fn driver_log(&self) -> String {
        self.driver.log()
    }

    async fn find_one_by_script(
        &self,
        script: &str,
        wanted: &str,
        found: String,
    ) -> Result<Element, BrowserError> {
        let doing = format!("find the element {found}");
        let reply = self
            .command(
                Method::POST,
                "execute/sync",
                json!({"script": script, "args": [wanted]}),
                &doing,
            )
            .await?;
        let mut matches = elements(&reply, &found).ok_or_else(|| unexpected(&doing, &reply))?;
        match matches.len() {
            1 => Ok(matches.remove(0)),
            0 => Err(BrowserError::NotFound { what: found }),
            count => Err(BrowserError::Ambiguous { what: found, count }),
        }
    }

    /// Sends one command of the session (`path` below `/session/<id>/`) and returns its value.
    async fn command(
        &self,
        method: Method,
        path: &str,
        body: impl Into<Option<Value>>,
        doing: &str,
    ) -> Result<Value, BrowserError> {
        let url = format!("{}/{path}", self.session);
        send(&self.http, method, &url, body.into(), doing)
            .await
            .map_err(|e| self.driver.explain(e))
    }
}

impl Element {
    /// How it was found: "matching `#send`", "labelled \"Prompt\"".
    pub fn description(&self) -> &str {
        &self.found
    }

    /// The path of one of its commands below the session.
    fn path(&self, command: &str) -> String {
        format!("element/{}/{command}", self.id)
    }
}

/// The visible elements whose normalized text is `arguments[0]`, innermost only.
const FIND_BY_TEXT: &str = r#"
const normal = (text) => text.replace(/\s+/g, ' ').trim();
const wanted = arguments[0];
const matching = [...document.body.querySelectorAll('*')]
    .filter((e) => e.checkVisibility() && normal(e.innerText ?? '') === wanted);
return matching.filter((e) => !matching.some((other) => other !== e && e.contains(other)));
"#;

/// The controls labelled `arguments[0]`, by a `<label>` (its own text, without the control's)
/// or by `aria-label`.
const FIND_BY_LABEL: &str = r#"
const normal = (text) => text.replace(/\s+/g, ' ').trim();
const wanted = arguments[0];
const found = new Set();
for (const label of document.querySelectorAll('label')) {
    const own = label.cloneNode(true);
    own.querySelectorAll('input, textarea, select, button').forEach((control) => control.remove());
    if (label.control && normal(own.textContent) === wanted) found.add(label.control);
}
for (const e of document.querySelectorAll('[aria-label]')) {
    if (normal(e.getAttribute('aria-label')) === wanted) found.add(e);
}
return [...found];
"#;

/// chromedriver, run under [`WRAPPER`], with the folder it and chromium write in.
struct Driver {
    shell: Mutex<Child>,
    /// Closing it kills the process group (see [`WRAPPER`]).
    lifeline: Option<ChildStdin>,
    /// chromium's profile, their temporary files, chromedriver's output.
    dir: tempfile::TempDir,
}

impl Driver {
    fn spawn(chromedriver: &Path) -> Result<Driver, BrowserError> {
        let dir = tempfile::Builder::new()
            .prefix("baton-browser-")
            .tempdir()
            .map_err(BrowserError::Spawn)?;
        let log = File::create(dir.path().join("chromedriver.log")).map_err(BrowserError::Spawn)?;
        let mut shell = Command::new("sh")
            .arg("-c")
            .arg(WRAPPER)
            .arg("browser")
            .arg(dir.path())
            .arg(chromedriver)
            // Port 0: chromedriver picks a free one and prints it.
            .arg("--port=0")
            // chromedriver's and chromium's temporary folders go in ours, removed with it.
            .env("TMPDIR", dir.path())
            .stdin(Stdio::piped())
            .stdout(log.try_clone().map_err(BrowserError::Spawn)?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .map_err(BrowserError::Spawn)?;
        let lifeline = shell.stdin.take();
        Ok(Driver {
            shell: Mutex::new(shell),
            lifeline,
            dir,
        })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("chromedriver.log")).unwrap_or_default()
    }

    /// The port from chromedriver's "ChromeDriver was started successfully on port N.".
    async fn wait_for_port(&self) -> Result<u16, BrowserError> {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            let log = self.log();
            let port = log
                .lines()
                .find_map(|line| line.split_once("started successfully on port "))
                .and_then(|(_, rest)| rest.trim_end_matches('.').trim().parse().ok());
            if let Some(port) = port {
                return Ok(port);
            }
            self.check_alive()?;
            if Instant::now() >= deadline {
                return Err(self.failed(format!("printed no port within {START_DEADLINE:?}")));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn wait_until_ready(
        &self,
        http: &reqwest::Client,
        base: &str,
    ) -> Result<(), BrowserError> {
        let deadline = Instant::now() + START_DEADLINE;
        let url = format!("{base}/status");
        loop {
            let last = match send(http, Method::GET, &url, None, "ask chromedriver's status").await
            {
                Ok(status) if status["ready"] == true => return Ok(()),
                Ok(status) => format!("not ready: {status}"),
                Err(error) => error.to_string(),
            };
            self.check_alive()?;
            if Instant::now() >= deadline {
                return Err(
                    self.failed(format!("was not ready within {START_DEADLINE:?} ({last})"))
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// An error if chromedriver has exited.
    fn check_alive(&self) -> Result<(), BrowserError> {
        let status = self
            .shell
            .lock()
            .expect("the shell's lock")
            .try_wait()
            .map_err(BrowserError::Spawn)?;
        match status {
            None => Ok(()),
            Some(status) => Err(self.failed(format!("exited with {status}"))),
        }
    }

    fn failed(&self, problem: String) -> BrowserError {
        BrowserError::Driver {
            problem,
            log: self.log(),
        }
    }

    /// `error`, or why it happened if chromedriver died meanwhile.
    fn explain(&self, error: BrowserError) -> BrowserError {
        match self.check_alive() {
            Ok(()) => error,
            Err(died) => died,
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("chromedriver's output:\n{}", self.log());
        }
        drop(self.lifeline.take());
        let Ok(mut shell) = self.shell.lock() else {
            return;
        };
        // The shell is in the group the watcher kills, so it goes at once; should the watcher
        // fail, the test must not hang here.
        let deadline = Instant::now() + START_DEADLINE;
        while matches!(shell.try_wait(), Ok(None)) {
            if Instant::now() >= deadline {
                eprintln!("chromedriver's process group outlived its lifeline; killing its shell");
                let _ = shell.kill();
                let _ = shell.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Sends a WebDriver command and returns the `value` of its reply.
async fn send(
    http: &reqwest::Client,
    method: Method,
    url: &str,
    body: Option<Value>,
    doing: &str,
) -> Result<Value, BrowserError> {
    let http_error = |source| BrowserError::Http {
        doing: doing.to_owned(),
        source,
    };
    let mut request = http.request(method, url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.map_err(http_error)?;
    let status = response.status();
    let reply: Value = response.json().await.map_err(http_error)?;
    let value = reply.get("value").cloned().unwrap_or(Value::Null);
    if let Some(error) = value.get("error").and_then(Value::as_str) {
        return Err(BrowserError::WebDriver {
            doing: doing.to_owned(),
            error: error.to_owned(),
            // The first line: the rest is chromedriver's stack trace.
            message: value["message"]
                .as_str()
                .unwrap_or("")
                .lines()
                .next()
                .unwrap_or("")
                .to_owned(),
        });
    }
    if !status.is_success() {
        return Err(unexpected(doing, &reply));
    }
    Ok(value)
}

fn element(value: &Value, found: String) -> Option<Element> {
    let id = value.get(ELEMENT_KEY)?.as_str()?.to_owned();
    Some(Element { id, found })
}

fn elements(value: &Value, found: &str) -> Option<Vec<Element>> {
    value
        .as_array()?
        .iter()
        .map(|item| element(item, found.to_owned()))
        .collect()
}

fn as_string(value: Value, doing: &str) -> Result<String, BrowserError> {
    match value {
        Value::String(text) => Ok(text),
        other => Err(unexpected(doing, &other)),
    }
}

fn unexpected(doing: &str, reply: &Value) -> BrowserError {
    BrowserError::Reply {
        doing: doing.to_owned(),
        reply: reply.to_string(),
    }
}

/// WebDriver's "no such element" as [`BrowserError::NotFound`].
fn not_found_as_such(error: BrowserError, found: &str) -> BrowserError {
    match error {
        BrowserError::WebDriver { error, .. } if error == "no such element" => {
            BrowserError::NotFound {
                what: found.to_owned(),
            }
        }
        other => other,
    }
}

/// `program` on PATH, or the error that names the packages to install.
fn find_program(program: &'static str) -> Result<PathBuf, BrowserError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| {
            std::fs::metadata(candidate).is_ok_and(|metadata| {
                metadata.is_file() && metadata.permissions().mode() & 0o111 != 0
            })
        })
        .ok_or(BrowserError::Missing { program })
}
