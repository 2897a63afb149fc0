//! Decision memory end to end: agents report decisions in their results' notes, the coordinator
//! stores them with agent, time and rationale, and `QueryDecisions` finds them again by meaning:
//! by shared words with the built-in embedder, by paraphrase with an OpenAI-compatible one (a
//! stub server here that serves fixed vectors). Workers are played by channels.

#[path = "support/client.rs"]
mod client;
#[path = "support/fake_worker.rs"]
mod fake_worker;
#[path = "support/running.rs"]
mod running;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use baton_coordinator::embed::{OpenAiConfig, OpenAiEmbedder};
use baton_coordinator::grpc::{run_service, worker_service};
use baton_coordinator::store::Store;
use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::{Config, Coordinator, Error};
use baton_proto::v1::{
    DecisionMatch, QueryDecisionsRequest, QueryDecisionsResponse, Task, TaskResult,
    WorkerQueryDecisionsRequest, task_result,
};
use fake_worker::{FakeWorker, json_bytes, payload};
use running::{Running, running};
use serde_json::{Value, json};

/// A planner hands over to a coder.
const THEME_FEATURE: &str = r#"{
  "id": "theme-feature",
  "steps": [
    { "id": "plan", "type": "agent", "agent": "planner", "next": "code" },
    { "id": "code", "type": "agent", "agent": "coder" }
  ]
}"#;

/// Another workflow with the same agent, whose decisions a `theme-feature` query must not see.
const BILLING: &str = r#"{
  "id": "billing",
  "steps": [{ "id": "plan", "type": "agent", "agent": "planner" }]
}"#;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

impl FakeWorker {
    /// Answers `task` with `data` and `notes` (`{"decisions": [...], "messages": [...]}`).
    async fn answer<S: Store>(
        &self,
        coordinator: &Coordinator<S>,
        task: &Task,
        data: Value,
        notes: Value,
    ) -> Result<(), Error> {
        self.complete(coordinator, task, &data, Some(&notes)).await
    }
}

async fn submit<S: Store>(coordinator: &Coordinator<S>, workflow: &str) -> String {
    client::submit(
        coordinator,
        workflow.as_bytes(),
        &json_bytes(&json!("dark mode")),
    )
    .await
    .unwrap()
}

fn query_run(run_id: &str, text: &str, k: u32) -> QueryDecisionsRequest {
    QueryDecisionsRequest {
        run_id: run_id.into(),
        text: text.into(),
        k,
        ..QueryDecisionsRequest::default()
    }
}

fn summaries(response: &QueryDecisionsResponse) -> Vec<&str> {
    response
        .matches
        .iter()
        .map(|m| m.summary.as_str())
        .collect()
}

/// Milliseconds since the epoch of an RFC 3339 UTC timestamp (`YYYY-MM-DDTHH:MM:SS[.fff]Z`);
/// `None` for anything else. By hand: the coordinator's tests have no date library.
fn utc_ms(text: &str) -> Option<i64> {
    let (date, time) = text.strip_suffix('Z')?.split_once('T')?;
    let number = |part: &str, digits: usize| -> Option<i64> {
        (part.len() == digits && part.bytes().all(|b| b.is_ascii_digit()))
            .then(|| part.parse().ok())
            .flatten()
    };
    let date: Vec<&str> = date.split('-').collect();
    let [year, month, day] = date.as_slice() else {
        return None;
    };
    let (year, month, day) = (number(year, 4)?, number(month, 2)?, number(day, 2)?);
    let (clock, fraction) = time.split_once('.').unwrap_or((time, ""));
    let clock: Vec<&str> = clock.split(':').collect();
    let [hour, minute, second] = clock.as_slice() else {
        return None;
    };
    let (hour, minute, second) = (number(hour, 2)?, number(minute, 2)?, number(second, 2)?);
    let millis = if fraction.is_empty() {
        0
    } else {
        if !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        format!("{fraction:0<3}")[..3].parse::<i64>().ok()?
    };
    // Days since 1970-01-01 in the proleptic Gregorian calendar (H. Hinnant's days_from_civil).
    let shifted_year = if month <= 2 { year - 1 } else { year };
    let era = shifted_year.div_euclid(400);
    let year_of_era = shifted_year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    Some((((days * 24 + hour) * 60 + minute) * 60 + second) * 1000 + millis)
}

#[test]
fn the_timestamp_reader_reads_what_the_engine_writes() {
    for at_ms in [1_000, 951_782_400_000, 1_795_428_000_000, 1_795_428_000_123] {
        let written = baton_core::handoff::rfc3339(at_ms).unwrap();
        assert_eq!(utc_ms(&written), Some(at_ms), "{written}");
    }
    assert_eq!(utc_ms("2026-11-23 10:00:00"), None);
    assert_eq!(utc_ms("2026-11-23T10:00:00+01:00"), None);
}

/// A time between two clock readings of the test, and RFC 3339 UTC.
fn assert_between(timestamp: &str, before_ms: i64, after_ms: i64) {
    let at_ms = utc_ms(timestamp).unwrap_or_else(|| panic!("{timestamp:?} is not RFC 3339 UTC"));
    assert!(
        (before_ms..=after_ms).contains(&at_ms),
        "{timestamp} ({at_ms}) is not between {before_ms} and {after_ms}"
    );
}

#[tokio::test]
async fn decisions_are_stored_with_agent_time_and_rationale_and_handed_to_the_next_agent() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner", "coder"]).await;
    let run_id = submit(&coordinator, THEME_FEATURE).await;
    let plan = worker.next_task();
    assert_eq!(plan.step_id, "plan");

    let before_ms = now_ms();
    worker
        .answer(
            &coordinator,
            &plan,
            json!({"files": ["src/theme.ts"]}),
            json!({
                "decisions": [
                    {
                        "summary": "Store the theme in local storage",
                        "rationale": "survives reloads",
                        "related_artifacts": ["src/theme.ts"]
                    },
                    {
                        "summary": "Use CSS variables for the palette",
                        "rationale": "one place to change every colour",
                        "related_artifacts": ["src/theme.css", "src/App.tsx"]
                    }
                ],
                "messages": [{"role": "assistant", "content": "plan ready"}]
            }),
        )
        .await
        .unwrap();
    let after_ms = now_ms();

    let found = run_service::query_decisions(&coordinator, query_run(&run_id, "theme", 10))
        .await
        .unwrap();
    assert_eq!(found.model, "baton-hashed-ngrams-v1-512");
    let mut matches: Vec<DecisionMatch> = found.matches.clone();
    matches.sort_by(|a, b| a.key.cmp(&b.key));
    // Everything but the time, which is checked against the clock below.
    let seen: Vec<Value> = matches
        .iter()
        .map(|m| {
            json!({
                "run_id": m.run_id, "agent": m.agent, "step_id": m.step_id, "visit": m.visit,
                "key": m.key, "summary": m.summary, "rationale": m.rationale,
                "related_artifacts": m.related_artifacts,
            })
        })
        .collect();
    assert_eq!(
        seen,
        [
            json!({
                "run_id": run_id, "agent": "planner", "step_id": "plan", "visit": 1,
                "key": "plan#1/0", "summary": "Store the theme in local storage",
                "rationale": "survives reloads", "related_artifacts": ["src/theme.ts"],
            }),
            json!({
                "run_id": run_id, "agent": "planner", "step_id": "plan", "visit": 1,
                "key": "plan#1/1", "summary": "Use CSS variables for the palette",
                "rationale": "one place to change every colour",
                "related_artifacts": ["src/theme.css", "src/App.tsx"],
            }),
        ]
    );
    for found in &matches {
        assert_between(&found.timestamp, before_ms, after_ms);
    }

    // GetRun's record lists them in the run's memory.
    let record = coordinator.record(&run_id).await.unwrap();
    let memory: Value = serde_json::from_slice(&record.memory).unwrap();
    let decisions = memory["decisions"].as_array().unwrap();
    assert_eq!(decisions.len(), 2, "{memory}");
    assert_eq!(decisions[0]["key"], "plan#1/0");
    assert_eq!(decisions[0]["agent"], "planner");
    assert_eq!(decisions[0]["summary"], "Store the theme in local storage");
    assert_eq!(decisions[0]["rationale"], "survives reloads");
    assert_eq!(decisions[0]["timestamp"], json!(matches[0].timestamp));
    assert_eq!(decisions[1]["key"], "plan#1/1");
    assert_eq!(
        decisions[1]["related_artifacts"],
        json!(["src/theme.css", "src/App.tsx"])
    );

    // The coder's payload carries the handoff with the planner's decisions.
    let code = worker.next_task();
    assert_eq!(code.step_id, "code");
    let handoff = &payload(&code)["handoff"];
    assert_eq!(handoff["source_agent"], "planner", "{handoff}");
    assert_eq!(handoff["target_agent"], "coder");
    let handed: Vec<&Value> = handoff["decisions"].as_array().unwrap().iter().collect();
    assert_eq!(handed.len(), 2, "{handoff}");
    assert_eq!(handed[0], &decisions[0]);
    assert_eq!(handed[1], &decisions[1]);
    assert_eq!(
        handoff["memory_refs"],
        json!(["decision:plan#1/0", "decision:plan#1/1", "message:plan#1/0"])
    );
    assert_eq!(
        memory["handoffs"][0], *handoff,
        "the record keeps the handoff"
    );
}

#[tokio::test]
async fn builtin_embedder_finds_a_decision_by_shared_words_limited_by_k_and_filtered_by_agent() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner", "coder"]).await;
    let run_id = submit(&coordinator, THEME_FEATURE).await;
    let plan = worker.next_task();
    worker
        .answer(
            &coordinator,
            &plan,
            json!({}),
            json!({"decisions": [
                {"summary": "Use CSS variables for every colour", "rationale": "one place to change the palette"},
                {"summary": "Store the theme in local storage", "rationale": "survives page reloads"},
            ]}),
        )
        .await
        .unwrap();
    let code = worker.next_task();
    worker
        .answer(
            &coordinator,
            &code,
            json!({}),
            json!({"decisions": [
                {"summary": "Name the React hook useTheme", "rationale": "matches the hooks naming convention"},
            ]}),
        )
        .await
        .unwrap();
    assert_eq!(
        coordinator.record(&run_id).await.unwrap().status,
        baton_core::RunStatus::Succeeded
    );

    let text = "is the theme kept in local storage?";
    let all = run_service::query_decisions(&coordinator, query_run(&run_id, text, 10))
        .await
        .unwrap();
    assert_eq!(all.matches.len(), 3);
    assert_eq!(all.matches[0].summary, "Store the theme in local storage");
    assert!(
        all.matches[0].score > all.matches[1].score && all.matches[1].score >= all.matches[2].score,
        "scores {:?}",
        all.matches.iter().map(|m| m.score).collect::<Vec<_>>()
    );

    let best = run_service::query_decisions(&coordinator, query_run(&run_id, text, 1))
        .await
        .unwrap();
    assert_eq!(summaries(&best), ["Store the theme in local storage"]);

    let coder_only = run_service::query_decisions(
        &coordinator,
        QueryDecisionsRequest {
            agent: "coder".into(),
            ..query_run(&run_id, text, 10)
        },
    )
    .await
    .unwrap();
    assert_eq!(summaries(&coder_only), ["Name the React hook useTheme"]);
    assert_eq!(coder_only.matches[0].key, "code#1/0");

    let planner_only = run_service::query_decisions(
        &coordinator,
        QueryDecisionsRequest {
            agent: "planner".into(),
            ..query_run(&run_id, text, 10)
        },
    )
    .await
    .unwrap();
    assert_eq!(planner_only.matches.len(), 2);
    assert!(planner_only.matches.iter().all(|m| m.agent == "planner"));

    let nobody = run_service::query_decisions(
        &coordinator,
        QueryDecisionsRequest {
            agent: "reviewer".into(),
            ..query_run(&run_id, text, 10)
        },
    )
    .await
    .unwrap();
    assert!(nobody.matches.is_empty());
}

// ---- an OpenAI-compatible embedder: a stub server with fixed vectors ----

const PERSIST_THEME: &str = "Store the theme in local storage: survives reloads";
const CSS_VARIABLES: &str = "Use CSS variables for colours: one place to change them";
const HOOK_NAME: &str = "Name the hook useTheme: matches React naming";
/// Shares no word with [`PERSIST_THEME`], yet means it.
const PARAPHRASE: &str = "where do we persist the user's colour preference?";

/// The vector the stub serves for each text it knows.
fn stub_vector(text: &str) -> Option<Vec<f32>> {
    Some(match text {
        PERSIST_THEME => vec![1.0, 0.0, 0.0],
        CSS_VARIABLES => vec![0.0, 1.0, 0.0],
        HOOK_NAME => vec![0.0, 0.0, 1.0],
        PARAPHRASE => vec![0.9, 0.1, 0.0],
        _ => return None,
    })
}

fn theme_decisions() -> Value {
    json!({"decisions": [
        {"summary": "Store the theme in local storage", "rationale": "survives reloads"},
        {"summary": "Use CSS variables for colours", "rationale": "one place to change them"},
        {"summary": "Name the hook useTheme", "rationale": "matches React naming"},
    ]})
}

#[derive(Clone)]
struct StubState {
    /// The `input` of every request, in order.
    inputs: Arc<Mutex<Vec<Vec<String>>>>,
    /// Requests still to answer with HTTP 500, as a server that is down.
    failures_left: Arc<AtomicUsize>,
}

struct Stub {
    url: String,
    state: StubState,
}

impl Stub {
    fn inputs(&self) -> Vec<Vec<String>> {
        self.state.inputs.lock().unwrap().clone()
    }
}

async fn start_stub(failures: usize) -> Stub {
    let state = StubState {
        inputs: Arc::default(),
        failures_left: Arc::new(AtomicUsize::new(failures)),
    };
    let app = Router::new()
        .route("/v1/embeddings", post(embeddings))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Stub {
        url: format!("http://{address}"),
        state,
    }
}

async fn embeddings(
    State(state): State<StubState>,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    let inputs: Vec<String> = serde_json::from_value(body["input"].clone()).unwrap_or_default();
    state.inputs.lock().unwrap().push(inputs.clone());
    let down = state
        .failures_left
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if down {
        return (StatusCode::INTERNAL_SERVER_ERROR, "model not loaded").into_response();
    }
    let mut data = Vec::new();
    for (index, text) in inputs.iter().enumerate() {
        let Some(vector) = stub_vector(text) else {
            let message = format!("the stub has no vector for {text:?}");
            return (StatusCode::BAD_REQUEST, message).into_response();
        };
        data.push(json!({"index": index, "embedding": vector}));
    }
    axum::Json(json!({"object": "list", "data": data, "model": body["model"]})).into_response()
}

fn with_stub(stub: &Stub) -> Running<MemoryStore> {
    let embedder = OpenAiEmbedder::new(OpenAiConfig::new(&stub.url, "stub-model")).unwrap();
    running(Coordinator::with_embedder(
        MemoryStore::new(),
        Config::default(),
        Arc::new(embedder),
    ))
}

#[tokio::test]
async fn http_embedder_finds_a_decision_by_a_paraphrase_with_vectors_stored_at_write_time() {
    let stub = start_stub(0).await;
    let coordinator = with_stub(&stub);
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner", "coder"]).await;
    let run_id = submit(&coordinator, THEME_FEATURE).await;
    let plan = worker.next_task();
    worker
        .answer(&coordinator, &plan, json!({}), theme_decisions())
        .await
        .unwrap();
    assert_eq!(
        stub.inputs(),
        [[PERSIST_THEME, CSS_VARIABLES, HOOK_NAME]],
        "the decisions are embedded when the result arrives"
    );

    let found = run_service::query_decisions(&coordinator, query_run(&run_id, PARAPHRASE, 3))
        .await
        .unwrap();
    assert_eq!(found.model, "openai:stub-model");
    assert_eq!(
        summaries(&found),
        [
            "Store the theme in local storage",
            "Use CSS variables for colours",
            "Name the hook useTheme"
        ]
    );
    // cos([0.9, 0.1, 0], [1, 0, 0]) = 0.9 / sqrt(0.82)
    assert!(
        (found.matches[0].score - 0.993_884).abs() < 1e-4,
        "{}",
        found.matches[0].score
    );
    assert!(found.matches[0].score > found.matches[1].score);
    assert_eq!(
        stub.inputs()[1..],
        [[PARAPHRASE]],
        "a query embeds its text only: the stored vectors are reused"
    );
}

#[tokio::test]
async fn a_result_is_accepted_while_the_embedder_is_down_and_its_decisions_are_embedded_at_query_time()
 {
    let stub = start_stub(1).await;
    let coordinator = with_stub(&stub);
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner", "coder"]).await;
    let run_id = submit(&coordinator, THEME_FEATURE).await;
    let plan = worker.next_task();
    worker
        .answer(&coordinator, &plan, json!({}), theme_decisions())
        .await
        .expect("the result is accepted though its decisions could not be embedded");
    assert_eq!(stub.inputs().len(), 1, "the embedder was asked, and failed");
    let code = worker.next_task();
    assert_eq!(code.step_id, "code", "the run moved on");
    let record = coordinator.record(&run_id).await.unwrap();
    let plan_step = record.steps.iter().find(|s| s.step_id == "plan").unwrap();
    assert_eq!(plan_step.status.as_str(), "succeeded");

    let found = run_service::query_decisions(&coordinator, query_run(&run_id, PARAPHRASE, 1))
        .await
        .unwrap();
    assert_eq!(summaries(&found), ["Store the theme in local storage"]);
    assert_eq!(stub.inputs()[1], [PARAPHRASE], "the query text");
    assert_eq!(
        stub.inputs()[2],
        [PERSIST_THEME, CSS_VARIABLES, HOOK_NAME],
        "then the decisions stored without vectors"
    );
}

/// A decision the embedder refuses even alone is left out of the query; the others are found.
#[tokio::test]
async fn a_decision_the_embedder_refuses_does_not_hide_the_others() {
    let stub = start_stub(1).await;
    let coordinator = with_stub(&stub);
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner", "coder"]).await;
    let run_id = submit(&coordinator, THEME_FEATURE).await;
    let plan = worker.next_task();
    // The stub knows no vector for the last text: it answers 400 for any batch holding it.
    let mut decisions = theme_decisions();
    decisions["decisions"]
        .as_array_mut()
        .unwrap()
        .push(json!({"summary": "a text the embedder refuses"}));
    worker
        .answer(&coordinator, &plan, json!({}), decisions)
        .await
        .expect("the result is accepted");
    let found = run_service::query_decisions(&coordinator, query_run(&run_id, PARAPHRASE, 5))
        .await
        .expect("the query still answers");
    assert_eq!(summaries(&found)[0], "Store the theme in local storage");
    assert_eq!(found.matches.len(), 3, "the refused one is left out");
}

#[tokio::test]
async fn a_workflow_query_covers_every_run_of_that_workflow_and_no_other() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner"]).await;
    let first = submit(&coordinator, THEME_FEATURE).await;
    let second = submit(&coordinator, THEME_FEATURE).await;
    let other = submit(&coordinator, BILLING).await;
    let summary_of = |run_id: &str| match run_id {
        id if id == first => "First run: store the theme in local storage",
        id if id == second => "Second run: store the theme in a cookie",
        _ => "Billing run: store the invoice theme in the database",
    };
    for _ in 0..3 {
        let task = worker.next_task();
        let notes = json!({"decisions": [{"summary": summary_of(&task.run_id)}]});
        worker
            .answer(&coordinator, &task, json!({}), notes)
            .await
            .unwrap();
    }

    let found = run_service::query_decisions(
        &coordinator,
        QueryDecisionsRequest {
            workflow_id: "theme-feature".into(),
            text: "store the theme".into(),
            k: 10,
            ..QueryDecisionsRequest::default()
        },
    )
    .await
    .unwrap();
    let runs: BTreeSet<(&str, &str)> = found
        .matches
        .iter()
        .map(|m| (m.run_id.as_str(), m.summary.as_str()))
        .collect();
    assert_eq!(
        runs,
        BTreeSet::from([
            (first.as_str(), summary_of(&first)),
            (second.as_str(), summary_of(&second)),
        ]),
        "not the billing run {other}"
    );
}

#[tokio::test]
async fn bad_queries_are_refused_naming_the_field() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let run_id = submit(&coordinator, THEME_FEATURE).await;
    let refused = |request: QueryDecisionsRequest| {
        let coordinator = coordinator.clone();
        async move {
            let error = run_service::query_decisions(&coordinator, request)
                .await
                .unwrap_err();
            tonic::Status::from(error)
        }
    };
    let invalid = |status: tonic::Status, field: &str| {
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains(field),
            "{:?} does not name {field:?}",
            status.message()
        );
    };

    invalid(refused(query_run(&run_id, "", 5)).await, "text:");
    invalid(refused(query_run(&run_id, " \n\t", 5)).await, "text:");
    invalid(
        refused(QueryDecisionsRequest {
            workflow_id: "theme-feature".into(),
            ..query_run(&run_id, "theme", 5)
        })
        .await,
        "run_id, workflow_id:",
    );
    invalid(
        refused(query_run("", "theme", 5)).await,
        "run_id, workflow_id:",
    );
    let too_many = refused(query_run(&run_id, "theme", 101)).await;
    invalid(too_many.clone(), "k: 101");
    invalid(too_many, "the limit is 100");
    run_service::query_decisions(&coordinator, query_run(&run_id, "theme", 100))
        .await
        .expect("100 is allowed");

    // A well-formed id of no run is not found; what cannot be a run id is not looked for.
    let missing = "0191d2a4-7b1c-7def-8abc-0123456789ab";
    let unknown = refused(query_run(missing, "theme", 5)).await;
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
    assert!(unknown.message().contains(missing), "{unknown:?}");
    let malformed = refused(query_run("no-such-run", "theme", 5)).await;
    assert_eq!(
        malformed.code(),
        tonic::Code::InvalidArgument,
        "{malformed:?}"
    );
    assert!(
        malformed
            .message()
            .starts_with("run_id: \"no-such-run\" is not a run id"),
        "{malformed:?}"
    );
}

#[tokio::test]
async fn a_worker_queries_only_through_a_task_it_holds() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner", "coder"]).await;
    let first = submit(&coordinator, THEME_FEATURE).await;
    let second = submit(&coordinator, THEME_FEATURE).await;
    let mut plans = HashMap::new();
    for _ in 0..2 {
        let plan = worker.next_task();
        let notes = json!({"decisions": [{
            "summary": format!("store the theme ({})", if plan.run_id == first { "first" } else { "second" })
        }]});
        worker
            .answer(&coordinator, &plan, json!({}), notes)
            .await
            .unwrap();
        plans.insert(plan.run_id.clone(), plan);
    }
    let code = worker.next_task();
    let held_run = code.run_id.clone();
    let _other_code = worker.next_task();
    let ask = |worker_id: &str, task_id: &str, workflow_scope: bool| WorkerQueryDecisionsRequest {
        worker_id: worker_id.into(),
        task_id: task_id.into(),
        text: "store the theme".into(),
        k: 10,
        workflow_scope,
        ..WorkerQueryDecisionsRequest::default()
    };

    let own_run =
        worker_service::query_decisions(&coordinator, "", ask("w1", &code.task_id, false))
            .await
            .unwrap();
    assert_eq!(own_run.matches.len(), 1);
    assert_eq!(own_run.matches[0].run_id, held_run);

    let workflow =
        worker_service::query_decisions(&coordinator, "", ask("w1", &code.task_id, true))
            .await
            .unwrap();
    let runs: BTreeSet<&str> = workflow.matches.iter().map(|m| m.run_id.as_str()).collect();
    assert_eq!(runs, BTreeSet::from([first.as_str(), second.as_str()]));

    let _stranger = FakeWorker::connect(&coordinator, "w2", &["reviewer"]).await;
    for (worker_id, task_id) in [
        ("w2", code.task_id.as_str()),
        // Answered already: w1 no longer holds it.
        ("w1", plans[&held_run].task_id.as_str()),
    ] {
        let error =
            worker_service::query_decisions(&coordinator, "", ask(worker_id, task_id, true))
                .await
                .unwrap_err();
        let status = tonic::Status::from(error);
        assert_eq!(
            status.code(),
            tonic::Code::PermissionDenied,
            "{worker_id} with {task_id}: {status:?}"
        );
        assert!(status.message().contains(task_id), "{status:?}");
    }
}

#[tokio::test]
async fn a_decision_without_a_summary_fails_the_step_naming_its_json_path() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner", "coder"]).await;
    let run_id = submit(&coordinator, THEME_FEATURE).await;
    let plan = worker.next_task();
    let error = worker
        .answer(
            &coordinator,
            &plan,
            json!({}),
            json!({"decisions": [{"rationale": "no summary"}]}),
        )
        .await
        .unwrap_err();
    let status = tonic::Status::from(error);
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("decisions[0]") && status.message().contains("summary"),
        "{status:?}"
    );

    let record = coordinator.record(&run_id).await.unwrap();
    assert_eq!(record.status.as_str(), "failed");
    let step = record.steps.iter().find(|s| s.step_id == "plan").unwrap();
    assert_eq!(step.status.as_str(), "failed");
    let error = step.error.as_deref().unwrap_or_default();
    assert!(error.contains("decisions[0]"), "{error}");
    assert!(record.error.contains("decisions[0]"), "{}", record.error);
    let found = run_service::query_decisions(&coordinator, query_run(&run_id, "no summary", 10))
        .await
        .unwrap();
    assert!(found.matches.is_empty(), "nothing was stored");
}

#[tokio::test]
async fn more_decisions_than_the_limit_are_refused_naming_the_limit() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner", "coder"]).await;
    let decisions = |count: usize| {
        let list: Vec<Value> = (0..count)
            .map(|n| json!({"summary": format!("decision number {n}")}))
            .collect();
        json!({ "decisions": list })
    };

    let too_many = submit(&coordinator, THEME_FEATURE).await;
    let plan = worker.next_task();
    let error = worker
        .answer(&coordinator, &plan, json!({}), decisions(101))
        .await
        .unwrap_err();
    let status = tonic::Status::from(error);
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("decisions has 101 entries; the limit is 100"),
        "{status:?}"
    );
    let record = coordinator.record(&too_many).await.unwrap();
    let step = record.steps.iter().find(|s| s.step_id == "plan").unwrap();
    assert_eq!(
        (record.status.as_str(), step.status.as_str()),
        ("failed", "failed")
    );
    let error = step.error.as_deref().unwrap_or_default();
    assert!(error.contains("the limit is 100"), "{error}");

    // Exactly the limit is accepted, and all of it is found.
    let at_limit = submit(&coordinator, THEME_FEATURE).await;
    let plan = worker.next_task();
    worker
        .answer(&coordinator, &plan, json!({}), decisions(100))
        .await
        .unwrap();
    let all =
        run_service::query_decisions(&coordinator, query_run(&at_limit, "decision number", 100))
            .await
            .unwrap();
    assert_eq!(all.matches.len(), 100);
    let default_k =
        run_service::query_decisions(&coordinator, query_run(&at_limit, "decision number", 0))
            .await
            .unwrap();
    assert_eq!(default_k.matches.len(), 5, "k 0 means 5");
}

#[tokio::test]
async fn an_empty_or_oversized_decision_text_is_refused_naming_the_field() {
    let cases = [
        (json!({"summary": "  "}), "decisions[0].summary is empty"),
        (
            json!({"summary": "s", "rationale": "x".repeat(17 << 10)}),
            "decisions[0].rationale is 17408 bytes; the limit is 16384",
        ),
    ];
    for (decision, expected) in cases {
        let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
        let worker = FakeWorker::connect(&coordinator, "w1", &["planner", "coder"]).await;
        submit(&coordinator, THEME_FEATURE).await;
        let mut worker = worker;
        let plan = worker.next_task();
        let error = worker
            .answer(
                &coordinator,
                &plan,
                json!({}),
                json!({"decisions": [decision]}),
            )
            .await
            .unwrap_err();
        assert!(error.to_string().contains(expected), "{error}");
    }
}

/// A workflow without an id has no "other runs of it": the worker is told so, by field.
#[tokio::test]
async fn a_workflow_scope_query_for_a_workflow_without_an_id_names_the_problem() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner"]).await;
    submit(
        &coordinator,
        r#"{"steps": [{"id": "plan", "type": "agent", "agent": "planner"}]}"#,
    )
    .await;
    let plan = worker.next_task();
    let error = worker_service::query_decisions(
        &coordinator,
        "",
        baton_proto::v1::WorkerQueryDecisionsRequest {
            worker_id: "w1".into(),
            task_id: plan.task_id.clone(),
            text: "theme".into(),
            workflow_scope: true,
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    let status = tonic::Status::from(error);
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .starts_with("invalid input: workflow_scope:"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn more_messages_than_the_limit_are_refused_naming_the_limit() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner", "coder"]).await;
    let run_id = submit(&coordinator, THEME_FEATURE).await;
    let plan = worker.next_task();
    let messages: Vec<Value> = (0..1_001)
        .map(|i| json!({"role": "assistant", "content": i}))
        .collect();
    let error = worker
        .answer(
            &coordinator,
            &plan,
            json!({}),
            json!({"messages": messages}),
        )
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("messages has 1001 entries; the limit is 1000"),
        "{error}"
    );
    let record = coordinator.record(&run_id).await.unwrap();
    assert_eq!(
        record.status.as_str(),
        "failed",
        "the step failed with the reason"
    );
}

/// Notes travel with their own SHA-256, checked like the data's.
#[tokio::test]
async fn notes_that_do_not_match_their_digest_are_refused() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner", "coder"]).await;
    let run_id = submit(&coordinator, THEME_FEATURE).await;
    let plan = worker.next_task();
    let mut notes = json_bytes(&theme_decisions());
    notes.flip(5, 1);
    let error = worker_service::answer(
        &coordinator,
        "w1",
        TaskResult {
            task_id: plan.task_id.clone(),
            outcome: Some(task_result::Outcome::Data(json_bytes(&json!({})))),
            notes: Some(notes),
            non_retryable: false,
            usage: Vec::new(),
        },
    )
    .await
    .unwrap_err();
    let status = tonic::Status::from(error);
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("SHA-256"), "{}", status.message());
    let record = coordinator.record(&run_id).await.unwrap();
    assert_eq!(
        record.status.as_str(),
        "failed",
        "the step fails with the reason"
    );
    assert!(record.error.contains("refused"), "{}", record.error);
}
