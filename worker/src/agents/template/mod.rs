//! Handlebars templates: the `template` agent kind, and prompts.
//!
//! - this file: compiling and rendering templates, and [`TemplateAgent`].
//! - `prompt`: [`PromptTemplate`], the prompt mode the `llm` kind renders its prompts in
//!   (missing fields empty, values as JSON text; see there).
//! - `config`: the kind's fields in an agents file, and their checks.
//!
//! Every template is compiled once (at load time) into its own registry configured the same
//! way (prompts differ, see `prompt`):
//!
//! - **Strict mode.** A reference to a field that does not exist (`{{context.plna}}`) fails the
//!   render instead of printing nothing, so typos surface as errors. Handlebars 6.4 applies this
//!   to plain expressions (`{{x}}`), `{{#each x}}` and `{{#with x}}` without an `{{else}}`,
//!   `lookup` and helper arguments, but **not** to the condition of `{{#if x}}` /
//!   `{{#unless x}}`: a missing value there is simply false. That is what makes optional
//!   context work, as in the spec's prompt templates:
//!   `{{#if context.plan}}Files: {{context.plan.files}}{{/if}}` renders nothing when no plan
//!   exists yet. Guard every optional field with `{{#if}}` (or give `{{#each}}` an `{{else}}`).
//!   The comparison helpers are strict about their arguments: `{{#if (eq context.x "a")}}`
//!   fails when `context.x` does not exist, so test `{{#if context.x}}` first.
//! - **No HTML escaping.** The output is JSON or plain text, never HTML, so `{{x}}` writes the
//!   value as is (`<`, `&` and quotes untouched).
//! - **The `json` helper.** `{{x}}` writes a string without quotes, an array as `[a, b]` and an
//!   object as `[object]` (Handlebars' text rendering), which is not JSON. `{{json x}}` writes
//!   `x` as JSON: strings quoted and escaped, objects and arrays complete. **`{{json ...}}` is
//!   how to embed values safely in a JSON template**: write `{"task": {{json input}}}`, never
//!   `{"task": "{{input}}"}` (a quote or newline in the input would break the JSON).
//!   `{{json x pretty=true}}` indents the output. In strict mode a missing `x` is an error.
//!
//! Segments may contain hyphens (`context.parallel-tests.data`); `{{#each context}}` walks an
//! object in key order (alphabetical, serde_json's map order) with `{{@key}}` and `{{this}}`.

pub(super) mod config;
mod prompt;

pub use prompt::{PromptTemplate, render_prompt};

use handlebars::{
    Context, Handlebars, Helper, HelperDef, HelperResult, Output, RenderContext, RenderError,
    RenderErrorReason, TemplateErrorReason, no_escape,
};
use serde_json::Value;

use super::AgentError;

/// The name each registry holds its one template under.
const TEMPLATE_NAME: &str = "template";

/// How much of a rendered text an error quotes.
const QUOTE_CHARS: usize = 200;

/// A template that failed to compile or to render.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct TemplateError {
    /// What went wrong, with the line and column when Handlebars knows them.
    pub reason: String,
}

/// A compiled Handlebars template (strict mode, no escaping, `json` helper; see the module
/// documentation).
#[derive(Debug)]
pub struct Template {
    registry: Handlebars<'static>,
}

impl Template {
    /// Compiles `source`. Syntax errors (an unclosed block, a mismatched `{{/if}}`) are
    /// reported here; unknown helpers and missing fields only when rendering.
    pub fn compile(source: &str) -> Result<Template, TemplateError> {
        let mut registry = registry();
        registry.set_strict_mode(true);
        registry
            .register_template_string(TEMPLATE_NAME, source)
            .map_err(|e| TemplateError {
                reason: describe_template_error(&e, source),
            })?;
        Ok(Template { registry })
    }

    /// Renders the template against `data` as plain text.
    pub fn render_text(&self, data: &Value) -> Result<String, TemplateError> {
        render(&self.registry, data)
    }
}

/// A registry for one template, as templates and prompts share it: no HTML escaping, the
/// `json` helper.
fn registry() -> Handlebars<'static> {
    let mut registry = Handlebars::new();
    registry.register_escape_fn(no_escape);
    registry.register_helper("json", Box::new(JsonHelper));
    registry
}

/// The registry's one template rendered against `data`.
fn render(registry: &Handlebars<'static>, data: &Value) -> Result<String, TemplateError> {
    registry
        .render(TEMPLATE_NAME, data)
        .map_err(|e| TemplateError {
            reason: describe_render_error(&e),
        })
}

/// Compiles `source` and renders it against `data` as plain text, by the template kind's rules
/// (strict mode). Prompts for a model render by other rules: [`render_prompt`].
pub fn render_text(source: &str, data: &Value) -> Result<String, TemplateError> {
    Template::compile(source)?.render_text(data)
}

/// An agent whose answer is its template rendered against the payload, parsed as JSON.
///
/// Useful for examples, tests and glue steps that reshape context without a process.
#[derive(Debug)]
pub struct TemplateAgent {
    name: String,
    template: Template,
    /// How long it waits before answering (`delay_ms`): a stand-in that takes time like a
    /// model, so that a demo or a test can watch, cancel or lose a worker mid-step.
    delay: std::time::Duration,
}

impl TemplateAgent {
    /// Compiles `source` for the agent `name`.
    pub fn new(name: impl Into<String>, source: &str) -> Result<TemplateAgent, TemplateError> {
        Ok(TemplateAgent {
            name: name.into(),
            template: Template::compile(source)?,
            delay: std::time::Duration::ZERO,
        })
    }

    pub(super) fn from_compiled(name: impl Into<String>, template: Template) -> TemplateAgent {
        TemplateAgent {
            name: name.into(),
            template,
            delay: std::time::Duration::ZERO,
        }
    }

    /// Waits `delay` before each answer.
    pub fn with_delay(self, delay: std::time::Duration) -> TemplateAgent {
        TemplateAgent { delay, ..self }
    }

    /// How long it waits before each answer.
    pub fn delay(&self) -> std::time::Duration {
        self.delay
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The compiled template.
    pub fn template(&self) -> &Template {
        &self.template
    }

    /// Renders the template against `payload`; the text must be one JSON value.
    pub fn run(&self, payload: &Value) -> Result<Value, AgentError> {
        let text = self
            .template
            .render_text(payload)
            .map_err(|e| AgentError::Template {
                agent: self.name.clone(),
                reason: e.reason,
            })?;
        serde_json::from_str(&text).map_err(|e| AgentError::BadOutput {
            agent: self.name.clone(),
            reason: format!(
                "the rendered template is not JSON ({e}); it starts with: {}",
                quote_start(&text, QUOTE_CHARS)
            ),
        })
    }
}

/// `{{json value}}`: writes `value` as compact JSON (`pretty=true`: indented).
struct JsonHelper;

impl HelperDef for JsonHelper {
    fn call<'reg: 'rc, 'rc>(
        &self,
        h: &Helper<'rc>,
        r: &'reg Handlebars<'reg>,
        _: &'rc Context,
        _: &mut RenderContext<'reg, 'rc>,
        out: &mut dyn Output,
    ) -> HelperResult {
        let param = h
            .param(0)
            .ok_or(RenderErrorReason::ParamNotFoundForIndex("json", 0))?;
        if h.params().len() > 1 {
            return Err(RenderErrorReason::Other(format!(
                "json takes one value, got {}",
                h.params().len()
            ))
            .into());
        }
        if param.is_value_missing() && r.strict_mode() {
            return Err(RenderError::strict_error(param.relative_path()));
        }
        let pretty = h
            .hash_get("pretty")
            .is_some_and(|v| v.value().as_bool() == Some(true));
        let value = param.value();
        let text = if pretty {
            serde_json::to_string_pretty(value)
        } else {
            serde_json::to_string(value)
        }
        .map_err(RenderErrorReason::SerdeError)?;
        out.write(&text)?;
        Ok(())
    }
}

fn describe_template_error(e: &handlebars::TemplateError, source: &str) -> String {
    // The parser's own message for a syntax error lists every grammar rule it expected, which
    // helps nobody; the line in question does.
    let reason = match e.reason() {
        TemplateErrorReason::InvalidSyntax(_) => "invalid handlebars syntax".to_owned(),
        other => other.to_string(),
    };
    match e.pos() {
        Some((line, col)) => {
            let text = source.lines().nth(line.saturating_sub(1)).unwrap_or("");
            format!(
                "line {line}, col {col}: {reason} in {}",
                quote_start(text, QUOTE_CHARS)
            )
        }
        None => reason,
    }
}

fn describe_render_error(e: &RenderError) -> String {
    let reason = match e.reason() {
        RenderErrorReason::MissingVariable(Some(path)) => format!(
            "`{path}` does not exist (strict mode; guard optional values with {{{{#if {path}}}}})"
        ),
        RenderErrorReason::MissingVariable(None) => {
            "a referenced value does not exist (strict mode)".to_owned()
        }
        RenderErrorReason::HelperNotFound(name) => format!("unknown helper `{name}`"),
        RenderErrorReason::ParamNotFoundForIndex(helper, index) => format!(
            "helper `{helper}`: argument {} is missing or does not exist (strict mode)",
            index + 1
        ),
        other => other.to_string(),
    };
    match (e.line_no, e.column_no) {
        (Some(line), Some(col)) => format!("line {line}, col {col}: {reason}"),
        _ => reason,
    }
}

/// The start of `text` (at most `max_chars` characters), quoted and escaped for a message.
pub(crate) fn quote_start(text: &str, max_chars: usize) -> String {
    let text = text.trim();
    let mut quoted: String = text.chars().take(max_chars).collect();
    if quoted.len() < text.len() {
        quoted.push('…');
    }
    format!("{quoted:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_helper_embeds_values_as_json() {
        let data = json!({
            "input": "say \"hi\"\n<b>&</b>",
            "plan": {"files": ["a.ts", "b.ts"], "n": 3, "ok": true, "none": null},
        });
        let text = render_text(
            r#"{"task": {{json input}}, "files": {{json plan.files}}, "plan": {{json plan}}, "n": {{json plan.n}}, "none": {{json plan.none}}}"#,
            &data,
        )
        .unwrap();
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            value,
            json!({
                "task": "say \"hi\"\n<b>&</b>",
                "files": ["a.ts", "b.ts"],
                "plan": {"files": ["a.ts", "b.ts"], "n": 3, "ok": true, "none": null},
                "n": 3,
                "none": null
            })
        );
    }

    #[test]
    fn json_helper_pretty_prints_on_request() {
        let text = render_text("{{json this pretty=true}}", &json!({"a": [1]})).unwrap();
        assert_eq!(text, "{\n  \"a\": [\n    1\n  ]\n}");
    }

    #[test]
    fn json_helper_fails_on_a_missing_value_and_on_extra_arguments() {
        let err = render_text("{{json context.plan}}", &json!({"context": {}})).unwrap_err();
        assert!(
            err.reason.contains("`context.plan` does not exist"),
            "{err}"
        );
        let err = render_text("{{json a a}}", &json!({"a": 1})).unwrap_err();
        assert!(err.reason.contains("json takes one value"), "{err}");
    }

    #[test]
    fn no_html_escaping() {
        let text = render_text("{{x}}", &json!({"x": "<a href=\"x\">&'</a>"})).unwrap();
        assert_eq!(text, "<a href=\"x\">&'</a>");
    }

    #[test]
    fn hyphenated_keys_and_each_over_objects() {
        let data = json!({"context": {
            "parallel-tests": {"success": true, "data": [{"stepId": "unit"}, {"stepId": "e2e"}]},
            "research-2": {"findings": "b"},
            "research-1": {"findings": "a"},
        }});
        let text = render_text(
            "{{context.parallel-tests.success}} {{#each context.parallel-tests.data}}{{this.stepId}},{{/each}}",
            &data,
        )
        .unwrap();
        assert_eq!(text, "true unit,e2e,");
        let text = render_text("{{#each context}}{{@key}};{{/each}}", &data).unwrap();
        assert_eq!(text, "parallel-tests;research-1;research-2;");
        let text = render_text("{{json context.research-1}}", &data).unwrap();
        assert_eq!(text, r#"{"findings":"a"}"#);
    }

    #[test]
    fn strict_mode_fails_on_missing_values_outside_if() {
        let data = json!({"input": "x", "context": {}});
        for (template, path) in [
            ("{{context.plan}}", "context.plan"),
            ("{{context.plan.files}}", "context.plan.files"),
            ("{{inptu}}", "inptu"),
            (
                "{{#each context.plan.files}}{{this}}{{/each}}",
                "context.plan.files",
            ),
            ("{{#with context.plan}}{{files}}{{/with}}", "context.plan"),
        ] {
            let err = render_text(template, &data).unwrap_err();
            assert!(
                err.reason.contains(&format!("`{path}` does not exist")),
                "{template}: {err}"
            );
        }
    }

    #[test]
    fn strict_mode_lets_if_test_missing_values() {
        let data = json!({"input": "x", "context": {}});
        assert_eq!(
            render_text("[{{#if context.plan}}{{context.plan.files}}{{/if}}]", &data).unwrap(),
            "[]"
        );
        assert_eq!(
            render_text("{{#if context.plan.files}}yes{{else}}no plan{{/if}}", &data).unwrap(),
            "no plan"
        );
        assert_eq!(
            render_text("{{#unless context.plan}}none{{/unless}}", &data).unwrap(),
            "none"
        );
        assert_eq!(
            render_text(
                "{{#each context.plan.files}}{{this}}{{else}}nothing{{/each}}",
                &data
            )
            .unwrap(),
            "nothing"
        );
        // Present but falsy values are fine too.
        let data = json!({"context": {"plan": {"files": []}}});
        assert_eq!(
            render_text("{{#if context.plan.files}}yes{{else}}empty{{/if}}", &data).unwrap(),
            "empty"
        );
    }

    #[test]
    fn text_rendering_of_arrays_and_objects() {
        let data = json!({"a": ["x", 1, true], "o": {"k": 1}, "n": null});
        assert_eq!(
            render_text("{{a}} {{o}} [{{n}}]", &data).unwrap(),
            "[x, 1, true] [object] []"
        );
    }

    #[test]
    fn compile_errors_have_a_position() {
        let err = Template::compile("line one\n{{#if x}}never closed").unwrap_err();
        assert!(err.reason.starts_with("line "), "{err}");
        let err = Template::compile("{{#if x}}a{{/each}}").unwrap_err();
        assert!(err.reason.contains("\"if\" was opened"), "{err}");
    }

    #[test]
    fn unknown_helpers_fail_at_render_time() {
        let err = render_text("{{shout input}}", &json!({"input": "x"})).unwrap_err();
        assert!(err.reason.contains("unknown helper `shout`"), "{err}");
    }

    #[test]
    fn template_agent_parses_the_rendered_json() {
        let agent = TemplateAgent::new(
            "coder",
            r#"{"filesCreated": {{json plan.files}}, "count": {{len plan.files}}}"#,
        )
        .unwrap();
        let out = agent.run(&json!({"plan": {"files": ["a", "b"]}})).unwrap();
        assert_eq!(out, json!({"filesCreated": ["a", "b"], "count": 2}));
    }

    #[test]
    fn template_agent_rejects_output_that_is_not_json() {
        let agent = TemplateAgent::new("coder", "Files: {{plan.files}}").unwrap();
        let err = agent
            .run(&json!({"plan": {"files": ["a", "b"]}}))
            .unwrap_err();
        assert!(matches!(err, AgentError::BadOutput { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.starts_with("agent \"coder\""), "{message}");
        assert!(message.contains("not JSON"), "{message}");
        assert!(message.contains("\"Files: [a, b]\""), "{message}");
    }

    #[test]
    fn template_agent_reports_render_errors() {
        let agent = TemplateAgent::new("coder", "{{json context.plan}}").unwrap();
        let err = agent.run(&json!({"context": {}})).unwrap_err();
        assert!(matches!(err, AgentError::Template { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.starts_with("agent \"coder\""), "{message}");
        assert!(
            message.contains("`context.plan` does not exist"),
            "{message}"
        );
    }

    #[test]
    fn template_agent_errors_are_not_retried() {
        use futures::FutureExt as _;
        // The same payload renders the same way: another attempt would fail the same.
        let agent = super::super::Agent::Template(
            TemplateAgent::new("coder", "{{json context.plan}}").unwrap(),
        );
        let payload = crate::Payload::from_value(json!({"context": {}}));
        let err = agent
            .run(&payload, &[], &crate::OutputSink::none())
            .now_or_never()
            .unwrap()
            .unwrap_err();
        let failure = agent.failure(err);
        assert!(!failure.is_retryable());
        assert!(
            failure.message().starts_with("agent \"coder\""),
            "{failure}"
        );
    }

    #[test]
    fn long_output_is_quoted_short() {
        let quoted = quote_start(&"x".repeat(1000), 10);
        assert_eq!(quoted, "\"xxxxxxxxxx…\"");
    }
}
