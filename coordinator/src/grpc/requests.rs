//! Proto requests into the service's domain types, checked on the way in.
//!
//! The edge checks what the wire carries: that a message has what it needs, that digests match
//! their bytes, that sizes are within the limits clients and workers control, that JSON parses
//! and nests no deeper than agents can read, and that an answer's notes are within theirs. What
//! a request means (a workflow's validity, a run's state, who holds a task) is the service's.
//! The checks of what a client asks of a run (its id, a step's, a decision, a cancel's reason)
//! are the web API's too, in `crate::run_requests`.

use baton_core::Decision;
use baton_core::big_integers::first_big_integer;
use baton_core::handoff::AgentNotes;
use baton_proto::{Json, v1};
use serde_json::Value;

use crate::bounded;
use crate::error::Error;
use crate::model::ModelUsage;
use crate::parts::Part;
use crate::run_requests::{self, DecisionAsked, agent_filter, shown, within, workflow_filter};
use crate::service::{
    Answer, Config, DecisionQuery, Outcome, Scope, Submission, WorkerHello, WorkerQuery,
};
use crate::store::{RunCursor, RunQuery, run_status};
use crate::task_ref::TaskRef;

/// The checks of what a client asks of runs are below both edges, the web API's too: the gRPC
/// edge applies them to its messages' fields under these names.
pub use crate::run_requests::{cancel_reason, requester, run_id, step_id};

/// How many matches a decision query returns when it names no `k`, and at most.
const DEFAULT_MATCHES: usize = 5;
const MAX_MATCHES: u32 = 100;

/// A `SubmitRun` request's input, which it cannot go without.
pub fn submitted_input(request: &mut v1::SubmitRunRequest) -> Result<Json, Error> {
    request
        .input
        .take()
        .ok_or_else(|| Error::Request("input: a run needs an input (JSON)".into()))
}

/// A `SubmitRun` request (its input taken out by [`submitted_input`]), with the run's trace
/// context.
pub fn submission(
    request: v1::SubmitRunRequest,
    input: Json,
    traceparent: String,
    config: &Config,
) -> Result<Submission, Error> {
    let key = (!request.idempotency_key.is_empty()).then_some(request.idempotency_key);
    if let Some(key) = &key
        && key.len() > config.max_idempotency_key_bytes
    {
        return Err(Error::InvalidInput(format!(
            "idempotency_key: {} bytes; it must have 1 to {}",
            key.len(),
            config.max_idempotency_key_bytes
        )));
    }
    within(
        "the workflow",
        request.workflow.len(),
        config.max_workflow_bytes,
    )?;
    within("the input", input.json.len(), config.max_input_bytes)?;
    input.verified()?;
    let input_value: Value = serde_json::from_slice(&input.json)
        .map_err(|e| Error::InvalidInput(format!("the input is not valid JSON: {e}")))?;
    check_depth("the input", &input_value, config)?;
    exact_integers("the input", &input.json, &input_value)?;
    Ok(Submission {
        workflow: request.workflow,
        input: input.json.to_vec(),
        input_value,
        idempotency_key: key,
        traceparent,
        principal: None,
    })
}

/// A `ListRuns` request: its status filter, workflow filter and page token read, its limit
/// left to the service (0 is its default).
pub fn run_query(request: v1::ListRunsRequest, config: &Config) -> Result<RunQuery, Error> {
    let status = match request.status.as_str() {
        "" => None,
        name => Some(run_status(name).ok_or_else(|| Error::UnknownRunStatus {
            field: "status",
            value: shown(name),
        })?),
    };
    let after = match request.page_token.as_str() {
        "" => None,
        token => Some(
            RunCursor::from_token(token).ok_or_else(|| Error::MalformedPageToken {
                field: "page_token",
                value: shown(token),
            })?,
        ),
    };
    Ok(RunQuery {
        limit: request.limit as usize,
        after,
        status,
        workflow_id: workflow_filter("workflow_id", request.workflow_id, config)?,
    })
}

/// A worker's hello, the first message of its stream: every field bounded ([`worker`] has the
/// limits), each refusal naming the field and its limit. Its principal is who sent it, which
/// the caller fills in.
impl TryFrom<v1::Hello> for WorkerHello {
    type Error = Error;

    fn try_from(hello: v1::Hello) -> Result<Self, Error> {
        if !baton_proto::serves_worker_protocol(hello.protocol) {
            return Err(Error::Protocol {
                worker: hello.protocol,
                oldest: baton_proto::OLDEST_WORKER_PROTOCOL,
                newest: baton_proto::WORKER_PROTOCOL,
            });
        }
        if hello.worker_id.is_empty() {
            return Err(Error::Request(
                "hello.worker_id: a worker needs an id".into(),
            ));
        }
        worker::check_hello(&hello)?;
        Ok(WorkerHello {
            worker_id: hello.worker_id,
            principal: String::new(),
            protocol: hello.protocol,
            agents: hello.agents,
            capacity: hello.capacity.max(1) as usize,
            cache_bytes: hello.cache_bytes,
            held: hello.held.iter().map(|id| id.parse()).collect(),
        })
    }
}

/// A worker's `ResendTask`: the task it names, and its reason cut to
/// [`Config::max_error_bytes`] (on giving up, the reason becomes the step's error).
pub fn resend_request(
    request: v1::ResendTask,
    config: &Config,
) -> Result<(TaskRef, String), Error> {
    let task = worker::task_id("resend.task_id", &request.task_id)?;
    Ok((task, bounded::cut(&request.reason, config.max_error_bytes)))
}

/// A worker's answer. Only a task id that does not parse (or is too long to be one) is refused
/// outright: a result that cannot be taken as data still settles its task, so it comes through
/// as [`Outcome::Refused`] with the reason. An agent's error is cut to
/// [`Config::max_error_bytes`].
pub fn answer(result: v1::TaskResult, config: &Config) -> Result<Answer, Error> {
    let task = worker::task_id("result.task_id", &result.task_id)?;
    let retryable = !result.non_retryable;
    let usage = read_usage(&result.usage, config);
    let outcome = match result.outcome {
        Some(v1::task_result::Outcome::Data(data)) => {
            match read_data(&data, result.notes.as_ref(), config) {
                Ok((value, notes)) => Outcome::Data {
                    data: value,
                    notes,
                    // Checked by `read_data`.
                    sent: Part {
                        json: data.json,
                        sha256: data.sha256,
                    },
                },
                Err(reason) => Outcome::Refused { reason, retryable },
            }
        }
        // An error is the agent's own text: kept, but only up to its limit.
        Some(v1::task_result::Outcome::Error(error)) => Outcome::Failed {
            error: bounded::cut(&error, config.max_error_bytes),
            retryable,
        },
        None => Outcome::Refused {
            reason: Error::InvalidInput("a result needs data or an error".into()),
            retryable,
        },
    };
    // Usage over its limits refuses the result like any other part of it.
    let (outcome, usage) = match usage {
        Ok(usage) => (outcome, usage),
        Err(_) if matches!(outcome, Outcome::Refused { .. }) => (outcome, Vec::new()),
        Err(reason) => (Outcome::Refused { reason, retryable }, Vec::new()),
    };
    Ok(Answer {
        task,
        outcome,
        usage,
    })
}

/// The tokens a result says its attempt used, within the limits on them.
fn read_usage(usage: &[v1::Usage], config: &Config) -> Result<Vec<ModelUsage>, Error> {
    if usage.len() > config.max_usage_entries {
        return Err(Error::InvalidInput(format!(
            "the result's usage has {} entries; the limit is {}",
            usage.len(),
            config.max_usage_entries
        )));
    }
    usage
        .iter()
        .enumerate()
        .map(|(i, usage)| {
            within(
                "a model name",
                usage.model.len(),
                config.max_model_name_bytes,
            )
            .map_err(|_| {
                Error::InvalidInput(format!(
                    "the result's usage[{i}].model is {} bytes; the limit is {}",
                    usage.model.len(),
                    config.max_model_name_bytes
                ))
            })?;
            Ok(ModelUsage {
                model: usage.model.clone(),
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
            })
        })
        .collect()
}

/// A result's data and notes, within every limit on them.
fn read_data(
    data: &Json,
    notes: Option<&Json>,
    config: &Config,
) -> Result<(Value, AgentNotes), Error> {
    let size = data.json.len() + notes.map_or(0, |n| n.json.len());
    within("the result (data and notes)", size, config.max_result_bytes)?;
    let bytes = data.verified()?;
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| Error::InvalidInput(format!("the result is not valid JSON: {e}")))?;
    check_depth("the result", &value, config)?;
    exact_integers("the result", bytes, &value)?;
    let notes = match notes {
        None => AgentNotes::default(),
        Some(notes) => {
            let bytes = notes.verified()?;
            let value: Value = serde_json::from_slice(bytes).map_err(|e| {
                Error::InvalidInput(format!("the result's notes are not JSON: {e}"))
            })?;
            check_depth("the result's notes", &value, config)?;
            exact_integers("the result's notes", bytes, &value)?;
            AgentNotes::from_json(bytes)
                .map_err(|e| Error::InvalidInput(format!("the result's notes: {e}")))?
        }
    };
    for (what, count, limit) in [
        (
            "decisions",
            notes.decisions.len(),
            config.max_decisions_per_result,
        ),
        (
            "messages",
            notes.messages.len(),
            config.max_messages_per_result,
        ),
    ] {
        if count > limit {
            return Err(Error::InvalidInput(format!(
                "the result's notes: {what} has {count} entries; the limit is {limit}"
            )));
        }
    }
    check_decisions(&notes, config)?;
    Ok((value, notes))
}

/// Decisions are embedded (often by a model with a bounded input) and shown to people: each
/// needs a summary, and neither it nor the rationale may be huge.
fn check_decisions(notes: &AgentNotes, config: &Config) -> Result<(), Error> {
    for (i, decision) in notes.decisions.iter().enumerate() {
        if decision.summary.trim().is_empty() {
            return Err(Error::InvalidInput(format!(
                "the result's notes: decisions[{i}].summary is empty; a decision needs a summary"
            )));
        }
        if decision.related_artifacts.len() > config.max_related_artifacts {
            return Err(Error::InvalidInput(format!(
                "the result's notes: decisions[{i}].related_artifacts has {} entries; the limit is {}",
                decision.related_artifacts.len(),
                config.max_related_artifacts
            )));
        }
        if let Some((n, artifact)) = decision
            .related_artifacts
            .iter()
            .enumerate()
            .find(|(_, a)| a.len() > config.max_decision_summary_bytes)
        {
            return Err(Error::InvalidInput(format!(
                "the result's notes: decisions[{i}].related_artifacts[{n}] is {} bytes; the limit is {}",
                artifact.len(),
                config.max_decision_summary_bytes
            )));
        }
        for (field, text, limit) in [
            (
                "summary",
                &decision.summary,
                config.max_decision_summary_bytes,
            ),
            (
                "rationale",
                &decision.rationale,
                config.max_decision_rationale_bytes,
            ),
        ] {
            if text.len() > limit {
                return Err(Error::InvalidInput(format!(
                    "the result's notes: decisions[{i}].{field} is {} bytes; the limit is {limit}",
                    text.len()
                )));
            }
        }
    }
    Ok(())
}

/// A piece of a task's live output, as a worker sends it.
pub fn output_piece(
    output: v1::TaskOutput,
    config: &Config,
) -> Result<(TaskRef, String, bool), Error> {
    let task = worker::task_id("output.task_id", &output.task_id)?;
    within(
        "a piece of live output",
        output.text.len(),
        config.max_output_piece_bytes,
    )?;
    Ok((task, output.text, output.restart))
}

/// A client's decision query: of one run, or of every run of one workflow.
pub fn decision_query(
    request: v1::QueryDecisionsRequest,
    config: &Config,
) -> Result<DecisionQuery, Error> {
    let (text, agent, k) = query_text(request.text, request.agent, request.k, config)?;
    let agent = match agent {
        Some(agent) => agent_filter("agent", agent, config)?,
        None => None,
    };
    let scope = match (request.run_id.is_empty(), request.workflow_id.is_empty()) {
        (false, true) => Scope::Run(run_id("run_id", &request.run_id)?.to_owned()),
        (true, false) => Scope::Workflow(
            workflow_filter("workflow_id", request.workflow_id, config)?.expect("not empty"),
        ),
        _ => {
            return Err(Error::InvalidInput(
                "run_id, workflow_id: give exactly one of them".into(),
            ));
        }
    };
    Ok(DecisionQuery {
        scope,
        text,
        agent,
        k,
    })
}

/// An agent's decision query, through the task its worker holds.
pub fn worker_query(
    request: v1::WorkerQueryDecisionsRequest,
    config: &Config,
) -> Result<WorkerQuery, Error> {
    let task = worker::task_id("task_id", &request.task_id)?;
    worker::check_worker_id("worker_id", &request.worker_id)?;
    let (text, agent, k) = query_text(request.text, request.agent, request.k, config)?;
    Ok(WorkerQuery {
        worker_id: request.worker_id,
        // Who asks is the caller's to fill in, from the call.
        principal: None,
        task,
        workflow_scope: request.workflow_scope,
        text,
        agent,
        k,
    })
}

/// A query's text (not blank, not too long), its agent filter, and how many matches.
fn query_text(
    text: String,
    agent: String,
    k: u32,
    config: &Config,
) -> Result<(String, Option<String>, usize), Error> {
    if text.trim().is_empty() {
        return Err(Error::InvalidInput("text: a query needs some text".into()));
    }
    within("the query text", text.len(), config.max_query_bytes)?;
    let k = match k {
        0 => DEFAULT_MATCHES,
        k if k > MAX_MATCHES => {
            return Err(Error::InvalidInput(format!(
                "k: {k} matches asked for; the limit is {MAX_MATCHES}"
            )));
        }
        k => k as usize,
    };
    Ok((text, (!agent.is_empty()).then_some(agent), k))
}

/// A `DecideApproval` request's decision, checked as the web API's are
/// (`run_requests::decision`).
pub fn decision(
    request: &v1::DecideApprovalRequest,
    principal: Option<&str>,
    config: &Config,
) -> Result<Decision, Error> {
    let asked = DecisionAsked {
        approved: request.approved,
        comment: &request.comment,
        approver: &request.approver,
    };
    run_requests::decision(&asked, principal, config)
}

/// Integers beyond 64 bits in `what` (`bytes`, read as `value`) are refused, naming where:
/// read as floats, they would be changed for every later reader.
fn exact_integers(what: &str, bytes: &[u8], value: &Value) -> Result<(), Error> {
    match first_big_integer(bytes, value) {
        None => Ok(()),
        Some(found) => Err(Error::InvalidInput(format!(
            "{what} at {}: {}",
            found.path,
            found.problem()
        ))),
    }
}

fn check_depth(what: &str, value: &Value, config: &Config) -> Result<(), Error> {
    let limit = config.max_data_depth;
    let depth = json_depth(value);
    if depth > limit {
        return Err(Error::InvalidInput(format!(
            "{what} nests {depth} levels deep; the limit is {limit}"
        )));
    }
    Ok(())
}

/// How deep a JSON value nests: 1 for a scalar, one more for each array or object around it.
fn json_depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 1)];
    while let Some((value, depth)) = stack.pop() {
        deepest = deepest.max(depth);
        match value {
            Value::Array(items) => stack.extend(items.iter().map(|v| (v, depth + 1))),
            Value::Object(fields) => stack.extend(fields.values().map(|v| (v, depth + 1))),
            _ => {}
        }
    }
    deepest
}

pub mod worker;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod client_tests;
