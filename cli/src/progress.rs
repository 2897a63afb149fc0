//! Printing a run's events as they come: one line per step that starts or settles.

use std::io::Write;

use baton_proto::v1::{RunEvent, RunRecord, run_event};

/// Writes one human line for `event`, or nothing.
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
        None => Ok(()),
    }
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
