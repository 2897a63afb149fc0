//! The suite's bounded fuzzing, shared by `core/tests/fuzz.rs`, `worker/tests/fuzz.rs` and
//! `coordinator/tests/fuzz.rs` (each includes this file as `mod driver`).
//!
//! For one target: every file of `tests/fuzz/corpus/<target>/` is replayed first (crashes found
//! before, kept as regression inputs, and the seeds), then inputs made by a pseudo-random
//! generator with a fixed seed (mutations of the corpus files, with the tokens of
//! `tests/fuzz/dict/<target>.dict`, and some random bytes) until the case count or the time
//! budget runs out, whichever comes first: the inputs are the same on every machine, a slow one
//! just runs fewer of them. Nothing here asserts a time.
//!
//! - `BATON_FUZZ_CASES`: generated cases per target (default: each test's own).
//! - `BATON_FUZZ_SECONDS`: time budget per target (default 3; 0 means no budget).
//! - `BATON_FUZZ_SEED`: the generator's seed (default fixed), to explore elsewhere.
//! - `BATON_FUZZ_TRACE=1`: write each input to `<target tmp>/fuzz/<target>.current` before it
//!   runs, to catch the input of a crash that aborts the process (a stack overflow).
//!
//! A panic saves the input to `<target tmp>/fuzz/<target>-<hash>` and fails the test naming
//! it; put that file in the corpus folder to keep it as a regression input. A case that runs for
//! over a minute fails the test as a hang, with its input saved the same way. The process's peak
//! memory must stay under [`MEMORY_CEILING_BYTES`].

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Peak resident memory of the whole test process, all targets together.
pub const MEMORY_CEILING_BYTES: u64 = 2 << 30;

/// How long one case may run before it counts as a hang.
const HANG: Duration = Duration::from_secs(60);

/// Largest input made (libFuzzer's default `-max_len` is 4096; a few seeds are larger).
const MAX_INPUT: usize = 64 << 10;

/// Stack of the thread that runs the cases: a Tokio worker's, where a coordinator parses.
const STACK: usize = 2 << 20;

/// How a target is fuzzed in the suite.
pub struct Fuzz {
    pub name: &'static str,
    pub target: fn(&[u8]),
    /// Generated cases when `BATON_FUZZ_CASES` is not set.
    pub cases: usize,
}

impl Fuzz {
    /// Replays the corpus, then runs the generated cases; panics naming the input of a failure.
    pub fn run(&self) {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let corpus = read_corpus(&workspace.join("tests/fuzz/corpus").join(self.name));
        let dictionary =
            read_dictionary(&workspace.join(format!("tests/fuzz/dict/{}.dict", self.name)));
        let cases = env_number("BATON_FUZZ_CASES").unwrap_or(self.cases as u64) as usize;
        let budget = match env_number("BATON_FUZZ_SECONDS").unwrap_or(3) {
            0 => None,
            seconds => Some(Duration::from_secs(seconds)),
        };
        let seed = env_number("BATON_FUZZ_SEED").unwrap_or(0x5eed_ba70) ^ fnv(self.name.as_bytes());
        let trace = std::env::var_os("BATON_FUZZ_TRACE").is_some();
        let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz");
        std::fs::create_dir_all(&out_dir).expect("the fuzz output folder can be made");

        let current = Arc::new(Mutex::new(Vec::new()));
        let (progress, heard) = mpsc::channel::<()>();
        let (name, target) = (self.name, self.target);
        let runner = {
            let current = current.clone();
            let out_dir = out_dir.clone();
            std::thread::Builder::new()
                .name(format!("fuzz-{name}"))
                .stack_size(STACK)
                .spawn(move || {
                    let started = Instant::now();
                    let run_one = |input: Vec<u8>| {
                        if trace {
                            let _ = std::fs::write(out_dir.join(format!("{name}.current")), &input);
                        }
                        *current.lock().unwrap() = input.clone();
                        let outcome = std::panic::catch_unwind(|| target(&input));
                        if let Err(panic) = outcome {
                            let saved = save(&out_dir, name, &input);
                            let message = panic
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                                .unwrap_or_default();
                            panic!(
                                "fuzz target {name} panicked ({message}) on {} bytes, saved as {}: {}",
                                input.len(),
                                saved.display(),
                                shown(&input)
                            );
                        }
                        let _ = progress.send(());
                    };
                    for (_, input) in &corpus {
                        run_one(input.clone());
                    }
                    // Regression inputs are replayed, not mutated: they are often large and
                    // slow (the bug was in their size), and their bug is fixed.
                    let seeds: Vec<&[u8]> = corpus
                        .iter()
                        .filter(|(name, _)| !name.starts_with("crash-"))
                        .map(|(_, input)| input.as_slice())
                        .collect();
                    let mut rng = Rng(seed);
                    let mut ran = 0;
                    while ran < cases && budget.is_none_or(|budget| started.elapsed() < budget) {
                        run_one(generate(&mut rng, &seeds, &dictionary));
                        ran += 1;
                    }
                    (corpus.len(), ran, started.elapsed())
                })
                .expect("a fuzzing thread starts")
        };
        loop {
            match heard.recv_timeout(HANG) {
                Ok(()) => {}
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    let input = current.lock().unwrap().clone();
                    let saved = save(&out_dir, name, &input);
                    panic!(
                        "fuzz target {name} hangs: one case ran for over {HANG:?} on {} bytes, saved as {}: {}",
                        input.len(),
                        saved.display(),
                        shown(&input)
                    );
                }
            }
        }
        let (replayed, generated, took) = match runner.join() {
            Ok(counts) => counts,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        let peak = peak_memory();
        eprintln!(
            "fuzz {name}: {replayed} corpus inputs and {generated} generated cases in {:.1} s; peak memory {} MiB",
            took.as_secs_f64(),
            peak.map_or("unknown".to_owned(), |bytes| (bytes >> 20).to_string())
        );
        if let Some(peak) = peak {
            assert!(
                peak < MEMORY_CEILING_BYTES,
                "fuzzing {name} took the process to {} MiB of memory",
                peak >> 20
            );
        }
    }
}

/// The corpus files of one target, by name: replayed in that order.
fn read_corpus(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<(String, Vec<u8>)> = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.path().is_file())
        .map(|entry| {
            let bytes = std::fs::read(entry.path()).expect("a corpus file reads");
            (entry.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    files.sort();
    files
}

/// A libFuzzer dictionary: one `"token"` per line (`\"`, `\\` and `\xNN` escapes), `#` comments,
/// an optional `name=` before the quotes.
fn read_dictionary(file: &Path) -> Vec<Vec<u8>> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.starts_with('#') {
                return None;
            }
            let quoted = &line[line.find('"')?..];
            let inner = quoted.strip_prefix('"')?.strip_suffix('"')?;
            let mut token = Vec::new();
            let mut bytes = inner.bytes();
            while let Some(byte) = bytes.next() {
                if byte != b'\\' {
                    token.push(byte);
                    continue;
                }
                match bytes.next()? {
                    b'x' => {
                        let hex = [bytes.next()?, bytes.next()?];
                        token.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
                    }
                    other => token.push(other),
                }
            }
            Some(token)
        })
        .collect()
}

fn env_number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.replace('_', "").parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={text} is not a number")))
}

fn save(dir: &Path, name: &str, input: &[u8]) -> PathBuf {
    let path = dir.join(format!("{name}-{:016x}", fnv(input)));
    let _ = std::fs::write(&path, input);
    path
}

/// The start of an input, escaped, for a failure's message.
fn shown(input: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(&input[..input.len().min(300)])
        .escape_debug()
        .collect();
    if input.len() > 300 {
        format!("{text}...")
    } else {
        text
    }
}

/// The process's peak resident memory, where Linux tells it.
fn peak_memory() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// SplitMix64: small, fast and the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..below` (0 when `below` is 0).
    fn below(&mut self, below: usize) -> usize {
        if below == 0 {
            0
        } else {
            (self.next() % below as u64) as usize
        }
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Bytes a mutation likes to put in: the structure of JSON, TOML and the expression languages,
/// and the edges of integers.
const INTERESTING: &[u8] = b"\0\x01\x7f\x80\xff\"'\\{}[](),:;=.#@/*-+!<>|&$\n\t 0123456789eE";

/// One input: mostly a corpus file mutated a few times, sometimes random bytes or tokens.
fn generate(rng: &mut Rng, seeds: &[&[u8]], dictionary: &[Vec<u8>]) -> Vec<u8> {
    let mut input = match rng.below(10) {
        0 => (0..rng.below(256)).map(|_| rng.next() as u8).collect(),
        1 if !dictionary.is_empty() => {
            let mut input = Vec::new();
            for _ in 0..1 + rng.below(16) {
                input.extend_from_slice(&dictionary[rng.below(dictionary.len())]);
                if rng.chance(2) {
                    input.push(INTERESTING[rng.below(INTERESTING.len())]);
                }
            }
            input
        }
        _ if !seeds.is_empty() => seeds[rng.below(seeds.len())].to_vec(),
        _ => Vec::new(),
    };
    let mutations = 1 + rng.below(8);
    for _ in 0..mutations {
        mutate(rng, &mut input, seeds, dictionary);
    }
    input.truncate(MAX_INPUT);
    input
}

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, seeds: &[&[u8]], dictionary: &[Vec<u8>]) {
    let at = rng.below(input.len() + 1);
    match rng.below(11) {
        0 if !input.is_empty() => {
            let i = rng.below(input.len());
            input[i] ^= 1 << rng.below(8);
        }
        1 if !input.is_empty() => {
            let i = rng.below(input.len());
            input[i] = rng.next() as u8;
        }
        2 if !input.is_empty() => {
            let i = rng.below(input.len());
            input[i] = INTERESTING[rng.below(INTERESTING.len())];
        }
        3 => input.insert(at, INTERESTING[rng.below(INTERESTING.len())]),
        4 if !input.is_empty() => {
            let start = rng.below(input.len());
            let end = (start + 1 + rng.below(16)).min(input.len());
            input.drain(start..end);
        }
        5 if !input.is_empty() => {
            // Repeat a slice: what makes deep nesting and long chains.
            let start = rng.below(input.len());
            let len = 1 + rng.below(8.min(input.len() - start));
            let slice = input[start..start + len].to_vec();
            let most = if rng.chance(8) { 512 } else { 8 };
            let times = 1 + rng.below(most);
            for _ in 0..times {
                input.splice(at..at, slice.iter().copied());
            }
        }
        6 | 7 if !dictionary.is_empty() => {
            let token = &dictionary[rng.below(dictionary.len())];
            input.splice(at..at, token.iter().copied());
        }
        8 if !seeds.is_empty() => {
            // Splice: the head of this input and the tail of another.
            let other = seeds[rng.below(seeds.len())];
            let from = rng.below(other.len() + 1);
            input.truncate(at);
            input.extend_from_slice(&other[from..]);
        }
        9 if input.len() > 1 => {
            let a = rng.below(input.len());
            let b = rng.below(input.len());
            input.swap(a, b);
        }
        10 => input.truncate(at),
        _ => input.insert(at, rng.next() as u8),
    }
}
