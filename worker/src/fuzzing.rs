//! Fuzz targets: what a worker reads that it did not write, as functions of arbitrary bytes.
//!
//! Like `baton_core::fuzzing` (which says what a target promises): each must not panic, hang or
//! allocate without bound, and asserts its invariants. The suite runs them in
//! `worker/tests/fuzz.rs`; `tests/fuzz/README.md` tells how to run them for longer.
//!
//! - [`agents_toml`]: an agents file, read and checked ([`AgentsFile::parse_with_env`]).
//! - [`envelope`]: what a command agent with `output = "envelope"` writes on stdout.
//! - [`part_cache`]: a stream of tasks by reference: manifests and parts, some of them lost or
//!   corrupted on the way, received by the worker's part cache while the coordinator's mirror
//!   of it follows; the payloads spliced back together.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use arbitrary::Unstructured;
use baton_core::BlobLru;
use baton_core::fuzzing::{Target, json_value, string};
use baton_core::handoff::AgentNotes;
use baton_core::payload::{ErrorInfo, Manifest, assemble};
use baton_proto::Json;
use serde_json::{Value, json};

use crate::Output;
use crate::agents::AgentsFile;
use crate::payload::{PartCache, Payload, PayloadError};

/// Every target of this crate, by name (the name of its corpus folder).
pub const TARGETS: &[(&str, Target)] = &[
    ("agents_toml", agents_toml),
    ("envelope", envelope),
    ("part_cache", part_cache),
];

/// The API key of `FUZZ_API_KEY`, the one variable set for fuzzed agents files.
const API_KEY: &str = "sk-fuzz-7f3a9c20";

/// Larger agents files are not worth the time: a real one is a few KiB.
const MAX_AGENTS_FILE: usize = 256 << 10;

/// An agents file, as `baton worker --agents` reads it, in a folder of its own with a few
/// prompts, templates and a schema that its `*_file` fields may name; environment variables
/// come from a fixed table.
///
/// A file naming a file outside that folder is skipped (an operator may point a field at any
/// file, `/dev/zero` included: that is not a parser's problem).
///
/// Invariants: each agent is filed under its name; an error names the file, and a problem with
/// one agent names the agent and the field; the API key is in no agent's `Debug` and no error.
pub fn agents_toml(data: &[u8]) {
    if data.len() > MAX_AGENTS_FILE {
        return;
    }
    let text = String::from_utf8_lossy(data);
    if names_a_file_outside(&text) {
        return;
    }
    let base = agents_folder();
    let env = |name: &str| (name == "FUZZ_API_KEY").then(|| API_KEY.to_owned());
    // Read once: an llm agent builds its HTTP client, which loads the system's root
    // certificates (some 20 ms in a debug build).
    match AgentsFile::parse_with_env(&text, base, &env) {
        Ok(file) => {
            for (name, agent) in &file.agents {
                assert_eq!(agent.name(), name);
                let shown = format!("{agent:?}");
                assert!(
                    !shown.contains(API_KEY) || text.contains(API_KEY),
                    "an API key is never shown: {shown}"
                );
            }
        }
        Err(error) => {
            let message = error.to_string();
            assert!(
                !message.contains(API_KEY) || text.contains(API_KEY),
                "{message}"
            );
            assert!(
                message.starts_with("<inline agents.toml>"),
                "an error names the file: {message}"
            );
            if let crate::agents::ConfigError::Agent { agent, field, .. } = &error {
                assert!(message.contains(&format!("agent \"{agent}\"")), "{message}");
                assert!(message.contains(&format!("field `{field}`")), "{message}");
            }
        }
    }
}

/// Whether a `*_file` field anywhere in `text` (read as TOML) names a path that leaves the
/// folder it is taken from. Text that is not TOML names nothing: the agents file fails on it
/// before any field is read.
fn names_a_file_outside(text: &str) -> bool {
    fn walk(value: &toml::Value, key: &str) -> bool {
        match value {
            toml::Value::Table(table) => table.iter().any(|(key, value)| walk(value, key)),
            toml::Value::Array(items) => items.iter().any(|item| walk(item, key)),
            toml::Value::String(path) if key.ends_with("_file") => {
                let path = Path::new(path);
                path.is_absolute()
                    || path
                        .components()
                        .any(|part| !matches!(part, std::path::Component::Normal(_)))
            }
            _ => false,
        }
    }
    match toml::from_str::<toml::Table>(text) {
        Ok(table) => table.iter().any(|(key, value)| walk(value, key)),
        Err(_) => false,
    }
}

/// The folder fuzzed agents files are read in, with the files the corpus's agents files name:
/// written once per process, each by a rename, so that processes fuzzing at once share it.
fn agents_folder() -> &'static Path {
    static FOLDER: OnceLock<PathBuf> = OnceLock::new();
    FOLDER.get_or_init(|| {
        let folder = std::env::temp_dir().join("baton-fuzz-agents");
        let files = [
            ("prompts/planner.md", "Plan this: {{input}}\nKnown: {{context}}"),
            ("prompts/coder.md", "{{#if plan}}Code {{plan.files}}{{else}}Code{{/if}}"),
            ("prompts/tester.md", "Test {{context.code.filesCreated}}"),
            ("prompts/reviewer.md", "Review {{code}} given {{messages}}"),
            ("template.hbs", "{\"files\": {{json context.plan.files}} }"),
            ("system.md", "You are careful."),
            (
                "schemas/plan.json",
                r#"{"type": "object", "required": ["files"], "properties": {"files": {"type": "array", "items": {"type": "string"}}}}"#,
            ),
            ("schemas/bad.json", r#"{"type": 12}"#),
        ];
        for (name, text) in files {
            let path = folder.join(name);
            let writing = folder.join(format!("{name}.{}", std::process::id()));
            let made = std::fs::create_dir_all(path.parent().expect("a file has a folder"))
                .and_then(|()| std::fs::write(&writing, text))
                .and_then(|()| std::fs::rename(&writing, &path));
            made.expect("the fuzzing folder for agents files can be written");
        }
        folder
    })
}

/// A command agent's stdout read as an envelope, as the worker reads it.
///
/// Invariants: an envelope that reads keeps its data as it was written and its messages and
/// decisions in order; its notes, as the worker sends them, are an object with only those
/// members.
pub fn envelope(data: &[u8]) {
    if data.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let Ok(output) = Output::from_envelope(value.clone()) else {
        return;
    };
    assert_eq!(output.data, value["data"]);
    let listed = |name: &str| match &value[name] {
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    };
    assert_eq!(output.messages, listed("messages"));
    assert_eq!(output.decisions, listed("decisions"));
    match output.notes_json() {
        None => assert!(output.messages.is_empty() && output.decisions.is_empty()),
        Some(notes) => {
            let notes: Value = serde_json::from_slice(&notes).expect("notes are JSON");
            let members = notes.as_object().expect("notes are an object");
            assert!(
                members
                    .keys()
                    .all(|key| key == "messages" || key == "decisions")
            );
            // What the coordinator makes of them (it may refuse them; it must not fail).
            let _ = AgentNotes::from_json(&serde_json::to_vec(&notes).expect("JSON writes"));
        }
    }
}

/// One task of [`part_cache`]: its manifest and what goes wrong with it on the way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, arbitrary::Arbitrary)]
enum Fault {
    None,
    /// A part that had to be sent is not.
    PartLost,
    /// A byte of a part sent is changed after its digest was taken.
    PartFlipped,
    /// A byte of the manifest is changed after its digest was taken.
    ManifestFlipped,
    /// The manifest is other bytes, with their own digest.
    ManifestReplaced,
    /// The task has no manifest.
    NoManifest,
}

/// A stream of tasks to one worker: manifests naming parts from a small pool (JSON, and now and
/// then bytes that are not), each task carrying the parts the coordinator's mirror says the
/// worker lacks, some of them lost or corrupted on the way.
///
/// Invariants: a task that arrives intact is received, its payload the bytes the engine would
/// have written, and the worker's cache holds what the mirror says it holds (the same bytes,
/// within the budget); a damaged one is refused for the damage done, keeping nothing of it, and
/// both caches start again, as after `ResetPartCache`.
pub fn part_cache(data: &[u8]) {
    let _ = part_cache_stream(&mut Unstructured::new(data));
}

fn part_cache_stream(u: &mut Unstructured) -> arbitrary::Result<()> {
    let budget = u64::from(u.int_in_range(0..=2048u32)?);
    let pool = Pool::draw(u)?;
    let mut cache = PartCache::new(budget);
    let mut mirror = BlobLru::new(budget);
    for _ in 0..u.int_in_range(1..=8)? {
        let manifest = arbitrary_manifest(u, &pool.digests)?;
        let fault: Fault = u.arbitrary()?;
        let sent = pool.sent_for(&manifest, &mut mirror);
        let delivery = Delivery::damaged(u, &manifest, fault, sent)?;
        let used_before = cache.used();
        match cache.receive(delivery.manifest, delivery.parts) {
            Ok(payload) => {
                assert!(
                    fault == Fault::None || delivery.harmless || fault == Fault::ManifestReplaced,
                    "a task damaged on the way ({fault:?}) was taken"
                );
                if fault == Fault::ManifestReplaced && !delivery.harmless {
                    // Another manifest that happens to read: it names other parts, and the
                    // caches no longer agree. The worker would start a new stream on its next
                    // mismatch; here, start again.
                    let _ = payload.bytes();
                    let _ = payload.try_value();
                    cache = PartCache::new(budget);
                    mirror = BlobLru::new(budget);
                    continue;
                }
                pool.check_spliced(&payload, &manifest);
                assert_eq!(
                    cache.used(),
                    mirror.used(),
                    "the mirror knows what the worker holds"
                );
                assert!(cache.used() <= budget);
            }
            Err(error) => {
                assert!(
                    refused_for(fault, &error),
                    "{fault:?} was refused as: {error}"
                );
                assert_eq!(
                    cache.used(),
                    used_before,
                    "nothing of a refused task is kept"
                );
                let _ = error.to_string();
                cache = PartCache::new(budget);
                mirror = BlobLru::new(budget);
            }
        }
    }
    Ok(())
}

/// The parts a stream's manifests name: JSON, and now and then bytes that are not.
struct Pool {
    /// Each part's digest, in the order drawn (a part drawn twice is named twice).
    digests: Vec<String>,
    by_digest: HashMap<String, Vec<u8>>,
}

impl Pool {
    fn draw(u: &mut Unstructured) -> arbitrary::Result<Pool> {
        let mut parts: Vec<Vec<u8>> = Vec::new();
        for _ in 0..u.int_in_range(1..=8)? {
            parts.push(if u.ratio(1, 10)? {
                let len = u.int_in_range(0..=16)?;
                u.bytes(len)?.to_vec()
            } else {
                serde_json::to_vec(&json_value(u, 3)?).expect("a value serialises")
            });
        }
        let digests: Vec<String> = parts
            .iter()
            .map(|part| Json::new(part.clone()).sha256)
            .collect();
        let by_digest = digests.iter().cloned().zip(parts).collect();
        Ok(Pool { digests, by_digest })
    }

    fn part(&self, digest: &str) -> &[u8] {
        &self.by_digest[digest]
    }

    /// What the coordinator sends with a task of `manifest`: each part the mirror does not
    /// hold, once. The mirror then holds them all.
    fn sent_for(&self, manifest: &Manifest, mirror: &mut BlobLru) -> Vec<Json> {
        let mut sent_digests = HashSet::new();
        let sent: Vec<Json> = manifest
            .parts()
            .filter(|(_, digest)| !mirror.contains(digest) && sent_digests.insert(*digest))
            .map(|(_, digest)| Json::new(self.part(digest).to_vec()))
            .collect();
        for (_, digest) in manifest.parts() {
            mirror.touch(digest, self.part(digest).len() as u64);
        }
        sent
    }

    /// A payload received intact is the bytes the engine would have written; JSON when every
    /// part is.
    fn check_spliced(&self, payload: &Payload, manifest: &Manifest) {
        let expected = assemble(manifest, |digest| {
            self.by_digest.get(digest).map(Vec::as_slice)
        })
        .expect("every part is in the pool");
        assert_eq!(
            payload.bytes(),
            &expected[..],
            "the payload splices back whole"
        );
        let every_part_is_json = manifest
            .parts()
            .all(|(_, digest)| serde_json::from_slice::<Value>(self.part(digest)).is_ok());
        if every_part_is_json {
            let value = payload
                .try_value()
                .expect("a payload of JSON parts is JSON");
            assert!(value.is_object());
        } else {
            let _ = payload.try_value();
        }
    }
}

/// A task as it reaches the worker: its manifest and parts, after `fault` did its damage.
struct Delivery {
    manifest: Option<Json>,
    parts: Vec<Json>,
    /// The fault changed nothing that matters (nothing to lose or flip; a replaced byte that
    /// reads as the same manifest).
    harmless: bool,
}

impl Delivery {
    fn damaged(
        u: &mut Unstructured,
        manifest: &Manifest,
        fault: Fault,
        mut sent: Vec<Json>,
    ) -> arbitrary::Result<Delivery> {
        let mut manifest_json = Some(Json::new(
            serde_json::to_vec(manifest).expect("a manifest serialises"),
        ));
        let mut harmless = false;
        match fault {
            Fault::None => {}
            Fault::PartLost if sent.is_empty() => harmless = true,
            Fault::PartLost => {
                sent.remove(u.choose_index(sent.len())?);
            }
            Fault::PartFlipped => {
                let candidates: Vec<usize> = (0..sent.len())
                    .filter(|&i| !sent[i].json.is_empty())
                    .collect();
                match u.choose(&candidates) {
                    Ok(&i) => {
                        let at = u.choose_index(sent[i].json.len())?;
                        sent[i].flip(at, 1 << u.choose_index(8)?);
                    }
                    Err(_) => harmless = true,
                }
            }
            Fault::ManifestFlipped => {
                let json = manifest_json.as_mut().expect("made above");
                let at = u.choose_index(json.json.len())?;
                json.flip(at, 1 << u.choose_index(8)?);
            }
            Fault::ManifestReplaced => {
                let mut bytes = serde_json::to_vec(manifest).expect("a manifest serialises");
                let at = u.choose_index(bytes.len())?;
                bytes[at] = u.arbitrary()?;
                harmless =
                    serde_json::from_slice::<Manifest>(&bytes).ok().as_ref() == Some(manifest);
                manifest_json = Some(Json::new(bytes));
            }
            Fault::NoManifest => manifest_json = None,
        }
        Ok(Delivery {
            manifest: manifest_json,
            parts: sent,
            harmless,
        })
    }
}

/// Whether a task damaged by `fault` was refused for that damage.
fn refused_for(fault: Fault, error: &PayloadError) -> bool {
    match fault {
        Fault::None => false,
        Fault::PartLost => matches!(error, PayloadError::Missing(_)),
        Fault::PartFlipped => matches!(error, PayloadError::CorruptPart(_)),
        Fault::ManifestFlipped => matches!(error, PayloadError::CorruptManifest(_)),
        // Bytes that still read as a manifest name other parts.
        Fault::ManifestReplaced => matches!(
            error,
            PayloadError::BadManifest(_) | PayloadError::Missing(_)
        ),
        Fault::NoManifest => matches!(error, PayloadError::NoManifest),
    }
}

/// A manifest naming parts of the pool (by `digests`) under arbitrary keys.
fn arbitrary_manifest(u: &mut Unstructured, digests: &[String]) -> arbitrary::Result<Manifest> {
    let pick =
        |u: &mut Unstructured| -> arbitrary::Result<String> { Ok(u.choose(digests)?.clone()) };
    let key = |u: &mut Unstructured| string(u, 16);
    let mut context = Vec::new();
    for _ in 0..u.int_in_range(0..=5)? {
        context.push((key(u)?, pick(u)?));
    }
    let manifest = Manifest {
        input: pick(u)?,
        reference: if u.arbitrary()? {
            Some((key(u)?, pick(u)?))
        } else {
            None
        },
        context,
        listing: None,
        error: if u.arbitrary()? {
            Some(ErrorInfo {
                step: key(u)?.into(),
                message: string(u, 40)?.into(),
            })
        } else {
            None
        },
        messages: pick(u)?,
        handoff: None,
        map: None,
    };
    let (handoff, item): (bool, bool) = (u.arbitrary()?, u.arbitrary()?);
    if !handoff && !item {
        return Ok(manifest);
    }
    // The handoff record and a map item are carried inline, as the JSON they are.
    let mut value = serde_json::to_value(&manifest).expect("a manifest serialises");
    if handoff {
        value["handoff"] = json!({"source_agent": key(u)?, "decisions": [json_value(u, 2)?]});
    }
    if item {
        value["map"] = json!({"step": key(u)?, "item": json_value(u, 2)?, "index": 0, "count": 1});
    }
    Ok(serde_json::from_value(value).expect("a manifest with a handoff or an item reads"))
}
