//! The service's domain types out to the wire, as `baton.v1` messages.

use baton_proto::{Json, v1};

use crate::decisions::StoredDecision;
use crate::hub::{TaskMessage, ToWorker};
use crate::parts::Part;
use crate::record::{ModelUsage, RunRecord, StepView, WaitingFor};
use crate::service::{DecisionMatches, RunEvent, Stats, Submitted, Verification};
use crate::store::{RunPage, RunSummary};

impl From<&Part> for Json {
    fn from(part: &Part) -> Self {
        // The bytes are shared, not copied: one part goes to every worker that needs it.
        Json {
            json: part.json.clone(),
            sha256: part.sha256.clone(),
        }
    }
}

impl From<ModelUsage> for v1::Usage {
    fn from(usage: ModelUsage) -> Self {
        v1::Usage {
            model: usage.model,
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
        }
    }
}

impl From<Submitted> for v1::SubmitRunResponse {
    fn from(submitted: Submitted) -> Self {
        v1::SubmitRunResponse {
            run_id: submitted.run_id,
            existing: submitted.existing,
        }
    }
}

impl From<RunRecord> for v1::RunRecord {
    fn from(record: RunRecord) -> Self {
        v1::RunRecord {
            run_id: record.run_id,
            workflow_id: record.workflow_id,
            status: record.status.to_string(),
            error: record.error,
            context: Some(Json::new(record.context)),
            steps: record.steps.into_iter().map(Into::into).collect(),
            waiting: record.waiting.into_iter().map(Into::into).collect(),
            state_sha256: record.state_sha256,
            created_ms: record.created_ms,
            updated_ms: record.updated_ms,
            memory: Some(Json::new(record.memory)),
            trace_id: record.trace_id,
            submitted_by: record.submitted_by,
            usage: record.usage.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<StepView> for v1::StepState {
    fn from(step: StepView) -> Self {
        v1::StepState {
            step_id: step.step_id,
            r#type: step.step_type.as_str().into(),
            status: step.status.as_str().into(),
            attempts: step.attempts,
            visits: step.visits,
            worker_id: step.worker_id.map(String::from).unwrap_or_default(),
            parent: step.parent,
            agent: step.agent,
            error: step.error.unwrap_or_default(),
            usage: step
                .usage
                .into_iter()
                .map(|used| v1::AttemptUsage {
                    visit: used.visit,
                    attempt: used.attempt,
                    usage: Some(used.usage.into()),
                })
                .collect(),
            items: step.items.map(|items| v1::MapItems {
                count: items.count,
                succeeded: items.succeeded,
                failed: items.failed,
                running: items.running,
                usage: items.usage.into_iter().map(Into::into).collect(),
            }),
        }
    }
}

impl From<WaitingFor> for v1::Waiting {
    fn from(waiting: WaitingFor) -> Self {
        match waiting {
            WaitingFor::Agent {
                step_id,
                agent,
                served,
            } => v1::Waiting {
                kind: "agent".into(),
                step_id,
                agent,
                served,
                message: String::new(),
            },
            WaitingFor::Approval { step_id, message } => v1::Waiting {
                kind: "approval".into(),
                step_id,
                agent: String::new(),
                served: false,
                message,
            },
            WaitingFor::Computation { step_id } => v1::Waiting {
                kind: "compute".into(),
                step_id,
                agent: String::new(),
                served: false,
                message: String::new(),
            },
        }
    }
}

impl From<RunPage> for v1::ListRunsResponse {
    fn from(page: RunPage) -> Self {
        v1::ListRunsResponse {
            runs: page.runs.into_iter().map(Into::into).collect(),
            next_page_token: page.next.map(|next| next.token()).unwrap_or_default(),
        }
    }
}

impl From<RunSummary> for v1::RunSummary {
    fn from(run: RunSummary) -> Self {
        v1::RunSummary {
            run_id: run.run_id,
            workflow_id: run.workflow_id,
            status: run.status.to_string(),
            created_ms: run.created_ms,
            updated_ms: run.updated_ms,
        }
    }
}

impl From<RunEvent> for v1::RunEvent {
    fn from(event: RunEvent) -> Self {
        use v1::run_event::Event;
        let event = match event {
            RunEvent::StepStarted {
                step_id,
                visit,
                agent,
                worker_id,
                attempt: _,
            } => Event::StepStarted(v1::StepStarted {
                step_id,
                visit,
                agent: agent.into(),
                worker_id: worker_id.map(String::from).unwrap_or_default(),
            }),
            RunEvent::StepFinished {
                step_id,
                visit,
                status,
                data,
                encoded,
                error,
                next,
                parent,
                position: _,
                answered_by: _,
            } => Event::StepFinished(v1::StepFinished {
                step_id,
                visit,
                status: status.as_str().into(),
                data: match (encoded, data) {
                    (Some(part), _) => Some(part.as_ref().into()),
                    (None, Some(data)) => Some(Json::new(
                        serde_json::to_vec(data.as_ref()).expect("data is JSON"),
                    )),
                    (None, None) => None,
                },
                error,
                next,
                parent,
            }),
            RunEvent::ApprovalRequested {
                step_id,
                visit,
                message,
            } => Event::ApprovalRequested(v1::ApprovalRequested {
                step_id,
                visit,
                message,
            }),
            RunEvent::RunFinished(record) => Event::RunFinished(v1::RunFinished {
                record: Some((*record).into()),
            }),
            RunEvent::StepOutput {
                step_id,
                visit,
                attempt,
                text,
                restart,
                offset,
                worker_id: _,
            } => Event::StepOutput(v1::StepOutput {
                step_id,
                visit,
                attempt,
                text,
                restart,
                offset: offset.to_string(),
            }),
            RunEvent::OutputMissed { pieces } => Event::OutputMissed(v1::OutputMissed { pieces }),
            RunEvent::MapProgress(progress) => Event::MapProgress(v1::MapProgress {
                step_id: progress.step_id.to_string(),
                visit: progress.visit,
                count: progress.count as u64,
                succeeded: progress.succeeded as u64,
                failed: progress.failed as u64,
                running: progress.running as u64,
            }),
        };
        v1::RunEvent { event: Some(event) }
    }
}

impl From<Stats> for v1::Stats {
    fn from(stats: Stats) -> Self {
        v1::Stats {
            workers: stats.workers,
            tasks_dispatched: stats.tasks_dispatched,
            bytes_to_workers: stats.bytes_to_workers,
            transitions: stats.transitions,
            engine_us: stats.engine_us,
            plan_us: stats.plan_us,
            store_us: stats.store_us,
            act_us: stats.act_us,
            integrity_failures: stats.integrity_failures,
            resends: stats.resends,
            fenced_results: stats.fenced_results,
            retries: stats.retries,
            redeliveries: stats.redeliveries,
            timeouts: stats.timeouts,
        }
    }
}

impl From<Verification> for v1::VerifyRunResponse {
    fn from(verified: Verification) -> Self {
        v1::VerifyRunResponse {
            ok: verified.ok,
            links: verified.links,
            state_sha256: verified.state_sha256,
            problem: verified.problem,
            step_id: verified.step_id,
            visit: verified.visit,
        }
    }
}

impl From<DecisionMatches> for v1::QueryDecisionsResponse {
    fn from(found: DecisionMatches) -> Self {
        v1::QueryDecisionsResponse {
            matches: found.matches.into_iter().map(decision_match).collect(),
            model: found.model,
        }
    }
}

fn decision_match((stored, score): (StoredDecision, f32)) -> v1::DecisionMatch {
    let d = stored.decision;
    v1::DecisionMatch {
        run_id: stored.run_id,
        key: d.key,
        agent: d.agent,
        step_id: d.step_id,
        visit: d.visit,
        summary: d.summary,
        rationale: d.rationale,
        timestamp: d.timestamp,
        related_artifacts: d.related_artifacts,
        score,
    }
}

impl From<ToWorker> for v1::CoordinatorMessage {
    fn from(message: ToWorker) -> Self {
        use v1::coordinator_message::Message;
        let message = match message {
            ToWorker::Task(task) => Message::Task(task.into()),
            ToWorker::Cancel { task_id, reason } => {
                Message::Cancel(v1::CancelTask { task_id, reason })
            }
            ToWorker::ResetPartCache => Message::ResetPartCache(v1::ResetPartCache {}),
            ToWorker::Goodbye => Message::Goodbye(v1::Goodbye {}),
            ToWorker::Rejected { task_id, message } => {
                Message::Rejected(v1::TaskRejected { task_id, message })
            }
        };
        v1::CoordinatorMessage {
            message: Some(message),
        }
    }
}

impl From<TaskMessage> for v1::Task {
    fn from(task: TaskMessage) -> Self {
        v1::Task {
            task_id: task.task.to_string(),
            attempt: task.task.attempt,
            run_id: task.task.run_id.into(),
            step_id: task.task.task.step_id.to_string(),
            visit: task.task.task.visit,
            agent: task.agent.into(),
            manifest: Some(task.manifest.as_ref().into()),
            parts: task.parts.iter().map(|part| part.as_ref().into()).collect(),
            timeout_ms: task.timeout_ms,
            traceparent: task.traceparent,
            item: task.task.task.item,
        }
    }
}
