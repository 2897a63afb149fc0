//! The `client_request` target: what a client sends (a submission, a decision query, a
//! decision, a cancel, a trace header), through the gRPC edge's checks.

use baton_proto::Json;
use baton_proto::v1;
use prost::Message;
use serde_json::Value;

use super::checks::{config, depth, fix_digest, refused};
use crate::grpc::requests;
use crate::service::Config;

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
