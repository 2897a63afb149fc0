//! Prompt templates: Handlebars rendered as text for a model to read (the `llm` kind's
//! `prompt` and `system`, the spec's "Agent Prompt Templates").
//!
//! A prompt is read by a model, not parsed by a program, and the spec's templates are written
//! for payloads that lack some of what they mention, so the rules differ from the `template`
//! kind's:
//!
//! - **A missing field renders empty** (no strict mode): the spec's tester prompt names
//!   `context.code.changes`, which its own context flow does not have.
//! - **Values render as JSON text.** A string renders as it is; a number or boolean as JSON
//!   (`15`, `true`); null as nothing; an array or object as compact JSON, so
//!   `Files to create: {{context.plan.files}}` shows `["src/theme.ts","src/toggle.tsx"]` where
//!   Handlebars alone writes `[src/theme.ts, src/toggle.tsx]` (and `[object]` for an object).
//! - **No HTML escaping**, as in the template kind; `{{json x}}` (and `pretty=true`) work too.
//!
//! Handlebars renders values itself and offers no hook for it, so the compiled template is
//! rewritten: every plain value expression (`{{path}}`, `{{{path}}}`, at any depth of blocks)
//! becomes a call of a helper that renders by the rules above. Block helpers (`{{#if}}`,
//! `{{#each}}`, hyphenated paths such as `context.parallel-tests.data`, `{{@key}}`) are
//! untouched. One consequence: in a prompt `{{name}}` is always a value, even where Handlebars
//! would call a helper without arguments of that name (a step called `log` stays readable).

use handlebars::template::{Parameter, Template as Ast, TemplateElement};
use handlebars::{
    Context, Handlebars, Helper, HelperDef, HelperResult, Output, RenderContext, RenderErrorReason,
};
use serde_json::Value;

use super::{TEMPLATE_NAME, TemplateError, describe_template_error};

/// The helper every plain expression is rewritten into. A helper's name in a template has no
/// spaces, so no template can call it, nor register another by that name.
const VALUE_HELPER: &str = "prompt value";

/// A compiled prompt template (see the module documentation for its rules).
#[derive(Debug)]
pub struct PromptTemplate {
    registry: Handlebars<'static>,
}

impl PromptTemplate {
    /// Compiles `source`; a syntax error names its line and column.
    pub fn compile(source: &str) -> Result<PromptTemplate, TemplateError> {
        let mut ast = Ast::compile_with_name(source, TEMPLATE_NAME.to_owned()).map_err(|e| {
            TemplateError {
                reason: describe_template_error(&e, source),
            }
        })?;
        render_values_as_json(&mut ast);
        let mut registry = super::registry();
        registry.register_helper(VALUE_HELPER, Box::new(ValueHelper));
        registry.register_template(TEMPLATE_NAME, ast);
        Ok(PromptTemplate { registry })
    }

    /// The text of the prompt for `data` (an agent's payload). It fails only on what the
    /// template asks for and cannot have: an unknown helper, a helper's wrong arguments.
    pub fn render(&self, data: &Value) -> Result<String, TemplateError> {
        super::render(&self.registry, data)
    }
}

/// Compiles `source` as a prompt and renders it against `data`.
pub fn render_prompt(source: &str, data: &Value) -> Result<String, TemplateError> {
    PromptTemplate::compile(source)?.render(data)
}

/// Rewrites every plain value expression of `template`, and of the blocks within it, into a
/// call of [`VALUE_HELPER`] with the expression's path as its argument. An expression's
/// position (for error messages) is kept: elements are changed in place.
fn render_values_as_json(template: &mut Ast) {
    for element in &mut template.elements {
        match element {
            TemplateElement::Expression(expression)
            | TemplateElement::HtmlExpression(expression) => {
                let plain_value = !expression.block
                    && expression.params.is_empty()
                    && expression.hash.is_empty()
                    && matches!(expression.name, Parameter::Path(_));
                if plain_value {
                    let path = std::mem::replace(
                        &mut expression.name,
                        Parameter::Name(VALUE_HELPER.to_owned()),
                    );
                    expression.params.push(path);
                }
            }
            TemplateElement::HelperBlock(block) => {
                // An `{{else}}` chain hangs off `inverse`, each link a block of its own.
                for inner in [&mut block.template, &mut block.inverse]
                    .into_iter()
                    .flatten()
                {
                    render_values_as_json(inner);
                }
            }
            TemplateElement::DecoratorBlock(block) | TemplateElement::PartialBlock(block) => {
                if let Some(inner) = &mut block.template {
                    render_values_as_json(inner);
                }
            }
            _ => {}
        }
    }
}

/// Writes its one argument by the prompt rules: strings as they are, null or a missing value
/// as nothing, anything else as compact JSON.
struct ValueHelper;

impl HelperDef for ValueHelper {
    fn call<'reg: 'rc, 'rc>(
        &self,
        h: &Helper<'rc>,
        _: &'reg Handlebars<'reg>,
        _: &'rc Context,
        _: &mut RenderContext<'reg, 'rc>,
        out: &mut dyn Output,
    ) -> HelperResult {
        let Some(param) = h.param(0) else {
            return Ok(());
        };
        match param.value() {
            Value::Null => {}
            Value::String(text) => out.write(text)?,
            other => {
                out.write(&serde_json::to_string(other).map_err(RenderErrorReason::SerdeError)?)?
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(source: &str, data: &Value) -> String {
        render_prompt(source, data).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Asserts each template renders as expected against `data`.
    #[track_caller]
    fn renders(data: &Value, cases: &[(&str, &str)]) {
        for (template, expected) in cases {
            assert_eq!(render(template, data), *expected, "{template}");
        }
    }

    #[test]
    fn missing_fields_render_empty() {
        renders(
            &json!({"input": "x", "context": {}}),
            &[
                ("[{{context.plan.files}}][{{nothing}}]", "[][]"),
                ("[{{{context.plan}}}]", "[]"),
                ("{{#each context.plan.files}}{{this}}{{/each}}.", "."),
                ("{{#with context.plan}}{{files}}{{/with}}.", "."),
                ("{{json context.plan}}", "null"),
            ],
        );
    }

    #[test]
    fn values_render_as_json_text_and_strings_as_they_are() {
        let data = json!({
            "s": "say \"hi\" <b>&</b>\n", "n": 15, "f": 0.5, "t": true, "z": null,
            "a": ["src/theme.ts", "src/toggle.tsx"], "o": {"k": [1, {"x": null}]}, "e": []
        });
        assert_eq!(
            render("{{s}}|{{n}}|{{f}}|{{t}}|{{z}}|{{a}}|{{o}}|{{e}}", &data),
            "say \"hi\" <b>&</b>\n|15|0.5|true||[\"src/theme.ts\",\"src/toggle.tsx\"]|{\"k\":[1,{\"x\":null}]}|[]"
        );
        // Triple braces (unescaped in Handlebars) follow the same rules.
        assert_eq!(
            render("{{{a}}} {{{s}}}", &data),
            render("{{a}} {{s}}", &data)
        );
    }

    #[test]
    fn values_inside_blocks_and_else_chains_are_rewritten_too() {
        renders(
            &json!({"a": [[1, 2], {"k": "v"}], "x": {"y": [true]}}),
            &[
                (
                    "{{#each a}}{{@index}}={{this}};{{/each}}",
                    "0=[1,2];1={\"k\":\"v\"};",
                ),
                (
                    "{{#if missing}}no{{else if x}}{{x.y}}{{else}}no{{/if}}",
                    "[true]",
                ),
                (
                    "{{#unless missing}}{{#with x}}{{y}}{{/with}}{{/unless}}",
                    "[true]",
                ),
                (
                    "{{#each missing}}no{{else}}{{a.1}}{{/each}}",
                    "{\"k\":\"v\"}",
                ),
                (
                    "{{#*inline \"p\"}}{{x}}{{/inline}}{{> p}}",
                    "{\"y\":[true]}",
                ),
            ],
        );
    }

    #[test]
    fn hyphenated_paths_and_each_over_an_object() {
        let data = json!({"context": {
            "parallel-tests": {"success": true, "data": [{"stepId": "unit", "result": {"passed": 15}}]},
            "research-2": {"findings": ["b"]},
            "research-1": {"findings": ["a"]},
        }});
        assert_eq!(
            render(
                "{{#if context.parallel-tests}}{{#each context.parallel-tests.data}}- {{this.stepId}}: {{this.result.passed}}{{/each}}{{/if}}",
                &data
            ),
            "- unit: 15"
        );
        assert_eq!(
            render(
                "{{#each context}}{{@key}}={{this.findings}};{{/each}}",
                &data
            ),
            "parallel-tests=;research-1=[\"a\"];research-2=[\"b\"];"
        );
        assert_eq!(render("{{context.parallel-tests.success}}", &data), "true");
    }

    #[test]
    fn helpers_still_work() {
        let data = json!({"a": [1, 2], "s": "x"});
        assert_eq!(
            render("{{len a}} {{json a}} {{lookup a 1}}", &data),
            "2 [1,2] 2"
        );
        assert_eq!(render("{{json a pretty=true}}", &data), "[\n  1,\n  2\n]");
        assert_eq!(render("{{#if (eq s \"x\")}}yes{{/if}}", &data), "yes");
        // A name-only expression is a value even where a helper has its name.
        assert_eq!(render("{{log}}", &json!({"log": [1]})), "[1]");
    }

    /// Syntax errors when compiling, with their line and column; unknown helpers only when
    /// rendering.
    #[test]
    fn errors() {
        for (source, compiles, expected) in [
            (
                "one\ntwo {{/if}}",
                false,
                "line 2, col 7: invalid handlebars syntax",
            ),
            ("{{#if x}}a{{/each}}", false, "\"if\" was opened"),
            ("{{shout input}}", true, "unknown helper `shout`"),
        ] {
            let err = match PromptTemplate::compile(source) {
                Ok(prompt) if compiles => prompt.render(&json!({"input": "x"})).unwrap_err(),
                Err(err) if !compiles => err,
                other => panic!("{source}: {other:?}"),
            };
            assert!(err.reason.contains(expected), "{source}: {err}");
        }
    }
}
