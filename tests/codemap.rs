//! ARCHITECTURE.md stays a true map: its first 150 lines hold the diagram, the glossary and the
//! "Where to look first" table; every file that table names exists; its codemap names every
//! source folder and every test file of the workspace. And SECURITY.md names only tests that
//! exist.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ sits in the workspace")
        .to_path_buf()
}

fn architecture() -> String {
    std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md")
}

/// The text of the `## <title>` section.
fn section(text: &str, title: &str) -> String {
    let heading = format!("\n## {title}\n");
    let start = text
        .find(&heading)
        .unwrap_or_else(|| panic!("no section {title:?}"));
    let rest = &text[start + heading.len()..];
    let end = rest.find("\n## ").unwrap_or(rest.len());
    rest[..end].to_owned()
}

/// Every file under `dir`, recursively, skipping build output.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[test]
fn the_map_comes_first() {
    let text = architecture();
    let first: String = text.lines().take(150).collect::<Vec<_>>().join("\n");
    for wanted in ["```text", "## Where to look first", "## Glossary"] {
        assert!(
            first.contains(wanted),
            "ARCHITECTURE.md's first 150 lines must hold {wanted:?}"
        );
    }
    let glossary = section(&text, "Glossary");
    let glossary_end = text.find(&glossary).expect("found above") + glossary.len();
    assert!(
        text[..glossary_end].lines().count() <= 150,
        "the glossary ends after line 150"
    );
    let table = section(&text, "Where to look first");
    for row in [
        "a submit",
        "a step from ready to a worker",
        "an answer to the transition script",
        "a model's reply parsed and repaired",
        "a map item",
        "a lease expiring",
        "a web approval to Redis",
    ] {
        assert!(
            table.contains(&format!("| {row} |")),
            "\"Where to look first\" has no row for {row:?}"
        );
    }
}

#[test]
fn every_file_the_table_names_exists() {
    let table = section(&architecture(), "Where to look first");
    let every: Vec<String> = files_under(&root())
        .iter()
        .map(|path| path.to_string_lossy().into_owned())
        .collect();
    let named = table
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|name| name.ends_with(".rs") || name.ends_with(".lua"));
    let mut missing = Vec::new();
    for name in named {
        if !every.iter().any(|path| path.ends_with(&format!("/{name}"))) {
            missing.push(name.to_owned());
        }
    }
    assert!(missing.is_empty(), "named but not found: {missing:?}");
}

#[test]
fn the_codemap_names_every_source_folder_and_test_file() {
    let codemap = section(&architecture(), "Codemap");
    let root = root();
    let mut missing = Vec::new();
    for krate in ["core", "coordinator", "worker", "cli", "proto"] {
        for file in files_under(&root.join(krate)) {
            let relative = file.strip_prefix(&root).expect("under the root");
            let parts: Vec<String> = relative
                .iter()
                .map(|part| part.to_string_lossy().into_owned())
                .collect();
            // Source folders: each folder below src/ is named as `<name>/`.
            if parts.get(1).map(String::as_str) == Some("src") {
                for folder in &parts[2..parts.len() - 1] {
                    if !codemap.contains(&format!("{folder}/")) {
                        missing.push(format!("{}/", relative.parent().unwrap().display()));
                    }
                }
            }
            // Test files: every .rs under a crate's tests/ is named.
            if parts.get(1).map(String::as_str) == Some("tests")
                && file.extension().is_some_and(|ext| ext == "rs")
            {
                let name = parts.last().expect("a file name");
                if !codemap.contains(name.as_str()) {
                    missing.push(relative.display().to_string());
                }
            }
        }
    }
    for file in files_under(&root.join("tests")) {
        if file.extension().is_some_and(|ext| ext == "rs") {
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            if !codemap.contains(&name) {
                missing.push(file.strip_prefix(&root).unwrap().display().to_string());
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's codemap does not name: {missing:#?}"
    );
}

/// SECURITY.md's threat model names, for each attack, the tests that hold it: every one it
/// names (`path::function`) is there, so that moving a test cannot leave an attack unheld on
/// paper.
#[test]
fn every_test_security_md_names_exists() {
    let root = root();
    let text = std::fs::read_to_string(root.join("SECURITY.md")).expect("SECURITY.md");
    let mut missing = Vec::new();
    for quoted in text.split('`').skip(1).step_by(2) {
        let Some((path, function)) = quoted.split_once(".rs::") else {
            continue;
        };
        let file = root.join(format!("{path}.rs"));
        let source = std::fs::read_to_string(&file).unwrap_or_default();
        if !source.contains(&format!("fn {function}("))
            && !source.contains(&format!("fn {function}<"))
        {
            missing.push(quoted.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "SECURITY.md names tests that are not there: {missing:#?}"
    );
}
