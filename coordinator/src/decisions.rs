//! Decision memory: decisions as stored (with their embedding) and ranked by meaning.
//!
//! When a result carries decisions, the coordinator embeds them before it applies the result,
//! and the transition stores each one with its vector. A query embeds its text with the same
//! embedder and ranks by cosine similarity. A decision stored without a vector (the embedder was
//! down when it arrived) or with another model's vector (the embedder was changed since) is
//! embedded again at query time; one the embedder refuses even alone is left out of that query
//! with a warning, rather than failing it for every other decision.

use std::sync::Arc;

use baton_core::handoff::DecisionRecord;
use serde::{Deserialize, Serialize};

use crate::embed::{EmbedError, Embedder, cosine, top_k};

/// Vectors for the decisions of one result, in order, and the model that made them.
#[derive(Debug, Clone)]
pub struct Embedded {
    pub model: String,
    pub vectors: Vec<Vec<f32>>,
}

/// A decision as the store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredDecision {
    pub run_id: String,
    #[serde(flatten)]
    pub decision: DecisionRecord,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub embedding: Option<Vec<f32>>,
}

impl StoredDecision {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a decision is JSON")
    }
}

/// The `k` decisions closest to `text`, best first, with their scores; only `agent`'s if set.
pub async fn rank(
    embedder: &Arc<dyn Embedder>,
    text: &str,
    agent: Option<&str>,
    k: usize,
    mut decisions: Vec<StoredDecision>,
) -> Result<Vec<(StoredDecision, f32)>, EmbedError> {
    if let Some(agent) = agent {
        decisions.retain(|d| d.decision.agent == agent);
    }
    if decisions.is_empty() || k == 0 {
        return Ok(Vec::new());
    }
    let model = embedder.model().to_owned();
    let stale: Vec<usize> = decisions
        .iter()
        .enumerate()
        .filter(|(_, d)| d.embedding.is_none() || d.model.as_deref() != Some(model.as_str()))
        .map(|(i, _)| i)
        .collect();
    let query = embedder
        .embed(&[text.to_owned()])
        .await?
        .pop()
        .unwrap_or_default();
    let texts: Vec<String> = stale
        .iter()
        .map(|&i| decisions[i].decision.text())
        .collect();
    let vectors = match embedder.embed(&texts).await {
        Ok(vectors) => vectors.into_iter().map(Some).collect(),
        // One text the embedder refuses must not hide every other decision: try each alone.
        Err(_) => {
            let mut one_by_one = Vec::with_capacity(texts.len());
            for text in &texts {
                let vector = embedder.embed(std::slice::from_ref(text)).await;
                if let Err(error) = &vector {
                    tracing::warn!(%error, "a decision cannot be embedded; it is left out of this query");
                }
                one_by_one.push(vector.ok().and_then(|mut v| v.pop()));
            }
            one_by_one
        }
    };
    let mut unembeddable = Vec::new();
    for (&i, vector) in stale.iter().zip(vectors) {
        match vector {
            Some(vector) => {
                decisions[i].embedding = Some(vector);
                decisions[i].model = Some(model.clone());
            }
            None => unembeddable.push(i),
        }
    }
    for i in unembeddable.into_iter().rev() {
        decisions.remove(i);
    }
    let scores: Vec<f32> = decisions
        .iter()
        .map(|d| cosine(&query, d.embedding.as_deref().unwrap_or_default()))
        .collect();
    Ok(top_k(&scores, k)
        .into_iter()
        .map(|i| (decisions[i].clone(), scores[i]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embed::HashedNgrams;

    fn stored(agent: &str, summary: &str, rationale: &str) -> StoredDecision {
        StoredDecision {
            run_id: "r".into(),
            decision: DecisionRecord {
                key: format!("{agent}#1/0"),
                agent: agent.into(),
                step_id: agent.into(),
                visit: 1,
                summary: summary.into(),
                rationale: rationale.into(),
                timestamp: String::new(),
                related_artifacts: vec![],
            },
            model: None,
            embedding: None,
        }
    }

    #[tokio::test]
    async fn decisions_without_vectors_are_embedded_at_query_time_and_filtered_by_agent() {
        let embedder: Arc<dyn Embedder> = Arc::new(HashedNgrams::default());
        let decisions = vec![
            stored("planner", "Use CSS variables for the theme", "no reload"),
            stored(
                "coder",
                "Store the theme in local storage",
                "survives reloads",
            ),
            stored("coder", "Name the hook useTheme", "matches React style"),
        ];
        let ranked = rank(&embedder, "theme local storage", None, 2, decisions.clone())
            .await
            .unwrap();
        assert_eq!(ranked.len(), 2);
        assert_eq!(
            ranked[0].0.decision.summary,
            "Store the theme in local storage"
        );
        assert!(ranked[0].1 > ranked[1].1);

        let planner_only = rank(&embedder, "theme", Some("planner"), 5, decisions)
            .await
            .unwrap();
        assert_eq!(planner_only.len(), 1);
        assert_eq!(planner_only[0].0.decision.agent, "planner");
    }
}
