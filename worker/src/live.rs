//! An agent's live output: text it streams while it runs (an LLM's tokens as they come), for
//! whoever watches the run. It never becomes the step's data, and never slows the agent.
//!
//! The agent writes into an [`OutputSink`] (`Task::stream` in the SDK); the runtime forwards
//! what accumulates to the coordinator, a few pieces to a message, until the agent is done and
//! before its answer, so that the answer comes after its output on the stream.

use tokio::sync::mpsc;

/// The most text one message to the coordinator carries; longer pieces are split.
pub const MAX_PIECE_BYTES: usize = 8 << 10;

/// How much unsent output a task may pile up (its coordinator is unreachable, say) before new
/// pieces are dropped: watchers miss them, the agent is not held back.
const MAX_BACKLOG_BYTES: usize = 4 << 20;

/// One piece of live output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    pub text: String,
    /// What the attempt streamed before is void (a broken stream is retried from the start).
    pub restart: bool,
}

/// Where an agent streams its live output; cheap to clone. Writing never waits.
#[derive(Debug, Clone, Default)]
pub struct OutputSink {
    /// `None`: nobody listens (a test, or an agent run outside a worker).
    pieces: Option<mpsc::UnboundedSender<Piece>>,
    backlog: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl OutputSink {
    /// A sink whose output goes nowhere.
    pub fn none() -> Self {
        Self::default()
    }

    /// A sink and the receiving end the runtime forwards from.
    pub(crate) fn channel() -> (Self, Receiver) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let backlog = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let sink = OutputSink {
            pieces: Some(sender),
            backlog: backlog.clone(),
        };
        let receiver = Receiver {
            receiver,
            backlog,
            held: Default::default(),
        };
        (sink, receiver)
    }

    /// For tests: a sink that keeps every piece written, and the end that reads them
    /// ([`CollectedOutput`]). Nothing is forwarded anywhere.
    pub fn collecting() -> (Self, CollectedOutput) {
        let (sink, receiver) = Self::channel();
        (sink, CollectedOutput(receiver.receiver))
    }

    /// Streams `text` to the run's watchers.
    pub fn text(&self, text: &str) {
        self.send(Piece {
            text: text.to_owned(),
            restart: false,
        });
    }

    /// Declares what was streamed so far void (the agent starts its output again); `text`
    /// begins the new output.
    pub fn restart(&self, text: &str) {
        self.send(Piece {
            text: text.to_owned(),
            restart: true,
        });
    }

    fn send(&self, piece: Piece) {
        let Some(pieces) = &self.pieces else {
            return;
        };
        use std::sync::atomic::Ordering;
        let size = piece.text.len();
        if self.backlog.fetch_add(size, Ordering::Relaxed) + size > MAX_BACKLOG_BYTES {
            self.backlog.fetch_sub(size, Ordering::Relaxed);
            return;
        }
        let _ = pieces.send(piece);
    }
}

/// For tests: what was written into a sink made by [`OutputSink::collecting`], piece by piece
/// as it was written (not joined as the runtime joins them).
#[derive(Debug)]
pub struct CollectedOutput(mpsc::UnboundedReceiver<Piece>);

impl CollectedOutput {
    /// The next piece as `(text, restart)`, waiting for it; `None` once every sink is dropped
    /// and all was read.
    pub async fn next(&mut self) -> Option<(String, bool)> {
        self.0.recv().await.map(|piece| (piece.text, piece.restart))
    }

    /// The pieces written so far and not yet read, without waiting.
    pub fn written(&mut self) -> Vec<(String, bool)> {
        std::iter::from_fn(|| self.0.try_recv().ok())
            .map(|piece| (piece.text, piece.restart))
            .collect()
    }
}

/// The runtime's end of an [`OutputSink`].
pub(crate) struct Receiver {
    receiver: mpsc::UnboundedReceiver<Piece>,
    backlog: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Taken from the channel but not sent yet: the rest of a long piece, or a restart that
    /// starts a message of its own.
    held: std::collections::VecDeque<Piece>,
}

impl Receiver {
    /// Takes no more pieces: what was written before comes out of [`Receiver::next`], then
    /// `None`, even if a sink outlives the agent (a handler that kept its task).
    pub fn close(&mut self) {
        self.receiver.close();
    }

    /// The next message's piece: everything waiting, joined, up to [`MAX_PIECE_BYTES`] (a
    /// restart starts a piece of its own). `None` once every sink is dropped and all was taken.
    pub async fn next(&mut self) -> Option<Piece> {
        let mut piece = match self.held.pop_front() {
            Some(piece) => piece,
            None => self.receiver.recv().await?,
        };
        while piece.text.len() < MAX_PIECE_BYTES {
            let next = match self.held.pop_front() {
                Some(next) => next,
                None => match self.receiver.try_recv() {
                    Ok(next) => next,
                    Err(_) => break,
                },
            };
            if next.restart {
                self.held.push_front(next);
                break;
            }
            piece.text.push_str(&next.text);
        }
        if piece.text.len() > MAX_PIECE_BYTES {
            let mut end = MAX_PIECE_BYTES;
            while !piece.text.is_char_boundary(end) {
                end -= 1;
            }
            let rest = piece.text.split_off(end);
            self.held.push_front(Piece {
                text: rest,
                restart: false,
            });
        }
        self.backlog
            .fetch_sub(piece.text.len(), std::sync::atomic::Ordering::Relaxed);
        Some(piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pieces_waiting_together_go_as_one_restarts_alone_long_ones_split() {
        let (sink, mut receiver) = OutputSink::channel();
        sink.text("Hel");
        sink.text("lo");
        sink.restart("Again");
        sink.text("!");
        let long = "é".repeat(MAX_PIECE_BYTES); // two bytes a character
        sink.text(&long);
        drop(sink);
        let first = receiver.next().await.unwrap();
        assert_eq!((first.text.as_str(), first.restart), ("Hello", false));
        let second = receiver.next().await.unwrap();
        assert!(second.restart);
        assert!(second.text.starts_with("Again!é"));
        assert!(second.text.len() <= MAX_PIECE_BYTES);
        let mut rest = String::new();
        while let Some(piece) = receiver.next().await {
            assert!(!piece.restart && piece.text.len() <= MAX_PIECE_BYTES);
            rest.push_str(&piece.text);
        }
        assert_eq!(format!("{}{rest}", second.text), format!("Again!{long}"));
    }

    #[tokio::test]
    async fn an_agent_is_never_held_back_its_backlog_is_bounded() {
        let (sink, mut receiver) = OutputSink::channel();
        let chunk = "x".repeat(1 << 20);
        for _ in 0..10 {
            sink.text(&chunk);
        }
        drop(sink);
        let mut total = 0;
        while let Some(piece) = receiver.next().await {
            total += piece.text.len();
        }
        assert_eq!(total, MAX_BACKLOG_BYTES, "what did not fit was dropped");
    }

    #[test]
    fn a_sink_of_nobody_takes_anything() {
        OutputSink::none().text("into the void");
    }
}
