//! [`Error`]: why a store call failed, the same for every store.

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("run {0} already exists")]
    AlreadyExists(String),
    #[error("run {0} not found")]
    NotFound(String),
    /// Someone else applied a transition first: reload and retry.
    #[error("run {run_id} is at version {actual}, not {expected}")]
    Conflict {
        run_id: String,
        expected: u64,
        actual: u64,
    },
    /// A fenced transition's task is gone, or at another attempt: the answer is late.
    #[error("run {run_id}: task {task_key} is at attempt {current}, not {attempt}")]
    Fenced {
        run_id: String,
        task_key: String,
        attempt: u32,
        /// `none` when the task is gone.
        current: String,
    },
    /// The store could not be reached, or refused the call before doing anything (a Redis out of
    /// memory, loading, busy): for a write, nothing was written.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A `create_run` or `apply_transition` was sent but its answer never came (it timed out, the
    /// connection dropped, or it reached fewer replicas than asked for), or, on a Redis Cluster,
    /// failed in any way but the script's own refusal (the cluster client tries a request
    /// again, so its last error says nothing of an earlier try that ran): it may have been done
    /// or not, and may even be done later. [`Runs::settle_create`] and
    /// [`Runs::settle_transition`] find out, and make sure.
    ///
    /// [`Runs::settle_create`]: super::Runs::settle_create
    /// [`Runs::settle_transition`]: super::Runs::settle_transition
    #[error("store unavailable: {0}")]
    Indeterminate(String),
    /// A `create_run` of a run id that [`Runs::settle_create`] voided: nothing was written, and
    /// no create of that id ever will be.
    ///
    /// [`Runs::settle_create`]: super::Runs::settle_create
    #[error("run {0} was voided: its submit was settled as never done")]
    Voided(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}
