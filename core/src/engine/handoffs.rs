//! What agent step visits hand on to the next agent step, as a transition records it: an
//! `impl Builder` beside [`super::transition`], which calls it as agents, parallel steps and
//! map items settle.
//!
//! The records themselves (decisions, sources, handoffs) are [`crate::handoff`]'s; here is when
//! they are made and where the run keeps them. An agent's decisions are recorded at once; its
//! messages merge into the history at once, or, in a branch, wait in the parallel step's slot
//! until the last branch settles, so that they join in branch order and the branches still in
//! flight keep the history they were dispatched with.

use std::sync::Arc;

use imbl::Vector;
use serde_json::value::RawValue;

use super::build::Builder;
use super::events::TaskId;
use super::pending::{Handed, Pending};
use super::run::MessageHistory;
use crate::handoff::{AgentNotes, DecisionRecord, Handoff, Source, rfc3339};
use crate::messages::{MAX_HISTORY, MessageUpdate, add_branch_messages, add_messages, assign_ids};
use crate::workflow::{MapBody, MapStep, Step, StepIndex, StepKind};

impl Builder {
    /// Records what an agent step visit hands on: its decisions at once, its messages into the
    /// history (a branch's wait for the merge, in branch order), and itself as the source of
    /// the next handoff. Messages that cannot merge (a removal of an unknown id) fail the step
    /// with the reason; it still hands over, without decisions.
    pub(super) fn hand_on(
        &mut self,
        index: StepIndex,
        visit: u32,
        notes: AgentNotes,
    ) -> Result<(), Arc<str>> {
        let (source, messages, merged) = self.take_notes(index, visit, None, notes);
        match self.run.workflow.step(index).parent {
            None => {
                if let Ok(Some(merged)) = &merged {
                    self.run.messages = MessageHistory::new(merged.clone());
                }
                self.run.sources = Arc::new(vec![source]);
            }
            Some(parent) => {
                let handed = Handed {
                    entries: vec![(source, messages)],
                };
                self.file_handed(parent, index, handed);
            }
        }
        merged.map(|_| ())
    }

    /// [`Builder::hand_on`] for a map item's agent: its decisions at once; its messages wait
    /// with the item (they join the history in index order when the map settles), and it hands
    /// over to the chain's next agent.
    pub(super) fn hand_on_item(
        &mut self,
        task: &TaskId,
        notes: AgentNotes,
        hand: &mut ItemHand<'_>,
    ) -> Result<(), Arc<str>> {
        let index = self
            .run
            .workflow
            .index_of(&task.step_id)
            .expect("a task the run waits for names one of its steps");
        let (source, messages, merged) = self.take_notes(index, task.visit, task.item, notes);
        *hand.sources = Arc::new(vec![source.clone()]);
        hand.handed.push((source, messages));
        merged.map(|_| ())
    }

    /// An agent's notes, checked: its decisions recorded, its messages given ids and checked
    /// against the history (not applied), and the source record of its visit.
    #[expect(
        clippy::type_complexity,
        reason = "one private helper's three results, named at its two callers"
    )]
    fn take_notes(
        &mut self,
        index: StepIndex,
        visit: u32,
        item: Option<u32>,
        mut notes: AgentNotes,
    ) -> (
        Arc<Source>,
        Vec<MessageUpdate>,
        Result<Option<Vec<crate::messages::Message>>, Arc<str>>,
    ) {
        let workflow = self.run.workflow.clone();
        let step = workflow.step(index);
        let agent = match &step.kind {
            StepKind::Agent { agent } => agent,
            StepKind::Map(MapStep {
                body: MapBody::Agent(agent),
                ..
            }) => agent,
            _ => unreachable!("only agent steps take agent results"),
        };
        // A map's items share the step (and, for an `agent` map, the visit): the item tells
        // their messages and decisions apart.
        let label = match item {
            Some(i) => format!("{}[{i}]", step.id),
            None => step.id.to_string(),
        };
        let message_ids = assign_ids(&mut notes.messages, &label, visit);
        // Most results carry no messages: the history stays as it is, shared.
        let checked = if notes.messages.is_empty() {
            Ok(None)
        } else {
            add_messages(
                self.run.messages.messages(),
                notes.messages.clone(),
                &label,
                visit,
                agent,
            )
            .map_err(|e| Arc::<str>::from(format!("the agent's messages were refused: {e}")))
            .and_then(|merged| {
                // Every later payload carries the history: it may not grow without bound.
                if merged.len() > MAX_HISTORY {
                    Err(format!(
                        "the agent's messages were refused: the history would hold {} messages; the limit is {MAX_HISTORY}",
                        merged.len()
                    )
                    .into())
                } else {
                    Ok(Some(merged))
                }
            })
        };
        let source = |decisions, message_ids| {
            Arc::new(Source {
                agent: agent.clone(),
                step_id: step.id.clone(),
                visit,
                item,
                decisions,
                message_ids,
            })
        };
        match checked {
            Ok(merged) => {
                // The ids this update leaves in the history, each once: what memory_refs name.
                let kept: std::collections::HashSet<&str> =
                    merged.iter().flatten().map(|m| m.id.as_str()).collect();
                let mut seen = std::collections::HashSet::new();
                let message_ids: Vec<String> = message_ids
                    .into_iter()
                    .filter(|id| kept.contains(id.as_str()) && seen.insert(id.clone()))
                    .collect();
                let timestamp = if notes.decisions.is_empty() {
                    Arc::from("")
                } else {
                    self.timestamp()
                };
                let decisions: Vec<Arc<DecisionRecord>> = notes
                    .decisions
                    .into_iter()
                    .enumerate()
                    .map(|(n, d)| {
                        Arc::new(DecisionRecord {
                            key: format!("{label}#{visit}/{n}"),
                            agent: agent.clone(),
                            step_id: step.id.to_string(),
                            visit,
                            summary: d.summary,
                            rationale: d.rationale,
                            timestamp: timestamp.to_string(),
                            related_artifacts: d.related_artifacts,
                        })
                    })
                    .collect();
                self.run.decisions.extend(decisions.iter().cloned());
                (source(decisions, message_ids), notes.messages, Ok(merged))
            }
            Err(refused) => (source(Vec::new(), Vec::new()), Vec::new(), Err(refused)),
        }
    }

    /// Files what `branch` handed on into its slot of the parallel step `parent`.
    fn file_handed(&mut self, parent: StepIndex, branch: StepIndex, branch_handed: Handed) {
        let workflow = self.run.workflow.clone();
        let StepKind::Parallel { branches, .. } = &workflow.step(parent).kind else {
            unreachable!("a branch's parent is a parallel step");
        };
        let slot = branches.iter().position(|&b| b == branch);
        if let (Some(slot), Some(Pending::Parallel(waiting))) =
            (slot, self.run.pending.get_mut(&parent))
        {
            waiting.handed.set(slot, Some(branch_handed));
        }
    }

    /// A parallel step settled: its agent branches' messages join the history in branch order,
    /// and those branches hand over together to the next agent step. A parallel step nested in
    /// another passes all of it up instead, so that nothing is applied before the outermost
    /// parallel step settles (its other branches all started from the same history).
    pub(super) fn merge_handed(&mut self, parallel: StepIndex, handed: &Vector<Option<Handed>>) {
        // (A map step's items merge the same way, in index order.)
        let entries: Vec<(Arc<Source>, Vec<MessageUpdate>)> = handed
            .iter()
            .flatten()
            .flat_map(|h| h.entries.iter().cloned())
            .collect();
        if entries.is_empty() {
            return;
        }
        if let Some(outer) = self.run.workflow.step(parallel).parent {
            self.file_handed(outer, parallel, Handed { entries });
            return;
        }
        let mut messages = self.run.messages.messages().to_vec();
        let mut changed = false;
        for (source, updates) in &entries {
            if updates.is_empty() {
                continue;
            }
            messages = add_branch_messages(
                &messages,
                updates.clone(),
                &source.step_id,
                source.visit,
                &source.agent,
            );
            changed = true;
        }
        if changed {
            self.run.messages = MessageHistory::new(messages);
        }
        self.run.sources = Arc::new(entries.into_iter().map(|(source, _)| source).collect());
    }

    /// Writes the handoff into an agent step being entered, from the agent step visits that
    /// handed on last, and keeps it in the run. `None` until some agent step has settled.
    /// The record is returned as JSON text so that every payload of this visit shares it.
    pub(super) fn handoff_into(
        &mut self,
        step: &Step,
        agent: &str,
        visit: u32,
        item: Option<u32>,
        sources: &[Arc<Source>],
    ) -> Option<Arc<RawValue>> {
        (!sources.is_empty()).then(|| {
            let timestamp = self.timestamp();
            let mut handoff = Handoff::new(
                sources,
                agent,
                step.id.clone(),
                visit,
                (!timestamp.is_empty()).then(|| timestamp.to_string()),
            );
            handoff.item = item;
            let handoff = Arc::new(handoff);
            self.run.handoffs.push_back(handoff.clone());
            Arc::from(handoff.to_raw())
        })
    }

    /// The transition's time, RFC 3339 (empty when the event carried none).
    pub(super) fn timestamp(&mut self) -> Arc<str> {
        let now_ms = self.run.now_ms;
        self.timestamp
            .get_or_insert_with(|| rfc3339(now_ms).unwrap_or_default().into())
            .clone()
    }
}

/// What an item's agent answer may change besides its outcome: the chain's sources and what
/// the item hands on ([`Builder::hand_on`]).
pub(super) struct ItemHand<'a> {
    pub sources: &'a mut Arc<Vec<Arc<Source>>>,
    pub handed: &'a mut Vec<(Arc<Source>, Vec<MessageUpdate>)>,
}
