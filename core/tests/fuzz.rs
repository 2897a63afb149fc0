//! The core's fuzz targets ([`baton_core::fuzzing`]), each run for a bounded number of cases:
//! the corpus of `tests/fuzz/corpus/<target>/` first, then generated inputs (see
//! `tests/fuzz/driver.rs`; `tests/fuzz/README.md` for longer runs).

#[path = "../../tests/fuzz/driver.rs"]
mod driver;

use baton_core::fuzzing;
use driver::Fuzz;

#[test]
fn workflow() {
    Fuzz {
        name: "workflow",
        target: fuzzing::workflow,
        cases: 20_000,
    }
    .run();
}

#[test]
fn workflow_shapes() {
    Fuzz {
        name: "workflow_shapes",
        target: fuzzing::workflow_shapes,
        cases: 5_000,
    }
    .run();
}

#[test]
fn condition() {
    Fuzz {
        name: "condition",
        target: fuzzing::condition,
        cases: 20_000,
    }
    .run();
}

#[test]
fn path() {
    Fuzz {
        name: "path",
        target: fuzzing::path,
        cases: 20_000,
    }
    .run();
}

#[test]
fn jq() {
    Fuzz {
        name: "jq",
        target: fuzzing::jq,
        cases: 2_000,
    }
    .run();
}

#[test]
fn manifest() {
    Fuzz {
        name: "manifest",
        target: fuzzing::manifest,
        cases: 10_000,
    }
    .run();
}

#[test]
fn notes() {
    Fuzz {
        name: "notes",
        target: fuzzing::notes,
        cases: 10_000,
    }
    .run();
}

#[test]
fn big_integers() {
    Fuzz {
        name: "big_integers",
        target: fuzzing::big_integers_in,
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
            "workflow",
            "workflow_shapes",
            "condition",
            "path",
            "jq",
            "manifest",
            "notes",
            "big_integers"
        ]
    );
}
