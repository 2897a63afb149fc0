//! The limits on the names and lists a worker sends, beyond the sizes of [`Config`]: its id,
//! the agents it offers, the tasks it says it still runs, its capacity, and the task ids of its
//! messages. Each refusal names the field, and the limit it passed (`INVALID_ARGUMENT`).
//!
//! What each bounds: a worker's id is written in run records and logs; every agent it offers
//! becomes a queue, a sweep of that agent's timers and a series on `/metrics` while it is
//! connected (200,000 of them once made `/metrics` 50 MB); every task it says it still runs is
//! a read of the store.
//!
//! [`Config`]: crate::service::Config

use baton_proto::v1;

use crate::bounded::{self, BadName};
use crate::error::Error;
use crate::task_ref::TaskRef;

/// Bytes of a worker id (`--id`; a host name and a process id by default).
pub const MAX_WORKER_ID_BYTES: usize = 256;
/// Agents one worker offers.
pub const MAX_AGENTS: usize = 256;
/// Bytes of an agent's name.
pub const MAX_AGENT_NAME_BYTES: usize = 256;
/// Tasks one worker runs at once: as many as one map step may have in flight.
pub const MAX_CAPACITY: u32 = baton_core::MAP_MAX_IN_FLIGHT;
/// Tasks a hello may say the worker still runs: no more than it can run at once.
pub const MAX_HELD: usize = MAX_CAPACITY as usize;
/// Bytes of a task id (`<run>/<step>#<visit>@<attempt>`, a map item's `[<item>]` included):
/// far more than a 128-character step id and a run id need.
pub const MAX_TASK_ID_BYTES: usize = 1024;

/// Every bound of a hello but its protocol and the presence of its id.
pub(super) fn check_hello(hello: &v1::Hello) -> Result<(), Error> {
    check_worker_id("hello.worker_id", &hello.worker_id)?;
    if hello.agents.len() > MAX_AGENTS {
        return Err(Error::Request(format!(
            "hello.agents: {} agents; the limit is {MAX_AGENTS}",
            hello.agents.len()
        )));
    }
    for (i, agent) in hello.agents.iter().enumerate() {
        bounded::check_name(agent, MAX_AGENT_NAME_BYTES)
            .map_err(|bad| Error::Request(format!("hello.agents[{i}] {bad}")))?;
    }
    if hello.capacity > MAX_CAPACITY {
        return Err(Error::Request(format!(
            "hello.capacity: {} tasks at once; the limit is {MAX_CAPACITY}",
            hello.capacity
        )));
    }
    if hello.held.len() > MAX_HELD {
        return Err(Error::Request(format!(
            "hello.held: {} tasks; the limit is {MAX_HELD}",
            hello.held.len()
        )));
    }
    if let Some((i, id)) = hello
        .held
        .iter()
        .enumerate()
        .find(|(_, id)| id.len() > MAX_TASK_ID_BYTES)
    {
        return Err(Error::Request(format!(
            "hello.held[{i}] is {} bytes; the limit is {MAX_TASK_ID_BYTES}",
            id.len()
        )));
    }
    Ok(())
}

/// A worker id, in the field `field`: printable, not blank, at most [`MAX_WORKER_ID_BYTES`].
pub(super) fn check_worker_id(field: &str, id: &str) -> Result<(), Error> {
    bounded::check_name(id, MAX_WORKER_ID_BYTES).map_err(|bad| match bad {
        BadName::Empty => Error::Request(format!("{field}: a worker needs an id")),
        bad => Error::Request(format!("{field} {bad}")),
    })
}

/// The task a worker's message names in the field `field`; an id too long to be one is
/// refused before it is read (and never echoed whole).
pub(super) fn task_id(field: &'static str, text: &str) -> Result<TaskRef, Error> {
    if text.len() > MAX_TASK_ID_BYTES {
        return Err(Error::TooLarge {
            what: field,
            size: text.len(),
            limit: MAX_TASK_ID_BYTES,
        });
    }
    Ok(text.parse()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::requests::{answer, resend_request};
    use crate::service::{Config, Outcome, WorkerHello};

    fn hello() -> v1::Hello {
        v1::Hello {
            worker_id: "w1".into(),
            agents: vec!["planner".into()],
            capacity: 4,
            cache_bytes: 0,
            protocol: baton_proto::WORKER_PROTOCOL,
            held: Vec::new(),
        }
    }

    fn refused(hello: v1::Hello) -> String {
        let error = WorkerHello::try_from(hello).unwrap_err();
        let message = error.to_string();
        assert_eq!(
            tonic::Status::from(error).code(),
            tonic::Code::InvalidArgument,
            "{message}"
        );
        message
    }

    /// The attack of issue 28: a worker naming 200,000 agents made `/metrics` 50 MB.
    #[test]
    fn a_hello_offering_too_many_agents_is_refused_naming_the_limit() {
        let many = v1::Hello {
            agents: (0..200_000).map(|n| format!("agent-{n}")).collect(),
            ..hello()
        };
        assert_eq!(
            refused(many),
            "hello.agents: 200000 agents; the limit is 256"
        );
        let enough = v1::Hello {
            agents: (0..MAX_AGENTS).map(|n| format!("agent-{n}")).collect(),
            ..hello()
        };
        assert_eq!(WorkerHello::try_from(enough).unwrap().agents.len(), 256);
    }

    #[test]
    fn a_hello_names_the_field_whose_text_is_out_of_bounds() {
        let cases = [
            (
                v1::Hello {
                    worker_id: "w\u{1b}[2J".into(),
                    ..hello()
                },
                "hello.worker_id holds the control character U+001B at byte 1; it must be printable",
            ),
            (
                v1::Hello {
                    worker_id: "w".repeat(257),
                    ..hello()
                },
                "hello.worker_id is 257 bytes; the limit is 256",
            ),
            (
                v1::Hello {
                    agents: vec!["planner".into(), " ".into()],
                    ..hello()
                },
                "hello.agents[1] is empty",
            ),
            (
                v1::Hello {
                    agents: vec!["a".repeat(300)],
                    ..hello()
                },
                "hello.agents[0] is 300 bytes; the limit is 256",
            ),
            (
                v1::Hello {
                    agents: vec!["plan\nner".into()],
                    ..hello()
                },
                "hello.agents[0] holds the control character U+000A at byte 4; it must be printable",
            ),
            (
                v1::Hello {
                    capacity: 1_000_000,
                    ..hello()
                },
                "hello.capacity: 1000000 tasks at once; the limit is 10000",
            ),
            (
                v1::Hello {
                    held: vec!["r/a#1@1".into(); MAX_HELD + 1],
                    ..hello()
                },
                "hello.held: 10001 tasks; the limit is 10000",
            ),
            (
                v1::Hello {
                    held: vec!["r/a#1@1".into(), "x".repeat(2_000)],
                    ..hello()
                },
                "hello.held[1] is 2000 bytes; the limit is 1024",
            ),
        ];
        for (hello, expected) in cases {
            assert_eq!(refused(hello), expected);
        }
    }

    /// The attack of issue 28: a 60 MiB `TaskResult.error` was stored twice and made the run
    /// record unreadable.
    #[test]
    fn an_agent_error_and_a_resend_reason_are_cut_to_their_limit() {
        let config = Config::default();
        let huge = format!("boom: {}", "e".repeat(60 << 20));
        let result = v1::TaskResult {
            task_id: "r/code#1@1".into(),
            outcome: Some(v1::task_result::Outcome::Error(huge.clone())),
            ..v1::TaskResult::default()
        };
        let Outcome::Failed { error, .. } = answer(result, &config).unwrap().outcome else {
            panic!("an error stays an error");
        };
        assert!(error.len() <= config.max_error_bytes, "{}", error.len());
        assert!(error.starts_with("boom: eee"));
        assert!(
            error.contains(&format!(
                "cut: {} bytes in all, past the limit of 16384",
                huge.len()
            )),
            "the marker says how long it was and the limit"
        );
        let (task, reason) = resend_request(
            v1::ResendTask {
                task_id: "r/code#1@1".into(),
                reason: huge,
            },
            &config,
        )
        .unwrap();
        assert_eq!(task.attempt, 1);
        assert!(reason.len() <= config.max_error_bytes);
    }

    #[test]
    fn a_task_id_too_long_to_be_one_is_refused_without_being_echoed() {
        let long = format!("r/{}#1@1", "s".repeat(10_000));
        let result = v1::TaskResult {
            task_id: long,
            outcome: Some(v1::task_result::Outcome::Error("e".into())),
            ..v1::TaskResult::default()
        };
        let refused = answer(result, &Config::default()).unwrap_err().to_string();
        assert_eq!(refused, "result.task_id is 10006 bytes; the limit is 1024");
    }
}
