//! Problems found in a workflow document, each naming where it is.

use std::fmt;

use crate::text::is_unprintable;

/// How bad a problem is: errors stop a workflow from being accepted, warnings do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    Warning,
    Error,
}

/// One problem in a workflow document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    /// JSON path of the offending value, such as `$.steps[3].next`.
    pub path: String,
    /// Id of the step the problem belongs to, when there is one.
    pub step_id: Option<String>,
    /// What is wrong, lowercase, no trailing period.
    pub message: String,
}

impl Diagnostic {
    pub fn error(
        path: impl Into<String>,
        step_id: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            severity: Severity::Error,
            path: path.into(),
            step_id: step_id.map(str::to_owned),
            message: message.into(),
        }
    }

    pub fn warning(
        path: impl Into<String>,
        step_id: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::error(path, step_id, message)
        }
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let severity = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{severity}: {}", Printable(&self.path))?;
        if let Some(step_id) = &self.step_id {
            write!(f, " (step \"{}\")", Printable(step_id))?;
        }
        write!(f, ": {}", Printable(&self.message))
    }
}

/// Text written with its unprintable characters escaped (`\u{1b}`): a diagnostic quotes what
/// the document says, and is printed to terminals, where an escape sequence in a step id would
/// otherwise act.
struct Printable<'a>(&'a str);

impl fmt::Display for Printable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if is_unprintable(c) {
                write!(f, "{}", c.escape_unicode())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

/// Every problem found in one document, in document order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    pub fn push(&mut self, diagnostic: Diagnostic) {
        self.0.push(diagnostic);
    }

    pub fn has_errors(&self) -> bool {
        self.0.iter().any(Diagnostic::is_error)
    }

    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter().filter(|d| d.is_error())
    }

    pub fn warnings(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter().filter(|d| !d.is_error())
    }

    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, diagnostic) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{diagnostic}")?;
        }
        Ok(())
    }
}

/// Suggests the closest candidate to a misspelt name, for "did you mean" hints.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    candidates
        .into_iter()
        .map(|candidate| (strsim::damerau_levenshtein(name, candidate), candidate))
        .filter(|(distance, candidate)| *distance <= (candidate.len() / 3).max(2))
        .min()
        .map(|(_, candidate)| format!("; did you mean \"{candidate}\"?"))
        .unwrap_or_default()
}
