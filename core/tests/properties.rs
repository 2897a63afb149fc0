//! Property tests: invariants of the context, the engine and the small languages that must hold
//! for every input, not only for the examples the other suites spell out.
//!
//! 1. Adding results never changes an earlier context.
//! 2. Every branch of a parallel step gets the same snapshot; the merge keeps workflow order.
//! 3. The condition parser and evaluator never panic.
//! 4. The path parser and resolver never panic, and a path that follows a document finds its
//!    value.
//! 5. Replaying a run's events rebuilds the same run.
//! 6. No data is lost across handoffs: the context is the union of the steps' latest results.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use baton_core::eval::expr::Expr;
use baton_core::eval::path::Path;
use baton_core::{Context, Decision, Event, Run, RunStatus, StepResult};
use common::Driver;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Map, Value, json};

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

/// A string strategy from a regex compiled once (a `&str` strategy compiles it for every value).
fn re(pattern: &str) -> proptest::string::RegexGeneratorStrategy<String> {
    proptest::string::string_regex(pattern).unwrap_or_else(|e| panic!("{pattern}: {e}"))
}

/// Object keys: mostly short identifiers, sometimes anything printable (or empty), so that paths
/// need the bracketed form.
fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => re("[a-e]{1,3}"),
        1 => re("[ -~]{0,4}"),
        1 => re("\\PC{0,3}"),
    ]
}

/// A small recursive JSON value.
fn arb_json() -> impl Strategy<Value = Value> {
    json_value(3, 24)
}

/// A smaller one, for the contexts parsers are evaluated against (generation dominates there).
fn small_json() -> impl Strategy<Value = Value> {
    json_value(2, 8)
}

/// Recursive JSON at most `depth` deep, aiming at `size` nodes.
fn json_value(depth: u32, size: u32) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // `Value::from` turns NaN and infinities into null, as JSON has no such numbers.
        any::<f64>().prop_map(Value::from),
        re("\\PC{0,8}").prop_map(Value::String),
    ];
    leaf.prop_recursive(depth, size, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(arb_key(), inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// An agent's answer: data, or sometimes an error.
fn arb_answer() -> impl Strategy<Value = Result<Value, String>> {
    answer_from(arb_json())
}

fn answer_from(data: impl Strategy<Value = Value>) -> impl Strategy<Value = Result<Value, String>> {
    prop_oneof![
        5 => data.prop_map(Ok),
        1 => re("[a-z ]{0,12}").prop_map(Err),
    ]
}

/// A context built from random (key, data) additions, the keys short so that paths hit them.
fn arb_context() -> impl Strategy<Value = Context> {
    (
        small_json(),
        prop::collection::vec((re("[a-e]"), 1..4u32, answer_from(small_json())), 0..6),
    )
        .prop_map(|(input, additions)| {
            additions
                .into_iter()
                .fold(Context::new(input), |context, (key, visit, answer)| {
                    context.with_result(key.as_str().into(), result(&key, visit, answer))
                })
        })
}

fn result(key: &str, visit: u32, answer: Result<Value, String>) -> StepResult {
    match answer {
        Ok(data) => StepResult::success(key.into(), visit, Arc::new(data)),
        Err(error) => StepResult::failure(key.into(), visit, error.as_str().into()),
    }
}

/// Strings over the condition language's alphabet, so that many of them parse.
fn expression_text() -> impl Strategy<Value = String> {
    // `select` rather than one `prop_oneof!` arm per token: a wide union is slow in debug builds.
    const FIXED: &[&str] = &[
        "context",
        "input",
        ".",
        "[",
        "]",
        "\"",
        "'",
        "(",
        ")",
        "!",
        "=",
        "<",
        ">",
        "&",
        "|",
        "-",
        " ",
        "\\",
        "true",
        "null",
        "undefined",
        "e",
    ];
    let token = prop_oneof![
        6 => prop::sample::select(FIXED).prop_map(str::to_owned),
        1 => re("[0-9]{1,3}"),
        1 => re("[a-z]{1,2}"),
    ];
    prop::collection::vec(token, 0..40).prop_map(|tokens| tokens.concat())
}

/// Well-formed conditions: paths and literals joined by every operator, negated and bracketed.
fn well_formed_expression() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        3 => re("(context|input)((\\.[a-e0-3]{1,2})|(\\[[0-3]\\])|(\\[\"[a-e]\"\\])){0,3}"),
        1 => prop_oneof![Just("true"), Just("false"), Just("null"), Just("undefined")]
            .prop_map(str::to_owned),
        1 => re("-?[0-9]{1,3}(\\.[0-9]{1,2})?(e-?[0-9])?"),
        1 => re("'[a-z 0-9]{0,4}'|\"[a-z 0-9]{0,4}\""),
    ];
    let operator =
        prop::sample::select(&["===", "!==", "==", "!=", "<", "<=", ">", ">=", "&&", "||"][..]);
    leaf.prop_recursive(4, 32, 2, move |inner| {
        prop_oneof![
            (
                inner.clone(),
                operator.clone(),
                inner.clone(),
                re("[ ]{0,2}")
            )
                .prop_map(|(left, op, right, space)| format!("{left}{space}{op}{space}{right}")),
            inner.clone().prop_map(|e| format!("!{e}")),
            inner.prop_map(|e| format!("( {e})")),
        ]
    })
}

/// A well-formed condition with one random edit: a token inserted or a slice cut out, so that
/// the parser meets almost-valid input.
fn mutated_expression() -> impl Strategy<Value = String> {
    (
        well_formed_expression(),
        expression_text(),
        any::<Index>(),
        any::<Index>(),
        any::<bool>(),
    )
        .prop_map(|(text, token, at, to, insert)| {
            let chars: Vec<char> = text.chars().collect();
            let at = at.index(chars.len() + 1);
            if insert {
                let mut out: String = chars[..at].iter().collect();
                out.push_str(&token);
                out.extend(&chars[at..]);
                out
            } else {
                let to = at + to.index(chars.len() - at + 1);
                chars[..at].iter().chain(&chars[to..]).collect()
            }
        })
}

/// Strings over the path language's alphabet.
fn path_text() -> impl Strategy<Value = String> {
    const FIXED: &[&str] = &[
        "context", "input", ".", "[", "]", "\"", "'", "\\", "-", "_", "$", " ",
    ];
    let token = prop_oneof![
        5 => prop::sample::select(FIXED).prop_map(str::to_owned),
        1 => re("[0-9]{1,3}"),
        1 => re("[a-e]{1,2}"),
        1 => re("\\PC"),
    ];
    let tokens = prop::collection::vec(token, 0..30).prop_map(|tokens| tokens.concat());
    // Well-formed paths too, so that resolution is exercised on hits as well as misses.
    let well_formed = re(
        "(context|input)((\\.[a-e0-3]{1,2})|(\\[ ?[0-3] ?\\])|(\\[\"[a-e]\"\\])|(\\['[a-e]'\\])){0,6}",
    );
    prop_oneof![tokens, well_formed]
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn step_ids(ids: &[String]) -> Vec<Value> {
    ids.iter()
        .map(|id| json!({"id": id, "type": "agent", "agent": format!("agent-{id}")}))
        .collect()
}

/// Answers the driver's pending task for `step_id` with `answer`.
fn answer(driver: &mut Driver, step_id: &str, answer: &Result<Value, String>) {
    let result = match answer {
        Ok(data) => Ok(data.clone()),
        Err(error) => Err(error.as_str()),
    };
    driver.answer(step_id, result);
}

/// Whether `id` may name a step: not a payload key Baton reserves.
fn usable_id(id: &str) -> bool {
    !["input", "context", "error", "messages", "handoff"].contains(&id)
}

// ---------------------------------------------------------------------------------------------
// 1. Adding results never changes an earlier context
// ---------------------------------------------------------------------------------------------

type Snapshot = (Value, BTreeMap<String, Vec<StepResult>>);

fn snapshot(context: &Context, keys: &BTreeSet<String>) -> Snapshot {
    let versions = keys
        .iter()
        .map(|key| (key.clone(), context.versions(key).cloned().collect()))
        .collect();
    (context.to_value(), versions)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn adding_results_never_changes_an_earlier_context(
        input in arb_json(),
        additions in prop::collection::vec((re("[a-e]{1,2}"), 1..5u32, arb_answer()), 0..24),
    ) {
        let keys: BTreeSet<String> = additions.iter().map(|(key, _, _)| key.clone()).collect();
        let mut contexts = vec![Context::new(input.clone())];
        let mut recorded = vec![snapshot(&contexts[0], &keys)];
        // What the context should show: the latest version per key, hidden when it failed.
        let mut model: BTreeMap<String, Vec<StepResult>> = BTreeMap::new();
        for (key, visit, outcome) in additions {
            let added = result(&key, visit, outcome);
            model.entry(key.clone()).or_default().push(added.clone());
            let next = contexts.last().unwrap().with_result(key.as_str().into(), added);
            let made = snapshot(&next, &keys);
            let expected: Map<String, Value> = model
                .iter()
                .filter_map(|(key, versions)| {
                    Some((key.clone(), Value::clone(versions.last()?.data()?)))
                })
                .collect();
            prop_assert_eq!(&made.0, &Value::Object(expected));
            for key in &keys {
                let versions = model.get(key).cloned().unwrap_or_default();
                prop_assert_eq!(&made.1[key], &versions);
            }
            contexts.push(next);
            recorded.push(made);
        }
        for (i, (context, made)) in contexts.iter().zip(&recorded).enumerate() {
            prop_assert_eq!(&snapshot(context, &keys), made, "context #{} changed", i);
            prop_assert_eq!(context.input().as_ref(), &input);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Every branch of a parallel step gets the same snapshot
// ---------------------------------------------------------------------------------------------

/// A workflow with `before` agent steps, then a parallel step of branches; a branch may name an
/// earlier step as its `input`. Everything the run needs: its shape, answers and answer order.
#[derive(Debug, Clone)]
struct ParallelCase {
    input: Value,
    before: Vec<Value>,
    /// Per branch: the index of the earlier step it names as `input`, if any.
    branch_inputs: Vec<Option<usize>>,
    branch_answers: Vec<Result<Value, String>>,
    /// The order branches are answered in: a permutation of their indexes.
    order: Vec<usize>,
}

fn parallel_case() -> impl Strategy<Value = ParallelCase> {
    (1..12usize, 1..20usize).prop_flat_map(|(before, branches)| {
        (
            arb_json(),
            prop::collection::vec(arb_json(), before),
            prop::collection::vec(prop::option::weighted(0.4, 0..before), branches),
            prop::collection::vec(arb_answer(), branches),
            Just((0..branches).collect::<Vec<_>>()).prop_shuffle(),
        )
            .prop_map(|(input, before, branch_inputs, branch_answers, order)| {
                ParallelCase {
                    input,
                    before,
                    branch_inputs,
                    branch_answers,
                    order,
                }
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn all_branches_of_a_parallel_step_get_identical_snapshots(case in parallel_case()) {
        let earlier: Vec<String> = (0..case.before.len()).map(|i| format!("s{i}")).collect();
        let branch_ids: Vec<String> =
            (0..case.branch_inputs.len()).map(|i| format!("b{i}")).collect();
        let mut steps = step_ids(&earlier);
        let branches: Vec<Value> = branch_ids
            .iter()
            .zip(&case.branch_inputs)
            .map(|(id, input)| {
                let mut branch = json!({"id": id, "type": "agent", "agent": "tester"});
                if let Some(k) = input {
                    branch["input"] = json!(earlier[*k]);
                }
                branch
            })
            .collect();
        steps.push(json!({"id": "fan-out", "type": "parallel", "steps": branches}));
        let text = serde_json::to_string(&json!({"id": "parallel", "steps": steps})).unwrap();

        let mut driver = Driver::start(&text, case.input.clone());
        for (id, data) in earlier.iter().zip(&case.before) {
            answer(&mut driver, id, &Ok(data.clone()));
        }
        // The context at the moment the parallel step started: the earlier steps' data only.
        let expected: Map<String, Value> = earlier
            .iter()
            .cloned()
            .zip(case.before.iter().cloned())
            .collect();
        let expected = Value::Object(expected);
        prop_assert_eq!(&driver.run.context().to_value(), &expected);
        let mut queued = driver.queue_ids();
        queued.sort();
        let mut all_branches = branch_ids.clone();
        all_branches.sort();
        prop_assert_eq!(queued, all_branches, "every branch is dispatched at once");

        for &i in &case.order {
            answer(&mut driver, &branch_ids[i], &case.branch_answers[i]);
        }
        prop_assert_eq!(driver.finished.clone(), Some((RunStatus::Succeeded, None)));

        // Payloads are read only now, after every branch settled: a snapshot must not have
        // picked up a sibling's result (or the parallel step's) in the meantime.
        for (i, id) in branch_ids.iter().enumerate() {
            let payload = driver.payload_of(id);
            prop_assert_eq!(&payload["context"], &expected, "branch {} saw another context", id);
            prop_assert_eq!(&payload["input"], &case.input);
            for sibling in branch_ids.iter().chain([&"fan-out".to_owned()]) {
                prop_assert!(payload["context"].get(sibling).is_none());
                prop_assert!(payload.get(sibling).is_none());
            }
            let mut keys: Vec<&str> = payload.as_object().unwrap().keys().map(String::as_str).collect();
            keys.sort_unstable();
            match case.branch_inputs[i] {
                Some(k) => {
                    prop_assert_eq!(&payload[&earlier[k]], &case.before[k]);
                    let mut want = vec!["context", "handoff", "input", "messages", earlier[k].as_str()];
                    want.sort_unstable();
                    prop_assert_eq!(keys, want);
                }
                None => prop_assert_eq!(keys, vec!["context", "handoff", "input", "messages"]),
            }
            // Every branch is handed over by the last agent before the parallel step.
            let last = earlier.last().expect("at least one earlier step");
            prop_assert_eq!(&payload["handoff"]["source_agent"], &json!(format!("agent-{last}")));
            prop_assert_eq!(&payload["handoff"]["step_id"], &json!(id));
        }

        // The merge lists branches in workflow order, whatever order they finished in.
        let merged = driver.run.context().data("fan-out").expect("the parallel step's data");
        let entries: Vec<Value> = branch_ids
            .iter()
            .zip(&case.branch_answers)
            .map(|(id, outcome)| match outcome {
                Ok(data) => json!({"stepId": id, "status": "fulfilled", "result": data, "error": null}),
                Err(error) => json!({"stepId": id, "status": "rejected", "result": null, "error": error}),
            })
            .collect();
        let success = case.branch_answers.iter().all(Result::is_ok);
        prop_assert_eq!(merged.as_ref(), &json!({"success": success, "data": entries}));
        // The branches' own results never enter the context by their ids.
        let mut with_merge = expected.as_object().unwrap().clone();
        with_merge.insert("fan-out".into(), Value::clone(merged));
        prop_assert_eq!(driver.run.context().to_value(), Value::Object(with_merge));
    }
}

// ---------------------------------------------------------------------------------------------
// 3. The condition parser and evaluator never panic
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_expression_parser_never_panics_on_any_string(
        text in ".*",
        context in arb_context(),
    ) {
        if let Ok(expr) = Expr::parse(&text, 64) {
            let _ = expr.is_true(&context);
        }
    }

    #[test]
    fn the_expression_parser_never_panics_on_its_own_alphabet(
        text in expression_text(),
        context in arb_context(),
    ) {
        if let Ok(expr) = Expr::parse(&text, 64) {
            let _ = expr.is_true(&context);
            let _ = expr.paths();
        }
    }

    #[test]
    fn well_formed_expressions_parse_and_evaluate(
        text in well_formed_expression(),
        context in arb_context(),
    ) {
        let expr = Expr::parse(&text, 64).map_err(TestCaseError::fail)?;
        let value = expr.is_true(&context);
        // Brackets and a double negation change nothing.
        let bracketed = Expr::parse(&format!("({text})"), 64).map_err(TestCaseError::fail)?;
        prop_assert_eq!(bracketed.is_true(&context), value);
        let negated = Expr::parse(&format!("!!({text})"), 64).map_err(TestCaseError::fail)?;
        prop_assert_eq!(negated.is_true(&context), value);
    }

    #[test]
    fn the_expression_parser_never_panics_on_almost_valid_input(
        text in mutated_expression(),
        context in arb_context(),
    ) {
        if let Ok(expr) = Expr::parse(&text, 64) {
            let _ = expr.is_true(&context);
        }
    }

    /// Nesting is bounded by the depth limit, exactly: each `!` and each `(` uses one level,
    /// and the literal inside needs one more.
    #[test]
    fn nesting_parses_up_to_the_depth_limit_and_is_refused_beyond(
        levels in prop::collection::vec(any::<bool>(), 0..90),
    ) {
        let opens: String = levels.iter().map(|&paren| if paren { "(" } else { "!" }).collect();
        let closes = ")".repeat(levels.iter().filter(|&&paren| paren).count());
        let text = format!("{opens}true{closes}");
        let parsed = Expr::parse(&text, 64);
        prop_assert_eq!(parsed.is_ok(), levels.len() <= 63, "{}: {:?}", text, parsed);
        if let Ok(expr) = parsed {
            let negations = levels.iter().filter(|&&paren| !paren).count();
            prop_assert_eq!(expr.is_true(&Context::new(Value::Null)), negations % 2 == 0);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 4. The path parser and resolver never panic
// ---------------------------------------------------------------------------------------------

/// One way down into a value, and how to write it.
fn render_walk(root: &Value, picks: &[(Index, bool)]) -> (String, Value) {
    let mut text = String::new();
    let mut value = root;
    for (pick, dotted) in picks {
        match value {
            Value::Object(map) if !map.is_empty() => {
                let (key, next) = map.iter().nth(pick.index(map.len())).unwrap();
                let plain = !key.is_empty()
                    && key
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_-$".contains(c));
                if plain && *dotted {
                    text.push('.');
                    text.push_str(key);
                } else {
                    // JSON's escapes are a subset of what the path's quoted keys accept.
                    text.push('[');
                    text.push_str(&serde_json::to_string(key).unwrap());
                    text.push(']');
                }
                value = next;
            }
            Value::Array(items) if !items.is_empty() => {
                let i = pick.index(items.len());
                if *dotted {
                    text.push_str(&format!(".{i}"));
                } else {
                    text.push_str(&format!("[{i}]"));
                }
                value = &items[i];
            }
            _ => break,
        }
    }
    (text, value.clone())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_path_parser_never_panics_on_any_string(text in ".*", context in arb_context()) {
        if let Ok(path) = Path::parse(&text) {
            let _ = path.resolve(&context);
            let _ = path.resolve_strict(&context);
            let _ = path.first_context_key();
        }
    }

    #[test]
    fn resolving_parsed_paths_never_panics(text in path_text(), context in arb_context()) {
        if let Ok(path) = Path::parse(&text) {
            let strict = path.resolve_strict(&context).ok();
            prop_assert_eq!(path.resolve(&context), strict);
        }
    }

    /// A path written along a document's own structure finds the value there.
    #[test]
    fn a_path_that_follows_the_document_finds_its_value(
        input in arb_json(),
        data in arb_json(),
        key in "[a-z][a-z0-9_-]{0,6}",
        from_context in any::<bool>(),
        picks in prop::collection::vec((any::<Index>(), any::<bool>()), 0..6),
    ) {
        let context = Context::new(input.clone())
            .with_result(key.as_str().into(), StepResult::success(key.as_str().into(), 1, Arc::new(data.clone())));
        let (root, root_value) = if from_context {
            (format!("context.{key}"), &data)
        } else {
            ("input".to_owned(), &input)
        };
        let (walk, expected) = render_walk(root_value, &picks);
        let text = format!("{root}{walk}");
        let path = Path::parse(&text).map_err(TestCaseError::fail)?;
        prop_assert_eq!(&path.text, &text);
        prop_assert_eq!(path.resolve(&context), Some(&expected), "{}", text);
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Replay is deterministic
// ---------------------------------------------------------------------------------------------

/// What a transform of a linear workflow reads.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Input,
    InputField,
    /// `context.<step>`: an earlier step.
    Step,
    StepField,
    /// `context.<step>` for any step, later ones too: fails at run time when it has not run.
    AnyStep,
    JqKeys,
    JqDocument,
    /// A jq program that always fails.
    JqError,
}

/// One step of a linear workflow: an agent, or a transform.
#[derive(Debug, Clone)]
enum LinearStep {
    Agent,
    Transform { shape: Shape, target: Index },
}

fn linear_step() -> impl Strategy<Value = LinearStep> {
    let shape = prop_oneof![
        2 => Just(Shape::Input),
        2 => Just(Shape::InputField),
        3 => Just(Shape::Step),
        2 => Just(Shape::StepField),
        1 => Just(Shape::AnyStep),
        2 => Just(Shape::JqKeys),
        2 => Just(Shape::JqDocument),
        1 => Just(Shape::JqError),
    ];
    prop_oneof![
        3 => Just(LinearStep::Agent),
        2 => (shape, any::<Index>())
            .prop_map(|(shape, target)| LinearStep::Transform { shape, target }),
    ]
}

fn linear_workflow(steps: &[LinearStep]) -> String {
    let ids: Vec<String> = (0..steps.len()).map(|i| format!("s{i}")).collect();
    let body: Vec<Value> = steps
        .iter()
        .enumerate()
        .map(|(i, step)| match step {
            LinearStep::Agent => json!({"id": ids[i], "type": "agent", "agent": "worker"}),
            LinearStep::Transform { shape, target } => {
                let earlier = &ids[target.index(i.max(1))];
                let any = &ids[target.index(ids.len())];
                let transform = match shape {
                    Shape::Input => "input".to_owned(),
                    Shape::InputField => "input.a".to_owned(),
                    // The first step has no earlier step to read.
                    Shape::Step if i == 0 => "input".to_owned(),
                    Shape::StepField if i == 0 => "input.a".to_owned(),
                    Shape::Step => format!("context.{earlier}"),
                    Shape::StepField => format!("context.{earlier}.a"),
                    Shape::AnyStep => format!("context.{any}"),
                    Shape::JqKeys => "jq: .context | keys".to_owned(),
                    Shape::JqDocument => "jq: [.input, .context]".to_owned(),
                    Shape::JqError => "jq: error(\"boom\")".to_owned(),
                };
                json!({"id": ids[i], "type": "transform", "transform": transform})
            }
        })
        .collect();
    serde_json::to_string(&json!({"id": "linear", "steps": body})).unwrap()
}

type RunState = (RunStatus, Option<String>, Value, usize);

fn state(run: &Run) -> RunState {
    (
        run.status(),
        run.error().map(str::to_owned),
        run.context().to_value(),
        run.history().len(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn replaying_the_events_rebuilds_the_same_run(
        steps in prop::collection::vec(linear_step(), 1..10),
        input in prop_oneof![arb_json(), arb_json().prop_map(|a| json!({"a": a}))],
        answers in prop::collection::vec(
            prop_oneof![arb_answer(), arb_json().prop_map(|a| Ok(json!({"a": a})))],
            10,
        ),
        cancel_after in prop::option::weighted(0.2, 0..10usize),
    ) {
        let text = linear_workflow(&steps);
        let mut driver = Driver::start(&text, input.clone());
        // The state after each number of events applied (the driver applies `Continue`
        // itself where the walk stops before a jq transform, so one answer may be several).
        let mut states = vec![(driver.events.len(), state(&driver.run))];
        let mut answers = answers.iter();
        while driver.finished.is_none() {
            if cancel_after == Some(driver.events.len()) {
                driver.apply(Event::Cancel { reason: "stop".into() });
            } else {
                let step = driver.queue.front().expect("a linear run waits for one agent").task.step_id.clone();
                answer(&mut driver, &step, answers.next().unwrap());
            }
            states.push((driver.events.len(), state(&driver.run)));
        }
        let workflow = driver.run.workflow().clone();
        let replayed = Run::replay(workflow.clone(), input.clone(), driver.events.clone())
            .map_err(|(i, error)| TestCaseError::fail(format!("event {i}: {error}")))?;
        prop_assert_eq!(state(&replayed), state(&driver.run));
        prop_assert_eq!(replayed.history(), driver.run.history());
        for (n, expected) in &states {
            let n = *n;
            let prefix = Run::replay(workflow.clone(), input.clone(), driver.events[..n].to_vec())
                .map_err(|(i, error)| TestCaseError::fail(format!("event {i}: {error}")))?;
            prop_assert_eq!(&state(&prefix), expected, "after {} events", n);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 6. Zero loss across handoffs
// ---------------------------------------------------------------------------------------------

/// Distinct step ids in a random order.
fn arb_ids() -> impl Strategy<Value = Vec<String>> {
    prop::collection::btree_set(
        re("[a-z][a-z0-9_-]{0,10}").prop_filter("reserved", |id| usable_id(id)),
        1..20,
    )
    .prop_map(|ids| ids.into_iter().collect::<Vec<_>>())
    .prop_shuffle()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_final_context_is_the_union_of_every_steps_result(
        (ids, results) in arb_ids().prop_flat_map(|ids| {
            let n = ids.len();
            (Just(ids), prop::collection::vec(arb_json(), n))
        }),
        input in arb_json(),
    ) {
        let text = serde_json::to_string(&json!({"steps": step_ids(&ids)})).unwrap();
        let mut driver = Driver::start(&text, input.clone());
        let mut expected = Map::new();
        prop_assert_eq!(ids.len(), results.len());
        for (id, data) in ids.iter().zip(&results) {
            let task = driver.answer(id, Ok(data.clone()));
            // Each handoff carries everything before it, nothing more.
            prop_assert_eq!(task.payload.context.to_value(), Value::Object(expected.clone()));
            prop_assert_eq!(task.payload.context.input().as_ref(), &input);
            expected.insert(id.clone(), data.clone());
        }
        prop_assert_eq!(driver.finished.clone(), Some((RunStatus::Succeeded, None)));
        prop_assert_eq!(driver.run.context().to_value(), Value::Object(expected));
    }

    /// With a loop back (an approval rejected a few times), each step's latest data wins and
    /// nothing else is lost. (Generated ids are lower case, so "Gate" is free.)
    #[test]
    fn after_loops_the_context_holds_each_steps_latest_result(
        (ids, rounds) in (arb_ids(), 1..4usize).prop_flat_map(|(ids, rounds)| {
            let n = ids.len();
            let data = prop::collection::vec(arb_json(), n);
            (Just(ids), prop::collection::vec(data, rounds))
        }),
    ) {
        let mut steps = step_ids(&ids);
        steps.push(json!({"id": "Gate", "type": "approval", "on_reject": ids[0]}));
        let text = serde_json::to_string(&json!({"steps": steps})).unwrap();
        let mut driver = Driver::start(&text, Value::Null);
        let mut latest = Map::new();
        for (round, results) in rounds.iter().enumerate() {
            for (id, data) in ids.iter().zip(results) {
                let task = driver.answer(id, Ok(data.clone()));
                prop_assert_eq!(task.task.visit as usize, round + 1);
                latest.insert(id.clone(), data.clone());
            }
            let decision = if round + 1 == rounds.len() {
                Decision::approve()
            } else {
                Decision::reject(format!("round {round}"))
            };
            latest.insert("Gate".into(), decision.to_value());
            driver.decide("Gate", decision);
        }
        prop_assert_eq!(driver.finished.clone(), Some((RunStatus::Succeeded, None)));
        prop_assert_eq!(driver.run.context().to_value(), Value::Object(latest));
        for id in &ids {
            prop_assert_eq!(driver.run.context().versions(id).count(), rounds.len());
        }
    }
}
