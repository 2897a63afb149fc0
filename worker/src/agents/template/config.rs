//! The `template` kind's fields in an agents file, and their checks.

use super::{Template, TemplateAgent};
use crate::agents::config::{Checker, ConfigError, Fields};

/// The fields a template agent takes besides `kind`: one of the first two, and how long the
/// stand-in takes.
pub(in crate::agents) const FIELDS: &[&str] = &["template", "template_file", "delay_ms"];

/// A stand-in may take as long as a slow model, not longer.
const MAX_DELAY_MS: i64 = 10 * 60 * 1_000;

/// The template agent a table declares (its fields are all of [`FIELDS`]), its template
/// compiled, or the first problem with it.
pub(in crate::agents) fn check(
    checker: &Checker,
    mut fields: Fields,
) -> Result<TemplateAgent, ConfigError> {
    let source = checker.required_inline_or_file(
        &mut fields,
        "template",
        "template_file",
        "a Handlebars template",
    )?;
    let template =
        Template::compile(&source.text).map_err(|e| checker.compile_error(&source, e.reason))?;
    let delay = match fields.remove("delay_ms") {
        None => std::time::Duration::ZERO,
        Some(value) => value
            .get_ref()
            .as_integer()
            .filter(|ms| (0..=MAX_DELAY_MS).contains(ms))
            .map(|ms| std::time::Duration::from_millis(ms as u64))
            .ok_or_else(|| {
                checker.invalid(
                    "delay_ms",
                    &value,
                    &format!("an integer from 0 to {MAX_DELAY_MS} (milliseconds)"),
                )
            })?,
    };
    Ok(TemplateAgent::from_compiled(checker.agent_name(), template).with_delay(delay))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::agents::AgentsFile;
    use crate::agents::config::testing::agent_error;
    use crate::agents::config::{ConfigError, Problem};

    #[test]
    fn missing_template() {
        let (problem, message) = agent_error(
            "[agents.coder]\nkind = \"template\"\n",
            "coder",
            "template",
            1,
        );
        assert!(matches!(problem, Problem::Missing { .. }));
        assert!(message.contains("template_file"), "{message}");
    }

    #[test]
    fn both_template_and_template_file() {
        let (problem, message) = agent_error(
            "[agents.coder]\nkind = \"template\"\ntemplate = \"{}\"\ntemplate_file = \"c.hbs\"\n",
            "coder",
            "template_file",
            4,
        );
        assert!(matches!(problem, Problem::Conflict { .. }));
        assert!(message.contains("together with `template`"), "{message}");
    }

    #[test]
    fn a_delay_that_is_not_a_number_of_milliseconds() {
        for (value, line) in [("\"2s\"", 4), ("-1", 4), ("600001", 4)] {
            let (problem, message) = agent_error(
                &format!(
                    "[agents.coder]\nkind = \"template\"\ntemplate = \"{{}}\"\ndelay_ms = {value}\n"
                ),
                "coder",
                "delay_ms",
                line,
            );
            assert!(
                matches!(problem, Problem::Invalid(_)),
                "{value}: {problem:?}"
            );
            assert!(message.contains("milliseconds"), "{message}");
        }
    }

    #[test]
    fn template_that_does_not_compile() {
        let (problem, message) = agent_error(
            "[agents.coder]\nkind = \"template\"\ntemplate = \"{{#if x}}open\"\n",
            "coder",
            "template",
            3,
        );
        assert!(matches!(problem, Problem::TemplateCompile(_)));
        assert!(message.contains("does not compile"), "{message}");
    }

    /// The error of an agents file whose agent's `template_file` is `coder.hbs`, holding
    /// `template` (`None`: there is no such file), and the agents file's path.
    fn template_file_error(template: Option<&str>) -> (tempfile::TempDir, PathBuf, ConfigError) {
        let dir = tempfile::tempdir().unwrap();
        if let Some(template) = template {
            std::fs::write(dir.path().join("coder.hbs"), template).unwrap();
        }
        let path = dir.path().join("agents.toml");
        std::fs::write(
            &path,
            "[agents.coder]\nkind = \"template\"\ntemplate_file = \"coder.hbs\"\n",
        )
        .unwrap();
        let err = AgentsFile::load(&path).unwrap_err();
        (dir, path, err)
    }

    #[test]
    fn unreadable_template_file() {
        let (dir, path, err) = template_file_error(None);
        assert_eq!(
            err.to_string(),
            format!(
                "{}:3: agent \"coder\": field `template_file` names {}, which cannot be read: No such file or directory (os error 2)",
                path.display(),
                dir.path().join("coder.hbs").display()
            )
        );
        assert!(
            matches!(&err, ConfigError::Agent { problem, .. } if matches!(**problem, Problem::UnreadableFile { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn a_template_file_that_does_not_compile_is_named_with_line_and_column() {
        let (dir, path, err) = template_file_error(Some("{\n  \"a\": {{/if}}\n}\n"));
        let message = err.to_string();
        assert!(
            message.starts_with(&format!(
                "{}:3: agent \"coder\": field `template_file` names {}, which does not compile: line 2, col 10: ",
                path.display(),
                dir.path().join("coder.hbs").display()
            )),
            "{message}"
        );
        assert!(
            matches!(&err, ConfigError::Agent { problem, .. } if matches!(**problem, Problem::FileCompile { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn template_file_is_read_from_the_files_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("templates")).unwrap();
        std::fs::write(
            dir.path().join("templates/coder.hbs"),
            "{\"files\": {{json plan.files}}}\n",
        )
        .unwrap();
        let path = dir.path().join("agents.toml");
        std::fs::write(
            &path,
            "[agents.coder]\nkind = \"template\"\ntemplate_file = \"templates/coder.hbs\"\n",
        )
        .unwrap();
        let file = AgentsFile::load(&path).unwrap();
        let crate::agents::Agent::Template(coder) = file.get("coder").unwrap() else {
            panic!("coder is a template agent");
        };
        let out = coder
            .run(&serde_json::json!({"plan": {"files": ["a"]}}))
            .unwrap();
        assert_eq!(out, serde_json::json!({"files": ["a"]}));
    }
}
