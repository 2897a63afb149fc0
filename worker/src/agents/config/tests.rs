//! The tests of `config.rs`: reading an agents file, the kinds, the errors and their lines.

use std::time::Duration;

use super::testing::{agent_error, parse};
use super::*;
use crate::agents::AgentsFile;

#[test]
fn a_valid_file() {
    let file = parse(
        r#"
[agents.planner]
kind = "command"
command = ["python3", "planner.py", "--fast"]
timeout_ms = 30000
env = { MODEL = "small" }

[agents.coder]
kind = "template"
template = '{"files": {{json context.plan.files}} }'
"#,
    )
    .unwrap();
    assert_eq!(file.agents.keys().collect::<Vec<_>>(), ["coder", "planner"]);
    let crate::agents::Agent::Command(planner) = file.get("planner").unwrap() else {
        panic!("planner is a command agent");
    };
    assert_eq!(planner.program(), Path::new("python3"));
    assert_eq!(planner.args(), ["planner.py", "--fast"]);
    assert_eq!(planner.dir(), Path::new("/tmp"));
    assert_eq!(planner.timeout(), Some(Duration::from_secs(30)));
    assert_eq!(
        planner.env().get("MODEL").map(String::as_str),
        Some("small")
    );
    assert_eq!(file.get("coder").unwrap().kind(), "template");
}

#[test]
fn an_empty_file_has_no_agents() {
    assert!(parse("").unwrap().agents.is_empty());
}

#[test]
fn unknown_kind() {
    let (problem, message) = agent_error("[agents.coder]\nkind = \"python\"\n", "coder", "kind", 2);
    assert!(matches!(problem, Problem::UnknownKind { ref kind, .. } if kind == "python"));
    assert!(message.contains("unknown value \"python\""), "{message}");
}

/// The messages that list kinds, or say which kind a field belongs to, are built from the
/// table of kinds: word for word what they were when they were written out.
#[test]
fn messages_that_name_kinds() {
    for (text, expected) in [
        (
            "[agents.a]\n",
            "<inline agents.toml>:1: agent \"a\": field `kind` is missing (expected \"command\", \"template\" or \"llm\")",
        ),
        (
            "[agents.a]\nkind = \"python\"\n",
            "<inline agents.toml>:2: agent \"a\": field `kind` has unknown value \"python\" (expected \"command\", \"template\" or \"llm\")",
        ),
        (
            "[agents.a]\nkind = 1\n",
            "<inline agents.toml>:2: agent \"a\": field `kind` must be \"command\", \"template\" or \"llm\", found integer",
        ),
        (
            "[agents.a]\nkind = \"command\"\ntemplate = \"{}\"\n",
            "<inline agents.toml>:3: agent \"a\": field `template` does not apply to kind \"command\" (it belongs to kind \"template\")",
        ),
        (
            "[agents.a]\nkind = \"template\"\nzzz = 1\n",
            "<inline agents.toml>:3: agent \"a\": field `zzz` is not a known field (expected one of: kind, template, template_file, delay_ms)",
        ),
    ] {
        assert_eq!(parse(text).unwrap_err().to_string(), expected);
    }
}

#[test]
fn missing_kind() {
    let (problem, _) = agent_error("\n[agents.coder]\ntemplate = \"{}\"\n", "coder", "kind", 2);
    assert!(matches!(problem, Problem::Missing { .. }));
}

#[test]
fn kind_of_the_wrong_type() {
    let (problem, message) = agent_error("[agents.a]\nkind = 1\n", "a", "kind", 2);
    assert!(matches!(problem, Problem::Invalid(_)));
    assert!(message.contains("found integer"), "{message}");
}

#[test]
fn unknown_fields() {
    let (problem, message) = agent_error(
        "[agents.planner]\nkind = \"command\"\ncommand = [\"x\"]\ntimeout = 5\nzzz = 1\n",
        "planner",
        "timeout",
        4,
    );
    assert!(matches!(problem, Problem::UnknownField { .. }));
    assert!(
        message.contains("expected one of: kind, command, timeout_ms, env"),
        "{message}"
    );
    // A field of the other kind says so.
    let (problem, message) = agent_error(
        "[agents.planner]\nkind = \"command\"\ncommand = [\"x\"]\ntemplate = \"{}\"\n",
        "planner",
        "template",
        4,
    );
    assert!(matches!(problem, Problem::WrongKind { .. }));
    assert!(
        message.contains("belongs to kind \"template\""),
        "{message}"
    );
}

#[test]
fn unknown_top_level_keys() {
    let err = parse("[agent.planner]\nkind = \"command\"\n").unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, ConfigError::Toml { line: Some(1), .. }),
        "{err:?}"
    );
    assert!(message.contains("agent"), "{message}");
}

#[test]
fn an_agent_that_is_not_a_table() {
    let err = parse("[agents]\nplanner = \"python3 planner.py\"\n").unwrap_err();
    assert!(
        matches!(err, ConfigError::Toml { line: Some(2), .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("[agents.planner]"), "{err}");
}

#[test]
fn toml_syntax_errors_have_their_line() {
    let err = parse("[agents.a]\nkind = \"command\"\ncommand = [\"x\"\n").unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Toml {
                line: Some(3..=4),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().starts_with("<inline agents.toml>:"),
        "{err}"
    );
}

#[test]
fn unreadable_agents_file() {
    let err = AgentsFile::load(Path::new("/nonexistent/agents.toml")).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    assert!(
        err.to_string()
            .starts_with("cannot read agents file /nonexistent/agents.toml: "),
        "{err}"
    );
}

#[test]
fn line_numbers() {
    assert_eq!(line_of("a\nb\nc", 0), 1);
    assert_eq!(line_of("a\nb\nc", 2), 2);
    assert_eq!(line_of("a\nb\nc", 100), 3);
}
