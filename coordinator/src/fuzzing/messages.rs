//! The `worker_message` target: a message off a worker's stream, decoded and converted as the
//! stream's handler does, and what an accepted hello or result may hold.

use baton_proto::v1::{self, worker_message};
use prost::Message;
use serde_json::Value;

use super::checks::{check_cut, check_task_ref, config, depth, fix_digest, refused};
use crate::grpc::requests::{self, worker};
use crate::service::{Config, Outcome, WorkerHello};
use crate::task_ref::TaskRef;

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
