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
#[path = "support/otlp.rs"]
mod otlp;
#[path = "support/spec.rs"]
mod spec;

use std::path::PathBuf;

use browser::{Browser, BrowserError, DESKTOP, PATIENCE, PHONE};
use fleet::{Fleet, Timing};
use harness::{Records, baton, output, root};
use serde_json::{Value, json};

const TIMING: Timing = Timing {
    lease_ms: 10_000,
    worker_silence_ms: 5_000,
};

const TRACE_URL: &str = "https://jaeger.example/trace/{trace_id}";

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
    let mut command = baton();
    command
        .arg("submit")
        .arg(&workflow)
        .arg("--input")
        .arg("Add dark mode toggle")
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

/// The `data-status` of the graph's node for `step_id`.
async fn node_status(browser: &Browser, step_id: &str) -> Result<String, BrowserError> {
    let value = browser
        .execute(
            "const node = document.querySelector(`g.step[data-step-id=\"${arguments[0]}\"]`);
             return node ? node.getAttribute('data-status') : null;",
            vec![json!(step_id)],
        )
        .await?;
    value
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| BrowserError::NotFound {
            what: format!("for step {step_id} in the graph"),
        })
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
    let found = browser
        .execute(
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
            vec![],
        )
        .await
        .unwrap();
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
    assert_eq!(accessibility_problems(&browser).await, Vec::<String>::new());
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
    assert_eq!(accessibility_problems(&browser).await, Vec::<String>::new());
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
        .wait_for("the state chain to be verified", PATIENCE, async |b| {
            let text = b.text_of(&b.find("#action-status").await?).await?;
            Ok(text.contains("State chain holds").then_some(text))
        })
        .await
        .unwrap();

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
        assert!(
            browser.find_by_text(hidden).await.is_err(),
            "{hidden} is shown to a read-only principal"
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
    assert!(browser.find_by_label("Token").await.is_err());

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
    let browser = Browser::start().await.unwrap();
    // The list is open before the run exists: the run appears in it without a reload.
    browser.goto(&format!("{ui}/")).await.unwrap();
    browser
        .wait_for_text("#runs-count", "0 runs", PATIENCE)
        .await
        .unwrap();
    browser
        .execute("window.__sameDocument = 'yes';", vec![])
        .await
        .unwrap();
    let mut command = baton();
    command
        .arg("submit")
        .arg(&path)
        .arg("--input")
        .arg("{}")
        .arg("--coordinator")
        .arg(fleet.url(0));
    let out = output(&mut command, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run_id = String::from_utf8(out.stdout).unwrap().trim().to_owned();

    // No worker serves `shard`: the list says so once, not 500 times.
    let row = format!("tr[data-run-id=\"{run_id}\"]");
    let text = browser
        .wait_for("the fan-out's row", PATIENCE, async |b| {
            let text = b.text_of(&b.find(&row).await?).await?;
            Ok(text.contains("shard").then_some(text))
        })
        .await
        .unwrap();
    assert!(
        text.len() < 400,
        "one line per wait, not per branch: {text}"
    );

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
