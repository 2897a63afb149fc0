//! The browser harness itself (`support/browser.rs`), on a small page served here: a real
//! headless chromium types into a labelled field, clicks a button whose script answers, sees a
//! server-sent event arrive, takes screenshots at the desktop and phone sizes, reports what it
//! waited for in vain; and leaves no process and no file behind, whether its `Browser` is
//! dropped or its test process is killed.

#[path = "support/browser.rs"]
mod browser;

use std::convert::Infallible;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use axum::Router;
use axum::response::Html;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use browser::{Browser, BrowserError, DESKTOP, PATIENCE, PHONE, WindowSize};
use serde_json::json;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::WatchStream;

/// A labelled textarea and a button whose script echoes it; a field known by its `aria-label`;
/// two buttons of the same text; a line the server updates over server-sent events.
const PAGE: &str = r#"<!doctype html>
<html lang="en">
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Harness</title>
<label for="prompt">Prompt</label>
<textarea id="prompt"></textarea>
<button id="send">Send</button>
<p id="echo"></p>
<input aria-label="Search">
<button>Copy</button> <button>Copy</button>
<p id="news">no news</p>
<script>
  document.getElementById('send').addEventListener('click', () => {
    const prompt = document.getElementById('prompt');
    document.getElementById('echo').textContent = 'You said: ' + prompt.value;
  });
  const news = document.getElementById('news');
  const events = new EventSource('/news');
  events.onopen = () => { news.textContent = 'listening'; };
  events.onmessage = (event) => { news.textContent = event.data; };
  console.log('harness page ready');
</script>
"#;

/// [`PAGE`] served on a free loopback port, with the news it streams.
struct Page {
    url: String,
    news: watch::Sender<Option<String>>,
}

async fn serve_page() -> Page {
    let (news, receiver) = watch::channel(None::<String>);
    let app = Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route(
            "/news",
            get(move || {
                // Whatever the test published last, then each new item.
                let items = WatchStream::new(receiver.clone())
                    .filter_map(|item| item)
                    .map(|item| Ok::<_, Infallible>(Event::default().data(item)));
                async move { Sse::new(items).keep_alive(KeepAlive::default()) }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Page { url, news }
}

/// Starts a browser, printing how long that took (a number worth knowing for a suite of UI
/// tests: each test starts its own).
async fn start_browser() -> Browser {
    let started = Instant::now();
    let browser = Browser::start().await.unwrap();
    eprintln!("the browser started in {:?}", started.elapsed());
    browser
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn types_clicks_and_sees_the_page_change() {
    let page = serve_page().await;
    let browser = start_browser().await;
    browser.goto(&page.url).await.unwrap();

    let prompt = browser.find_by_label("Prompt").await.unwrap();
    browser.type_into(&prompt, "hello browser").await.unwrap();
    assert_eq!(browser.value_of(&prompt).await.unwrap(), "hello browser");
    let send = browser.find_by_text("Send").await.unwrap();
    browser.click(&send).await.unwrap();
    browser
        .wait_for_text("#echo", "You said: hello browser", PATIENCE)
        .await
        .unwrap();

    let search = browser.find_by_label("Search").await.unwrap();
    browser.type_into(&search, "runs").await.unwrap();
    assert_eq!(browser.value_of(&search).await.unwrap(), "runs");
    browser.clear(&search).await.unwrap();
    assert_eq!(browser.value_of(&search).await.unwrap(), "");

    // Nothing is published until the page listens, so what it shows next came from the server.
    browser
        .wait_for_text("#news", "listening", PATIENCE)
        .await
        .unwrap();
    page.news.send_replace(Some("run 7 succeeded".to_owned()));
    browser
        .wait_for_text("#news", "run 7 succeeded", PATIENCE)
        .await
        .unwrap();

    let shots = tempfile::tempdir().unwrap();
    let desktop = shots.path().join("desktop.png");
    browser.screenshot(&desktop).await.unwrap();
    assert_eq!(png_size(&desktop), (DESKTOP.width, DESKTOP.height));
    assert_eq!(viewport(&browser).await, DESKTOP);

    browser.set_window_size(PHONE).await.unwrap();
    assert_eq!(viewport(&browser).await, PHONE);
    let phone = shots.path().join("phone.png");
    browser.screenshot(&phone).await.unwrap();
    assert_eq!(png_size(&phone), (PHONE.width, PHONE.height));

    browser.quit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_missing_or_never_comes_is_named() {
    let page = serve_page().await;
    let browser = start_browser().await;
    browser.goto(&page.url).await.unwrap();

    // The text never changes, so the wait ends at its deadline, however short.
    let error = browser
        .wait_for_text("#echo", "never said", Duration::from_millis(300))
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, BrowserError::Timeout { .. }),
        "not a timeout: {message}"
    );
    assert!(
        message.contains(r#"the element matching `#echo` to show "never said""#),
        "{message}"
    );
    assert!(
        message.contains(r#"last: the element matching `#echo` shows """#),
        "{message}"
    );
    assert!(
        message.contains("harness page ready"),
        "no console in: {message}"
    );
    assert_eq!(browser.url().await.unwrap(), page.url);
    assert_eq!(browser.find_all("button").await.unwrap().len(), 3);

    for (result, expected) in [
        (
            browser.find("#nowhere").await,
            "no element matching `#nowhere`",
        ),
        (
            browser.find_by_text("Publish").await,
            r#"no element showing the text "Publish""#,
        ),
        (
            browser.find_by_label("Password").await,
            r#"no element labelled "Password""#,
        ),
        (
            browser.find_by_text("Copy").await,
            r#"2 elements showing the text "Copy"; expected one"#,
        ),
    ] {
        assert_eq!(result.unwrap_err().to_string(), expected);
    }
    browser.quit().await.unwrap();
}

#[test]
fn dropping_the_browser_leaves_nothing_behind() {
    assert_leaves_nothing_behind("browser_child_drops_its_browser");
}

#[test]
fn a_killed_test_leaves_no_browser_behind() {
    assert_leaves_nothing_behind("browser_child_is_killed");
}

/// Set for the `browser_child_*` tests by the tests that run them: run any other way (say with
/// `--include-ignored`), they do nothing, rather than kill the test binary.
const CHILD: &str = "BATON_BROWSER_TEST_CHILD";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by dropping_the_browser_leaves_nothing_behind"]
async fn browser_child_drops_its_browser() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let browser = started_child_browser().await;
    drop(browser);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by a_killed_test_leaves_no_browser_behind"]
async fn browser_child_is_killed() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let _browser = started_child_browser().await;
    // The most sudden death: no unwinding, no drop, no exit handlers.
    Command::new("kill")
        .args(["-9", &std::process::id().to_string()])
        .status()
        .unwrap();
    std::thread::sleep(Duration::from_secs(10));
    unreachable!("still alive after SIGKILL");
}

/// A browser with a page open (so chromium runs renderers too), once its processes are counted
/// for the parent test.
async fn started_child_browser() -> Browser {
    let browser = Browser::start().await.unwrap();
    browser.goto("data:text/html,<p>a page</p>").await.unwrap();
    println!("PROCESSES {}", processes_under(&std::env::temp_dir()).len());
    browser
}

/// Runs a `browser_child_*` test in a child test process with a TMPDIR of its own, which every
/// process of its browser inherits; then waits until none of them is left and the folder is
/// empty.
fn assert_leaves_nothing_behind(child: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "--nocapture",
            "--test-threads=1",
            child,
        ])
        .env("TMPDIR", tmp.path())
        .env(CHILD, "1")
        .stdin(Stdio::null())
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let processes: usize = stdout
        .lines()
        // libtest prints the test's name on the same line, before it.
        .find_map(|line| line.split_once("PROCESSES ").map(|(_, n)| n.trim()))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "{child} did not start its browser ({}):\n{stdout}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )
        });
    // chromedriver, its shell, the watcher, chromium and its helpers.
    assert!(processes >= 4, "{child} counted {processes} processes");

    let deadline = Instant::now() + PATIENCE;
    loop {
        let processes = processes_under(tmp.path());
        let files: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect();
        if processes.is_empty() && files.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{child} left behind processes {processes:?} and files {files:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The live processes (their command lines) other than this one whose TMPDIR is in `dir`.
fn processes_under(dir: &Path) -> Vec<String> {
    let wanted = format!("TMPDIR={}", dir.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // Gone meanwhile, or not ours to read: not one of the browser's.
        let (Ok(stat), Ok(environ)) = (
            std::fs::read_to_string(entry.path().join("stat")),
            std::fs::read(entry.path().join("environ")),
        ) else {
            continue;
        };
        // The state follows the command name, which is in parentheses and may hold spaces. A
        // zombie is dead; only its parent, or init, can still reap it.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if pid == std::process::id() || matches!(state, Some("Z" | "X")) {
            continue;
        }
        let inherited = environ
            .split(|byte| *byte == 0)
            .any(|variable| variable.starts_with(wanted.as_bytes()));
        if inherited {
            let command = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push(format!(
                "{pid}: {}",
                String::from_utf8_lossy(&command).replace('\0', " ")
            ));
        }
    }
    found
}

/// The viewport the page sees, and whether it has a touch screen (a phone's).
async fn viewport(browser: &Browser) -> WindowSize {
    let seen = browser
        .execute(
            "return [window.innerWidth, window.innerHeight, navigator.maxTouchPoints > 0]",
            vec![],
        )
        .await
        .unwrap();
    WindowSize {
        width: seen[0].as_u64().unwrap() as u32,
        height: seen[1].as_u64().unwrap() as u32,
        mobile: seen[2] == json!(true),
    }
}

/// The width and height of a PNG file, after checking that it is one: its signature, then its
/// header chunk.
fn png_size(path: &Path) -> (u32, u32) {
    const SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
    let bytes = std::fs::read(path).unwrap();
    assert!(
        bytes.len() > 24 && bytes.starts_with(SIGNATURE) && &bytes[12..16] == b"IHDR",
        "{} is not a PNG ({} bytes)",
        path.display(),
        bytes.len()
    );
    let number = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (number(16), number(20))
}
