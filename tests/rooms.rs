//! The house's rooms stay small enough to read: no source file over 600 lines, no source
//! function over 120, no web UI module over 400 (issue 29). Tests, benches and a crate's
//! `tests.rs` files aside; generated code is not in the tree.

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 600;
const MAX_FUNCTION_LINES: usize = 120;
const MAX_MODULE_LINES: usize = 400;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ sits in the workspace")
        .to_path_buf()
}

/// Every file under `dir` whose name ends with `extension`, recursively.
fn files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path, extension));
        } else if path.extension().is_some_and(|ext| ext == extension) {
            found.push(path);
        }
    }
    found
}

/// The crates' source files: under `<crate>/src`, tests aside.
fn sources() -> Vec<PathBuf> {
    let root = root();
    ["core", "coordinator", "worker", "cli", "proto"]
        .iter()
        .flat_map(|krate| files(&root.join(krate).join("src"), "rs"))
        .filter(|path| {
            let name = path.file_name().unwrap().to_string_lossy();
            !(name == "tests.rs"
                || name.ends_with("_tests.rs")
                || path.components().any(|part| part.as_os_str() == "tests"))
        })
        .collect()
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root()).unwrap().display().to_string()
}

/// The functions of `text` longer than `limit` lines, as `name (lines)`: a function runs from
/// its `fn` line to the first line after it that closes its indentation level. Declarations
/// without a body are no functions; an inline test module ends what is read.
fn long_functions(text: &str, limit: usize) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut long = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        if line.trim_start() == "#[cfg(test)]"
            && lines
                .get(at + 1)
                .is_some_and(|next| next.trim_start().starts_with("mod tests"))
        {
            break;
        }
        let trimmed = line.trim_start();
        // `pub`, `pub(crate)`, `pub(in crate::service)`...
        let signature = match trimmed.strip_prefix("pub(") {
            Some(rest) => rest.split_once(") ").map_or(rest, |(_, after)| after),
            None => trimmed.strip_prefix("pub ").unwrap_or(trimmed),
        };
        let signature = ["const ", "async "].iter().fold(signature, |rest, word| {
            rest.strip_prefix(word).unwrap_or(rest)
        });
        let Some(name) = signature.strip_prefix("fn ") else {
            continue;
        };
        let indent = &line[..line.len() - trimmed.len()];
        // A declaration ends its signature with `;` before any body opens.
        let Some(opening) = lines[at..]
            .iter()
            .position(|line| line.trim_end().ends_with('{') || line.trim_end().ends_with(';'))
        else {
            continue;
        };
        if lines[at + opening].trim_end().ends_with(';') {
            continue;
        }
        let closing = lines[at + 1..]
            .iter()
            .position(|line| line.starts_with(indent) && line[indent.len()..].starts_with('}'));
        if let Some(closing) = closing
            && closing + 2 > limit
        {
            let name: String = name
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            long.push(format!("{name} ({} lines)", closing + 2));
        }
    }
    long
}

#[test]
fn no_source_file_is_over_600_lines() {
    let long: Vec<String> = sources()
        .iter()
        .filter_map(|path| {
            let lines = std::fs::read_to_string(path).unwrap().lines().count();
            (lines > MAX_FILE_LINES).then(|| format!("{} ({lines} lines)", relative(path)))
        })
        .collect();
    assert!(
        long.is_empty(),
        "source files over {MAX_FILE_LINES} lines: {long:#?}"
    );
}

#[test]
fn no_source_function_is_over_120_lines() {
    let long: Vec<String> = sources()
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            long_functions(&text, MAX_FUNCTION_LINES)
                .into_iter()
                .map(move |function| format!("{}: {function}", relative(path)))
        })
        .collect();
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines: {long:#?}"
    );
}

#[test]
fn no_web_module_is_over_400_lines() {
    let modules = files(&root().join("coordinator/src/web/assets"), "js");
    assert!(!modules.is_empty(), "the web UI's modules are there");
    let long: Vec<String> = modules
        .iter()
        .filter_map(|path| {
            let lines = std::fs::read_to_string(path).unwrap().lines().count();
            (lines > MAX_MODULE_LINES).then(|| format!("{} ({lines} lines)", relative(path)))
        })
        .collect();
    assert!(
        long.is_empty(),
        "web modules over {MAX_MODULE_LINES} lines: {long:#?}"
    );
}

#[test]
fn the_measure_of_a_function_finds_a_long_one_and_skips_declarations() {
    let body: String = (0..130).map(|n| format!("    let x{n} = {n};\n")).collect();
    let long = format!("fn long() {{\n{body}}}\n");
    assert_eq!(long_functions(&long, 120), ["long (132 lines)"]);
    let declared = format!("trait T {{\n    fn declared(&self);\n{body}}}\n");
    assert!(long_functions(&declared, 120).is_empty());
    let short = "pub async fn short() {\n    work();\n}\n";
    assert!(long_functions(short, 120).is_empty());
    let scoped = format!("    pub(in crate::service) async fn scoped() {{\n{body}    }}\n");
    assert_eq!(long_functions(&scoped, 120), ["scoped (132 lines)"]);
}
