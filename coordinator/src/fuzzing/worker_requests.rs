//! The `worker_query` and `worker_request` targets: an agent's decision query as its worker
//! sends it, and a worker's messages built from the input as structures, with names, lists
//! and texts drawn on both sides of each limit.

use arbitrary::Unstructured;
use baton_core::fuzzing::string;
use baton_proto::v1::{self, worker_message};
use prost::Message;

use super::checks::{check_task_ref, config, refused};
use super::messages::worker_message;
use crate::grpc::requests::{self, worker};

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
            assert_eq!(query.principal, None);
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
