//! The README's examples of the features a run meets when things go wrong or are looked back on
//! (issue 30): a map item failing under `tolerated_failures`, a failed run retried with `baton
//! runs retry`, and agents' decisions found with `baton decisions`. Each block is run as
//! printed, by bash, against real processes (`baton dev`, or `baton coordinator` and `baton
//! worker`), in a folder with a copy of `examples/`; only `<run id>` is filled in. What is
//! asserted is what the user sees.

#[path = "support/recipe_run.rs"]
mod recipe_run;

use recipe_run::{Ran, Recipe, block};
use serde_json::{Value, json};

/// Panics with everything printed unless `ran` exited as `success` says.
fn assert_exit(ran: &Ran, success: bool, recipe: &Recipe) {
    assert_eq!(
        ran.status.success(),
        success,
        "`{}` exited with {}\n── stdout:\n{}\n── stderr:\n{}\n{}",
        ran.code,
        ran.status,
        ran.stdout,
        ran.stderr,
        recipe.logs()
    );
}

/// The step lines of a transcript (the exchanges, indented by four, left out), trimmed, with
/// their runs of spaces made one.
fn step_lines(transcript: &str) -> Vec<String> {
    transcript
        .lines()
        .filter(|line| !line.starts_with("    "))
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// The JSON a `baton dev` transcript shows `step`'s agent returning.
fn returned(transcript: &str, step: &str) -> Value {
    let header = format!("── {step} (agent ");
    let from = transcript
        .find(&header)
        .unwrap_or_else(|| panic!("no exchange of {step}:\n{transcript}"));
    let after = &transcript[from..];
    let start = after.find("── returned:\n").expect("the agent's answer") + "── returned:\n".len();
    let json: String = after[start..]
        .lines()
        .take_while(|line| line.starts_with("    ") && !line.trim_start().starts_with("──"))
        .collect::<Vec<_>>()
        .join("\n");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

#[test]
fn a_map_item_fails_within_tolerated_failures_and_the_run_succeeds() {
    let lines = block(
        "docs/src/examples.md",
        "## A map item fails, within `tolerated_failures`",
    );
    assert_eq!(lines.len(), 1, "{lines:#?}");
    let mut recipe = Recipe::new();
    let ran = recipe.run(&lines);
    assert_exit(&ran[0], true, &recipe);
    let transcript = &ran[0].stdout;
    let steps = step_lines(transcript);
    assert!(
        steps.contains(&"✓ check-links succeeded (4 items, 1 failed) -> checked".to_owned()),
        "{transcript}"
    );
    assert!(
        steps
            .iter()
            .any(|line| line.starts_with("run ") && line.ends_with(" succeeded")),
        "{transcript}"
    );
    let error = "agent \"link-checker\" exited with code 1: docs/usage.md links to config.md, \
                 which does not exist";
    assert_eq!(
        returned(transcript, "publish"),
        json!({
            "published": ["docs/faq.md", "docs/index.md", "docs/install.md"],
            "held_back": [{"page": "docs/usage.md", "error": error}],
        }),
        "{transcript}"
    );

    // "Break a link in a second page and the step fails instead", and the run with it.
    let faq = recipe.dir().join("examples/check-links/docs/faq.md");
    let mut page = std::fs::read_to_string(&faq).unwrap();
    page.push_str("\nSee also the [changelog](changes.md).\n");
    std::fs::write(&faq, page).unwrap();
    let ran = recipe.run(&lines);
    assert_exit(&ran[0], false, &recipe);
    let transcript = &ran[0].stdout;
    let steps = step_lines(transcript);
    // (The counts may include an item still running when the second failure came: stopped,
    // it counts as failed too.)
    assert!(
        steps
            .iter()
            .any(|line| line.starts_with("✗ check-links failed (4 items, ")
                && line.ends_with(" failed): 2 of 4 items failed; tolerated_failures is 1")),
        "{transcript}"
    );
    assert!(
        steps.iter().any(|line| line.starts_with("run ")
            && line.ends_with(
                " failed: step \"check-links\" failed: 2 of 4 items failed; tolerated_failures is 1"
            )),
        "{transcript}"
    );
    assert!(!transcript.contains("── publish"), "{transcript}");
}

#[test]
fn a_failed_deploy_is_retried_and_only_what_failed_runs_again() {
    let lines = block("docs/src/examples.md", "## A failed run, retried");
    let mut recipe = Recipe::new();
    let ran = recipe.run(&lines);
    let printed = |prefix: &str| -> &Ran {
        ran.iter()
            .find(|ran| ran.code.starts_with(prefix))
            .unwrap_or_else(|| panic!("the recipe has no `{prefix}` line: {lines:#?}"))
    };

    // The submit's watch: build and test pass, deploy fails saying why, and so does the run.
    let submit = printed("baton submit");
    assert_exit(submit, false, &recipe);
    let site = recipe.dir().join("site");
    let why = format!(
        "failed: agent \"deployer\" exited with code 1: cannot deploy v1.4.0: {} does not exist",
        site.display()
    );
    let steps = step_lines(&submit.stdout);
    for wanted in ["✓ build succeeded -> test", "✓ test succeeded -> deploy"] {
        assert!(steps.contains(&wanted.to_owned()), "{}", submit.stdout);
    }
    assert!(
        steps.contains(&format!("✗ deploy {why}")),
        "{}",
        submit.stdout
    );
    let run_id = steps[0].strip_prefix("run ").expect("`run <id>` first");
    assert!(
        steps.contains(&format!("run {run_id} failed: step \"deploy\" {why}")),
        "{}",
        submit.stdout
    );

    // The retry's watch: the run so far, then deploy's second visit and announce; nothing
    // before deploy starts again.
    let retry = printed("baton runs retry");
    assert_exit(retry, true, &recipe);
    let steps = step_lines(&retry.stdout);
    let at = |wanted: &str| {
        steps
            .iter()
            .position(|line| line.starts_with(wanted))
            .unwrap_or_else(|| panic!("no `{wanted}` line:\n{}", retry.stdout))
    };
    assert!(at("↻ deploy redriven") < at("✓ deploy (visit 2) succeeded -> announce"));
    assert!(at("✓ deploy (visit 2)") < at("✓ announce succeeded"));
    assert_eq!(steps.last().unwrap(), &format!("run {run_id} succeeded"));
    // The replay of the run so far tells build and test as they happened, once each, before the
    // redrive; neither starts or settles again after it.
    let redriven = at("↻ deploy redriven");
    for step in ["build", "test"] {
        let told: Vec<usize> = steps
            .iter()
            .enumerate()
            .filter(|(_, line)| line.starts_with(&format!("▶ {step}")))
            .map(|(n, _)| n)
            .collect();
        assert!(
            told.len() <= 1 && told.iter().all(|n| *n < redriven),
            "{step} started again:\n{}",
            retry.stdout
        );
        assert!(
            !steps
                .iter()
                .any(|line| line.starts_with(&format!("✓ {step} (visit 2)"))),
            "{step} ran again:\n{}",
            retry.stdout
        );
    }

    // The run's record: build and test ran once, deploy twice, announce once.
    let get = printed("baton runs get");
    assert_exit(get, true, &recipe);
    let steps = step_lines(&get.stdout);
    assert_eq!(
        steps[0],
        format!("run {run_id} succeeded"),
        "{}",
        get.stdout
    );
    for (step, visits) in [("build", 1), ("test", 1), ("deploy", 2), ("announce", 1)] {
        assert!(
            steps
                .iter()
                .any(|line| line.starts_with(&format!("{step} succeeded visits {visits} on "))),
            "{step}, {visits} visits:\n{}",
            get.stdout
        );
    }
    let cat = printed("cat site/VERSION");
    assert_exit(cat, true, &recipe);
    assert_eq!(cat.stdout, "v1.4.0\n");
}

#[test]
fn agents_record_decisions_that_baton_decisions_finds() {
    let lines = block("docs/src/examples.md", "## Agents that record decisions");
    let mut recipe = Recipe::new();
    let ran = recipe.run(&lines);
    for each in &ran {
        assert_exit(each, true, &recipe);
    }
    let [submit, by_length, by_storage] = &ran[..] else {
        panic!("three client lines: {lines:#?}");
    };
    let run_id = submit
        .stdout
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("run "))
        .expect("`run <id>` first");
    assert!(
        submit
            .stdout
            .lines()
            .any(|line| line == format!("run {run_id} succeeded")),
        "{}",
        submit.stdout
    );

    // Every decision of the run, the planner's about the link's lifetime first.
    let found: Vec<&str> = by_length.stdout.lines().collect();
    assert_eq!(found.len(), 4, "{}", by_length.stdout);
    assert!(
        found[0].contains(
            "  Send the reset link by email, valid for 30 minutes (planner at plan #1, "
        ) && found[0].ends_with(
            "): a short-lived link limits what a leaked mailbox exposes; users reset within minutes"
        ),
        "{}",
        by_length.stdout
    );
    // Only the coder's, and only the closest.
    let found: Vec<&str> = by_storage.stdout.lines().collect();
    assert_eq!(found.len(), 1, "{}", by_storage.stdout);
    assert!(
        found[0].contains("  Store only a SHA-256 hash of each reset token (coder at code #1, ")
            && found[0].ends_with("): a leaked database must not hand out working reset links"),
        "{}",
        by_storage.stdout
    );
}
