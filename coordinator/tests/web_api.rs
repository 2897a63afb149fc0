//! The web UI's JSON API over real HTTP, against a coordinator in process (a memory store,
//! workers played by the test): what the pages read and do, as the browser does it.

#[path = "support/client.rs"]
mod client;
#[path = "support/fake_worker.rs"]
mod fake_worker;
#[path = "support/running.rs"]
mod running;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use baton_coordinator::auth::Gate;
use baton_coordinator::store::Store;
use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::{Config, Coordinator};
use fake_worker::{FakeWorker, json_bytes, payload};
use futures::StreamExt;
use running::{Running, running};
use serde_json::{Value, json};

/// The spec's feature-development shape, cut to what the API needs: an agent, an approval of
/// its plan, an agent retried once, a parallel step and a loop back.
const WORKFLOW: &str = r#"{"id": "feature-development", "steps": [
    {"id": "plan", "type": "agent", "agent": "planner", "next": "approve-plan"},
    {"id": "approve-plan", "type": "approval", "message": "Approve implementation plan?",
     "on_approve": "code", "on_reject": "plan"},
    {"id": "code", "type": "agent", "agent": "coder", "input": "plan",
     "retry": {"max_attempts": 2, "initial_interval_ms": 1}, "next": "tests"},
    {"id": "tests", "type": "parallel", "steps": [
        {"id": "unit", "type": "agent", "agent": "tester"},
        {"id": "integration", "type": "agent", "agent": "tester"}
    ]}
]}"#;

struct Ui {
    base: String,
    http: reqwest::Client,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Ui {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Ui {
    async fn serve<S: Store>(coordinator: &Coordinator<S>, gate: Arc<Gate>) -> Ui {
        let router = baton_coordinator::web::router(
            coordinator.clone(),
            gate,
            Some("https://jaeger.example/trace/{trace_id}".into()),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(
                listener,
                router.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .unwrap();
        });
        // reqwest is built without a crypto provider of its own; this process's is ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ui {
            base: format!("http://{address}"),
            http: reqwest::Client::new(),
            server,
        }
    }

    async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Value, token: Option<&str>) -> (u16, Value) {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

async fn coordinator() -> Running<MemoryStore> {
    running(Coordinator::new(MemoryStore::new(), Config::default()))
}

async fn submit(coordinator: &Coordinator<MemoryStore>) -> String {
    client::submit(
        coordinator,
        WORKFLOW.as_bytes(),
        &json_bytes(&json!({"feature": "dark mode"})),
    )
    .await
    .unwrap()
}

/// A run submitted and its plan answered (`{"plan": "p"}`) by a planner connected for it: it
/// goes on to its approval.
async fn planned(coordinator: &Coordinator<MemoryStore>) -> String {
    let mut planner = FakeWorker::connect(coordinator, "w-plan", &["planner"]).await;
    let run_id = submit(coordinator).await;
    let task = planner.wait_task().await;
    planner
        .complete(coordinator, &task, &json!({"plan": "p"}), None)
        .await
        .unwrap();
    run_id
}

/// Until `check` holds for the run's record, or 10 s.
async fn until(ui: &Ui, run_id: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..200 {
        let (_, record) = ui.get(&format!("/api/runs/{run_id}"), None).await;
        if check(&record) {
            return record;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the run never got to: {what}");
}

fn step<'a>(record: &'a Value, id: &str) -> &'a Value {
    record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|step| step["id"] == id)
        .unwrap_or_else(|| panic!("no step {id} in {record}"))
}

#[tokio::test]
async fn a_run_is_listed_inspected_approved_and_verified_as_the_pages_do_it() {
    let coordinator = coordinator().await;
    let ui = Ui::serve(&coordinator, Gate::loopback_only()).await;
    let mut planner = FakeWorker::connect(&coordinator, "w-plan", &["planner"]).await;
    let mut coder = FakeWorker::connect(&coordinator, "w-code", &["coder"]).await;
    let run_id = submit(&coordinator).await;

    let task = planner.wait_task().await;
    let received = payload(&task);
    planner
        .complete(
            &coordinator,
            &task,
            &json!({"plan": ["add a toggle"]}),
            Some(&json!({
                "messages": [{"role": "assistant", "content": "planned it"}],
                "decisions": [{"summary": "a toggle, not a theme editor", "rationale": "scope"}]
            })),
        )
        .await
        .unwrap();
    until(&ui, &run_id, "waiting for the approval", |record| {
        record["waiting"][0]["kind"] == "approval"
    })
    .await;

    // The list: the run, what it waits for, filters and paging.
    let (status, listed) = ui.get("/api/runs?status=running", None).await;
    assert_eq!(status, 200, "{listed}");
    let row = &listed["runs"][0];
    assert_eq!(row["run_id"], run_id.as_str());
    assert_eq!(row["workflow_id"], "feature-development");
    assert_eq!(row["waiting"][0]["step_id"], "approve-plan");
    assert_eq!(row["waiting"][0]["message"], "Approve implementation plan?");
    let (_, other) = ui.get("/api/runs?workflow=another", None).await;
    assert_eq!(other["runs"], json!([]));
    let (_, done) = ui.get("/api/runs?status=succeeded", None).await;
    assert_eq!(done["runs"], json!([]));
    let (status, bad) = ui.get("/api/runs?status=sleeping", None).await;
    assert_eq!(status, 400);
    assert!(bad["error"].as_str().unwrap().contains("sleeping"), "{bad}");

    // The agent step's panel: its payload exactly as the worker received it, its result, its
    // attempt, its messages and decisions.
    let (status, plan) = ui
        .get(&format!("/api/runs/{run_id}/steps/plan"), None)
        .await;
    assert_eq!(status, 200, "{plan}");
    let visit = &plan["visits"][0];
    assert_eq!(visit["payload"], received);
    assert_eq!(visit["payload"]["input"]["feature"], "dark mode");
    assert_eq!(visit["result"], json!({"plan": ["add a toggle"]}));
    assert_eq!(visit["attempts"][0]["worker_id"], "w-plan");
    assert!(visit["attempts"][0]["started_ms"].as_i64().unwrap() > 0);
    assert_eq!(plan["messages"][0]["content"], "planned it");
    assert_eq!(
        plan["decisions"][0]["summary"],
        "a toggle, not a theme editor"
    );

    // The approval's panel says what is approved.
    let (_, approval) = ui
        .get(&format!("/api/runs/{run_id}/steps/approve-plan"), None)
        .await;
    assert_eq!(
        approval["approval"]["message"],
        "Approve implementation plan?"
    );
    assert_eq!(approval["approval"]["about"], "plan");
    assert_eq!(
        approval["approval"]["about_data"],
        json!({"plan": ["add a toggle"]})
    );

    // A change needs JSON from this coordinator's own pages.
    let form = ui
        .http
        .post(format!(
            "{}/api/runs/{run_id}/approvals/approve-plan",
            ui.base
        ))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("approved=true")
        .send()
        .await
        .unwrap();
    assert_eq!(form.status().as_u16(), 415);
    let (status, refused) = ui
        .post(
            &format!("/api/runs/{run_id}/approvals/approve-plan"),
            json!({"comment": "no verdict"}),
            None,
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        refused["error"].as_str().unwrap().contains("approved"),
        "{refused}"
    );

    let (status, approved) = ui
        .post(
            &format!("/api/runs/{run_id}/approvals/approve-plan"),
            json!({"approved": true, "comment": "ship it"}),
            None,
        )
        .await;
    assert_eq!(status, 200, "{approved}");
    assert_eq!(step(&approved, "approve-plan")["status"], "succeeded");
    let (status, again) = ui
        .post(
            &format!("/api/runs/{run_id}/approvals/approve-plan"),
            json!({"approved": true}),
            None,
        )
        .await;
    assert_eq!(status, 409, "{again}");
    assert_eq!(again["code"], "failed_precondition");

    // Two attempts of `code`: the first fails and is retried.
    let first = coder.wait_task().await;
    coder
        .fail(&coordinator, &first, "compiler crashed", false)
        .await
        .unwrap();
    let second = coder.wait_task().await;
    coder
        .complete(&coordinator, &second, &json!({"diff": "+toggle"}), None)
        .await
        .unwrap();
    until(&ui, &run_id, "code settled", |record| {
        step(record, "code")["status"] == "succeeded"
    })
    .await;
    let (_, code) = ui
        .get(&format!("/api/runs/{run_id}/steps/code"), None)
        .await;
    let attempts = code["visits"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{code}");
    assert_eq!(attempts[0]["attempt"], 1);
    assert_eq!(attempts[0]["error"], "compiler crashed");
    assert_eq!(attempts[1]["attempt"], 2);
    assert!(attempts[1]["error"].is_null(), "{code}");
    assert_eq!(code["visits"][0]["payload"], payload(&second));
    assert_eq!(
        code["visits"][0]["payload"]["plan"],
        json!({"plan": ["add a toggle"]}),
        "the step's `input` is handed over under its own key"
    );
    // The approval and its comment are in the record the pages show.
    let (_, approval) = ui
        .get(&format!("/api/runs/{run_id}/steps/approve-plan"), None)
        .await;
    assert_eq!(approval["visits"][0]["result"]["approved"], true);
    assert_eq!(approval["visits"][0]["result"]["comment"], "ship it");

    let (status, verified) = ui
        .post(&format!("/api/runs/{run_id}/verify"), json!({}), None)
        .await;
    assert_eq!(status, 200, "{verified}");
    assert_eq!(verified["ok"], true);
    assert!(verified["links"].as_u64().unwrap() >= 3, "{verified}");

    let (status, missing) = ui
        .get(&format!("/api/runs/{run_id}/steps/deploy"), None)
        .await;
    assert_eq!(status, 404);
    assert!(
        missing["error"].as_str().unwrap().contains("deploy"),
        "{missing}"
    );

    let (_, cancelled) = ui
        .post(
            &format!("/api/runs/{run_id}/cancel"),
            json!({"reason": "enough"}),
            None,
        )
        .await;
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["error"], "enough");
}

#[tokio::test]
async fn the_graph_has_every_step_and_the_events_stream_as_the_run_moves() {
    let coordinator = coordinator().await;
    let ui = Ui::serve(&coordinator, Gate::loopback_only()).await;
    let mut planner = FakeWorker::connect(&coordinator, "w-plan", &["planner"]).await;
    let run_id = submit(&coordinator).await;

    let (status, graph) = ui.get(&format!("/api/runs/{run_id}/graph"), None).await;
    assert_eq!(status, 200, "{graph}");
    let ids: Vec<&str> = graph["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|node| node["id"].as_str().unwrap())
        .collect();
    for id in [
        "plan",
        "approve-plan",
        "code",
        "tests",
        "unit",
        "integration",
    ] {
        assert!(ids.contains(&id), "{id} missing from {ids:?}");
    }
    let reject = graph["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|edge| edge["kind"] == "on_reject")
        .expect("the reject edge");
    assert_eq!(
        (&reject["from"], &reject["to"]),
        (&json!("approve-plan"), &json!("plan"))
    );
    assert_eq!(reject["back"], true);

    let events = ui
        .http
        .get(format!("{}/api/runs/{run_id}/events", ui.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        events.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut body = events.bytes_stream();
    let task = planner.wait_task().await;
    planner
        .complete(&coordinator, &task, &json!({"plan": "p"}), None)
        .await
        .unwrap();
    let mut seen = String::new();
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(chunk) = body.next().await {
            seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            if seen.contains("event: approval_requested") {
                return;
            }
        }
    })
    .await;
    assert!(found.is_ok(), "no approval_requested event in:\n{seen}");
    assert!(seen.contains("event: step_finished"), "{seen}");
    let finished = seen
        .lines()
        .skip_while(|line| *line != "event: step_finished")
        .nth(1)
        .and_then(|line| line.strip_prefix("data: "))
        .unwrap();
    let finished: Value = serde_json::from_str(finished).unwrap();
    assert_eq!(finished["step_id"], "plan");
    assert_eq!(finished["data"], json!({"plan": "p"}));
    assert_eq!(finished["next"], "approve-plan");
}

#[tokio::test]
async fn with_tokens_the_principal_is_asked_for_limited_to_its_roles_and_recorded() {
    let tokens = tempfile::NamedTempFile::new().unwrap();
    let digest = |token: &str| hex::encode(<sha2::Sha256 as sha2::Digest>::digest(token));
    std::fs::write(
        tokens.path(),
        format!(
            "[principals.viewer]\ntoken_sha256 = \"{}\"\nroles = [\"read\"]\n\n\
             [principals.lead]\ntoken_sha256 = \"{}\"\nroles = [\"read\", \"approve\"]\n",
            digest("viewer-token-0123456789"),
            digest("lead-token-0123456789")
        ),
    )
    .unwrap();
    let gate = Gate::configure(Some(tokens.path().to_owned()), false, false).unwrap();
    let coordinator = coordinator().await;
    let ui = Ui::serve(&coordinator, gate).await;
    let run_id = planned(&coordinator).await;

    let (status, anonymous) = ui.get("/api/session", None).await;
    assert_eq!(status, 401, "{anonymous}");
    assert_eq!(anonymous["code"], "unauthenticated");
    let (status, _) = ui.get(&format!("/api/runs/{run_id}"), None).await;
    assert_eq!(status, 401);
    let (status, _) = ui.get("/api/session", Some("a-wrong-token-000000")).await;
    assert_eq!(status, 401);

    let (_, viewer) = ui
        .get("/api/session", Some("viewer-token-0123456789"))
        .await;
    assert_eq!(viewer["auth_required"], true);
    assert_eq!(viewer["principal"], "viewer");
    assert_eq!(viewer["roles"], json!(["read"]));
    assert_eq!(
        viewer["trace_url"],
        "https://jaeger.example/trace/{trace_id}"
    );
    let path = format!("/api/runs/{run_id}/approvals/approve-plan");
    let decision = json!({"approved": true, "comment": "fine by me"});
    let (status, denied) = ui
        .post(&path, decision.clone(), Some("viewer-token-0123456789"))
        .await;
    assert_eq!(status, 403, "{denied}");
    assert!(
        denied["error"].as_str().unwrap().contains("approve"),
        "{denied}"
    );

    // The watch takes its token in the URL (an EventSource sends no headers).
    let events = ui
        .http
        .get(format!(
            "{}/api/runs/{run_id}/events?access_token=viewer-token-0123456789",
            ui.base
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(events.status().as_u16(), 200);
    drop(events);

    let (_, lead) = ui.get("/api/session", Some("lead-token-0123456789")).await;
    assert_eq!(lead["roles"], json!(["read", "approve"]));
    let (status, approved) = ui
        .post(&path, decision, Some("lead-token-0123456789"))
        .await;
    assert_eq!(status, 200, "{approved}");
    let (_, approval) = ui
        .get(
            &format!("/api/runs/{run_id}/steps/approve-plan"),
            Some("lead-token-0123456789"),
        )
        .await;
    let result = &approval["visits"][0]["result"];
    assert_eq!(result["approver"], "lead", "{approval}");
    assert_eq!(result["comment"], "fine by me");
}

#[tokio::test]
async fn another_coordinators_pages_show_where_its_steps_stand_and_who_serves_them() {
    // Short leases: the holder renews (and so records the worker) every third of one.
    let config = || Config {
        lease_ms: 300,
        ..Config::default()
    };
    let store = Arc::new(MemoryStore::new());
    let near = running(Coordinator::new(store.clone(), config()));
    let far = running(Coordinator::new(store.clone(), config()));
    let ui = Ui::serve(&far, Gate::loopback_only()).await;
    let mut planner = FakeWorker::connect(&near, "w-plan", &["planner"]).await;
    let run_id = client::submit(
        &near,
        WORKFLOW.as_bytes(),
        &json_bytes(&json!({"feature": "dark mode"})),
    )
    .await
    .unwrap();
    let _task = planner.wait_task().await;
    // `far` has no worker at all; `near`'s holds the task.
    let record = until(
        &ui,
        &run_id,
        "plan running on w-plan, seen from far",
        |record| {
            step(record, "plan")["status"] == "running"
                && step(record, "plan")["worker_id"] == "w-plan"
        },
    )
    .await;
    assert_eq!(step(&record, "plan")["attempts"], 1);
    assert_eq!(record["waiting"][0]["agent"], "planner");
    assert_eq!(record["waiting"][0]["served"], true, "{record}");
    let (_, listed) = ui.get("/api/runs", None).await;
    assert_eq!(listed["runs"][0]["waiting"][0]["served"], true, "{listed}");
}

#[tokio::test]
async fn a_failed_run_is_retried_from_the_page_and_each_attempt_shows_its_tokens() {
    let coordinator = coordinator().await;
    let ui = Ui::serve(&coordinator, Gate::loopback_only()).await;
    let mut planner = FakeWorker::connect(&coordinator, "w-plan", &["planner"]).await;
    let run_id = submit(&coordinator).await;

    // No retry policy on `plan`: its one failure fails the run.
    let first = planner.wait_task().await;
    planner
        .fail_with_usage(
            &coordinator,
            &first,
            "model overloaded",
            &[("gpt-x", 120, 7)],
        )
        .await
        .unwrap();
    let failed = until(&ui, &run_id, "failed", |record| {
        record["status"] == "failed"
    })
    .await;
    let error = step(&failed, "plan")["error"].as_str().unwrap();
    assert!(error.contains("model overloaded"), "{error}");
    let (status, refused) = ui
        .post(&format!("/api/runs/{run_id}/cancel"), json!({}), None)
        .await;
    assert_eq!(status, 409, "a failed run cannot be cancelled: {refused}");

    let (status, retried) = ui
        .post(&format!("/api/runs/{run_id}/retry"), json!({}), None)
        .await;
    assert_eq!(status, 200, "{retried}");
    assert_eq!(retried["status"], "running");
    let second = planner.wait_task().await;
    planner
        .complete_with_usage(
            &coordinator,
            &second,
            &json!({"plan": "p"}),
            &[("gpt-x", 200, 40)],
        )
        .await
        .unwrap();
    until(&ui, &run_id, "the plan settled", |record| {
        record["waiting"][0]["kind"] == "approval"
    })
    .await;

    let (_, plan) = ui
        .get(&format!("/api/runs/{run_id}/steps/plan"), None)
        .await;
    assert_eq!(plan["visit_count"], 2, "{plan}");
    let visits = plan["visits"].as_array().unwrap();
    assert_eq!(visits[0]["status"], "redriven");
    assert!(
        visits[0]["error"]
            .as_str()
            .unwrap()
            .contains("model overloaded"),
        "{plan}"
    );
    assert_eq!(
        visits[0]["attempts"][0]["usage"],
        json!([{"model": "gpt-x", "prompt_tokens": 120, "completion_tokens": 7}])
    );
    assert_eq!(visits[1]["status"], "succeeded");
    assert_eq!(
        visits[1]["attempts"][0]["usage"],
        json!([{"model": "gpt-x", "prompt_tokens": 200, "completion_tokens": 40}])
    );
    assert_eq!(visits[1]["payload"], payload(&second));
}

#[tokio::test]
async fn an_approval_decided_on_another_coordinator_right_after_it_was_requested_is_taken() {
    let store = Arc::new(MemoryStore::new());
    let near = running(Coordinator::new(store.clone(), Config::default()));
    let far = running(Coordinator::new(store.clone(), Config::default()));
    let ui = Ui::serve(&far, Gate::loopback_only()).await;
    let mut planner = FakeWorker::connect(&near, "w-plan", &["planner"]).await;
    let run_id = client::submit(
        &near,
        WORKFLOW.as_bytes(),
        &json_bytes(&json!({"feature": "dark mode"})),
    )
    .await
    .unwrap();
    // `far` reads the run while the plan is under way, and keeps that copy.
    let (_, early) = ui.get(&format!("/api/runs/{run_id}"), None).await;
    assert_eq!(early["waiting"][0]["kind"], "agent");
    let task = planner.wait_task().await;
    planner
        .complete(&near, &task, &json!({"plan": "p"}), None)
        .await
        .unwrap();
    let requested = near.record(&run_id).await.unwrap();
    assert!(!requested.waiting.is_empty());
    // Decided on `far`, whose copy is from before the request: it must look again, not refuse.
    let (status, decided) = ui
        .post(
            &format!("/api/runs/{run_id}/approvals/approve-plan"),
            json!({"approved": true, "comment": "from the other page"}),
            None,
        )
        .await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(
        decided["context"]["approve-plan"]["comment"],
        "from the other page"
    );
}

/// Every page of `/api/runs?{filters}` from the first, by its cursor, until `next` is null.
async fn pages(ui: &Ui, filters: &str) -> Vec<Vec<Value>> {
    let mut pages = Vec::new();
    let mut cursor = String::new();
    loop {
        let path = format!("/api/runs?{filters}{cursor}");
        let (status, page) = ui.get(&path, None).await;
        assert_eq!(status, 200, "{path}: {page}");
        pages.push(page["runs"].as_array().unwrap().clone());
        match page["next"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => return pages,
        }
        assert!(pages.len() < 20, "{filters}: the list does not end");
    }
}

fn ids(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .map(|row| row["run_id"].as_str().unwrap().to_owned())
        .collect()
}

/// Issue 19: the list is paged, 10,000 runs or 120. Each page follows the one before, newest
/// first, with no run twice and none left out, filters included; and what a running run waits
/// for is shown as its own page shows it.
#[tokio::test]
async fn the_runs_list_pages_newest_first_with_nothing_twice_or_left_out() {
    const REVIEW: &str = r#"{"id": "review", "steps": [
        {"id": "approve", "type": "approval", "message": "Merge it?"}]}"#;
    const QUICK: &str = r#"{"id": "quick", "steps": [
        {"id": "copy", "type": "transform", "transform": "input"}]}"#;
    const BUILD: &str = r#"{"id": "build", "steps": [
        {"id": "compile", "type": "agent", "agent": "compiler"}]}"#;
    let coordinator = coordinator().await;
    let ui = Ui::serve(&coordinator, Gate::loopback_only()).await;
    let mut submitted = Vec::new();
    for n in 0..120 {
        let workflow = [REVIEW, QUICK, BUILD][n % 3];
        let input = json_bytes(&json!({"n": n}));
        let run_id = client::submit(&coordinator, workflow.as_bytes(), &input)
            .await
            .unwrap();
        submitted.push((run_id, workflow));
    }
    let of = |workflow: &str| -> Vec<String> {
        let mut ids: Vec<String> = submitted
            .iter()
            .filter(|(_, w)| *w == workflow)
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    };

    let all = pages(&ui, "limit=50").await;
    let sizes: Vec<usize> = all.iter().map(Vec::len).collect();
    assert_eq!(sizes, [50, 50, 20]);
    let rows: Vec<Value> = all.concat();
    // One page of them all is the same list: pages are consecutive slices of it.
    let (_, whole) = ui.get("/api/runs?limit=200", None).await;
    assert_eq!(ids(&rows), ids(whole["runs"].as_array().unwrap()));
    // Newest first (equal times by descending id), so no run is twice.
    let positions: Vec<(i64, String)> = rows
        .iter()
        .map(|row| {
            let created_ms = row["created_ms"].as_i64().unwrap();
            (created_ms, row["run_id"].as_str().unwrap().to_owned())
        })
        .collect();
    assert!(
        positions.windows(2).all(|pair| pair[0] > pair[1]),
        "not newest first: {positions:?}"
    );
    let mut listed = ids(&rows);
    listed.sort();
    let mut every: Vec<String> = submitted.iter().map(|(id, _)| id.clone()).collect();
    every.sort();
    assert_eq!(listed, every, "each run once, none left out");

    // Filters hold on every page, and the pages together are every run that matches.
    let filtered = [
        ("status=running&limit=30", [30, 30, 20].as_slice(), {
            let mut ids = [of(REVIEW), of(BUILD)].concat();
            ids.sort();
            ids
        }),
        ("workflow=review&limit=15", &[15, 15, 10], of(REVIEW)),
        (
            "status=succeeded&workflow=quick&limit=25",
            &[25, 15],
            of(QUICK),
        ),
    ];
    for (filters, sizes, expected) in filtered {
        let found = pages(&ui, filters).await;
        let found_sizes: Vec<usize> = found.iter().map(Vec::len).collect();
        assert_eq!(found_sizes, sizes, "{filters}");
        let mut found_ids = ids(&found.concat());
        found_ids.sort();
        assert_eq!(found_ids, expected, "{filters}");
    }
    let (_, none) = ui
        .get("/api/runs?status=succeeded&workflow=review", None)
        .await;
    assert_eq!(none["runs"], json!([]));

    // A running run's row says what it waits for exactly as its record does.
    for row in rows.iter().filter(|row| row["status"] == "running") {
        let (_, record) = ui
            .get(
                &format!("/api/runs/{}", row["run_id"].as_str().unwrap()),
                None,
            )
            .await;
        assert!(
            !record["waiting"].as_array().unwrap().is_empty(),
            "{record}"
        );
        assert_eq!(row["waiting"], record["waiting"], "{row}");
    }
    let build = rows
        .iter()
        .find(|row| row["workflow_id"] == "build")
        .unwrap();
    assert_eq!(build["waiting"][0]["agent"], "compiler");
    assert_eq!(build["waiting"][0]["served"], false, "{build}");
    let review = rows
        .iter()
        .find(|row| row["workflow_id"] == "review")
        .unwrap();
    assert_eq!(review["waiting"][0]["message"], "Merge it?");
    let quick = rows
        .iter()
        .find(|row| row["workflow_id"] == "quick")
        .unwrap();
    assert_eq!(quick["status"], "succeeded");
    assert!(quick.get("waiting").is_none(), "{quick}");
}

/// A query parameter or a body field that does not fit is refused in the API's JSON, naming
/// it, not in axum's plain text, which a script reading `error` and `code` cannot parse.
#[tokio::test]
async fn a_bad_parameter_or_body_is_refused_as_json_naming_it() {
    let coordinator = coordinator().await;
    let ui = Ui::serve(&coordinator, Gate::loopback_only()).await;
    let run_id = submit(&coordinator).await;

    let (status, limit) = ui.get("/api/runs?limit=abc", None).await;
    assert_eq!(status, 400, "{limit}");
    assert_eq!(limit["code"], "invalid_argument");
    assert_eq!(limit["error"], "limit: invalid digit found in string");
    let (status, unknown) = ui.get("/api/runs?colour=red", None).await;
    assert_eq!(status, 400, "{unknown}");
    assert!(
        unknown["error"].as_str().unwrap().contains("`colour`"),
        "{unknown}"
    );
    let (status, watch) = ui
        .get(&format!("/api/runs/{run_id}/events?acces_token=t"), None)
        .await;
    assert_eq!(status, 400, "{watch}");
    assert!(
        watch["error"].as_str().unwrap().contains("`acces_token`"),
        "{watch}"
    );

    let path = format!("/api/runs/{run_id}/approvals/approve-plan");
    let (status, approved) = ui.post(&path, json!({"approved": "yes"}), None).await;
    assert_eq!(status, 400, "{approved}");
    assert_eq!(approved["code"], "invalid_argument");
    let error = approved["error"].as_str().unwrap();
    assert!(
        error.starts_with("the request body: approved: invalid type"),
        "{approved}"
    );
    let huge = json!({"reason": "x".repeat(baton_coordinator::web::MAX_BODY_BYTES)});
    let (status, too_big) = ui
        .post(&format!("/api/runs/{run_id}/cancel"), huge, None)
        .await;
    assert_eq!(status, 413, "{too_big}");
    assert_eq!(too_big["code"], "resource_exhausted");
    assert!(
        too_big["error"].as_str().unwrap().contains("65536 bytes"),
        "{too_big}"
    );
    // Within the body's limit, the fields are held to gRPC's: a reason, a comment, a filter.
    let (status, long) = ui
        .post(
            &format!("/api/runs/{run_id}/cancel"),
            json!({"reason": "x".repeat(5000)}),
            None,
        )
        .await;
    assert_eq!(status, 400, "{long}");
    assert_eq!(long["error"], "reason is 5000 bytes; the limit is 4096");
    let (status, comment) = ui
        .post(
            &path,
            json!({"approved": true, "comment": "ok\u{1b}[2J"}),
            None,
        )
        .await;
    assert_eq!(status, 400, "{comment}");
    assert!(
        comment["error"]
            .as_str()
            .unwrap()
            .starts_with("comment: holds an unprintable character (U+001B) at byte 2"),
        "{comment}"
    );
    let (status, filter) = ui.get("/api/runs?workflow=%7Bx%7D", None).await;
    assert_eq!(status, 400, "{filter}");
    assert!(
        filter["error"]
            .as_str()
            .unwrap()
            .starts_with("workflow: a workflow id \"{x}\" holds a brace"),
        "{filter}"
    );
    let (status, step) = ui
        .get(&format!("/api/runs/{run_id}/steps/%7Bplan%7D"), None)
        .await;
    assert_eq!(status, 400, "{step}");
    assert!(
        step["error"]
            .as_str()
            .unwrap()
            .starts_with("step id: a step id"),
        "{step}"
    );
    assert_eq!(
        ui.get(&format!("/api/runs/{run_id}"), None).await.1["status"],
        "running",
        "nothing refused changed the run"
    );

    // A path the API does not have, or a method a path does not take: JSON too.
    let (status, nowhere) = ui.get("/api/rnus", None).await;
    assert_eq!(status, 404, "{nowhere}");
    assert_eq!(nowhere["code"], "not_found");
    assert_eq!(nowhere["error"], "no API at /api/rnus");
    let (status, wrong) = ui.post("/api/runs", json!({}), None).await;
    assert_eq!(status, 405, "{wrong}");
    assert_eq!(wrong["error"], "/api/runs does not take POST");
    // A run the store does not have is the coordinator's own 404, unchanged.
    let id = "0191d2a4-7b1c-7def-8abc-0123456789ab";
    let (status, missing) = ui.get(&format!("/api/runs/{id}"), None).await;
    assert_eq!(status, 404, "{missing}");
    assert!(missing["error"].as_str().unwrap().contains(id), "{missing}");
    // What cannot be a run id is refused as such, never looked for.
    let (status, malformed) = ui.get("/api/runs/no-such-run", None).await;
    assert_eq!(status, 400, "{malformed}");
    assert!(
        malformed["error"]
            .as_str()
            .unwrap()
            .starts_with("run id: \"no-such-run\" is not a run id"),
        "{malformed}"
    );
}

impl Ui {
    /// `GET path` with this `Host` header: the status, the content type and the body.
    async fn get_as(&self, host: &str, path: &str, token: Option<&str>) -> (u16, String, String) {
        let mut request = self
            .http
            .get(format!("{}{path}", self.base))
            .header("host", host);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .map(|value| value.to_str().unwrap().to_owned())
            .unwrap_or_default();
        (
            status,
            content_type,
            response.text().await.unwrap_or_default(),
        )
    }

    fn port(&self) -> &str {
        self.base.rsplit(':').next().unwrap()
    }
}

/// DNS rebinding: another site's page whose name its DNS pointed at 127.0.0.1 calls from this
/// machine, as its own origin, with its own name as `Host`. In protected mode, which lets this
/// machine in without credentials, it gets nothing: no run, no change, not even the page.
#[tokio::test]
async fn protected_mode_answers_only_a_host_naming_this_machine() {
    let coordinator = coordinator().await;
    let ui = Ui::serve(&coordinator, Gate::loopback_only()).await;
    let run_id = planned(&coordinator).await;
    until(&ui, &run_id, "waiting for the approval", |record| {
        record["waiting"][0]["kind"] == "approval"
    })
    .await;

    let evil = "evil.example:9464";
    for path in [
        "/api/session".to_owned(),
        "/api/runs".to_owned(),
        format!("/api/runs/{run_id}"),
        format!("/api/runs/{run_id}/graph"),
        format!("/api/runs/{run_id}/steps/plan"),
        format!("/api/runs/{run_id}/events"),
    ] {
        let (status, content_type, body) = ui.get_as(evil, &path, None).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert_eq!(content_type, "application/json", "{path}");
        let refused: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(refused["code"], "permission_denied", "{path}");
        let error = refused["error"].as_str().unwrap();
        assert!(error.contains("\"evil.example:9464\""), "{path}: {error}");
        assert!(error.contains("http://127.0.0.1:9464/"), "{path}: {error}");
        assert!(error.contains("--auth-tokens"), "{path}: {error}");
    }
    for path in ["/", &format!("/runs/{run_id}"), "/assets/app.js"] {
        let (status, content_type, body) = ui.get_as(evil, path, None).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert!(content_type.starts_with("text/plain"), "{path}");
        assert!(body.contains("DNS rebinding"), "{path}: {body}");
    }
    // Same origin as far as the browser knows: `Origin` matches `Host`.
    let approve = ui
        .http
        .post(format!(
            "{}/api/runs/{run_id}/approvals/approve-plan",
            ui.base
        ))
        .header("host", evil)
        .header("origin", format!("http://{evil}"))
        .header("content-type", "application/json")
        .body(json!({"approved": true}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(approve.status().as_u16(), 403);
    let (_, record) = ui.get(&format!("/api/runs/{run_id}"), None).await;
    assert_eq!(record["waiting"][0]["kind"], "approval", "nothing changed");

    // This machine by name or address, with its port or none.
    let port = ui.port().to_owned();
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "baton.localhost".to_owned(),
    ] {
        for path in ["/api/runs", "/"] {
            let (status, _, body) = ui.get_as(&host, path, None).await;
            assert_eq!(status, 200, "{host}{path}: {body}");
        }
    }
}

/// The Host check is protected mode's alone: with tokens the other site's page has none to
/// send, and `--allow-unauthenticated` is reached by whatever name its proxy passes on.
#[tokio::test]
async fn with_tokens_or_allow_unauthenticated_any_host_is_answered() {
    let tokens = tempfile::NamedTempFile::new().unwrap();
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        "viewer-token-0123456789",
    ));
    std::fs::write(
        tokens.path(),
        format!("[principals.viewer]\ntoken_sha256 = \"{digest}\"\nroles = [\"read\"]\n"),
    )
    .unwrap();
    let coordinator = coordinator().await;
    let with_tokens = Gate::configure(Some(tokens.path().to_owned()), false, false).unwrap();
    let ui = Ui::serve(&coordinator, with_tokens).await;
    let host = "baton.example.com";
    let (status, _, body) = ui
        .get_as(host, "/api/runs", Some("viewer-token-0123456789"))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, _, _) = ui.get_as(host, "/api/runs", None).await;
    assert_eq!(status, 401);
    let (status, _, _) = ui.get_as(host, "/", None).await;
    assert_eq!(status, 200);

    let anyone = Gate::configure(None, false, true).unwrap();
    let ui = Ui::serve(&coordinator, anyone).await;
    let (status, _, body) = ui.get_as(host, "/api/runs", None).await;
    assert_eq!(status, 200, "{body}");
}
