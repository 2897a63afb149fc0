//! What clients send, bounded and checked before it reaches the service (issue 28: ANSI
//! escapes and braces in ids and filters, unbounded reasons and comments, integers beyond 64
//! bits rounded).

use serde_json::json;

use super::*;

const RUN: &str = "0191d2a4-7b1c-7def-8abc-0123456789ab";

fn code(error: Error) -> tonic::Code {
    tonic::Status::from(error).code()
}

#[test]
fn a_run_id_is_a_uuid_as_the_coordinator_writes_it_or_invalid_argument() {
    assert_eq!(run_id("run_id", RUN).unwrap(), RUN);
    for bad in [
        "",
        "no-such-run",
        "{0191d2a4-7b1c-7def-8abc-0123456789ab}",
        "0191D2A4-7B1C-7DEF-8ABC-0123456789AB",
        "0191d2a47b1c7def8abc0123456789ab",
        "0191d2a4-7b1c-7def-8abc-0123456789a}",
        "0191d2a4-7b1c-7def-8abc-0123456789\u{1b}b",
    ] {
        let error = run_id("run_id", bad).unwrap_err();
        let message = error.to_string();
        assert!(message.starts_with("run_id: "), "{bad:?}: {message}");
        assert!(!message.contains('\u{1b}'), "{message}");
        assert_eq!(code(error), tonic::Code::InvalidArgument, "{bad:?}");
    }
    let long = "a".repeat(10 << 20);
    let message = run_id("run_id", &long).unwrap_err().to_string();
    assert!(
        message.len() < 300,
        "the error quotes 100 characters at most"
    );
    assert_eq!(
        run_id("run_id", "").unwrap_err().to_string(),
        "run_id: a run id is needed: the one `baton submit` printed"
    );
}

#[test]
fn filters_name_only_what_could_exist() {
    let config = Config::default();
    let list = |workflow_id: &str| v1::ListRunsRequest {
        workflow_id: workflow_id.into(),
        ..Default::default()
    };
    assert_eq!(
        run_query(list("feature dev/α"), &config)
            .unwrap()
            .workflow_id
            .as_deref(),
        Some("feature dev/α")
    );
    for (bad, expected) in [
        (
            "{x}:runs",
            "workflow_id: a workflow id \"{x}:runs\" holds a brace at byte 0",
        ),
        (
            "a\u{1b}[2J",
            "workflow_id: a workflow id \"a\\u{1b}[2J\" holds an unprintable",
        ),
    ] {
        let error = run_query(list(bad), &config).unwrap_err();
        assert!(error.to_string().starts_with(expected), "{error}");
        assert_eq!(code(error), tonic::Code::InvalidArgument);
    }
    let error = run_query(list(&"w".repeat(129)), &config).unwrap_err();
    assert_eq!(
        error.to_string(),
        "workflow_id: a workflow id is 129 bytes long; the limit is 128"
    );

    let query = |run_id: &str, workflow_id: &str, agent: &str| v1::QueryDecisionsRequest {
        run_id: run_id.into(),
        workflow_id: workflow_id.into(),
        text: "theme".into(),
        agent: agent.into(),
        k: 0,
    };
    let refused = |request| decision_query(request, &config).unwrap_err().to_string();
    assert!(refused(query("run-1", "", "")).starts_with("run_id: \"run-1\" is not a run id"));
    assert!(refused(query("", "{w}", "")).starts_with("workflow_id: a workflow id \"{w}\""));
    assert!(refused(query(RUN, "", "plan}")).starts_with("agent: an agent name \"plan}\""));
    let read = decision_query(query(RUN, "", "planner"), &config).unwrap();
    assert_eq!(read.scope, Scope::Run(RUN.into()));
    assert_eq!(read.agent.as_deref(), Some("planner"));
}

#[test]
fn a_step_id_in_a_request_follows_the_workflow_rules() {
    let config = Config::default();
    assert_eq!(step_id("step_id", "gate-1", &config).unwrap(), "gate-1");
    for bad in ["", "ga te", "{gate}", "gate\u{1b}"] {
        let error = step_id("step_id", bad, &config).unwrap_err();
        assert!(
            error.to_string().starts_with("step_id: a step id"),
            "{error}"
        );
        assert_eq!(code(error), tonic::Code::InvalidArgument);
    }
}

#[test]
fn a_ten_mebibyte_cancel_reason_is_refused_naming_the_field_and_the_limit() {
    let config = Config::default();
    let huge = "x".repeat(10 << 20);
    let error = cancel_reason(&huge, Some("alice"), &config).unwrap_err();
    assert_eq!(
        error.to_string(),
        "reason is 10485760 bytes; the limit is 4096"
    );
    assert_eq!(code(error), tonic::Code::InvalidArgument);
    let at_limit = "x".repeat(config.max_reason_bytes);
    assert!(cancel_reason(&at_limit, None, &config).is_ok());
    // Lines are text; an escape sequence is not.
    assert_eq!(
        cancel_reason("line one\n\tline two", Some("alice"), &config).unwrap(),
        "cancelled by `alice`: line one\n\tline two"
    );
    let error = cancel_reason("ok\u{1b}[2J", None, &config).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("reason: holds an unprintable character (U+001B) at byte 2"),
        "{error}"
    );
}

#[test]
fn an_approval_comment_and_approver_are_bounded() {
    let config = Config::default();
    let request = |comment: &str, approver: &str| v1::DecideApprovalRequest {
        run_id: RUN.into(),
        step_id: "gate".into(),
        approved: true,
        comment: comment.into(),
        approver: approver.into(),
    };
    let error = decision(&request(&"c".repeat((16 << 10) + 1), ""), None, &config).unwrap_err();
    assert_eq!(
        error.to_string(),
        "comment is 16385 bytes; the limit is 16384"
    );
    assert_eq!(code(error), tonic::Code::InvalidArgument);
    let error = decision(&request("", &"a".repeat(129)), Some("alice"), &config).unwrap_err();
    assert_eq!(error.to_string(), "approver is 129 bytes; the limit is 128");
    let error = decision(&request("", "mallory\u{202e}"), None, &config).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("approver: an approver \"mallory\\u{202e}\" holds an unprintable"),
        "{error}"
    );
    let error = decision(&request("ship\u{7}", ""), None, &config).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("comment: holds an unprintable"),
        "{error}"
    );
    // Within the limits: the comment kept, and with authentication on the approver is the
    // principal, whatever the request says.
    let decided = decision(
        &request("looks good\nship it", "bob"),
        Some("alice"),
        &config,
    )
    .unwrap();
    assert_eq!(decided.comment.as_deref(), Some("looks good\nship it"));
    assert_eq!(decided.approver.as_deref(), Some("alice"));
}

#[test]
fn an_input_with_an_integer_beyond_64_bits_is_refused_naming_its_path() {
    let config = Config::default();
    let request = v1::SubmitRunRequest {
        workflow: b"{}".to_vec(),
        input: None,
        idempotency_key: String::new(),
    };
    let input = Json::new(br#"{"order": {"id": 123456789012345678901234567890}}"#.to_vec());
    let error = submission(request.clone(), input, String::new(), &config).unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid input: the input at $.order.id: integer 123456789012345678901234567890 is \
         beyond 64 bits, which JSON readers round to a float; write it as a string \
         (\"123456789012345678901234567890\")"
    );
    assert_eq!(code(error), tonic::Code::InvalidArgument);
    // The largest that fit, and floats, are kept as they are.
    let fits = Json::new(br#"[18446744073709551615, -9223372036854775808, 1.5e300]"#.to_vec());
    let read = submission(request, fits, String::new(), &config).unwrap();
    assert_eq!(read.input_value[0], json!(u64::MAX));
    assert_eq!(read.input_value[1], json!(i64::MIN));
}

#[test]
fn a_result_with_an_integer_beyond_64_bits_fails_its_attempt_naming_the_path() {
    let config = Config::default();
    let sent = |json: &[u8]| Json::new(json.to_vec());
    let result = v1::TaskResult {
        task_id: format!("{RUN}/plan#1@1"),
        outcome: Some(v1::task_result::Outcome::Data(sent(
            br#"{"ids": [1, 18446744073709551616]}"#,
        ))),
        notes: None,
        non_retryable: false,
        usage: Vec::new(),
    };
    let answer = answer(result.clone(), &config).unwrap();
    let Outcome::Refused { reason, .. } = answer.outcome else {
        panic!("accepted: {:?}", answer.outcome);
    };
    assert!(
        reason.to_string().starts_with(
            "invalid input: the result at $.ids[1]: integer 18446744073709551616 is beyond 64 bits"
        ),
        "{reason}"
    );
    // In the notes too.
    let noted = v1::TaskResult {
        outcome: Some(v1::task_result::Outcome::Data(sent(b"{}"))),
        notes: Some(sent(
            br#"{"messages": [{"role": "ai", "content": "n", "seq": -99999999999999999999}]}"#,
        )),
        ..result
    };
    let Outcome::Refused { reason, .. } = super::answer(noted, &config).unwrap().outcome else {
        panic!("notes accepted");
    };
    assert!(
        reason
            .to_string()
            .contains("the result's notes at $.messages[0].seq: integer -99999999999999999999"),
        "{reason}"
    );
}
