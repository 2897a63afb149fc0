//! New runs: the workflow validated, the idempotency key claimed, the run stored and started.

use std::sync::Arc;

use baton_core::integrity::genesis_of_digest;
use baton_core::{Diagnostic, Diagnostics, Run, Transition};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::Mutex as AsyncMutex;

use super::plan::{Applied, Planned, plan};
use super::runs::Loaded;
use super::{Coordinator, Error, json};
use crate::model::{LoggedEvent, StoredEvent};
use crate::store::{self, Claim, Coordination, RunHeader, Runs, Store};
use crate::workflows::Known;

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

/// How many times a submission with an idempotency key whose run was voided is given a new run
/// (a voided run is one whose submit timed out and was settled as never done).
const RECLAIMS: usize = 3;

/// The run a submission goes on with.
enum Claimed {
    /// Not created yet: create it under this id.
    New(String),
    /// Its idempotency key names this run, which exists.
    Existing(String),
}

impl<S: Store> Coordinator<S> {
    /// Validates the workflow, stores the new run and starts it. With an idempotency key, the
    /// first submission starts a run, and the same request with the same key (a client's retry,
    /// within a day) gets that run back instead of a second one; the same key with another
    /// workflow or input is refused, naming the run it belongs to.
    ///
    /// A store that does not answer the create is asked whether it was done before this
    /// answers (`resolve`): an error means the run was not created and never will be, or says
    /// it may have been and names it.
    pub async fn submit(&self, submission: Submission) -> Result<Submitted, Error> {
        let (text, known) = self.parse_workflow(&submission)?;
        let workflow_id = known.workflow.id.clone().unwrap_or_default();
        let submitted = |run_id: String, existing: bool| Submitted {
            run_id,
            existing,
            workflow_id: workflow_id.clone(),
        };
        self.check_running_limit(&submission).await?;
        let mut voided = None;
        for _ in 0..RECLAIMS {
            let run_id = match self.claim(&submission, voided.take()).await? {
                Claimed::New(run_id) => run_id,
                Claimed::Existing(run_id) => return Ok(submitted(run_id, true)),
            };
            match self.start(&submission, text, &known, run_id.clone()).await {
                Ok(existing) => return Ok(submitted(run_id, existing)),
                // The run the key names was voided: the key is given a new one.
                Err(Error::Store(store::Error::Voided(_)))
                    if submission.idempotency_key.is_some() =>
                {
                    voided = Some(run_id);
                }
                Err(error) => return Err(error),
            }
        }
        Err(store::Error::Unavailable(format!(
            "the runs of this idempotency key were voided {RECLAIMS} times (their creates went \
             unanswered): submit again"
        ))
        .into())
    }

    /// The submission's workflow, read and validated (parsed once per distinct text).
    fn parse_workflow<'s>(&self, submission: &'s Submission) -> Result<(&'s str, Known), Error> {
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
        Ok((text, known))
    }

    /// Refuses a submission whose principal already runs as many runs as it may. Checked before
    /// the run is stored; submits racing each other may pass it together.
    async fn check_running_limit(&self, submission: &Submission) -> Result<(), Error> {
        let Some((name, limit)) = limited(submission) else {
            return Ok(());
        };
        let running = self.inner.store.running_runs_of(name).await?;
        if running >= limit as usize {
            return Err(Error::TooManyRunning {
                principal: name.to_owned(),
                running,
                limit,
            });
        }
        Ok(())
    }

    /// The run id a submission starts its run under: a fresh one, or the one its idempotency
    /// key names (`Existing` if that run exists). `voided` is a run the key named whose create
    /// was voided: the key is given a fresh id instead.
    async fn claim(
        &self,
        submission: &Submission,
        voided: Option<String>,
    ) -> Result<Claimed, Error> {
        let run_id = uuid::Uuid::now_v7().to_string();
        let Some(key) = &submission.idempotency_key else {
            return Ok(Claimed::New(run_id));
        };
        let request = submission.request_sha256();
        let store = &self.inner.store;
        let claim = match &voided {
            Some(voided) => {
                store
                    .reclaim_idempotency_key(key, voided, &run_id, &request, IDEMPOTENCY_TTL_S)
                    .await?
            }
            None => {
                store
                    .claim_idempotency_key(key, &run_id, &request, IDEMPOTENCY_TTL_S)
                    .await?
            }
        };
        match claim {
            Claim::Claimed => Ok(Claimed::New(run_id)),
            Claim::Held {
                run_id: held,
                request_sha256,
            } if request_sha256 != request => Err(Error::IdempotencyConflict {
                key: key.clone(),
                run_id: held,
            }),
            Claim::Held { run_id: held, .. } => {
                if store.load_run(&held).await?.is_some() {
                    return Ok(Claimed::Existing(held));
                }
                // Claimed, but its run was never created (the submitter died in between, or is
                // creating it now, or its create was voided): create it under the id the key
                // names (which is `Voided` if it was).
                Ok(Claimed::New(held))
            }
        }
    }

    /// Stores the run `run_id` of a valid submission (`text`, parsed as `known`) and starts it;
    /// whether it existed already (another submission with the same idempotency key created it
    /// first).
    async fn start(
        &self,
        submission: &Submission,
        text: &str,
        known: &Known,
        run_id: String,
    ) -> Result<bool, Error> {
        let now = self.now_ms();
        let header = RunHeader {
            run_id: run_id.clone(),
            workflow_id: known.workflow.id.clone().unwrap_or_default(),
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
        let transition = Run::start(known.workflow.clone(), submission.input_value.clone());
        let loaded = Loaded::new(header.clone(), transition.run.clone(), now, chain_start);
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
            fence: None,
        };
        let planned = plan(&loaded, &applied, &self.holder());
        match self.create_settled(&header, planned.write.clone()).await {
            Ok(()) => {}
            // Another submission with the same idempotency key created it first.
            Err(Error::Store(store::Error::AlreadyExists(_)))
                if submission.idempotency_key.is_some() =>
            {
                return Ok(true);
            }
            Err(error) => return Err(error),
        }
        // The run exists now: failing the submit here would tell the client it failed while
        // the run runs. A run left uncounted lets its principal start one more than its limit.
        if let Some((name, _)) = limited(submission)
            && !transition.run.status().is_terminal()
            && let Err(error) = self.inner.store.add_principal_run(name, &run_id).await
        {
            tracing::warn!(run_id, principal = name, %error, "run created but not counted against its principal's max_running_runs");
        }
        self.take_in_created(&run_id, loaded, transition, planned)
            .await;
        Ok(false)
    }

    /// A run just created, kept in memory (locked while its first actions are carried out) and
    /// its first tasks handed out.
    async fn take_in_created(
        &self,
        run_id: &str,
        mut loaded: Loaded,
        transition: Transition,
        planned: Planned,
    ) {
        let held = self.held_change(&planned);
        loaded.adopt(transition.run.clone(), 1, planned);
        let slot = Arc::new(AsyncMutex::new(None));
        let mut guard = slot.lock().await;
        self.inner.runs.insert(run_id, slot.clone());
        let assignments = self.act(run_id, &mut loaded, &transition.actions, 0);
        self.note_held(run_id, held);
        self.inner.metrics.run_started();
        let finished = loaded.run.status().is_terminal();
        *guard = Some(loaded);
        drop(guard);
        if finished {
            self.inner.runs.evict(run_id);
        }
        self.assigned(assignments).await;
    }
}

/// The submitting principal's name and its limit of running runs, if it has one.
fn limited(submission: &Submission) -> Option<(&str, u32)> {
    let principal = submission.principal.as_ref()?;
    Some((principal.name.as_str(), principal.max_running_runs?))
}
