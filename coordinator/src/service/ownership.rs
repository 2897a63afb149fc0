//! Runs belong to the principal that submitted them: cancelling or retrying another
//! principal's run takes an operator (the `operate` role, or `admin`).
//!
//! The gate admits CancelRun and RetryRun to `submit` and `operate` alike, since it sees only
//! the call's path; which run the call names, and who submitted it, only the service knows,
//! so the decision is made here, against the owner stored with the run ([`may_change`], a
//! pure function). An approval is not checked this way: it is decided by role alone, at the
//! gate. `approve` (or `admin`) decides any run's approvals, whoever submitted the run, and a
//! principal without it decides none, not even its own run's: an approval step is there so
//! that someone other than the submitter lets the run go on (SECURITY.md, "Principals, roles
//! and tokens"). Without authentication (protected mode, `--allow-unauthenticated`) there is
//! no requester and nothing is checked.

use super::Error;

/// Who asks to change a run, as the gate authenticated them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requester {
    /// The principal's name.
    pub name: String,
    /// It may change any run (`operate` or `admin`), not only its own.
    pub operates: bool,
}

/// A change to a run that only its owner or an operator may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunChange {
    Cancel,
    Retry,
}

impl RunChange {
    /// The verb, for messages: `cancel`.
    pub fn verb(self) -> &'static str {
        match self {
            RunChange::Cancel => "cancel",
            RunChange::Retry => "retry",
        }
    }
}

/// Whether `requester` may ask for `change` of run `run_id`, submitted by `owner` (empty: by
/// nobody authenticated, before principals were configured). `None` is a coordinator that does
/// not authenticate: anyone who got in may.
pub fn may_change(
    requester: Option<&Requester>,
    owner: &str,
    run_id: &str,
    change: RunChange,
) -> Result<(), Error> {
    match requester {
        None => Ok(()),
        Some(requester) if requester.operates => Ok(()),
        Some(requester) if !owner.is_empty() && requester.name == owner => Ok(()),
        Some(requester) => Err(Error::NotOwner {
            principal: requester.name.clone(),
            owner: owner.to_owned(),
            run_id: run_id.to_owned(),
            change: change.verb(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(name: &str, operates: bool) -> Requester {
        Requester {
            name: name.to_owned(),
            operates,
        }
    }

    #[test]
    fn a_run_is_changed_by_its_owner_or_an_operator_only() {
        let alice = principal("alice", false);
        let bob = principal("bob", false);
        let ops = principal("ops", true);
        for change in [RunChange::Cancel, RunChange::Retry] {
            assert!(may_change(Some(&alice), "alice", "r1", change).is_ok());
            assert!(may_change(Some(&ops), "alice", "r1", change).is_ok());
            assert!(may_change(None, "alice", "r1", change).is_ok());
            let refused = may_change(Some(&bob), "alice", "r1", change).unwrap_err();
            assert_eq!(
                refused.to_string(),
                format!(
                    "principal `bob` may not {} run r1: it belongs to `alice`, who submitted \
                     it; changing another principal's run needs the `operate` role (or `admin`)",
                    change.verb()
                )
            );
        }
    }

    #[test]
    fn a_run_submitted_without_authentication_belongs_to_no_principal() {
        // Not even to a principal whose name is empty, were one configured.
        for name in ["bob", ""] {
            let refused =
                may_change(Some(&principal(name, false)), "", "r1", RunChange::Cancel).unwrap_err();
            assert!(
                refused.to_string().contains(
                    "it was submitted without authentication and belongs to no principal"
                ),
                "{refused}"
            );
        }
        assert!(may_change(Some(&principal("ops", true)), "", "r1", RunChange::Retry).is_ok());
    }
}
