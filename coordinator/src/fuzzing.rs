//! Fuzz targets: what a coordinator decodes from workers and clients, as functions of arbitrary
//! bytes, through the same conversions and checks as the gRPC edge ([`crate::grpc::requests`]).
//!
//! Like `baton_core::fuzzing` (which says what a target promises): each must not panic, hang or
//! allocate without bound, and asserts its invariants. The suite runs them in
//! `coordinator/tests/fuzz.rs`; `tests/fuzz/README.md` tells how to run them for longer.
//!
//! - [`worker_message`]: a `WorkerMessage` off a worker's stream (hello, result, resend, live
//!   output, heartbeat, drain), as sent and with its digests made right (so that the checks
//!   behind them are reached too).
//! - [`worker_answer`]: a worker's result built from the input as a structure (data and notes
//!   of every shape, sizes on both sides of each limit), encoded, then as [`worker_message`]:
//!   mutated protobuf seldom decodes, so this is the target that reaches the checks of data
//!   and notes.
//! - [`worker_query`]: an agent's decision query, through its worker.
//! - [`worker_request`]: a hello, a resend, a piece of live output, an agent's error or a
//!   decision query built from the input as a structure, with its names, lists and texts on
//!   both sides of each limit, encoded, then as [`worker_message`] or [`worker_query`]: the
//!   target that reaches the bounds of a worker's messages (issue 28).
//! - [`client_request`]: a client's `SubmitRun` (its workflow parsed as the service parses
//!   it), `QueryDecisions`, `DecideApproval` or `CancelRun`, or a `traceparent` header.

use std::sync::OnceLock;

use arbitrary::Unstructured;
use baton_core::fuzzing::{Target, json_value, string};
use baton_proto::v1::{self, worker_message};
use baton_proto::{Json, sha256_hex};
use prost::Message;
use serde_json::{Value, json};

use crate::grpc::requests::{self, worker};
use crate::service::{Config, Outcome, WorkerHello};
use crate::task_ref::TaskRef;

/// Every target of this crate, by name (the name of its corpus folder).
pub const TARGETS: &[(&str, Target)] = &[
    ("worker_message", worker_message),
    ("worker_answer", worker_answer),
    ("worker_query", worker_query),
    ("worker_request", worker_request),
    ("client_request", client_request),
];

/// The coordinator's default configuration: its limits are what a worker or client meets.
fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(Config::default)
}

/// A message off a worker's stream, decoded and converted as the stream's handler does; then,
/// for a result, again with the digests of its data and notes made right.
///
/// Invariants: a message re-encodes to one that decodes the same; a hello that is accepted
/// keeps the worker's id and held tasks, with a capacity of at least 1, and is within every
/// bound of a hello (a printable id, at most 256 printable agents, 10,000 slots and held
/// tasks of 1 KiB), naming no principal (who sent it is not the wire's to say); a result is
/// refused outright only for a task id that does not read (or is too long to be one), data
/// accepted is the JSON sent, within the depth and the limits on notes, and an agent's error
/// is kept within its limit (whole if it was); a resend's reason too; task ids that read write
/// back as ids that read the same; a piece of live output accepted is within its size.
pub fn worker_message(data: &[u8]) {
    let Ok(message) = v1::WorkerMessage::decode(data) else {
        return;
    };
    let reencoded = message.encode_to_vec();
    assert_eq!(
        v1::WorkerMessage::decode(reencoded.as_slice()).as_ref(),
        Ok(&message),
        "a message re-encodes to itself"
    );
    let config = config();
    match message.message {
        None | Some(worker_message::Message::Heartbeat(_) | worker_message::Message::Drain(_)) => {}
        Some(worker_message::Message::Hello(hello)) => match WorkerHello::try_from(hello.clone()) {
            Ok(accepted) => {
                assert_eq!(accepted.worker_id, hello.worker_id);
                assert!(!accepted.worker_id.is_empty());
                assert!(baton_proto::serves_worker_protocol(hello.protocol));
                assert_eq!(accepted.protocol, hello.protocol);
                assert!(accepted.capacity >= 1);
                assert_eq!(accepted.held.len(), hello.held.len());
                for (held, id) in accepted.held.iter().zip(&hello.held) {
                    if let Ok(task) = held {
                        check_task_ref(task, id);
                    }
                }
                check_hello_bounds(&accepted, &hello);
            }
            Err(error) => refused(error),
        },
        Some(worker_message::Message::Result(result)) => {
            check_answer(result.clone(), config);
            let mut fixed = result;
            let mut changed = false;
            if let Some(v1::task_result::Outcome::Data(data)) = &mut fixed.outcome {
                changed |= fix_digest(data);
            }
            if let Some(notes) = &mut fixed.notes {
                changed |= fix_digest(notes);
            }
            if changed {
                check_answer(fixed, config);
            }
        }
        Some(worker_message::Message::Resend(resend)) => {
            let sent = resend.clone();
            match requests::resend_request(resend, config) {
                Ok((task, reason)) => {
                    check_task_ref(&task, &sent.task_id);
                    assert!(sent.task_id.len() <= worker::MAX_TASK_ID_BYTES);
                    check_cut(&sent.reason, &reason, config.max_error_bytes);
                }
                Err(error) => {
                    assert!(
                        sent.task_id.len() > worker::MAX_TASK_ID_BYTES
                            || sent.task_id.parse::<TaskRef>().is_err(),
                        "only its task id refuses a resend: {error}"
                    );
                    refused(error);
                }
            }
        }
        Some(worker_message::Message::Output(output)) => {
            let task_id = output.task_id.clone();
            match requests::output_piece(output, config) {
                Ok((task, text, _restart)) => {
                    check_task_ref(&task, &task_id);
                    assert!(text.len() <= config.max_output_piece_bytes);
                }
                Err(error) => refused(error),
            }
        }
    }
}

/// A worker's result drawn from the input as a structure, sent as a `WorkerMessage`.
pub fn worker_answer(data: &[u8]) {
    let Ok(result) = arbitrary_result(&mut Unstructured::new(data)) else {
        return;
    };
    let message = v1::WorkerMessage {
        message: Some(worker_message::Message::Result(result)),
    };
    worker_message(&message.encode_to_vec());
}

fn arbitrary_result(u: &mut Unstructured) -> arbitrary::Result<v1::TaskResult> {
    let config = config();
    let task_id = if u.ratio(9, 10)? {
        format!(
            "{}/{}#{}@{}",
            string(u, 12)?.replace('/', ""),
            string(u, 12)?,
            u.arbitrary::<u32>()?,
            u.arbitrary::<u32>()?
        )
    } else {
        string(u, 40)?
    };
    // The first choice of each is the common one: what an input that has run out makes.
    let outcome = match u.choose_index(9)? {
        7 => Some(v1::task_result::Outcome::Error(string(u, 80)?)),
        8 => None,
        kind => {
            let bytes = match kind {
                5 => {
                    let len = u.len().min(64);
                    u.bytes(len)?.to_vec()
                }
                // Around the depth limit, on both sides.
                6 => {
                    let levels = config.max_data_depth - 2 + u.choose_index(5)?;
                    format!("{}1{}", "[".repeat(levels - 1), "]".repeat(levels - 1)).into_bytes()
                }
                _ => serde_json::to_vec(&json_value(u, 4)?).expect("a value serialises"),
            };
            Some(v1::task_result::Outcome::Data(sent(u, bytes)?))
        }
    };
    let notes = if !u.ratio(1, 3)? {
        let notes = arbitrary_notes(u)?;
        Some(sent(
            u,
            serde_json::to_vec(&notes).expect("a value serialises"),
        )?)
    } else {
        None
    };
    let mut usage = Vec::new();
    let entries = match u.choose_index(10)? {
        9 => config.max_usage_entries + u.choose_index(3)?,
        _ => u.choose_index(4)?,
    };
    for _ in 0..entries {
        let model_len = match u.choose_index(10)? {
            9 => config.max_model_name_bytes + u.choose_index(3)?,
            _ => u.choose_index(20)?,
        };
        usage.push(v1::Usage {
            model: "m".repeat(model_len),
            prompt_tokens: u.arbitrary()?,
            completion_tokens: u.arbitrary()?,
        });
    }
    Ok(v1::TaskResult {
        task_id,
        outcome,
        notes,
        non_retryable: u.arbitrary()?,
        usage,
    })
}

/// `bytes` with their digest, or now and then a digest that does not match.
fn sent(u: &mut Unstructured, bytes: Vec<u8>) -> arbitrary::Result<Json> {
    let mut json = Json::new(bytes);
    if u.choose_index(20)? == 19 {
        json.sha256 = sha256_hex(b"something else");
    }
    Ok(json)
}

/// Notes as an agent might write them: messages that append, replace and remove, decisions
/// with and without a summary, sizes on both sides of each limit, and now and then anything.
fn arbitrary_notes(u: &mut Unstructured) -> arbitrary::Result<Value> {
    let config = config();
    if u.choose_index(10)? == 9 {
        return json_value(u, 3);
    }
    let mut messages = Vec::new();
    let count = match u.choose_index(20)? {
        19 => config.max_messages_per_result + u.choose_index(2)?,
        _ => u.choose_index(4)?,
    };
    for n in 0..count {
        messages.push(match u.choose_index(6)? {
            4 => json!({"type": "remove", "id": format!("m{}", u.choose_index(3)?)}),
            3 => json!({"id": format!("m{}", u.choose_index(3)?), "role": "assistant",
                        "content": json_value(u, 2)?, "name": string(u, 8)?,
                        "metadata": {"n": n}}),
            5 => json_value(u, 2)?,
            _ => json!({"role": string(u, 10)?, "content": string(u, 30)?}),
        });
    }
    let mut decisions = Vec::new();
    let count = match u.choose_index(20)? {
        19 => config.max_decisions_per_result + u.choose_index(2)?,
        _ => u.choose_index(3)?,
    };
    let around = |u: &mut Unstructured, limit: usize| -> arbitrary::Result<usize> {
        Ok(match u.choose_index(10)? {
            9 => limit - 1 + u.choose_index(3)?,
            _ => u.choose_index(12)?,
        })
    };
    for _ in 0..count {
        let summary = match u.choose_index(10)? {
            9 => " \t\n".to_owned(),
            _ => "s".repeat(around(u, config.max_decision_summary_bytes)?.max(1)),
        };
        let artifacts: Vec<String> = (0..around(u, config.max_related_artifacts)?)
            .map(|i| format!("a{i}.ts"))
            .collect();
        decisions.push(json!({
            "summary": summary,
            "rationale": "r".repeat(around(u, config.max_decision_rationale_bytes)?),
            "related_artifacts": artifacts,
        }));
    }
    Ok(json!({"messages": messages, "decisions": decisions}))
}

/// Makes `json`'s digest that of its bytes; whether it changed.
fn fix_digest(json: &mut Json) -> bool {
    let digest = sha256_hex(&json.json);
    let changed = json.sha256 != digest;
    json.sha256 = digest;
    changed
}

/// A worker's result through [`requests::answer`], and what an accepted one may hold.
fn check_answer(result: v1::TaskResult, config: &Config) {
    let task_id = result.task_id.clone();
    let sent_data = match &result.outcome {
        Some(v1::task_result::Outcome::Data(data)) => Some(data.json.clone()),
        _ => None,
    };
    let sent_error = match &result.outcome {
        Some(v1::task_result::Outcome::Error(error)) => Some(error.clone()),
        _ => None,
    };
    let answer = match requests::answer(result, config) {
        Ok(answer) => answer,
        Err(error) => {
            assert!(
                task_id.len() > worker::MAX_TASK_ID_BYTES || task_id.parse::<TaskRef>().is_err(),
                "only a task id that does not read refuses a result outright: {error}"
            );
            return refused(error);
        }
    };
    check_task_ref(&answer.task, &task_id);
    assert!(answer.usage.len() <= config.max_usage_entries);
    for usage in &answer.usage {
        assert!(usage.model.len() <= config.max_model_name_bytes);
    }
    match answer.outcome {
        Outcome::Data {
            data,
            notes,
            sent: part,
        } => {
            let sent = sent_data.expect("data comes from a result with data");
            assert_eq!(part.json, sent, "the bytes kept are the bytes sent");
            let read: Value = serde_json::from_slice(&sent).expect("accepted data is JSON");
            assert_eq!(read, data, "the data accepted is the data sent");
            assert!(depth(&data) <= config.max_data_depth);
            assert!(notes.decisions.len() <= config.max_decisions_per_result);
            assert!(notes.messages.len() <= config.max_messages_per_result);
            for decision in &notes.decisions {
                assert!(!decision.summary.trim().is_empty());
                assert!(decision.summary.len() <= config.max_decision_summary_bytes);
                assert!(decision.rationale.len() <= config.max_decision_rationale_bytes);
                assert!(decision.related_artifacts.len() <= config.max_related_artifacts);
            }
            // The notes go into the run's history as they are: they must write out again.
            assert!(serde_json::to_vec(&notes).is_ok());
        }
        Outcome::Failed { error, .. } => {
            let sent = sent_error.expect("a failure comes from a result with an error");
            check_cut(&sent, &error, config.max_error_bytes);
        }
        Outcome::Refused { reason, .. } => assert!(!reason.to_string().is_empty()),
    }
}

/// An accepted hello is within every bound of one.
fn check_hello_bounds(accepted: &WorkerHello, hello: &v1::Hello) {
    let printable = |text: &str| !text.chars().any(char::is_control);
    assert!(accepted.worker_id.len() <= worker::MAX_WORKER_ID_BYTES);
    assert!(printable(&accepted.worker_id));
    assert!(accepted.agents.len() <= worker::MAX_AGENTS);
    for agent in &accepted.agents {
        assert!(!agent.trim().is_empty() && agent.len() <= worker::MAX_AGENT_NAME_BYTES);
        assert!(printable(agent), "{agent:?}");
    }
    assert!(hello.capacity <= worker::MAX_CAPACITY);
    assert!(hello.held.len() <= worker::MAX_HELD);
    assert!(
        hello
            .held
            .iter()
            .all(|id| id.len() <= worker::MAX_TASK_ID_BYTES)
    );
    assert_eq!(accepted.principal, "", "the wire never names the principal");
}

/// `kept` is `sent` if that was within `limit`, and otherwise within the limit, starting as
/// `sent` did and naming its length.
fn check_cut(sent: &str, kept: &str, limit: usize) {
    if sent.len() <= limit {
        assert_eq!(kept, sent);
        return;
    }
    assert!(kept.len() <= limit, "{} bytes kept of {limit}", kept.len());
    let (head, _) = kept.split_once(" [... cut: ").expect("a marker");
    assert!(sent.starts_with(head));
    assert!(kept.contains(&format!("cut: {} bytes in all", sent.len())));
}

/// How deep a JSON value nests (1 for a scalar), without recursion.
fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 1)];
    while let Some((value, at)) = stack.pop() {
        deepest = deepest.max(at);
        match value {
            Value::Array(items) => stack.extend(items.iter().map(|item| (item, at + 1))),
            Value::Object(members) => stack.extend(members.values().map(|item| (item, at + 1))),
            _ => {}
        }
    }
    deepest
}

/// A task id that was read from `text` writes back as an id that reads the same.
fn check_task_ref(task: &TaskRef, text: &str) {
    let written = task.to_string();
    assert_eq!(
        written.parse::<TaskRef>().as_ref(),
        Ok(task),
        "task id {text:?} written back as {written:?}"
    );
}

/// An error the edge returns: it has a message and a gRPC status.
fn refused(error: crate::Error) {
    let message = error.to_string();
    assert!(!message.is_empty());
    let status = tonic::Status::from(error);
    assert_ne!(status.code(), tonic::Code::Ok);
}

/// An agent's decision query, as its worker sends it.
///
/// Invariants: an accepted query has text within its limit and between 1 and 100 matches, and
/// names a printable worker id within its limit and no principal (who asks is the call's).
pub fn worker_query(data: &[u8]) {
    let Ok(request) = v1::WorkerQueryDecisionsRequest::decode(data) else {
        return;
    };
    let task_id = request.task_id.clone();
    let config = config();
    match requests::worker_query(request, config) {
        Ok(query) => {
            check_task_ref(&query.task, &task_id);
            assert!(!query.text.trim().is_empty());
            assert!(query.text.len() <= config.max_query_bytes);
            assert!((1..=100).contains(&query.k));
            assert_ne!(query.agent.as_deref(), Some(""));
            assert!(query.worker_id.len() <= worker::MAX_WORKER_ID_BYTES);
            assert!(!query.worker_id.trim().is_empty());
            assert!(!query.worker_id.chars().any(char::is_control));
            assert_eq!(query.principal, "");
        }
        Err(error) => refused(error),
    }
}

/// A worker's message built from the input as a structure, chosen by its first choice: a
/// hello, a resend, a piece of live output, an agent's error, or a decision query; names,
/// lists and texts drawn on both sides of each limit (and with control characters now and
/// then). Encoded, it goes through [`worker_message`] or [`worker_query`] and their invariants.
pub fn worker_request(data: &[u8]) {
    let u = &mut Unstructured::new(data);
    let Ok(kind) = u.choose_index(5) else {
        return;
    };
    let message = match kind {
        0 => arbitrary_hello(u).map(worker_message::Message::Hello),
        1 => arbitrary_resend(u).map(worker_message::Message::Resend),
        2 => arbitrary_output(u).map(worker_message::Message::Output),
        3 => arbitrary_failure(u).map(worker_message::Message::Result),
        _ => {
            if let Ok(query) = arbitrary_query(u) {
                worker_query(&query.encode_to_vec());
            }
            return;
        }
    };
    if let Ok(message) = message {
        let message = v1::WorkerMessage {
            message: Some(message),
        };
        worker_message(&message.encode_to_vec());
    }
}

/// A length around `limit` (one of a few either side) one time in `rare`, else up to `small`
/// (the first choice, which an input that has run out makes, is the common one).
fn around(
    u: &mut Unstructured,
    limit: usize,
    rare: usize,
    small: usize,
) -> arbitrary::Result<usize> {
    Ok(if u.choose_index(rare)? == rare - 1 {
        (limit + u.choose_index(5)?).saturating_sub(2)
    } else {
        u.choose_index(small + 1)?
    })
}

/// A name of `len` bytes: `fill` repeated, or an arbitrary string, with a control character
/// (an escape, a newline, a NUL) put in now and then.
fn name(u: &mut Unstructured, len: usize, fill: char) -> arbitrary::Result<String> {
    let drawn = if len <= 40 && u.choose_index(2)? == 1 {
        string(u, len)?
    } else {
        String::new()
    };
    // Empty only when `len` is: an input that ran out draws no string.
    let mut text = if drawn.is_empty() {
        fill.to_string().repeat(len)
    } else {
        drawn
    };
    if u.choose_index(8)? == 7 {
        let control = ['\u{1b}', '\n', '\0', '\u{7f}'][u.choose_index(4)?];
        let at = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .nth(u.choose_index(text.len() + 1)?)
            .unwrap_or(0);
        text.insert(at, control);
    }
    Ok(text)
}

/// A task id that reads (`<run>/<step>#<visit>@<attempt>`, its step id long now and then),
/// or text that does not.
fn task_id(u: &mut Unstructured) -> arbitrary::Result<String> {
    if u.choose_index(10)? == 9 {
        return string(u, 40);
    }
    let step = around(u, worker::MAX_TASK_ID_BYTES - 24, 8, 12)?;
    Ok(format!(
        "{}/{}#{}@{}",
        string(u, 12)?.replace('/', ""),
        "s".repeat(step.max(1)),
        u.arbitrary::<u32>()?,
        u.arbitrary::<u32>()?
    ))
}

/// A worker id's length: about its limit now and then, empty seldom, else short.
fn id_len(u: &mut Unstructured) -> arbitrary::Result<usize> {
    Ok(match around(u, worker::MAX_WORKER_ID_BYTES, 6, 20)? {
        0 if u.choose_index(10)? != 9 => 8,
        len => len,
    })
}

fn arbitrary_hello(u: &mut Unstructured) -> arbitrary::Result<v1::Hello> {
    let id_len = id_len(u)?;
    let worker_id = name(u, id_len, 'w')?;
    let agents = around(u, worker::MAX_AGENTS, 6, 4)?;
    let agents = (0..agents)
        .map(|n| {
            let len = around(u, worker::MAX_AGENT_NAME_BYTES, 20, 12)?;
            let agent = name(u, len, 'a')?;
            // Blank seldom: a hello names its agents.
            if agent.trim().is_empty() && u.choose_index(10)? != 9 {
                return Ok(format!("agent-{n}"));
            }
            Ok(agent)
        })
        .collect::<arbitrary::Result<Vec<String>>>()?;
    let capacity = match u.choose_index(8)? {
        7 => around(u, worker::MAX_CAPACITY as usize, 1, 0)? as u32,
        6 => u.arbitrary()?,
        _ => u.choose_index(9)? as u32,
    };
    let held = around(u, worker::MAX_HELD, 20, 3)?;
    let held = (0..held)
        .map(|_| task_id(u))
        .collect::<arbitrary::Result<Vec<String>>>()?;
    let protocol = match u.choose_index(6)? {
        5 => u.arbitrary()?,
        4 => baton_proto::OLDEST_WORKER_PROTOCOL,
        _ => baton_proto::WORKER_PROTOCOL,
    };
    Ok(v1::Hello {
        worker_id,
        agents,
        capacity,
        cache_bytes: u.arbitrary()?,
        protocol,
        held,
    })
}

/// A text of about `limit` bytes now and then (either side of it), else a short one.
fn long_text(u: &mut Unstructured, limit: usize) -> arbitrary::Result<String> {
    let len = around(u, limit, 4, 0)?;
    if len == 0 {
        return string(u, 80);
    }
    // Multi-byte characters, so that a cut must find character boundaries.
    let unit = ["e", "é", "€", "𝄞"][u.choose_index(4)?];
    Ok(unit.repeat(len / unit.len() + 1))
}

fn arbitrary_resend(u: &mut Unstructured) -> arbitrary::Result<v1::ResendTask> {
    Ok(v1::ResendTask {
        task_id: task_id(u)?,
        reason: long_text(u, config().max_error_bytes)?,
    })
}

fn arbitrary_output(u: &mut Unstructured) -> arbitrary::Result<v1::TaskOutput> {
    Ok(v1::TaskOutput {
        task_id: task_id(u)?,
        text: long_text(u, config().max_output_piece_bytes)?,
        restart: u.arbitrary()?,
    })
}

fn arbitrary_failure(u: &mut Unstructured) -> arbitrary::Result<v1::TaskResult> {
    Ok(v1::TaskResult {
        task_id: task_id(u)?,
        outcome: Some(v1::task_result::Outcome::Error(long_text(
            u,
            config().max_error_bytes,
        )?)),
        notes: None,
        non_retryable: u.arbitrary()?,
        usage: Vec::new(),
    })
}

fn arbitrary_query(u: &mut Unstructured) -> arbitrary::Result<v1::WorkerQueryDecisionsRequest> {
    let id_len = id_len(u)?;
    Ok(v1::WorkerQueryDecisionsRequest {
        worker_id: name(u, id_len, 'w')?,
        task_id: task_id(u)?,
        text: long_text(u, config().max_query_bytes)?,
        agent: string(u, 12)?,
        k: u.choose_index(120)? as u32,
        workflow_scope: u.arbitrary()?,
    })
}

/// A client's request, chosen by the first byte: `SubmitRun` (with the workflow parsed and
/// validated as the service does), `QueryDecisions`, `DecideApproval`, `CancelRun`, or a
/// `traceparent` header.
///
/// Invariants: an accepted submission keeps its workflow and input bytes, the input read is
/// the JSON sent, within the depth; a valid workflow validates the same again; a decision
/// query names exactly one scope; an accepted decision or cancel reason is within its limits
/// and names the caller; a run id accepted is a UUID's 36 characters; a traceparent that reads
/// writes back to one that reads the same.
pub fn client_request(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let config = config();
    match kind % 5 {
        0 => submit_run(rest, config),
        1 => {
            let Ok(request) = v1::QueryDecisionsRequest::decode(rest) else {
                return;
            };
            let one_scope = request.run_id.is_empty() != request.workflow_id.is_empty();
            match requests::decision_query(request, config) {
                Ok(query) => {
                    assert!(one_scope);
                    assert!((1..=100).contains(&query.k));
                    assert!(query.text.len() <= config.max_query_bytes);
                }
                Err(error) => refused(error),
            }
        }
        2 => {
            let Ok(request) = v1::DecideApprovalRequest::decode(rest) else {
                return;
            };
            let _ = requests::run_id("run_id", &request.run_id);
            let _ = requests::step_id("step_id", &request.step_id, config);
            match requests::decision(&request, Some("fuzzer"), config) {
                Ok(decision) => {
                    assert_eq!(decision.approved, request.approved);
                    assert!(request.comment.len() <= config.max_comment_bytes);
                    assert!(request.approver.len() <= config.limits.max_id_len);
                    assert_eq!(decision.approver.as_deref(), Some("fuzzer"));
                }
                Err(error) => refused(error),
            }
        }
        3 => {
            let Ok(request) = v1::CancelRunRequest::decode(rest) else {
                return;
            };
            match requests::run_id("run_id", &request.run_id) {
                Ok(run_id) => assert_eq!(run_id.len(), 36),
                Err(error) => refused(error),
            }
            match requests::cancel_reason(&request.reason, Some("fuzzer"), config) {
                Ok(reason) => {
                    assert!(request.reason.len() <= config.max_reason_bytes);
                    assert!(reason.starts_with("cancelled by `fuzzer`"));
                }
                Err(error) => refused(error),
            }
        }
        _ => {
            let header = String::from_utf8_lossy(rest);
            if let Some(context) = baton_proto::trace_context::parse_traceparent(&header) {
                let written = baton_proto::trace_context::format_traceparent(&context);
                let again = baton_proto::trace_context::parse_traceparent(&written)
                    .expect("a traceparent written back reads");
                assert_eq!(again, context);
                let _ = baton_proto::trace_context::trace_id_of(&header);
            }
        }
    }
}

fn submit_run(data: &[u8], config: &Config) {
    let Ok(mut request) = v1::SubmitRunRequest::decode(data) else {
        return;
    };
    let input = match requests::submitted_input(&mut request) {
        Ok(input) => input,
        Err(error) => return refused(error),
    };
    // As sent, and with the input's digest made right.
    let mut fixed = input.clone();
    let changed = fix_digest(&mut fixed);
    check_submission(request.clone(), input, config);
    if changed {
        check_submission(request, fixed, config);
    }
}

fn check_submission(request: v1::SubmitRunRequest, input: Json, config: &Config) {
    let workflow = request.workflow.clone();
    let input_bytes = input.json.clone();
    let submission = match requests::submission(request, input, String::new(), config) {
        Ok(submission) => submission,
        Err(error) => return refused(error),
    };
    assert_eq!(submission.workflow, workflow);
    assert_eq!(submission.input, input_bytes);
    let read: Value = serde_json::from_slice(&input_bytes).expect("an accepted input is JSON");
    assert_eq!(read, submission.input_value);
    assert!(depth(&submission.input_value) <= config.max_data_depth);
    // What the service does first with it.
    let Ok(text) = std::str::from_utf8(&submission.workflow) else {
        return;
    };
    if let Ok(parsed) = baton_core::parse_workflow_with(text, &config.limits) {
        let again = baton_core::parse_workflow_with(text, &config.limits)
            .expect("a valid workflow stays valid");
        assert_eq!(again.workflow.steps().len(), parsed.workflow.steps().len());
    }
}
