//! The coordinator's fuzz targets ([`baton_coordinator::fuzzing`]), each run for a bounded
//! number of cases: the corpus of `tests/fuzz/corpus/<target>/` first, then generated inputs
//! (see `tests/fuzz/driver.rs`; `tests/fuzz/README.md` for longer runs).

#[path = "../../tests/fuzz/driver.rs"]
mod driver;

use baton_coordinator::fuzzing;
use driver::Fuzz;

#[test]
fn worker_message() {
    Fuzz {
        name: "worker_message",
        target: fuzzing::worker_message,
        cases: 20_000,
    }
    .run();
}

#[test]
fn worker_answer() {
    Fuzz {
        name: "worker_answer",
        target: fuzzing::worker_answer,
        cases: 10_000,
    }
    .run();
}

#[test]
fn worker_query() {
    Fuzz {
        name: "worker_query",
        target: fuzzing::worker_query,
        cases: 10_000,
    }
    .run();
}

#[test]
fn worker_request() {
    Fuzz {
        name: "worker_request",
        target: fuzzing::worker_request,
        cases: 10_000,
    }
    .run();
}

#[test]
fn client_request() {
    Fuzz {
        name: "client_request",
        target: fuzzing::client_request,
        cases: 20_000,
    }
    .run();
}

/// Every target of the crate is run above.
#[test]
fn every_target_is_fuzzed() {
    let names: Vec<&str> = fuzzing::TARGETS.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        names,
        [
            "worker_message",
            "worker_answer",
            "worker_query",
            "worker_request",
            "client_request"
        ]
    );
}
