//! New runs: the workflow validated, the idempotency key claimed, the run stored and started.

use std::sync::Arc;

use baton_core::integrity::genesis_of_digest;
use baton_core::{Diagnostic, Diagnostics, Run};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::Mutex as AsyncMutex;

use super::plan::{Applied, plan};
use super::runs::Loaded;
use super::{Coordinator, Error, json};
use crate::model::{LoggedEvent, StoredEvent};
use crate::store::{self, Claim, RunHeader, Store};

/// How long an idempotency key names its run: a client retrying within a day gets the same run.
pub const IDEMPOTENCY_TTL_S: u64 = 24 * 60 * 60;

/// A run to start. From a client, the edge has checked it: sizes within their limits, the
/// input's digest, the input valid JSON no deeper than agents can parse.
#[derive(Debug, Clone)]
pub struct Submission {
    /// The workflow document, as submitted.
    pub workflow: Vec<u8>,
    /// The input's bytes as submitted: they are stored, and they tell two requests apart.
    pub input: Vec<u8>,
    /// The same input, read.
    pub input_value: Value,
    /// A client's retry with the same key (within a day) gets the same run.
    pub idempotency_key: Option<String>,
    /// W3C trace context of the run's `SubmitRun` span (or of the caller's, untraced here),
    /// stored with the run; empty for none.
    pub traceparent: String,
    /// The authenticated principal submitting, and how many of its runs may run at once.
    pub principal: Option<Submitter>,
}

/// Who submits a run, when the coordinator authenticates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitter {
    pub name: String,
    pub max_running_runs: Option<u32>,
}

impl Submission {
    /// `workflow` with `input`, no key, untraced: how an in-process caller submits.
    pub fn new(workflow: impl Into<Vec<u8>>, input: &Value) -> Self {
        Submission {
            workflow: workflow.into(),
            input: json(input),
            input_value: input.clone(),
            idempotency_key: None,
            traceparent: String::new(),
            principal: None,
        }
    }

    pub fn with_idempotency_key(self, key: &str) -> Self {
        Submission {
            idempotency_key: Some(key.to_owned()),
            ..self
        }
    }

    /// What makes two submissions the same request: the workflow text and the input bytes.
    fn request_sha256(&self) -> String {
        hex::encode(
            Sha256::new()
                .chain_update(&self.workflow)
                .chain_update([0])
                .chain_update(&self.input)
                .finalize(),
        )
    }
}

/// The run a submission started, or found under its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    pub run_id: String,
    /// The key already named this run: nothing new was started.
    pub existing: bool,
    /// The workflow's `id`, empty if it has none.
    pub workflow_id: String,
}

impl<S: Store> Coordinator<S> {
    /// Validates the workflow, stores the new run and starts it. With an idempotency key, the
    /// first submission starts a run, and the same request with the same key (a client's retry,
    /// within a day) gets that run back instead of a second one; the same key with another
    /// workflow or input is refused, naming the run it belongs to.
    pub async fn submit(&self, submission: Submission) -> Result<Submitted, Error> {
        let text = std::str::from_utf8(&submission.workflow).map_err(|_| {
            Error::InvalidWorkflow(Diagnostics(vec![Diagnostic::error(
                "$",
                None,
                "the workflow is not UTF-8 text",
            )]))
        })?;
        let known = self
            .inner
            .workflows
            .parse(text)
            .map_err(|e| Error::InvalidWorkflow(e.diagnostics))?;
        let workflow = known.workflow;
        let workflow_id = workflow.id.clone().unwrap_or_default();
        let submitted = |run_id: String, existing: bool| Submitted {
            run_id,
            existing,
            workflow_id: workflow_id.clone(),
        };
        let limited = submission
            .principal
            .as_ref()
            .and_then(|principal| Some((principal.name.as_str(), principal.max_running_runs?)));
        if let Some((name, limit)) = limited {
            // Checked before the run is stored; submits racing each other may pass it together.
            let running = self.inner.store.running_runs_of(name).await?;
            if running >= limit as usize {
                return Err(Error::TooManyRunning {
                    principal: name.to_owned(),
                    running,
                    limit,
                });
            }
        }
        let mut run_id = uuid::Uuid::now_v7().to_string();
        if let Some(key) = &submission.idempotency_key {
            let request = submission.request_sha256();
            match self
                .inner
                .store
                .claim_idempotency_key(key, &run_id, &request, IDEMPOTENCY_TTL_S)
                .await?
            {
                Claim::Claimed => {}
                Claim::Held {
                    run_id: held,
                    request_sha256,
                } if request_sha256 != request => {
                    return Err(Error::IdempotencyConflict {
                        key: key.clone(),
                        run_id: held,
                    });
                }
                Claim::Held { run_id: held, .. } => {
                    if self.inner.store.load_run(&held).await?.is_some() {
                        return Ok(submitted(held, true));
                    }
                    // Claimed, but its run was never created (the submitter died in between,
                    // or is creating it now): create it under the id the key names.
                    run_id = held;
                }
            }
        }
        let now = self.now_ms();
        let header = RunHeader {
            run_id: run_id.clone(),
            workflow_id: workflow_id.clone(),
            workflow: text.to_owned(),
            input: submission.input.clone(),
            created_ms: now,
            traceparent: submission.traceparent.clone(),
            submitted_by: submission
                .principal
                .as_ref()
                .map(|principal| principal.name.clone())
                .unwrap_or_default(),
        };
        let chain_start = genesis_of_digest(&run_id, &known.text_sha256, &submission.input_value);
        let transition = Run::start(workflow, submission.input_value);
        let mut loaded = Loaded::new(header.clone(), transition.run.clone(), now, chain_start);
        // The first event says the run started the way a replay must start it: its walk stops
        // before any step that runs jq, which goes on in a transition of its own, once the run
        // is stored (listed, watchable, cancellable). No submit ever runs a jq program.
        let started = LoggedEvent::new(now, StoredEvent::Started);
        let applied = Applied {
            event: Some(&started),
            answering: None,
            transition: &transition,
            history_before: 0,
            now_ms: now,
            embedded: None,
            computed: &[],
        };
        let planned = plan(&loaded, &applied, &self.holder());
        match self
            .inner
            .store
            .create_run(header, planned.write.clone())
            .await
        {
            Ok(()) => {}
            // Another submission with the same idempotency key created it first.
            Err(store::Error::AlreadyExists(_)) if submission.idempotency_key.is_some() => {
                return Ok(submitted(run_id, true));
            }
            Err(error) => return Err(error.into()),
        }
        if let Some((name, _)) = limited
            && !transition.run.status().is_terminal()
        {
            self.inner.store.add_principal_run(name, &run_id).await?;
        }
        let held = self.held_change(&planned);
        loaded.adopt(transition.run.clone(), 1, planned);
        let slot = Arc::new(AsyncMutex::new(None));
        let mut guard = slot.lock().await;
        self.inner.runs.insert(&run_id, slot.clone());
        let assignments = self.act(&run_id, &mut loaded, &transition.actions, 0);
        self.note_held(&run_id, held);
        self.inner.metrics.run_started();
        let finished = loaded.run.status().is_terminal();
        *guard = Some(loaded);
        drop(guard);
        if finished {
            self.inner.runs.evict(&run_id);
        }
        self.assigned(assignments).await;
        Ok(submitted(run_id, false))
    }
}
