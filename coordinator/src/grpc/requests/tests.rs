use serde_json::json;

use super::*;

fn result(task_id: &str, outcome: v1::task_result::Outcome) -> v1::TaskResult {
    v1::TaskResult {
        task_id: task_id.into(),
        outcome: Some(outcome),
        notes: None,
        non_retryable: false,
        usage: Vec::new(),
    }
}

fn data(value: &Value) -> v1::task_result::Outcome {
    v1::task_result::Outcome::Data(Json::new(serde_json::to_vec(value).unwrap()))
}

fn refusal(answer: Answer) -> String {
    match answer.outcome {
        Outcome::Refused { reason, .. } => reason.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn only_a_malformed_task_id_refuses_an_answer_outright() {
    let config = Config::default();
    let error = answer(result("run/plan#1", data(&json!({}))), &config).unwrap_err();
    assert!(
        matches!(&error, Error::MalformedTaskId(id) if id == "run/plan#1"),
        "{error}"
    );
    let read = answer(result("run/plan#1@2", data(&json!({"ok": 1}))), &config).unwrap();
    assert_eq!(read.task.to_string(), "run/plan#1@2");
    assert!(matches!(read.outcome, Outcome::Data { ref data, .. } if data == &json!({"ok": 1})));
}

#[test]
fn a_result_that_cannot_be_data_is_carried_as_a_refusal_naming_why() {
    let config = Config {
        max_result_bytes: 64,
        max_data_depth: 3,
        ..Config::default()
    };
    let mut tampered = Json::new(br#"{"a":1}"#.to_vec());
    tampered.flip(5, tampered.json[5] ^ b'2');
    let tampered = v1::task_result::Outcome::Data(tampered);
    assert!(refusal(answer(result("r/s#1@1", tampered), &config).unwrap()).contains("SHA-256"));
    let big = data(&json!("x".repeat(100)));
    assert_eq!(
        refusal(answer(result("r/s#1@1", big), &config).unwrap()),
        "the result (data and notes) is 102 bytes; the limit is 64"
    );
    let deep = data(&json!([[[1]]]));
    assert_eq!(
        refusal(answer(result("r/s#1@1", deep), &config).unwrap()),
        "invalid input: the result nests 4 levels deep; the limit is 3"
    );
    let nothing = v1::TaskResult {
        outcome: None,
        ..result("r/s#1@1", data(&json!(1)))
    };
    assert!(refusal(answer(nothing, &config).unwrap()).contains("needs data or an error"));
}

#[test]
fn notes_over_their_limits_are_refused_naming_the_json_path() {
    let config = Config {
        max_decisions_per_result: 1,
        ..Config::default()
    };
    let notes = |value: Value| v1::TaskResult {
        notes: Some(Json::new(serde_json::to_vec(&value).unwrap())),
        ..result("r/s#1@1", data(&json!({})))
    };
    let blank = notes(json!({"decisions": [{"summary": " "}]}));
    assert!(refusal(answer(blank, &config).unwrap()).contains("decisions[0].summary is empty"),);
    let two = notes(json!({"decisions": [{"summary": "a"}, {"summary": "b"}]}));
    assert!(
        refusal(answer(two, &config).unwrap()).contains("decisions has 2 entries; the limit is 1")
    );
    let fine = notes(json!({"decisions": [{"summary": "a", "rationale": "b"}]}));
    assert!(matches!(
        answer(fine, &config).unwrap().outcome,
        Outcome::Data { ref notes, .. } if notes.decisions.len() == 1
    ));
}

#[test]
fn an_agents_error_keeps_whether_it_may_be_retried() {
    let failed = v1::TaskResult {
        non_retryable: true,
        ..result("r/s#1@1", v1::task_result::Outcome::Error("boom".into()))
    };
    assert!(matches!(
        answer(failed, &Config::default()).unwrap().outcome,
        Outcome::Failed { ref error, retryable: false } if error == "boom"
    ));
}

#[test]
fn a_hello_must_speak_this_protocol_or_the_one_before_and_name_its_worker() {
    let hello = v1::Hello {
        worker_id: "w1".into(),
        agents: vec!["coder".into()],
        capacity: 0,
        cache_bytes: 1 << 20,
        protocol: baton_proto::WORKER_PROTOCOL,
        held: vec!["r/code#1@2".into(), "garbage".into()],
    };
    let read = WorkerHello::try_from(hello.clone()).unwrap();
    assert_eq!(
        read.protocol,
        baton_proto::WORKER_PROTOCOL,
        "kept for dispatch"
    );
    assert_eq!(read.capacity, 1, "a worker takes at least one task");
    assert_eq!(read.held[0].as_ref().unwrap().attempt, 2);
    assert!(
        read.held[1].is_err(),
        "kept, so that the worker is told to stop it"
    );
    let previous = v1::Hello {
        protocol: baton_proto::WORKER_PROTOCOL - 1,
        ..hello.clone()
    };
    assert_eq!(
        WorkerHello::try_from(previous)
            .expect("a rolling upgrade keeps workers of the previous protocol")
            .protocol,
        baton_proto::WORKER_PROTOCOL - 1,
        "known as such, for dispatch"
    );
    let older = v1::Hello {
        protocol: baton_proto::WORKER_PROTOCOL - 2,
        ..hello.clone()
    };
    let refused = WorkerHello::try_from(older).unwrap_err();
    assert!(matches!(refused, Error::Protocol { .. }));
    assert!(
        refused.to_string().contains("upgrade the worker"),
        "{refused}"
    );
    let newer = v1::Hello {
        protocol: baton_proto::WORKER_PROTOCOL + 1,
        ..hello.clone()
    };
    let refused = WorkerHello::try_from(newer).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("upgrade the coordinators first"),
        "{refused}"
    );
    let anonymous = v1::Hello {
        worker_id: String::new(),
        ..hello
    };
    assert_eq!(
        WorkerHello::try_from(anonymous).unwrap_err().to_string(),
        "hello.worker_id: a worker needs an id"
    );
}

#[test]
fn a_submission_is_checked_in_order_key_sizes_digest_json_depth() {
    let config = Config {
        max_workflow_bytes: 10,
        max_input_bytes: 8,
        max_idempotency_key_bytes: 4,
        ..Config::default()
    };
    let request = |workflow: &[u8], key: &str| v1::SubmitRunRequest {
        workflow: workflow.to_vec(),
        input: None,
        idempotency_key: key.into(),
    };
    let input = |bytes: &[u8]| Json::new(bytes.to_vec());
    let refused = |request, input| {
        submission(request, input, String::new(), &config)
            .unwrap_err()
            .to_string()
    };
    assert!(refused(request(b"{}", "toolong"), input(b"1")).contains("idempotency_key: 7 bytes"));
    assert!(refused(request(&[b' '; 11], ""), input(b"1")).contains("the workflow is 11 bytes"));
    assert!(refused(request(b"{}", ""), input(b"[1,2,3,4]")).contains("the input is 9 bytes"));
    let mut tampered = input(b"1");
    tampered.flip(0, tampered.json[0] ^ b'2');
    assert!(refused(request(b"{}", ""), tampered).contains("SHA-256"));
    assert!(refused(request(b"{}", ""), input(b"{oops")).contains("not valid JSON"));
    let ok = submission(request(b"{}", "k"), input(b"[1]"), "tp".into(), &config).unwrap();
    assert_eq!(ok.input_value, json!([1]));
    assert_eq!(ok.idempotency_key.as_deref(), Some("k"));
    assert_eq!(ok.traceparent, "tp");
    let mut missing = request(b"{}", "");
    assert_eq!(
        submitted_input(&mut missing).unwrap_err().to_string(),
        "input: a run needs an input (JSON)"
    );
}

#[test]
fn a_query_names_the_field_it_gets_wrong() {
    let config = Config::default();
    let query = |run_id: &str, workflow_id: &str, text: &str, k: u32| v1::QueryDecisionsRequest {
        run_id: run_id.into(),
        workflow_id: workflow_id.into(),
        text: text.into(),
        agent: String::new(),
        k,
    };
    let refused = |request| decision_query(request, &config).unwrap_err().to_string();
    assert!(refused(query("r", "", " \n", 5)).contains("text: a query needs some text"));
    assert!(refused(query("r", "w", "theme", 5)).contains("run_id, workflow_id:"));
    assert!(refused(query("", "", "theme", 5)).contains("run_id, workflow_id:"));
    assert!(
        refused(query("r", "", "theme", 101))
            .contains("k: 101 matches asked for; the limit is 100")
    );
    let read = decision_query(query("", "w", "theme", 0), &config).unwrap();
    assert_eq!(read.scope, Scope::Workflow("w".into()));
    assert_eq!((read.k, read.agent), (5, None));
}

fn list_request(status: &str, workflow_id: &str, page_token: &str) -> v1::ListRunsRequest {
    v1::ListRunsRequest {
        limit: 7,
        status: status.into(),
        workflow_id: workflow_id.into(),
        page_token: page_token.into(),
    }
}

#[test]
fn a_list_request_reads_its_filters_and_page_token() {
    let query = run_query(list_request("", "", ""), &Config::default()).unwrap();
    assert_eq!(query, crate::store::RunQuery::newest(7));

    let query = run_query(
        list_request("failed", "nightly", "1700000000000.run-9"),
        &Config::default(),
    )
    .unwrap();
    assert_eq!(query.status, Some(baton_core::RunStatus::Failed));
    assert_eq!(query.workflow_id.as_deref(), Some("nightly"));
    assert_eq!(
        query.after,
        Some(crate::store::RunCursor {
            created_ms: 1_700_000_000_000,
            run_id: "run-9".into(),
        })
    );
}

#[test]
fn a_list_request_names_the_field_it_cannot_read() {
    let error = run_query(list_request("done", "", ""), &Config::default()).unwrap_err();
    assert!(
        matches!(&error, Error::UnknownRunStatus { field: "status", value } if value == "done"),
        "{error}"
    );
    assert!(error.to_string().starts_with("status: \"done\""), "{error}");
    assert_eq!(
        tonic::Status::from(error).code(),
        tonic::Code::InvalidArgument
    );

    for token in ["17000", "x.run", "1.", "+1.run"] {
        let error = run_query(list_request("", "", token), &Config::default()).unwrap_err();
        assert!(
            matches!(
                &error,
                Error::MalformedPageToken {
                    field: "page_token",
                    ..
                }
            ),
            "{token:?}: {error}"
        );
        assert!(error.to_string().starts_with("page_token: "), "{error}");
        assert_eq!(
            tonic::Status::from(error).code(),
            tonic::Code::InvalidArgument
        );
    }
}
