//! The documentation as a reader meets it: README.md is a front page (what Baton is, install, a
//! tour, links) under 200 lines; the book in docs/ (mdBook) builds, with no chapter missing; every
//! link between the README and the book's chapters leads to a file and a heading that exist; and
//! every command block of either is run by a test as printed, each listed below with the test
//! that runs it (a block added without a test fails here).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every `sh` block of the docs: the file, the text it is the first block after (what
/// `recipes::block(file, anchor)` finds), and the test that reads it with that call and runs it.
const RUN_BY: &[(&str, &str, &str)] = &[
    ("README.md", "## Install", "tests/cli_dev.rs"),
    ("README.md", "With Docker and no Rust", "tests/image.rs"),
    ("README.md", "## Two commands", "tests/cli_dev.rs"),
    ("README.md", "## A cluster", "tests/readme_cluster.rs"),
    (
        "docs/src/security.md",
        "## Security: TLS, principals, protected mode",
        "tests/security.rs",
    ),
    (
        "docs/src/agents.md",
        "## Models (`llm` agents)",
        "tests/llm.rs",
    ),
    (
        "docs/src/maps.md",
        "# Fanning out over data: map steps",
        "tests/cli_dev.rs",
    ),
    ("docs/src/benchmark.md", "# The benchmark", "tests/bench.rs"),
    (
        "docs/src/examples.md",
        "## A map item fails, within `tolerated_failures`",
        "tests/readme_examples.rs",
    ),
    (
        "docs/src/examples.md",
        "## A failed run, retried",
        "tests/readme_examples.rs",
    ),
    (
        "docs/src/examples.md",
        "## Agents that record decisions",
        "tests/readme_examples.rs",
    ),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// README.md and every chapter of the book, as paths from the repository root.
fn documents() -> Vec<String> {
    let mut found = vec!["README.md".to_owned()];
    let mut folders = vec![root().join("docs/src")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("docs/src").flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|extension| extension == "md") {
                let relative = path
                    .strip_prefix(root())
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                found.push(relative.trim_start_matches("cli/../").to_owned());
            }
        }
    }
    found.sort();
    found
}

fn read(file: &str) -> String {
    std::fs::read_to_string(root().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Where each ```sh block of `text` starts (the byte after its fence line).
fn sh_blocks(text: &str) -> Vec<usize> {
    text.match_indices("```sh\n")
        .map(|(at, fence)| at + fence.len())
        .collect()
}

#[test]
fn the_readme_is_a_front_page_under_200_lines() {
    let lines = read("README.md").lines().count();
    assert!(
        lines < 200,
        "README.md is {lines} lines: the rest belongs in the book (docs/)"
    );
}

#[test]
fn the_book_builds_with_mdbook() {
    let tools = root().join("target/test-tools/mdbook/bin/mdbook");
    let mdbook = if tools.is_file() {
        tools
    } else {
        PathBuf::from("mdbook")
    };
    let out = tempfile::tempdir().unwrap();
    let built = Command::new(&mdbook)
        .arg("build")
        .arg(root().join("docs"))
        .arg("--dest-dir")
        .arg(out.path())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {}: {e} (scripts/test installs mdbook)",
                mdbook.display()
            )
        });
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    assert!(built.status.success(), "{said}");
    assert!(!said.contains("WARN") && !said.contains("ERROR"), "{said}");
    assert!(out.path().join("index.html").is_file(), "{said}");
}

/// A heading's anchor as GitHub and mdBook make it: lower case, letters, digits, `-` and `_`
/// kept, spaces made `-`, the rest dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.starts_with("```") {
                fenced = !fenced;
            }
            !fenced
        })
        .filter_map(|line| line.strip_prefix('#'))
        .map(|heading| slug(heading.trim_start_matches('#')))
        .collect()
}

/// The targets of a document's Markdown links `[text](target)`, outside code.
fn links(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut found = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                found.push(rest[..end].to_owned());
                rest = &rest[end..];
            }
        }
    }
    found
}

#[test]
fn every_link_between_the_docs_resolves() {
    let mut broken = Vec::new();
    for file in documents() {
        let text = read(&file);
        let folder = Path::new(&file).parent().unwrap_or(Path::new(""));
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let linked = if path.is_empty() {
                file.clone()
            } else {
                folder.join(path).to_string_lossy().into_owned()
            };
            let Ok(linked_text) = std::fs::read_to_string(root().join(&linked)) else {
                if !root().join(&linked).exists() {
                    broken.push(format!("{file}: {target} (no such file)"));
                }
                continue;
            };
            if !anchor.is_empty() && !anchors(&linked_text).iter().any(|a| a == anchor) {
                broken.push(format!("{file}: {target} (no such heading)"));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_command_block_is_run_by_a_test() {
    let mut unrun = Vec::new();
    let mut covered: Vec<(String, usize)> = Vec::new();
    for (file, anchor, test) in RUN_BY {
        let text = read(file);
        let at = text
            .find(anchor)
            .unwrap_or_else(|| panic!("{file} has no {anchor:?}, which RUN_BY names"));
        let block = sh_blocks(&text)
            .into_iter()
            .find(|start| *start > at)
            .unwrap_or_else(|| panic!("{file} has no sh block after {anchor:?}"));
        let source = read(test);
        assert!(
            source.contains(&format!("{anchor:?}")) && source.contains(&format!("{file:?}")),
            "{test} does not read the block after {anchor:?} in {file} (recipes::block)"
        );
        covered.push(((*file).to_owned(), block));
    }
    for file in documents() {
        let text = read(&file);
        for block in sh_blocks(&text) {
            if !covered.contains(&(file.clone(), block)) {
                let line = text[..block].lines().count();
                unrun.push(format!("{file}:{line}"));
            }
        }
    }
    assert!(
        unrun.is_empty(),
        "command blocks no test runs (add the test, and the block to RUN_BY):\n{}",
        unrun.join("\n")
    );
}
