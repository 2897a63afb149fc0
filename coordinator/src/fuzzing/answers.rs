//! The `worker_answer` target: a worker's result built from the input as a structure (data and
//! notes of every shape, sizes on both sides of each limit), sent as a `WorkerMessage`.

use arbitrary::Unstructured;
use baton_core::fuzzing::{json_value, string};
use baton_proto::v1::{self, worker_message};
use baton_proto::{Json, sha256_hex};
use prost::Message;
use serde_json::{Value, json};

use super::checks::config;
use super::messages::worker_message;

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
