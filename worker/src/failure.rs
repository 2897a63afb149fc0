//! Why an agent failed, and whether running it again could help.

use crate::output::ModelCall;

/// An agent's failure: the message the step's error shows, and whether a retry could succeed.
///
/// A retryable failure (the default, and what a plain `String` error becomes) leaves the step
/// to its retry policy. A non-retryable one (bad input, a request the agent refuses) fails the
/// step at once, whatever its policy says, instead of spending its attempts on the same answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    message: String,
    retryable: bool,
    /// The calls to models the failed attempt made: their tokens count all the same.
    calls: Vec<ModelCall>,
}

impl Failure {
    /// A failure that may go away on another attempt (a timeout, a flaky service).
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
            calls: Vec::new(),
        }
    }

    /// A failure that another attempt would only repeat.
    pub fn non_retryable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
            calls: Vec::new(),
        }
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// Adds the calls to models the attempt made before it failed.
    pub fn with_calls(mut self, calls: impl IntoIterator<Item = ModelCall>) -> Self {
        self.calls.extend(calls);
        self
    }

    pub fn calls(&self) -> &[ModelCall] {
        &self.calls
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// A handler's plain error, or one passed on with `?`: retryable, as every error was before
/// failures could say otherwise.
impl From<String> for Failure {
    fn from(message: String) -> Self {
        Self::retryable(message)
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Self {
        Self::retryable(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_errors_are_retryable_and_display_their_message() {
        let from_string = Failure::from("flaky".to_owned());
        let from_str = Failure::from("flaky");
        assert_eq!(from_string, from_str);
        assert!(from_str.is_retryable());
        assert_eq!(from_str.to_string(), "flaky");
        let refused = Failure::non_retryable("bad input");
        assert!(!refused.is_retryable());
        assert_eq!(refused.message(), "bad input");
    }
}
