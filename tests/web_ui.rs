//! The web UI in a real browser (headless Chromium over WebDriver, `support/browser.rs`) on a
//! real cluster: a durable `redis-server`, two `baton coordinator` processes and a `baton
//! worker`, all separate processes. The browser talks to the coordinator that did not take the
//! submission, to show that any coordinator serves any run.
//!
//! Writes `tests/screenshots/runs.png` and `tests/screenshots/run.png`, which README.md shows.

#[path = "support/browser.rs"]
mod browser;
#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/cluster.rs"]
mod harness;
#[path = "support/llm_server.rs"]
mod llm_server;
#[path = "support/otlp.rs"]
mod otlp;
#[path = "support/spec.rs"]
mod spec;

use std::path::PathBuf;

use browser::{Browser, BrowserError, DESKTOP, PATIENCE, PHONE};
use fleet::{Fleet, Timing};
use harness::{Records, baton, output, root};
use llm_server::{Gate, LlmServer, Reply};
use serde_json::{Value, json};

const TIMING: Timing = Timing {
    lease_ms: 10_000,
    worker_silence_ms: 5_000,
};

const TRACE_URL: &str = "https://jaeger.example/trace/{trace_id}";

// WebDriver's key values.
const TAB: &str = "\u{E004}";
const END: &str = "\u{E010}";
const ARROW_UP: &str = "\u{E013}";
const ARROW_DOWN: &str = "\u{E015}";

/// The spec's five agents as `memory-agent.sh` (data, one message, one decision each), except
/// the reviewer: `streaming-agent.sh`, which streams lines on stderr until the test releases it.
fn agents_file(records: &Records, worker: &str, streaming_reviewer: bool) -> PathBuf {
    let quote = |s: &str| serde_json::to_string(s).unwrap();
    let scripts = root().join("tests/agents");
    let env = format!(
        "env = {{ RECORD_ROOT = {}, WORKER = {}, BATON_BIN = {} }}\n",
        quote(&records.root().display().to_string()),
        quote(worker),
        quote(env!("CARGO_BIN_EXE_baton")),
    );
    let mut toml = String::new();
    for agent in [
        "planner",
        "coder",
        "test-unit",
        "test-integration",
        "reviewer",
    ] {
        let (script, stream) = match agent {
            "reviewer" if streaming_reviewer => ("streaming-agent.sh", "stream_stderr = true\n"),
            "reviewer" => ("spec-agent.sh", ""),
            _ => ("memory-agent.sh", ""),
        };
        let output = if script == "spec-agent.sh" {
            ""
        } else {
            "output = \"envelope\"\n"
        };
        toml.push_str(&format!(
            "[agents.{agent}]\nkind = \"command\"\ncommand = [\"sh\", {}, {}]\n{output}{stream}{env}\n",
            quote(&scripts.join(script).display().to_string()),
            quote(agent),
        ));
    }
    let path = records.root().join(format!("{worker}.agents.toml"));
    std::fs::create_dir_all(records.root()).unwrap();
    std::fs::write(&path, toml).unwrap();
    path
}

fn screenshots() -> PathBuf {
    let dir = root().join("tests/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `baton submit` of the feature-development example to `coordinator`; its run id.
fn submit(coordinator: &str, token: Option<&str>) -> String {
    let workflow = root().join("examples/feature-development/workflow.json");
    submit_file(&workflow, "Add dark mode toggle", coordinator, token)
}

/// `baton submit` of the workflow at `path` with `input` to `coordinator`; its run id.
fn submit_file(
    path: &std::path::Path,
    input: &str,
    coordinator: &str,
    token: Option<&str>,
) -> String {
    let mut command = baton();
    command
        .arg("submit")
        .arg(path)
        .arg("--input")
        .arg(input)
        .arg("--coordinator")
        .arg(coordinator);
    if let Some(token) = token {
        command.env("BATON_TOKEN", token);
    }
    let out = output(&mut command, None);
    assert!(
        out.status.success(),
        "baton submit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The run record as the UI's API gives it.
async fn record(http: &str, run_id: &str, token: Option<&str>) -> Value {
    let mut request = reqwest::Client::new().get(format!("{http}/api/runs/{run_id}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap().json().await.unwrap()
}

fn step<'a>(record: &'a Value, id: &str) -> &'a Value {
    record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|step| step["id"] == id)
        .unwrap_or_else(|| panic!("no step {id} in {record}"))
}

/// What `read` (JavaScript over `node`) gives of the graph's node for `step_id`.
async fn read_node(browser: &Browser, step_id: &str, read: &str) -> Result<String, BrowserError> {
    let script = format!(
        "const node = document.querySelector(`g.step[data-step-id=\"${{arguments[0]}}\"]`);
         return node ? {read} : null;"
    );
    let value = browser.execute(&script, vec![json!(step_id)]).await?;
    value
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| BrowserError::NotFound {
            what: format!("for step {step_id} in the graph"),
        })
}

/// The `data-status` of the graph's node for `step_id`.
async fn node_status(browser: &Browser, step_id: &str) -> Result<String, BrowserError> {
    read_node(browser, step_id, "node.getAttribute('data-status')").await
}

/// Waits until the graph shows `step_id` in one of the `wanted` states; fails with the run
/// record the API gives.
async fn wait_for_status(browser: &Browser, step_id: &str, wanted: &[&str]) -> String {
    let waited = browser
        .wait_for(
            &format!("step {step_id} to show one of {wanted:?}"),
            PATIENCE,
            async |browser| {
                let status = node_status(browser, step_id).await?;
                Ok(wanted.contains(&status.as_str()).then_some(status))
            },
        )
        .await;
    match waited {
        Ok(status) => status,
        Err(error) => {
            let record = browser
                .execute(
                    "const run = location.pathname.split('/').pop();
                     return fetch(`/api/runs/${run}`).then((answer) => answer.text());",
                    vec![],
                )
                .await;
            panic!("{error}\nthe run record: {record:?}")
        }
    }
}

/// Problems a screen reader or keyboard user would meet on the page: form controls without a
/// label, buttons and links without a name, focusable graph nodes without a label.
async fn accessibility_problems(browser: &Browser) -> Vec<String> {
    problems(
        browser,
        "const problems = [];
             const visible = (e) => e.getClientRects().length > 0;
             for (const control of document.querySelectorAll('input, select, textarea')) {
               if (!visible(control) || control.type === 'hidden') continue;
               const labelled = control.labels?.length || control.getAttribute('aria-label')
                 || control.getAttribute('aria-labelledby');
               if (!labelled) problems.push('unlabelled control ' + control.outerHTML.slice(0, 80));
             }
             for (const named of document.querySelectorAll('button, a[href], [role=button]')) {
               if (!visible(named)) continue;
               const name = (named.getAttribute('aria-label') || named.textContent || '').trim();
               if (!name) problems.push('nameless ' + named.outerHTML.slice(0, 80));
             }
             if (!document.documentElement.lang) problems.push('no lang on <html>');
             if (!document.title) problems.push('no <title>');
             if (!document.querySelector('main')) problems.push('no <main> landmark');
             return problems;",
    )
    .await
}

/// Text that does not stand out from what is behind it: every visible piece of text, HTML or
/// in the graph, against its background (the layers behind it composited, a node's text against
/// its box), below WCAG's AA contrast (4.5:1; 3:1 for large text). Disabled controls are
/// exempt, as WCAG exempts inactive components.
async fn contrast_problems(browser: &Browser) -> Vec<String> {
    problems(
        browser,
            r#"const parse = (text) => {
               const m = /rgba?\(([^)]+)\)/.exec(text || '');
               if (!m) return null;
               const p = m[1].split(/[\s,\/]+/).filter(Boolean).map(Number);
               return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
             };
             const over = (top, under) => [0, 1, 2].map((i) => top[i] * top[3] + under[i] * (1 - top[3])).concat(1);
             const channel = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
             const luminance = (c) => 0.2126 * channel(c[0]) + 0.7152 * channel(c[1]) + 0.0722 * channel(c[2]);
             const ratio = (a, b) => {
               const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
               return (hi + 0.05) / (lo + 0.05);
             };
             const canvas = matchMedia('(prefers-color-scheme: dark)').matches ? [18, 18, 18, 1] : [255, 255, 255, 1];
             const behind = (element) => {
               const layers = [];
               for (let n = element; n; n = n.parentElement) {
                 if (n instanceof SVGElement) continue;
                 const bg = parse(getComputedStyle(n).backgroundColor);
                 if (bg && bg[3] > 0) { layers.push(bg); if (bg[3] >= 1) break; }
               }
               return layers.reverse().reduce((under, layer) => over(layer, under), canvas);
             };
             const problems = [];
             for (const element of document.querySelectorAll('body *')) {
               const text = [...element.childNodes]
                 .filter((n) => n.nodeType === Node.TEXT_NODE)
                 .map((n) => n.textContent).join('').trim();
               if (!text || !element.getClientRects().length) continue;
               const style = getComputedStyle(element);
               if (style.visibility === 'hidden' || Number(style.opacity) === 0) continue;
               if (element.closest('[disabled], [hidden]')) continue;
               const svg = element instanceof SVGElement;
               let colour = parse(svg ? style.fill : style.color);
               if (!colour) continue;
               let background = behind(element);
               if (svg) {
                 const box = element.closest('g.step')?.querySelector('rect.box');
                 if (box) {
                   const fill = parse(getComputedStyle(box).fill);
                   if (fill) {
                     fill[3] *= Number(getComputedStyle(box).fillOpacity || 1);
                     background = over(fill, background);
                   }
                 }
               }
               colour = over(colour, background);
               const size = parseFloat(style.fontSize);
               const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
               const needed = large ? 3 : 4.5;
               const got = ratio(colour, background);
               if (got < needed) {
                 const what = element.id ? '#' + element.id : element.tagName.toLowerCase() + '.' + (element.getAttribute('class') || '');
                 problems.push(`${what} "${text.slice(0, 40)}": ${got.toFixed(2)}:1, needs ${needed}:1 (${colour.slice(0, 3)} on ${background.slice(0, 3)})`);
               }
             }
             return problems;"#,
        )
        .await
}

/// [`accessibility_problems`] and [`contrast_problems`] in the light colour scheme and the
/// dark one; the page is left light.
async fn readable_in_both_schemes(browser: &Browser, page: &str) {
    for dark in [false, true] {
        browser.set_color_scheme(dark).await.unwrap();
        let mut problems = accessibility_problems(browser).await;
        problems.extend(contrast_problems(browser).await);
        let scheme = if dark { "dark" } else { "light" };
        assert_eq!(problems, Vec::<String>::new(), "{page}, {scheme}");
    }
    browser.set_color_scheme(false).await.unwrap();
}

/// The problems `script` (a function body returning a list of strings) finds in the page.
async fn problems(browser: &Browser, script: &str) -> Vec<String> {
    let found = browser.execute(script, vec![]).await.unwrap();
    found
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_owned())
        .collect()
}

/// Whether the page is wider than its viewport (a phone would scroll sideways).
async fn overflows_sideways(browser: &Browser) -> bool {
    browser
        .execute(
            "return document.documentElement.scrollWidth > window.innerWidth + 1;",
            vec![],
        )
        .await
        .unwrap()
        .as_bool()
        .unwrap()
}

fn release(records: &Records, run_id: &str, step_id: &str) {
    std::fs::write(
        records.root().join(format!("{run_id}.{step_id}.release")),
        "",
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feature_development_run_in_a_browser_from_list_to_approval_to_its_end() {
    // reqwest is built without a crypto provider of its own; this process's is ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (receiver, otlp_url) = otlp::Receiver::start().await;
    let mut fleet = Fleet::start_with_args(
        2,
        TIMING,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_url.as_str())],
        &["--trace-url", TRACE_URL],
    )
    .await;
    let records = Records::new(fleet.dir().join("records"));
    let agents = agents_file(&records, "worker-1", true);
    fleet.start_worker_on("worker-1", &agents, 4, 0);
    fleet.wait_for_workers(1).await;
    // Submitted to coordinator 0; the browser reads coordinator 1.
    let run_id = submit(&fleet.url(0), None);
    let ui = fleet.http_url(1);
    let browser = Browser::start().await.unwrap();

    // The list: the run appears, with what it waits for.
    browser.goto(&format!("{ui}/")).await.unwrap();
    let row = format!("tr[data-run-id=\"{run_id}\"]");
    let text = browser
        .wait_for(
            "the run's row to say it waits for approve-plan",
            PATIENCE,
            async |b| {
                let text = b.text_of(&b.find(&row).await?).await?;
                Ok(text.contains("approve-plan").then_some(text))
            },
        )
        .await
        .unwrap();
    assert!(text.contains("feature-development"), "{text}");
    assert!(text.contains("running"), "{text}");
    readable_in_both_schemes(&browser, "the runs list").await;
    browser
        .screenshot(&screenshots().join("runs.png"))
        .await
        .unwrap();

    // Filters: another status hides it, its own shows it again.
    let status = browser.find_by_label("Status").await.unwrap();
    browser
        .execute(
            "arguments[0].value = 'succeeded'; arguments[0].dispatchEvent(new Event('change'));",
            vec![Browser::element_arg(&status)],
        )
        .await
        .unwrap();
    browser
        .wait_for(
            "the running run to leave the succeeded list",
            PATIENCE,
            async |b| Ok(b.find_all(&row).await?.is_empty().then_some(())),
        )
        .await
        .unwrap();
    browser
        .execute(
            "arguments[0].value = 'running'; arguments[0].dispatchEvent(new Event('change'));",
            vec![Browser::element_arg(&status)],
        )
        .await
        .unwrap();
    let link = format!("{row} a");
    browser
        .wait_for("the run back in the running list", PATIENCE, async |b| {
            Ok(Some(b.find(&link).await?))
        })
        .await
        .unwrap();

    // Its page: every step of the workflow in the graph.
    browser
        .click(&browser.find(&link).await.unwrap())
        .await
        .unwrap();
    for step_id in [
        "plan",
        "approve-plan",
        "code",
        "parallel-tests",
        "unit",
        "integration",
        "check-tests",
        "review",
    ] {
        let status = wait_for_status(
            &browser,
            step_id,
            &["pending", "succeeded", "waiting", "running", "queued"],
        )
        .await;
        let expected = match step_id {
            "plan" => "succeeded",
            "approve-plan" => "waiting",
            _ => "pending",
        };
        assert_eq!(status, expected, "{step_id}");
        // Shown, not only named in an attribute: the box reads its id and its state.
        let shown = node_text(&browser, step_id).await.unwrap();
        assert!(
            shown.contains(step_id) && shown.contains(expected),
            "{step_id}: {shown}"
        );
    }
    // Marks this page: a reload would lose it.
    browser
        .execute("window.__sameDocument = 'yes';", vec![])
        .await
        .unwrap();

    // The approval: its question, the data it is about.
    browser
        .wait_for_text("#approval-title", "Approval needed: approve-plan", PATIENCE)
        .await
        .unwrap();
    let approval = browser.find("#approval").await.unwrap();
    browser
        .wait_for(
            "the approval to show the plan it is about",
            PATIENCE,
            async |b| {
                let text = b.text_of(&approval).await?;
                Ok((text.contains("Approve implementation plan?")
                    && text.contains("CSS variables"))
                .then_some(()))
            },
        )
        .await
        .unwrap();

    // The planner's panel: the payload it received, its result, its message and decision.
    let plan = browser.find("g.step[data-step-id=\"plan\"]").await.unwrap();
    browser.click(&plan).await.unwrap();
    browser
        .wait_for_text("#step-panel-title", "plan", PATIENCE)
        .await
        .unwrap();
    let panel = browser.find("#step-panel").await.unwrap();
    let shown = browser
        .wait_for(
            "the plan's payload and memory in its panel",
            PATIENCE,
            async |b| {
                let text = b.text_of(&panel).await?;
                Ok((text.contains("Payload")
                    && text.contains("Add dark mode toggle")
                    && text.contains("Use CSS variables for the theme colours")
                    && text.contains("worker-1"))
                .then_some(text))
            },
        )
        .await
        .unwrap();
    assert!(shown.contains("Result"), "{shown}");
    readable_in_both_schemes(&browser, "the run page with a step's panel").await;
    browser
        .screenshot(&screenshots().join("run.png"))
        .await
        .unwrap();

    // The trace link names the run's trace.
    let trace_id = record(&ui, &run_id, None).await["trace_id"]
        .as_str()
        .expect("a traced run")
        .to_owned();
    let href = browser
        .execute(
            "return document.querySelector('#run-trace').getAttribute('href');",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        href,
        json!(format!("https://jaeger.example/trace/{trace_id}"))
    );
    receiver
        .wait_for("the run's spans", |spans| {
            !otlp::of_trace(spans, &trace_id).is_empty()
        })
        .await;

    // Approve with a comment: the run moves on, on this same page.
    let comment = browser.find_by_label("Comment").await.unwrap();
    browser
        .type_into(&comment, "Ship it, with tests")
        .await
        .unwrap();
    browser
        .click(&browser.find_by_text("Approve").await.unwrap())
        .await
        .unwrap();
    browser
        .wait_for_text("#approval-status", "Approved", PATIENCE)
        .await
        .unwrap();
    wait_for_status(&browser, "approve-plan", &["succeeded"]).await;
    wait_for_status(&browser, "code", &["queued", "running", "succeeded"]).await;
    // The reviewer streams until released: its panel shows the stream as it comes.
    wait_for_status(&browser, "review", &["running"]).await;
    browser
        .click(
            &browser
                .find("g.step[data-step-id=\"review\"]")
                .await
                .unwrap(),
        )
        .await
        .unwrap();
    browser
        .wait_for(
            "the reviewer's live output in its panel",
            PATIENCE,
            async |b| {
                let text = b.text_of(&b.find("#live-output").await?).await?;
                Ok(text
                    .contains("Reading the diff of the dark mode toggle")
                    .then_some(()))
            },
        )
        .await
        .unwrap();
    release(&records, &run_id, "review");
    wait_for_status(&browser, "review", &["succeeded"]).await;
    browser
        .wait_for_text("#run-status", "succeeded", PATIENCE)
        .await
        .unwrap();
    let same = browser
        .execute("return window.__sameDocument || null;", vec![])
        .await
        .unwrap();
    assert_eq!(same, json!("yes"), "the page was reloaded");

    // The record keeps the approval and its comment.
    let finished = record(&ui, &run_id, None).await;
    assert_eq!(finished["status"], "succeeded");
    assert_eq!(finished["context"]["approve-plan"]["approved"], true);
    assert_eq!(
        finished["context"]["approve-plan"]["comment"],
        "Ship it, with tests"
    );
    assert_eq!(step(&finished, "review")["status"], "succeeded");

    // Verify recomputes the state chain.
    browser
        .click(&browser.find_by_text("Verify").await.unwrap())
        .await
        .unwrap();
    browser
        .wait_for_text_containing("#action-status", "State chain holds", PATIENCE)
        .await
        .unwrap();
    // A stored result changed behind Baton's back: Verify says where the chain breaks.
    let mut redis = fleet.redis_connection().await;
    let results = format!("baton:run:{{{run_id}}}:results");
    let mut code: Vec<u8> = redis::AsyncCommands::hget(&mut redis, &results, "code#1")
        .await
        .unwrap();
    let at = code
        .windows(7)
        .position(|w| w == b"toggle.")
        .expect("the coder's result names toggle.tsx");
    code[at] = b'T';
    let _: () = redis::AsyncCommands::hset(&mut redis, &results, "code#1", &code)
        .await
        .unwrap();
    browser
        .click(&browser.find_by_text("Verify").await.unwrap())
        .await
        .unwrap();
    let broken = browser
        .wait_for_text_containing("#action-error", "State chain broken", PATIENCE)
        .await
        .unwrap();
    assert!(broken.contains("(step code, visit 1)"), "{broken}");

    // A phone: the page fits its width, and the list too.
    browser.set_window_size(PHONE).await.unwrap();
    assert!(
        !overflows_sideways(&browser).await,
        "the run page overflows a phone"
    );
    browser.goto(&format!("{ui}/")).await.unwrap();
    browser
        .wait_for("the list on a phone", PATIENCE, async |b| {
            Ok(Some(b.find(&row).await?))
        })
        .await
        .unwrap();
    assert!(
        !overflows_sideways(&browser).await,
        "the list overflows a phone"
    );
    browser.set_window_size(DESKTOP).await.unwrap();
    browser.quit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tokens_the_page_asks_once_and_shows_only_what_the_principal_may_do() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let digest = |token: &str| hex::encode(<sha2::Sha256 as sha2::Digest>::digest(token));
    let tokens = dir.path().join("principals.toml");
    std::fs::write(
        &tokens,
        format!(
            "[principals.pool]\ntoken_sha256 = \"{}\"\nroles = [\"worker\", \"read\"]\n\n\
             [principals.ci]\ntoken_sha256 = \"{}\"\nroles = [\"submit\", \"read\"]\n\n\
             [principals.viewer]\ntoken_sha256 = \"{}\"\nroles = [\"read\"]\n\n\
             [principals.lead]\ntoken_sha256 = \"{}\"\nroles = [\"read\", \"approve\"]\n",
            digest("pool-token-0123456789"),
            digest("ci-token-0123456789"),
            digest("viewer-token-0123456789"),
            digest("lead-token-0123456789"),
        ),
    )
    .unwrap();
    let mut fleet = Fleet::start_with_args(
        1,
        TIMING,
        &[("BATON_TOKEN", "pool-token-0123456789")],
        &["--auth-tokens", tokens.to_str().unwrap()],
    )
    .await;
    let records = Records::new(fleet.dir().join("records"));
    let agents = agents_file(&records, "worker-1", false);
    fleet.start_worker("worker-1", &agents, 4);
    let run_id = submit(&fleet.url(0), Some("ci-token-0123456789"));
    let ui = fleet.http_url(0);
    let browser = Browser::start().await.unwrap();

    // Asked for a token; a read-only principal sees the approval but cannot decide it.
    browser.goto(&format!("{ui}/runs/{run_id}")).await.unwrap();
    let sign_in = |token: &'static str| {
        let browser = &browser;
        async move {
            let field = browser
                .wait_for("the sign-in form", PATIENCE, async |b| {
                    Ok(Some(b.find_by_label("Token").await?))
                })
                .await
                .unwrap();
            browser.type_into(&field, token).await.unwrap();
            browser
                .click(&browser.find_by_text("Sign in").await.unwrap())
                .await
                .unwrap();
        }
    };
    sign_in("viewer-token-0123456789").await;
    browser
        .wait_for_text("#session-principal", "Signed in as viewer", PATIENCE)
        .await
        .unwrap();
    browser
        .wait_for_text("#approval-title", "Approval needed: approve-plan", PATIENCE)
        .await
        .unwrap();
    for hidden in ["Approve", "Reject", "Cancel"] {
        let found = browser.find_by_text(hidden).await;
        assert!(
            matches!(found, Err(BrowserError::NotFound { .. })),
            "{hidden} is shown to a read-only principal: {found:?}"
        );
    }
    // Once: the list and back ask nothing again.
    browser.goto(&format!("{ui}/")).await.unwrap();
    browser
        .wait_for("the list, signed in", PATIENCE, async |b| {
            Ok(Some(
                b.find(&format!("tr[data-run-id=\"{run_id}\"]")).await?,
            ))
        })
        .await
        .unwrap();
    let asked = browser.find_by_label("Token").await;
    assert!(
        matches!(asked, Err(BrowserError::NotFound { .. })),
        "asked for a token again: {asked:?}"
    );

    // Another principal, who may approve: the approver recorded is that principal.
    browser
        .click(&browser.find_by_text("Sign out").await.unwrap())
        .await
        .unwrap();
    browser.goto(&format!("{ui}/runs/{run_id}")).await.unwrap();
    sign_in("lead-token-0123456789").await;
    let comment = browser
        .wait_for("the comment box", PATIENCE, async |b| {
            Ok(Some(b.find_by_label("Comment").await?))
        })
        .await
        .unwrap();
    browser.type_into(&comment, "Looks right").await.unwrap();
    browser
        .click(&browser.find_by_text("Approve").await.unwrap())
        .await
        .unwrap();
    browser
        .wait_for_text("#approval-status", "Approved", PATIENCE)
        .await
        .unwrap();
    let decided = record(&ui, &run_id, Some("lead-token-0123456789")).await;
    assert_eq!(
        decided["context"]["approve-plan"],
        json!({"approved": true, "comment": "Looks right", "approver": "lead"})
    );
    // Without a token the API answers nothing.
    let anonymous = reqwest::get(format!("{ui}/api/runs/{run_id}"))
        .await
        .unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    browser.quit().await.unwrap();
    drop(fleet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_branch_step_is_drawn_whole_and_each_branch_opens() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let fleet = Fleet::start_with_args(1, TIMING, &[], &[]).await;
    let branches: Vec<Value> = (0..500)
        .map(|i| json!({"id": format!("shard-{i}"), "type": "agent", "agent": "shard"}))
        .collect();
    let workflow = json!({"id": "fan-out", "steps": [
        {"id": "fan", "type": "parallel", "steps": branches, "next": "merge"},
        {"id": "merge", "type": "transform", "transform": "context.fan.data"}
    ]});
    let path = fleet.dir().join("fan-out.json");
    std::fs::write(&path, workflow.to_string()).unwrap();
    let ui = fleet.http_url(0);
    // 52 runs that end at once, more than a page of the list.
    let mut client = fleet.client(0).await.unwrap();
    let quick = json!({"id": "quick", "steps": [
        {"id": "only", "type": "transform", "transform": "input"}
    ]})
    .to_string();
    let mut quick_runs = Vec::new();
    for n in 0..52 {
        quick_runs.push(harness::submit(&mut client, quick.clone(), &json!(n)).await);
    }
    let browser = Browser::start().await.unwrap();
    browser.goto(&format!("{ui}/")).await.unwrap();
    browser
        .wait_for_text("#runs-page", "Page 1", PATIENCE)
        .await
        .unwrap();
    let first_page = rows(&browser).await.unwrap();
    assert_eq!(first_page.len(), 50, "50 a page");
    // Newest first: the last 50 submitted, the newest on top.
    let newest: Vec<String> = quick_runs.iter().rev().take(50).cloned().collect();
    assert_eq!(first_page, newest);
    browser
        .click(&browser.find_by_text("Older").await.unwrap())
        .await
        .unwrap();
    browser
        .wait_for_text("#runs-page", "Page 2", PATIENCE)
        .await
        .unwrap();
    let second_page = browser
        .wait_for("the second page's rows", PATIENCE, async |b| {
            let ids = rows(b).await?;
            Ok((ids.len() == 2).then_some(ids))
        })
        .await
        .unwrap();
    assert_eq!(
        second_page,
        vec![quick_runs[1].clone(), quick_runs[0].clone()]
    );
    browser
        .click(&browser.find_by_text("Newer").await.unwrap())
        .await
        .unwrap();
    browser
        .wait_for_text("#runs-page", "Page 1", PATIENCE)
        .await
        .unwrap();

    // The list is open before the run exists: the run appears in it without a reload.
    browser
        .execute("window.__sameDocument = 'yes';", vec![])
        .await
        .unwrap();
    let run_id = submit_file(&path, "{}", &fleet.url(0), None);

    // No worker serves `shard`: the list says so once, not 500 times.
    let row = format!("tr[data-run-id=\"{run_id}\"]");
    let text = browser
        .wait_for_text_containing(&row, "shard", PATIENCE)
        .await
        .unwrap();
    assert!(
        text.contains("agent shard — no worker serves it (500 steps)"),
        "{text}"
    );
    assert_eq!(
        text.matches("shard").count(),
        1,
        "one line per wait, not per branch: {text}"
    );
    let same = browser
        .execute("return window.__sameDocument || null;", vec![])
        .await
        .unwrap();
    assert_eq!(same, json!("yes"), "the list was reloaded");

    browser.goto(&format!("{ui}/runs/{run_id}")).await.unwrap();
    let drawn = browser
        .wait_for("every branch in the graph", PATIENCE, async |b| {
            let count = b
                .execute("return document.querySelectorAll('g.step').length;", vec![])
                .await?;
            Ok((count == json!(502)).then_some(count))
        })
        .await
        .unwrap();
    assert_eq!(
        drawn,
        json!(502),
        "500 branches, their parallel step and merge"
    );
    assert_eq!(node_status(&browser, "shard-499").await.unwrap(), "queued");
    // The graph is one Tab stop, not 502: Tab from the button before it lands on its first
    // step, and Tab again leaves it; the arrow keys move inside it.
    let tab_stops = browser
        .execute(
            "return document.querySelectorAll('g.step[tabindex=\"0\"]').length;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(tab_stops, json!(1));
    browser
        .execute("document.getElementById('graph-zoom').focus();", vec![])
        .await
        .unwrap();
    browser.press(&[TAB]).await.unwrap();
    assert_eq!(browser.focused().await.unwrap().as_deref(), Some("fan"));
    browser.press(&[ARROW_DOWN]).await.unwrap();
    let below = browser.focused().await.unwrap().unwrap_or_default();
    assert!(below.starts_with("shard-"), "{below}");
    browser.press(&[END]).await.unwrap();
    assert_eq!(browser.focused().await.unwrap().as_deref(), Some("merge"));
    browser.press(&[ARROW_UP]).await.unwrap();
    let above = browser.focused().await.unwrap().unwrap_or_default();
    assert!(above.starts_with("shard-") || above == "fan", "{above}");
    browser.press(&[TAB]).await.unwrap();
    let after = browser.focused().await.unwrap().unwrap_or_default();
    assert!(
        !after.starts_with("shard-") && after != "fan" && after != "merge",
        "Tab stayed in the graph: {after}"
    );
    let shard = browser
        .find("g.step[data-step-id=\"shard-250\"]")
        .await
        .unwrap();
    // By keyboard: the node takes focus and Enter opens its panel.
    browser.type_into(&shard, "\u{E007}").await.unwrap();
    browser
        .wait_for_text("#step-panel-title", "shard-250", PATIENCE)
        .await
        .unwrap();
    // Focus follows to the panel, so a screen reader reads it next.
    browser
        .wait_for("focus on the panel's heading", PATIENCE, async |b| {
            let focused = b
                .execute("return document.activeElement?.id || null;", vec![])
                .await?;
            Ok((focused == json!("step-panel-title")).then_some(()))
        })
        .await
        .unwrap();
    browser.quit().await.unwrap();
}

/// The run ids of the list's rows, top to bottom.
async fn rows(browser: &Browser) -> Result<Vec<String>, BrowserError> {
    let ids = browser
        .execute(
            "return [...document.querySelectorAll('tr[data-run-id]')].map((r) => r.dataset.runId);",
            vec![],
        )
        .await?;
    Ok(serde_json::from_value(ids).expect("a list of run ids"))
}

/// The text the graph's node for `step_id` shows.
async fn node_text(browser: &Browser, step_id: &str) -> Result<String, BrowserError> {
    let read = "[...node.querySelectorAll('text')].map((t) => t.textContent).join(' ')";
    read_node(browser, step_id, read).await
}

/// A map step whose item fails, retried from the page, then a model's tokens streaming into
/// its step's panel; and a run waiting on a model, cancelled from the page, which cuts the
/// model's connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_map_is_retried_and_a_model_streams_into_its_panel_and_a_run_is_cancelled() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = LlmServer::start().await;
    let gate = Gate::new();
    server.push(
        Reply::stream(["{\"summary\":", " \"five files", " checked\"}"])
            .usage(11, 7)
            .hold_before(2, &gate),
    );
    let never = Gate::new();
    server.push(Reply::stream(["{\"summary\":", " \"never\"}"]).hold_before(1, &never));
    let mut fleet = Fleet::start_with_args(1, TIMING, &[], &[]).await;
    let records = Records::new(fleet.dir().join("records"));
    std::fs::create_dir_all(records.root()).unwrap();
    // Item 2 fails once the other four have ended, while its mark is there.
    std::fs::write(records.root().join("expect-ends"), "4").unwrap();
    std::fs::write(records.root().join("fail-2"), "").unwrap();
    let agents = records.agents_file("worker-1", &[("checker", vec!["map-item.sh", "0.05"])]);
    let mut toml = std::fs::read_to_string(&agents).unwrap();
    toml.push_str(&format!(
        "[agents.summariser]\nkind = \"llm\"\nbase_url = \"{}\"\nmodel = \"small\"\n\
         prompt = \"Summarise {{{{json context}}}}.\"\n",
        server.base_url()
    ));
    std::fs::write(&agents, toml).unwrap();
    fleet.start_worker("worker-1", &agents, 4);
    fleet.wait_for_workers(1).await;
    let workflow = json!({"id": "check-files", "steps": [
        {"id": "check-each", "type": "map", "items": "input.files", "agent": "checker",
         "max_concurrency": 2, "tolerated_failures": 0, "next": "summarise"},
        {"id": "summarise", "type": "agent", "agent": "summariser"}
    ]});
    let path = fleet.dir().join("check-files.json");
    std::fs::write(&path, workflow.to_string()).unwrap();
    let files = json!({"files": ["a.rs", "b.rs", "c.rs", "d.rs", "e.rs"]}).to_string();
    let run_id = submit_file(&path, &files, &fleet.url(0), None);
    let ui = fleet.http_url(0);
    let browser = Browser::start().await.unwrap();
    browser.goto(&format!("{ui}/runs/{run_id}")).await.unwrap();

    // The map fails at its third item; its box counts the items.
    browser
        .wait_for_text("#run-status", "failed", PATIENCE)
        .await
        .unwrap();
    assert_eq!(node_status(&browser, "check-each").await.unwrap(), "failed");
    let counts = node_text(&browser, "check-each").await.unwrap();
    assert!(counts.contains("5/5 done, 1 failed"), "{counts}");
    assert_eq!(node_status(&browser, "summarise").await.unwrap(), "pending");

    // Retry, with the cause gone: the failed item runs again and the model is asked.
    std::fs::remove_file(records.root().join("fail-2")).unwrap();
    browser
        .click(&browser.find_by_text("Retry").await.unwrap())
        .await
        .unwrap();
    wait_for_status(&browser, "check-each", &["succeeded"]).await;
    let counts = browser
        .wait_for(
            "the map's box to count every item done",
            PATIENCE,
            async |b| {
                let text = node_text(b, "check-each").await?;
                Ok((text.contains("5/5 done") && !text.contains("failed")).then_some(text))
            },
        )
        .await
        .unwrap();
    assert!(!counts.contains("failed"), "{counts}");

    // The model's first tokens show in the step's panel while the rest is held back.
    wait_for_status(&browser, "summarise", &["running"]).await;
    browser
        .click(
            &browser
                .find("g.step[data-step-id=\"summarise\"]")
                .await
                .unwrap(),
        )
        .await
        .unwrap();
    let streamed = browser
        .wait_for_text_containing("#live-output", "\"five files", PATIENCE)
        .await
        .unwrap();
    assert!(
        !streamed.contains("checked"),
        "the held piece is out: {streamed}"
    );
    assert_eq!(node_status(&browser, "summarise").await.unwrap(), "running");

    // The list, open while the run ends, shows it ending without a reload.
    browser.goto(&format!("{ui}/")).await.unwrap();
    let row = format!("tr[data-run-id=\"{run_id}\"]");
    let text = browser
        .wait_for_text_containing(&row, "running", PATIENCE)
        .await
        .unwrap();
    assert!(text.contains("agent summariser (step summarise)"), "{text}");
    browser
        .execute("window.__sameDocument = 'yes';", vec![])
        .await
        .unwrap();
    gate.open();
    browser
        .wait_for_text_containing(&row, "succeeded", PATIENCE)
        .await
        .unwrap();
    let same = browser
        .execute("return window.__sameDocument || null;", vec![])
        .await
        .unwrap();
    assert_eq!(same, json!("yes"), "the list was reloaded");

    // The step's page (`?step=` opens its panel): the tokens the model reported.
    browser
        .goto(&format!("{ui}/runs/{run_id}?step=summarise"))
        .await
        .unwrap();
    wait_for_status(&browser, "summarise", &["succeeded"]).await;
    let panel = browser.find("#step-panel").await.unwrap();
    browser
        .wait_for("the attempt's tokens in the panel", PATIENCE, async |b| {
            let text = b.text_of(&panel).await?;
            Ok(text.contains("11 + 7").then_some(()))
        })
        .await
        .unwrap();
    let finished = record(&ui, &run_id, None).await;
    assert_eq!(
        finished["context"]["summarise"],
        json!({"summary": "five files checked"})
    );

    // A second run waits on the model; Cancel on its page stops it, and the model's call.
    let run_id = submit_file(&path, r#"{"files": []}"#, &fleet.url(0), None);
    browser.goto(&format!("{ui}/runs/{run_id}")).await.unwrap();
    wait_for_status(&browser, "summarise", &["running"]).await;
    browser
        .click(&browser.find_by_text("Cancel").await.unwrap())
        .await
        .unwrap();
    let reason = browser.find_by_label("Reason").await.unwrap();
    browser.type_into(&reason, "not needed").await.unwrap();
    browser
        .click(&browser.find_by_text("Stop the run").await.unwrap())
        .await
        .unwrap();
    browser
        .wait_for_text("#run-status", "cancelled", PATIENCE)
        .await
        .unwrap();
    server.wait_for_closed(1).await;
    let cancelled = record(&ui, &run_id, None).await;
    assert_eq!(cancelled["status"], "cancelled");
    assert!(
        cancelled.to_string().contains("not needed"),
        "the reason is on the record: {cancelled}"
    );
    browser.quit().await.unwrap();
}
