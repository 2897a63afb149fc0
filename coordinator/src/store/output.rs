//! A run's live output as the store keeps it: the pieces its agents stream while they run (an
//! LLM's tokens), in order, so that watchers on any coordinator see them, and one that joins
//! mid-step first sees what was streamed so far. Bounded, and gone soon after the run ends:
//! the step's result is the agent's answer, never this. The [`LiveOutput`] trait, and a piece
//! ([`OutputPiece`]) and its place in the output ([`OutputOffset`]).

use baton_core::{RunId, WorkerId};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::Error;
use super::declare::store_trait;

store_trait! {
    /// A run's live output, appended by the coordinator that holds the task and read by the
    /// watchers of any coordinator.
    ///
    /// Contract, for every implementation:
    /// - Each piece gets an offset greater than every earlier one of its run.
    /// - A run keeps the newest [`OUTPUT_MAX_BYTES`] of text: the oldest pieces go first.
    /// - Once the transition that ends a run is written, its output takes no more pieces,
    ///   stays readable for [`OUTPUT_KEPT_AFTER_END`], then is gone; a transition that makes an
    ///   ended run `running` again (a retry) keeps what is left of it and lets it take pieces
    ///   again.
    pub trait LiveOutput {
        /// Appends live output, `(run id, piece)` in order, to each run's output, only while
        /// the run's status is `running` (pieces for a run that ended or does not exist are
        /// dropped, not an error).
        async fn append_output(&self, pieces: Vec<(RunId, OutputPiece)>) -> Result<(), Error>;

        /// A run's pieces after an offset (all with `None`), oldest first (empty for an unknown
        /// or ended run).
        async fn read_output(
            &self,
            run_id: &str,
            after: Option<OutputOffset>,
        ) -> Result<Vec<(OutputOffset, OutputPiece)>, Error>;

        /// Pieces after `(run id, offset)` of each run, as `(run id, offset, piece)`, waiting up
        /// to `block` for some to come (empty when none did).
        #[untimed = "it waits for output by design, so its duration says nothing about the store"]
        async fn wait_output(
            &self,
            after: Vec<(String, OutputOffset)>,
            block: Duration,
        ) -> Result<Vec<(String, OutputOffset, OutputPiece)>, Error>;
    }
}

/// The most text a run's output keeps: when a piece would pass it, the oldest pieces go.
pub const OUTPUT_MAX_BYTES: usize = 4 << 20;

/// How long a run's output stays readable after the run ended (it takes no more pieces then),
/// for watchers still catching up on the last of it. `transition.lua` writes this number.
pub const OUTPUT_KEPT_AFTER_END: std::time::Duration = std::time::Duration::from_secs(60);

/// One piece of a task's live output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputPiece {
    pub step_id: String,
    pub visit: u32,
    pub attempt: u32,
    pub text: String,
    /// What this attempt streamed before is void: `text` starts its output again.
    pub restart: bool,
    /// The worker that streamed it (it holds the attempt): a watcher on a coordinator that
    /// does not hand the task out learns from it who runs the step, before the store does (a
    /// holder writes its workers down only at its lease renewals). `None` in pieces stored
    /// before workers were recorded.
    pub worker_id: Option<WorkerId>,
}

/// Where a piece is in its run's output: a Redis stream id, `<ms>-<seq>`. Offsets only grow,
/// so a reader that holds one resumes after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct OutputOffset {
    pub ms: u64,
    pub seq: u64,
}

impl fmt::Display for OutputOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

impl FromStr for OutputOffset {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let malformed = || format!("malformed output offset {text:?}");
        let (ms, seq) = text.split_once('-').ok_or_else(malformed)?;
        Ok(OutputOffset {
            ms: ms.parse().map_err(|_| malformed())?,
            seq: seq.parse().map_err(|_| malformed())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_read_back_and_order_as_redis_stream_ids_do() {
        let offset: OutputOffset = "1700000000000-3".parse().unwrap();
        assert_eq!(offset.to_string(), "1700000000000-3");
        assert!(offset < "1700000000000-10".parse().unwrap());
        assert!(offset < "1700000000001-0".parse().unwrap());
        assert!("12".parse::<OutputOffset>().is_err());
        assert!("a-1".parse::<OutputOffset>().is_err());
    }
}
