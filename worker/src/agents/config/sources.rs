//! Fields whose text is given inline or in a file (`template` / `template_file`, `prompt` /
//! `prompt_file`...), and the error of such a text that does not compile.

use std::ops::Range;
use std::path::PathBuf;

use toml::Value;

use super::{Checker, ConfigError, Fields, Problem};

/// The text of a field given inline or as a file (see [`Checker::inline_or_file`]).
pub(in crate::agents) struct Source {
    /// The field that gave it, and where it stands.
    pub(in crate::agents) field: &'static str,
    pub(in crate::agents) span: Range<usize>,
    /// The file it was read from (absolute), when it came from one.
    pub(in crate::agents) path: Option<PathBuf>,
    pub(in crate::agents) text: String,
}

impl Checker<'_> {
    /// The text of `inline` (a string field) or of the file `file` names (relative to the
    /// agents file's folder), removed from `fields`: `None` when neither is set, an error when
    /// both are, or when the file cannot be read.
    pub(in crate::agents) fn inline_or_file(
        &self,
        fields: &mut Fields,
        inline: &'static str,
        file: &'static str,
    ) -> Result<Option<Source>, ConfigError> {
        match (fields.remove(inline), fields.remove(file)) {
            (None, None) => Ok(None),
            (Some(_), Some(named)) => Err(self.error(
                file,
                Some(named.span()),
                Problem::Conflict {
                    other: inline.to_owned(),
                },
            )),
            (Some(value), None) => match value.get_ref() {
                Value::String(text) => Ok(Some(Source {
                    field: inline,
                    span: value.span(),
                    path: None,
                    text: text.clone(),
                })),
                _ => Err(self.invalid(inline, &value, "a string")),
            },
            (None, Some(named)) => {
                let Value::String(name) = named.get_ref() else {
                    return Err(self.invalid(file, &named, "a string (a path)"));
                };
                let path = self.base_dir.join(name);
                let text = std::fs::read_to_string(&path).map_err(|source| {
                    self.error(
                        file,
                        Some(named.span()),
                        Problem::UnreadableFile {
                            path: path.clone(),
                            source,
                        },
                    )
                })?;
                Ok(Some(Source {
                    field: file,
                    span: named.span(),
                    path: Some(path),
                    text,
                }))
            }
        }
    }

    /// [`Checker::inline_or_file`] for a text the agent cannot do without: its absence is an
    /// error that says how to give it, `what` being what it is ("a Handlebars template").
    pub(in crate::agents) fn required_inline_or_file(
        &self,
        fields: &mut Fields,
        inline: &'static str,
        file: &'static str,
        what: &str,
    ) -> Result<Source, ConfigError> {
        self.inline_or_file(fields, inline, file)?.ok_or_else(|| {
            self.missing(
                inline,
                &format!("set `{inline}` to {what}, or `{file}` to a file holding one"),
            )
        })
    }

    /// `source` (a template) does not compile, for `reason`: the field's problem, naming the
    /// file when it came from one.
    pub(in crate::agents) fn compile_error(&self, source: &Source, reason: String) -> ConfigError {
        let problem = match &source.path {
            Some(path) => Problem::FileCompile {
                path: path.clone(),
                reason,
            },
            None => Problem::TemplateCompile(reason),
        };
        self.error(source.field, Some(source.span.clone()), problem)
    }
}
