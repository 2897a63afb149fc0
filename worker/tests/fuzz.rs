//! The worker's fuzz targets ([`baton_worker::fuzzing`]), each run for a bounded number of
//! cases: the corpus of `tests/fuzz/corpus/<target>/` first, then generated inputs (see
//! `tests/fuzz/driver.rs`; `tests/fuzz/README.md` for longer runs).

#[path = "../../tests/fuzz/driver.rs"]
mod driver;

use baton_worker::fuzzing;
use driver::Fuzz;

#[test]
fn agents_toml() {
    Fuzz {
        name: "agents_toml",
        target: fuzzing::agents_toml,
        cases: 5_000,
    }
    .run();
}

#[test]
fn envelope() {
    Fuzz {
        name: "envelope",
        target: fuzzing::envelope,
        cases: 20_000,
    }
    .run();
}

#[test]
fn part_cache() {
    Fuzz {
        name: "part_cache",
        target: fuzzing::part_cache,
        cases: 10_000,
    }
    .run();
}

/// Every target of the crate is run above.
#[test]
fn every_target_is_fuzzed() {
    let names: Vec<&str> = fuzzing::TARGETS.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, ["agents_toml", "envelope", "part_cache"]);
}
