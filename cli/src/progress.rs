//! Printing a run's events as they come: one line per step that starts or settles, the live
//! output of running steps under them, flushed as it arrives, and a map step's items as one
//! line of counts (rewritten in place on a terminal; elsewhere, a line per tenth of the items).

use std::collections::HashMap;
use std::io::Write;

use baton_proto::v1::{MapProgress, RunEvent, RunRecord, StepOutput, run_event};

/// A step visit's attempt, whose output is printed under one header.
type Streamer = (String, u32, u32);

/// What the live output printed so far needs to continue: whose output was printed last,
/// whether its last line is still open, and what other steps streamed meanwhile.
///
/// Steps that stream at once (parallel branches) take turns by line: while one step's line is
/// open, the others' output waits and is printed when that line ends, or before the next event
/// (a step's end flushes it all). One step streaming alone is printed piece by piece.
#[derive(Default)]
pub struct Progress {
    streaming: Option<Streamer>,
    /// The last output line has no newline yet.
    open_line: bool,
    /// Output that came while another step's line was open: (whose, restart, text), in order.
    held: Vec<(Streamer, bool, String)>,
    /// Writing to a terminal: a map's progress line is rewritten in place.
    terminal: bool,
    /// The tenth of its items each map step visit was last printed at (not on a terminal).
    map_tenths: HashMap<(String, u32), u64>,
}

/// How live output lines are set off under their step.
const OUTPUT_PREFIX: &str = "    │ ";

impl Progress {
    /// Progress for `out`; `terminal` when it is one (a map's counts are then one line,
    /// rewritten as they change).
    pub fn new(terminal: bool) -> Self {
        Self {
            terminal,
            ..Self::default()
        }
    }

    /// Writes `event`: a line for a step or the run, or a piece of a step's live output.
    pub fn print(
        &mut self,
        out: &mut impl Write,
        run_id: &str,
        event: &RunEvent,
    ) -> std::io::Result<()> {
        match &event.event {
            Some(run_event::Event::StepOutput(output)) => self.print_output(out, output),
            Some(run_event::Event::MapProgress(map)) => self.print_map(out, map),
            Some(run_event::Event::OutputMissed(missed)) => {
                self.settle(out)?;
                writeln!(
                    out,
                    "  … this watcher fell behind: {} pieces of live output missed",
                    missed.pieces
                )
            }
            _ => {
                self.settle(out)?;
                print_event(out, run_id, event)
            }
        }
    }

    /// A map step's counts: done (and failed), running, of all its items.
    fn print_map(&mut self, out: &mut impl Write, map: &MapProgress) -> std::io::Result<()> {
        let settled = map.succeeded + map.failed;
        let line = format!(
            "  ⋯ {:<20} {settled}/{} items done, {} failed, {} running",
            label(&map.step_id, map.visit),
            map.count,
            map.failed,
            map.running
        );
        if self.terminal {
            if self.open_line && self.streaming.is_some() {
                self.settle(out)?;
            }
            // Rewrites the line in place: carriage return, then clear to its end.
            write!(out, "\r{line}\x1b[K")?;
            self.open_line = true;
            self.streaming = None;
            return out.flush();
        }
        let tenth = (settled * 10).checked_div(map.count).unwrap_or(10);
        let key = (map.step_id.clone(), map.visit);
        if self.map_tenths.get(&key) == Some(&tenth) {
            return Ok(());
        }
        self.map_tenths.insert(key, tenth);
        self.settle(out)?;
        writeln!(out, "{line}")
    }

    fn print_output(&mut self, out: &mut impl Write, output: &StepOutput) -> std::io::Result<()> {
        let streamer = (output.step_id.clone(), output.visit, output.attempt);
        let mut restart = output.restart;
        let lines: Vec<&str> = match output.text.as_str() {
            "" => vec![""],
            text => text.split_inclusive('\n').collect(),
        };
        for line in lines {
            if self.open_line && self.streaming.as_ref() != Some(&streamer) {
                self.hold(streamer.clone(), restart, line);
            } else {
                self.write_output(out, streamer.clone(), restart, line)?;
                // A line ended: what other steps streamed meanwhile goes now.
                while !self.open_line && !self.held.is_empty() {
                    let (streamer, restart, text) = self.held.remove(0);
                    self.write_output(out, streamer, restart, &text)?;
                }
            }
            restart = false;
        }
        out.flush()
    }

    fn hold(&mut self, streamer: Streamer, restart: bool, text: &str) {
        match self
            .held
            .iter_mut()
            .rev()
            .find(|(held, ..)| *held == streamer)
        {
            Some((_, _, held)) if !restart => held.push_str(text),
            _ => self.held.push((streamer, restart, text.to_owned())),
        }
    }

    /// Writes output under its step's header (printed when another step printed last, or the
    /// output starts again).
    fn write_output(
        &mut self,
        out: &mut impl Write,
        streamer: Streamer,
        restart: bool,
        text: &str,
    ) -> std::io::Result<()> {
        if self.streaming.as_ref() != Some(&streamer) || restart {
            self.close_line(out)?;
            let again = if restart {
                " (from the start again)"
            } else {
                ""
            };
            writeln!(
                out,
                "  … {:<20} output{again}",
                label(&streamer.0, streamer.1)
            )?;
            self.streaming = Some(streamer);
        }
        for piece in text.split_inclusive('\n') {
            if !self.open_line {
                write!(out, "{OUTPUT_PREFIX}")?;
            }
            write!(out, "{piece}")?;
            self.open_line = !piece.ends_with('\n');
        }
        Ok(())
    }

    /// Ends the output printed so far, the held output included, before something else.
    fn settle(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        self.close_line(out)?;
        for (streamer, restart, text) in std::mem::take(&mut self.held) {
            self.write_output(out, streamer, restart, &text)?;
            self.close_line(out)?;
        }
        self.streaming = None;
        Ok(())
    }

    /// Writes a block of text of the caller's (`baton dev`'s transcript of an exchange) on
    /// lines of its own, after the output printed so far.
    pub fn write_block(&mut self, out: &mut impl Write, text: &str) -> std::io::Result<()> {
        self.settle(out)?;
        write!(out, "{text}")
    }

    fn close_line(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if self.open_line {
            self.open_line = false;
            writeln!(out)?;
        }
        Ok(())
    }
}

/// Writes one human line for `event`, or nothing (live output is [`Progress`]'s).
pub fn print_event(out: &mut impl Write, run_id: &str, event: &RunEvent) -> std::io::Result<()> {
    match &event.event {
        Some(run_event::Event::StepStarted(started)) => writeln!(
            out,
            "  ▶ {:<20} started   agent {} on {}",
            label(&started.step_id, started.visit),
            started.agent,
            started.worker_id
        ),
        Some(run_event::Event::StepFinished(done)) => {
            let mark = match done.status.as_str() {
                "succeeded" => "✓",
                "rejected" => "↩",
                "redriven" => "↻",
                _ => "✗",
            };
            let mut line = format!(
                "  {mark} {:<20} {}",
                label(&done.step_id, done.visit),
                done.status
            );
            if !done.parent.is_empty() {
                line.push_str(&format!("  (branch of {})", done.parent));
            }
            if let Some((count, failed)) = map_items(done.data.as_ref()) {
                line.push_str(&format!("  ({count} items, {failed} failed)"));
            }
            if !done.error.is_empty() {
                line.push_str(&format!(": {}", done.error));
            }
            if !done.next.is_empty() {
                line.push_str(&format!("  -> {}", done.next));
            }
            writeln!(out, "{line}")
        }
        Some(run_event::Event::ApprovalRequested(approval)) => writeln!(
            out,
            "  ⏸ {:<20} waiting   {}  (baton approve {run_id} {} [--reject])",
            label(&approval.step_id, approval.visit),
            approval.message,
            approval.step_id
        ),
        Some(run_event::Event::RunFinished(finished)) => match &finished.record {
            Some(record) => print_summary(out, record),
            None => Ok(()),
        },
        Some(
            run_event::Event::StepOutput(_)
            | run_event::Event::OutputMissed(_)
            | run_event::Event::MapProgress(_),
        )
        | None => Ok(()),
    }
}

/// A map step's data, `{"success", "data": [{"index", "status", ...}]}`, as (items, failed).
fn map_items(data: Option<&baton_proto::v1::Json>) -> Option<(usize, usize)> {
    let data: serde_json::Value = serde_json::from_slice(&data?.json).ok()?;
    let entries = data.get("data")?.as_array()?;
    if !entries.iter().all(|entry| entry.get("index").is_some()) {
        return None;
    }
    let failed = entries
        .iter()
        .filter(|entry| entry["status"] == "rejected")
        .count();
    Some((entries.len(), failed))
}

pub fn print_summary(out: &mut impl Write, record: &RunRecord) -> std::io::Result<()> {
    write!(out, "run {} {}", record.run_id, record.status)?;
    if !record.error.is_empty() {
        write!(out, ": {}", record.error)?;
    }
    writeln!(out)?;
    for waiting in &record.waiting {
        match waiting.kind.as_str() {
            "agent" if !waiting.served => writeln!(
                out,
                "  waiting: step \"{}\" needs agent \"{}\", which no connected worker serves",
                waiting.step_id, waiting.agent
            )?,
            "agent" => writeln!(
                out,
                "  waiting: step \"{}\" is queued for agent \"{}\"",
                waiting.step_id, waiting.agent
            )?,
            "compute" => writeln!(
                out,
                "  waiting: step \"{}\" waits for its turn to run its jq program",
                waiting.step_id
            )?,
            _ => writeln!(
                out,
                "  waiting: step \"{}\" needs an approval: {}",
                waiting.step_id, waiting.message
            )?,
        }
    }
    Ok(())
}

fn label(step_id: &str, visit: u32) -> String {
    if visit > 1 {
        format!("{step_id} (visit {visit})")
    } else {
        step_id.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(step: &str, text: &str, restart: bool) -> RunEvent {
        RunEvent {
            event: Some(run_event::Event::StepOutput(StepOutput {
                step_id: step.into(),
                visit: 1,
                attempt: 1,
                text: text.into(),
                restart,
                offset: String::new(),
            })),
        }
    }

    #[test]
    fn steps_streaming_at_once_take_turns_by_line() {
        let mut progress = Progress::default();
        let mut out = Vec::new();
        for event in [
            output("unit", "{\"passed\": ", false),
            output("integration", "{\"passed\": 5", false),
            output("unit", "15}", false),
            output("integration", "}\nok\n", false),
            output("unit", "\nbye", false),
        ] {
            progress.print(&mut out, "r", &event).unwrap();
        }
        let done = RunEvent {
            event: Some(run_event::Event::StepFinished(
                baton_proto::v1::StepFinished {
                    step_id: "unit".into(),
                    visit: 1,
                    status: "succeeded".into(),
                    ..Default::default()
                },
            )),
        };
        progress.print(&mut out, "r", &done).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "  … unit                 output\n    │ {\"passed\": 15}\n  … integration          output\n    │ {\"passed\": 5}\n    │ ok\n  … unit                 output\n    │ bye\n  ✓ unit                 succeeded\n"
        );
    }

    #[test]
    fn live_output_prints_under_its_step_line_by_line() {
        let mut progress = Progress::default();
        let mut out = Vec::new();
        for event in [
            output("code", "Writing ", false),
            output("code", "the theme\nDone", false),
            output("review", "Looks good", false),
            output("review", "Again", true),
        ] {
            progress.print(&mut out, "r", &event).unwrap();
        }
        let missed = RunEvent {
            event: Some(run_event::Event::OutputMissed(
                baton_proto::v1::OutputMissed { pieces: 3 },
            )),
        };
        progress.print(&mut out, "r", &missed).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "  … code                 output\n    │ Writing the theme\n    │ Done\n  … review               output\n    │ Looks good\n  … review               output (from the start again)\n    │ Again\n  … this watcher fell behind: 3 pieces of live output missed\n"
        );
    }

    fn map(succeeded: u64, failed: u64, running: u64) -> RunEvent {
        RunEvent {
            event: Some(run_event::Event::MapProgress(MapProgress {
                step_id: "each".into(),
                visit: 1,
                count: 100,
                succeeded,
                failed,
                running,
            })),
        }
    }

    #[test]
    fn a_map_s_progress_is_a_line_per_tenth_of_its_items_off_a_terminal() {
        let mut progress = Progress::new(false);
        let mut out = Vec::new();
        for (done, running) in [(0, 8), (3, 8), (9, 8), (10, 8), (19, 8), (55, 8), (100, 0)] {
            progress
                .print(&mut out, "r", &map(done, 0, running))
                .unwrap();
        }
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "  ⋯ each                 0/100 items done, 0 failed, 8 running\n  ⋯ each                 10/100 items done, 0 failed, 8 running\n  ⋯ each                 55/100 items done, 0 failed, 8 running\n  ⋯ each                 100/100 items done, 0 failed, 0 running\n"
        );
    }

    #[test]
    fn on_a_terminal_a_map_s_progress_is_one_line_rewritten_in_place() {
        let mut progress = Progress::new(true);
        let mut out = Vec::new();
        progress.print(&mut out, "r", &map(1, 0, 8)).unwrap();
        progress.print(&mut out, "r", &map(2, 1, 7)).unwrap();
        let finished = RunEvent {
            event: Some(run_event::Event::StepFinished(baton_proto::v1::StepFinished {
                step_id: "each".into(),
                visit: 1,
                status: "succeeded".into(),
                data: Some(baton_proto::Json::new(
                    br#"{"success": false, "data": [{"index": 0, "status": "fulfilled"}, {"index": 1, "status": "rejected"}]}"#.to_vec(),
                )),
                error: String::new(),
                next: String::new(),
                parent: String::new(),
            })),
        };
        progress.print(&mut out, "r", &finished).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "\r  ⋯ each                 1/100 items done, 0 failed, 8 running\x1b[K\r  ⋯ each                 3/100 items done, 1 failed, 7 running\x1b[K\n  ✓ each                 succeeded  (2 items, 1 failed)\n"
        );
    }
}
