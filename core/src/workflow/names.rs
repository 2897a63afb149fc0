//! What may name things a run is filed and shown under: step ids, and the freer names of
//! workflows and agents.
//!
//! Names reach places where a stray character does harm: Redis keys, whose `{...}` hash tag
//! picks the slot a key lives on (`P:timer-slots:{t:<agent>}`, a workflow's run index), and
//! terminals and pages that show them (`baton runs list`, the web UI), where an escape
//! sequence repaints the screen and a bidirectional override reorders what is read. So every
//! name is bounded and printable, and none holds a brace. The coordinator checks the names a
//! client filters by with the same rules, so a filter can only name what could exist.

// Public here too: the coordinator checks the names a client filters by with the same rule.
pub use crate::text::is_unprintable;

/// Why `name` cannot be a step id (or an output alias): it must be 1 to `max_bytes` ASCII
/// letters, digits, `_` and `-`, not starting with `-`. `what` names it in the message.
pub fn step_id_problem(what: &str, name: &str, max_bytes: usize) -> Option<String> {
    let valid_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if name.is_empty() {
        Some(format!("{what} is empty"))
    } else if !valid_chars || name.starts_with('-') {
        Some(format!(
            "{what} {:?} may only contain ASCII letters, digits, \"_\" and \"-\" (not first)",
            shown(name)
        ))
    } else if name.len() > max_bytes {
        // Only ASCII is left here, so bytes are characters.
        Some(format!(
            "{what} is {} characters long; the limit is {max_bytes}",
            name.len()
        ))
    } else {
        None
    }
}

/// Why `name` cannot name a workflow or an agent (or a person, in an approval): it must be 1
/// to `max_bytes` bytes of printable text, with no `{` or `}`. `what` names it in the message.
pub fn name_problem(what: &str, name: &str, max_bytes: usize) -> Option<String> {
    if name.is_empty() {
        return Some(format!("{what} is empty"));
    }
    if name.len() > max_bytes {
        return Some(format!(
            "{what} is {} bytes long; the limit is {max_bytes}",
            name.len()
        ));
    }
    if let Some((at, c)) = name.char_indices().find(|(_, c)| is_unprintable(*c)) {
        return Some(format!(
            "{what} {:?} holds an unprintable character (U+{:04X}) at byte {at}; names are shown \
             in terminals and web pages, so they may not hold control or direction characters",
            shown(name),
            u32::from(c)
        ));
    }
    if let Some(at) = name.find(['{', '}']) {
        return Some(format!(
            "{what} {:?} holds a brace at byte {at}; names are part of storage keys, where braces \
             choose the key's Redis Cluster slot, so they may not hold \"{{\" or \"}}\"",
            shown(name)
        ));
    }
    None
}

/// A name as a message shows it: its first 40 characters.
fn shown(name: &str) -> String {
    name.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_printable_bounded_and_brace_free() {
        for fine in ["feature-dev", "Feature Dev v2", "équipe/plan:1", "a"] {
            assert_eq!(name_problem("workflow id", fine, 128), None, "{fine}");
        }
        for (name, expected) in [
            ("", "workflow id is empty"),
            (
                "\u{1b}[31mred",
                "holds an unprintable character (U+001B) at byte 0",
            ),
            ("a\nb", "(U+000A) at byte 1"),
            ("ab\u{202E}cd", "(U+202E) at byte 2"),
            ("x\u{200B}", "(U+200B) at byte 1"),
            ("{run}", "holds a brace at byte 0"),
            ("a}", "holds a brace at byte 1"),
        ] {
            let problem = name_problem("workflow id", name, 128).expect(name);
            assert!(problem.contains(expected), "{name:?}: {problem}");
        }
        let long = "é".repeat(65);
        assert_eq!(
            name_problem("agent name", &long, 128).unwrap(),
            "agent name is 130 bytes long; the limit is 128"
        );
        assert_eq!(name_problem("agent name", &"a".repeat(128), 128), None);
    }

    #[test]
    fn the_escape_is_shown_escaped_never_raw() {
        let problem = name_problem("workflow id", "\u{1b}[2Jgone", 128).unwrap();
        assert!(!problem.contains('\u{1b}'), "{problem}");
        assert!(problem.contains("\\u{1b}[2Jgone"), "{problem}");
    }

    #[test]
    fn step_ids_are_ascii_words() {
        assert_eq!(step_id_problem("step id", "Plan_2-b", 128), None);
        for id in ["plan step", "plän", "-plan", "{a}", "a\u{1b}"] {
            let problem = step_id_problem("step id", id, 128).unwrap();
            assert!(
                problem.contains("may only contain ASCII letters"),
                "{problem}"
            );
        }
        assert_eq!(
            step_id_problem("step id", &"a".repeat(129), 128).unwrap(),
            "step id is 129 characters long; the limit is 128"
        );
        assert_eq!(
            step_id_problem("step id", "", 128).unwrap(),
            "step id is empty"
        );
    }
}
