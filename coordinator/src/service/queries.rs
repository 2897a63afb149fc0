//! Decisions found by meaning: for clients (`QueryDecisions`), and for agents mid-step, only
//! about the run of a task their worker holds.

use super::{Coordinator, Error};
use crate::decisions::{self, StoredDecision};
use crate::metrics::Refused;
use crate::store::{Listing, Runs, Store};
use crate::task_ref::TaskRef;

/// Whose decisions a query ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Run(String),
    /// Every run of the workflow with this `id`, newest first, up to a limit.
    Workflow(String),
}

/// A query, as the edge checked it: text that is not blank and not too long, `k` within its
/// limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionQuery {
    pub scope: Scope,
    pub text: String,
    /// Only this agent's decisions.
    pub agent: Option<String>,
    /// How many matches at most.
    pub k: usize,
}

/// An agent's query, through the task its worker holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerQuery {
    /// The worker the query is made through: a field the caller fills in, so it counts only
    /// when that worker connected as `principal`.
    pub worker_id: String,
    /// Who asks (`None` without authentication); the edge fills it in from the call.
    pub principal: Option<String>,
    pub task: TaskRef,
    /// Every run of the task's workflow rather than its run alone.
    pub workflow_scope: bool,
    pub text: String,
    pub agent: Option<String>,
    pub k: usize,
}

/// The best matches first, with their cosine similarity, and the embedder's model.
#[derive(Debug, Clone)]
pub struct DecisionMatches {
    pub matches: Vec<(StoredDecision, f32)>,
    pub model: String,
}

impl<S: Store> Coordinator<S> {
    /// The decisions closest in meaning to the query's text.
    pub async fn query_decisions(&self, query: DecisionQuery) -> Result<DecisionMatches, Error> {
        let config = &self.inner.config;
        let runs = match &query.scope {
            Scope::Run(run_id) => vec![run_id.clone()],
            Scope::Workflow(workflow_id) => {
                self.inner
                    .store
                    .runs_of_workflow(workflow_id, config.max_query_runs)
                    .await?
            }
        };
        let mut found = Vec::new();
        for run_id in &runs {
            let stored = self.inner.store.decisions(run_id).await?;
            // A run without decisions may not exist at all: say so rather than "no match".
            if stored.is_empty()
                && matches!(query.scope, Scope::Run(_))
                && self.inner.runs.cached(run_id).is_none()
                && self.inner.store.load_run(run_id).await?.is_none()
            {
                return Err(Error::RunNotFound(run_id.clone()));
            }
            if found.len() + stored.len() > config.max_query_decisions {
                tracing::warn!(
                    limit = config.max_query_decisions,
                    "a decision query stops reading older runs at its limit"
                );
                break;
            }
            for (key, bytes) in stored {
                let decision: StoredDecision =
                    serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
                        run_id: run_id.clone(),
                        reason: format!("decision {key}: {e}"),
                    })?;
                found.push(decision);
            }
        }
        let embedder = &self.inner.embedder;
        let agent = query.agent.as_deref();
        let matches = decisions::rank(embedder, &query.text, agent, query.k, found)
            .await
            .map_err(|e| Error::Embedding(e.to_string()))?;
        Ok(DecisionMatches {
            matches,
            model: embedder.model().to_owned(),
        })
    }

    /// [`Coordinator::query_decisions`] for an agent mid-step: only about the run of a task
    /// the worker holds (or, with `workflow_scope`, every run of its workflow), and only when
    /// that worker is the caller's principal's: a worker id is no secret, and another
    /// principal's worker naming it would otherwise read that run's decisions.
    pub async fn worker_query_decisions(
        &self,
        query: WorkerQuery,
    ) -> Result<DecisionMatches, Error> {
        let task = &query.task;
        if !self.inner.hub.holds_as(
            &query.worker_id,
            query.principal.as_deref(),
            &task.run_id,
            &task.key(),
            task.attempt,
        ) {
            self.inner.metrics.worker_refused(Refused::Query);
            return Err(Error::TaskNotHeld {
                worker_id: query.worker_id.clone(),
                task_id: task.to_string(),
            });
        }
        let scope = if query.workflow_scope {
            let workflow_id = self.workflow_id_of(&task.run_id).await?;
            if workflow_id.is_empty() {
                return Err(Error::InvalidInput(
                    "workflow_scope: this run's workflow has no \"id\", so there are no other runs of it to search; give the workflow an id, or query the run alone".into(),
                ));
            }
            Scope::Workflow(workflow_id)
        } else {
            Scope::Run(task.run_id.to_string())
        };
        self.query_decisions(DecisionQuery {
            scope,
            text: query.text,
            agent: query.agent,
            k: query.k,
        })
        .await
    }

    async fn workflow_id_of(&self, run_id: &str) -> Result<String, Error> {
        let (_, guard) = self.locked(run_id).await?;
        let loaded = guard.as_ref().expect("locked loads the run");
        Ok(loaded.header.workflow_id.clone())
    }
}
