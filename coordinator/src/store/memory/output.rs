//! [`LiveOutput`] in memory: each run's pieces in a bounded queue in its entry, and one
//! [`Notify`](tokio::sync::Notify) that wakes the readers waiting for more.

use baton_core::RunId;
use std::collections::VecDeque;
use std::time::Duration;

use baton_core::RunStatus;

use super::MemoryStore;
use crate::store::{
    Error, LiveOutput, OUTPUT_KEPT_AFTER_END, OUTPUT_MAX_BYTES, OutputOffset, OutputPiece,
};

/// A run's live output: its pieces, their text's size, and the next offset.
#[derive(Debug, Default)]
pub(super) struct Output {
    pieces: VecDeque<(OutputOffset, OutputPiece)>,
    bytes: usize,
    next: u64,
    /// When the run ended: the output is gone [`OUTPUT_KEPT_AFTER_END`] later.
    pub(super) ended: Option<std::time::Instant>,
}

impl Output {
    fn push(&mut self, piece: OutputPiece) {
        self.next += 1;
        self.bytes += piece.text.len();
        let offset = OutputOffset {
            ms: 0,
            seq: self.next,
        };
        self.pieces.push_back((offset, piece));
        while self.bytes > OUTPUT_MAX_BYTES
            && let Some((_, oldest)) = self.pieces.pop_front()
        {
            self.bytes -= oldest.text.len();
        }
    }

    fn after(
        &self,
        after: Option<OutputOffset>,
    ) -> impl Iterator<Item = &(OutputOffset, OutputPiece)> {
        let expired = self
            .ended
            .is_some_and(|ended| ended.elapsed() >= OUTPUT_KEPT_AFTER_END);
        self.pieces
            .iter()
            .filter(move |(offset, _)| !expired && after.is_none_or(|after| *offset > after))
    }
}

impl LiveOutput for MemoryStore {
    async fn append_output(&self, pieces: Vec<(RunId, OutputPiece)>) -> Result<(), Error> {
        let mut runs = self.runs.lock().expect("store lock");
        // Expired output is hidden as soon as it expires, and freed here.
        for entry in runs.values_mut() {
            if entry
                .output
                .ended
                .is_some_and(|ended| ended.elapsed() >= OUTPUT_KEPT_AFTER_END)
                && !entry.output.pieces.is_empty()
            {
                entry.output.pieces.clear();
                entry.output.bytes = 0;
            }
        }
        for (run_id, piece) in pieces {
            if let Some(entry) = runs.get_mut(run_id.as_str())
                && entry.run.status == RunStatus::Running
            {
                entry.output.push(piece);
            }
        }
        drop(runs);
        self.output_added.notify_waiters();
        Ok(())
    }

    async fn read_output(
        &self,
        run_id: &str,
        after: Option<OutputOffset>,
    ) -> Result<Vec<(OutputOffset, OutputPiece)>, Error> {
        let runs = self.runs.lock().expect("store lock");
        Ok(runs
            .get(run_id)
            .map(|entry| entry.output.after(after).cloned().collect())
            .unwrap_or_default())
    }

    async fn wait_output(
        &self,
        after: Vec<(String, OutputOffset)>,
        block: Duration,
    ) -> Result<Vec<(String, OutputOffset, OutputPiece)>, Error> {
        let deadline = tokio::time::Instant::now() + block;
        loop {
            // Registered before looking, so that output appended in between still wakes it.
            let added = self.output_added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            let found: Vec<(String, OutputOffset, OutputPiece)> = {
                let runs = self.runs.lock().expect("store lock");
                after
                    .iter()
                    .filter_map(|(run_id, offset)| Some((run_id, runs.get(run_id)?, offset)))
                    .flat_map(|(run_id, entry, offset)| {
                        entry
                            .output
                            .after(Some(*offset))
                            .map(|(offset, piece)| (run_id.clone(), *offset, piece.clone()))
                    })
                    .collect()
            };
            if !found.is_empty() {
                return Ok(found);
            }
            if tokio::time::timeout_at(deadline, added).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }
}
