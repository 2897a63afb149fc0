//! The recipes the READMEs print, read as a user copies them: the first `sh` block after a
//! heading, line by line, so that a test can run each line as printed.

#![allow(dead_code)]

use std::path::Path;

/// The lines of the first `sh` block after `heading` in `file` (a path from the repository
/// root), without blank lines and whole-line comments.
pub fn block(file: &str, heading: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let section = &text[text
        .find(heading)
        .unwrap_or_else(|| panic!("{file} has no section {heading:?}"))..];
    let start = section.find("```sh\n").expect("a sh block") + "```sh\n".len();
    let block = &section[start..start + section[start..].find("```").expect("the block ends")];
    block
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// A line's command without its trailing `# comment`, and whether it ends with `&`.
pub fn command_of(line: &str) -> (String, bool) {
    let code = match line.find(" #") {
        // Not a `#` inside a quoted argument.
        Some(at) if line[..at].matches('"').count().is_multiple_of(2) => &line[..at],
        _ => line,
    };
    let code = code.trim();
    match code.strip_suffix('&') {
        Some(code) => (code.trim().to_owned(), true),
        None => (code.to_owned(), false),
    }
}
