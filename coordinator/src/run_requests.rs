//! What a client asks of runs, checked before the service takes it: the run and the step it
//! names, the filters of a listing or a query, an approval decision, a cancel's reason, and who
//! asks. Both edges come here, the gRPC one from its `baton.v1` messages (`grpc::requests`) and
//! the web API from its paths and JSON bodies (`web::api`), so that the two refuse the same
//! things in the same words; each names the field as its caller knows it (`run_id` in a
//! message, `run id` in a path).
//!
//! Like the rest of the edge's checks, these are about what crosses the wire: forms, sizes,
//! characters a terminal or a page would act on. What a request means (whether the run exists,
//! waits for that approval, may be changed by this caller) is the service's.

use baton_core::Decision;
use baton_core::workflow::names::{is_unprintable, name_problem, step_id_problem};

use crate::auth::{Caller, Role};
use crate::error::Error;
use crate::service::{Config, Requester};

/// A value a client sent, as an error shows it: its first 100 characters.
pub fn shown(value: &str) -> String {
    value.chars().take(100).collect()
}

/// `size` bytes of `what`, refused past `limit`.
pub fn within(what: &'static str, size: usize, limit: usize) -> Result<(), Error> {
    if size > limit {
        return Err(Error::TooLarge { what, size, limit });
    }
    Ok(())
}

/// The length of a run id: a UUID written as `baton submit` prints it.
const RUN_ID_LEN: usize = 36;

/// A run id a client names, in field `field`: a UUID as the coordinator writes them
/// (8-4-4-4-12 lowercase hex digits), so that nothing else reaches the store's keys, which
/// embed it in a Redis Cluster hash tag (`{<run id>}`). A well-formed id that names no run is
/// the service's `NotFound`.
pub fn run_id<'a>(field: &'static str, value: &'a str) -> Result<&'a str, Error> {
    let well_formed = value.len() == RUN_ID_LEN
        && value.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        });
    if well_formed {
        return Ok(value);
    }
    let problem = if value.is_empty() {
        "a run id is needed: the one `baton submit` printed".to_owned()
    } else {
        format!(
            "{:?} is not a run id; a run id is a UUID as `baton submit` printed it (8-4-4-4-12 \
             lowercase hex digits)",
            shown(value)
        )
    };
    Err(Error::InvalidField { field, problem })
}

/// A step id a client names (an approval step): what a workflow may call a step.
pub fn step_id<'a>(field: &'static str, value: &'a str, config: &Config) -> Result<&'a str, Error> {
    match step_id_problem("a step id", value, config.limits.max_id_len) {
        None => Ok(value),
        Some(problem) => Err(Error::InvalidField { field, problem }),
    }
}

/// A filter by workflow id (empty: none): only what a workflow could be called, so that a
/// filter reaches the store's per-workflow keys only as a workflow's id would.
pub fn workflow_filter(
    field: &'static str,
    value: String,
    config: &Config,
) -> Result<Option<String>, Error> {
    name_filter(field, "a workflow id", value, config)
}

/// A filter by agent name (empty: none), under the rules of agent names.
pub fn agent_filter(
    field: &'static str,
    value: String,
    config: &Config,
) -> Result<Option<String>, Error> {
    name_filter(field, "an agent name", value, config)
}

/// A filter by a name (empty: none), under the rules of workflow ids and agent names.
fn name_filter(
    field: &'static str,
    what: &str,
    value: String,
    config: &Config,
) -> Result<Option<String>, Error> {
    if value.is_empty() {
        return Ok(None);
    }
    match name_problem(what, &value, config.limits.max_id_len) {
        None => Ok(Some(value)),
        Some(problem) => Err(Error::InvalidField { field, problem }),
    }
}

/// The principal asking to change a run, as the service's ownership check needs it; `None`
/// when the coordinator does not authenticate.
pub fn requester(caller: &Caller) -> Option<Requester> {
    caller.0.as_ref().map(|principal| Requester {
        name: principal.name.clone(),
        operates: principal.has(Role::Operate),
    })
}

/// An approval decision as a client sent it, before [`decision`] checks it.
#[derive(Debug, Clone, Copy)]
pub struct DecisionAsked<'a> {
    pub approved: bool,
    /// Empty: none.
    pub comment: &'a str,
    /// Who the request says decides; empty: nobody named.
    pub approver: &'a str,
}

/// An approval decision. With authentication on, the approver is the principal that called,
/// whatever the request's `approver` says; without it, the request names its approver. The
/// comment and the approver are kept in the run's context for good, so both are bounded: a
/// comment is text of people (lines and tabs, no control characters), an approver a name.
pub fn decision(
    asked: &DecisionAsked<'_>,
    principal: Option<&str>,
    config: &Config,
) -> Result<Decision, Error> {
    person_text("comment", asked.comment, config.max_comment_bytes)?;
    if !asked.approver.is_empty() {
        within("approver", asked.approver.len(), config.limits.max_id_len)?;
        if let Some(problem) = name_problem("an approver", asked.approver, config.limits.max_id_len)
        {
            return Err(Error::InvalidField {
                field: "approver",
                problem,
            });
        }
    }
    let named = (!asked.approver.is_empty()).then(|| asked.approver.to_owned());
    Ok(Decision {
        approved: asked.approved,
        comment: (!asked.comment.is_empty()).then(|| asked.comment.to_owned()),
        approver: principal.map(str::to_owned).or(named),
    })
}

/// A cancel's reason, bounded as a comment is, naming the principal that cancelled when
/// authentication is on: it becomes the run's error, shown wherever the run is.
pub fn cancel_reason(
    reason: &str,
    principal: Option<&str>,
    config: &Config,
) -> Result<String, Error> {
    person_text("reason", reason, config.max_reason_bytes)?;
    Ok(match (principal, reason.is_empty()) {
        (None, _) => reason.to_owned(),
        (Some(name), true) => format!("cancelled by `{name}`"),
        (Some(name), false) => format!("cancelled by `{name}`: {reason}"),
    })
}

/// Text a person wrote, in field `field`: at most `limit` bytes, and nothing a terminal would
/// act on (lines and tabs are text; an escape sequence is not).
fn person_text(field: &'static str, text: &str, limit: usize) -> Result<(), Error> {
    within(field, text.len(), limit)?;
    let unprintable = text
        .char_indices()
        .find(|&(_, c)| !matches!(c, '\n' | '\r' | '\t') && is_unprintable(c));
    if let Some((at, c)) = unprintable {
        return Err(Error::InvalidField {
            field,
            problem: format!(
                "holds an unprintable character (U+{:04X}) at byte {at}; it is shown in \
                 terminals and web pages, so it may hold lines and tabs but no control or \
                 direction characters",
                u32::from(c)
            ),
        });
    }
    Ok(())
}
