//! Texts from outside, bounded: cut to a limit with a marker that says so, or checked as names.
//!
//! An agent's error text ends up in the run's state twice (the step's and the run's error), in
//! every record `GetRun` and the web UI send, and in the attempt log; a worker can send one as
//! long as a gRPC message (a 60 MiB error once made a run record of 125 MB that `baton runs
//! get` could never read again). Such a text is kept up to a limit, its start and its end (an
//! error's cause is often at the end of a process's stderr), with a marker between them that
//! says how long it was and what the limit is.

/// `text` if it is at most `limit` bytes; otherwise its start and its end around a marker
/// naming the text's length and the limit, `limit` bytes in all (at most: it is cut on
/// character boundaries). A limit shorter than the marker keeps the marker alone.
pub fn cut(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let marker = format!(
        " [... cut: {} bytes in all, past the limit of {limit} ...] ",
        text.len()
    );
    let room = limit.saturating_sub(marker.len());
    let head = floor_boundary(text, room / 2 + room % 2);
    let tail = ceil_boundary(text, text.len() - room / 2);
    let mut out = String::with_capacity(limit.max(marker.len()));
    out.push_str(&text[..head]);
    out.push_str(&marker);
    out.push_str(&text[tail..]);
    out
}

/// The largest character boundary of `text` at most `at`.
fn floor_boundary(text: &str, at: usize) -> usize {
    (0..=at.min(text.len()))
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0)
}

/// The smallest character boundary of `text` at least `at`.
fn ceil_boundary(text: &str, at: usize) -> usize {
    (at..=text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len())
}

/// Why a name (a worker id, an agent name) is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadName {
    Empty,
    TooLong {
        bytes: usize,
        limit: usize,
    },
    /// A control character (an ANSI escape, a newline...) at this byte offset.
    Control {
        offset: usize,
        character: char,
    },
}

impl std::fmt::Display for BadName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadName::Empty => write!(f, "is empty"),
            BadName::TooLong { bytes, limit } => {
                write!(f, "is {bytes} bytes; the limit is {limit}")
            }
            BadName::Control { offset, character } => write!(
                f,
                "holds the control character U+{:04X} at byte {offset}; it must be printable",
                u32::from(*character)
            ),
        }
    }
}

/// A name shown to people and written in logs and records: not blank, at most `limit` bytes,
/// no control characters.
pub fn check_name(name: &str, limit: usize) -> Result<(), BadName> {
    if name.trim().is_empty() {
        return Err(BadName::Empty);
    }
    if name.len() > limit {
        return Err(BadName::TooLong {
            bytes: name.len(),
            limit,
        });
    }
    match name.char_indices().find(|(_, c)| c.is_control()) {
        Some((offset, character)) => Err(BadName::Control { offset, character }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_short_text_is_kept_whole() {
        assert_eq!(cut("agent failed", 100), "agent failed");
        assert_eq!(cut("", 0), "");
    }

    #[test]
    fn a_long_error_keeps_its_start_and_its_end_and_says_how_long_it_was() {
        let error = format!(
            "agent \"coder\" exited with code 1: {}the real cause",
            "x".repeat(60 << 20)
        );
        let kept = cut(&error, 16 << 10);
        assert!(kept.len() <= 16 << 10, "{}", kept.len());
        assert!(kept.starts_with("agent \"coder\" exited with code 1: "));
        assert!(kept.ends_with("the real cause"));
        assert!(
            kept.contains(&format!(
                "cut: {} bytes in all, past the limit of 16384",
                error.len()
            )),
            "{}",
            &kept[8000..8400]
        );
    }

    #[test]
    fn names_must_be_printable_non_blank_and_short() {
        assert_eq!(check_name("coder", 256), Ok(()));
        assert_eq!(check_name("étape-2 (ünïcode)", 256), Ok(()));
        assert_eq!(check_name("  ", 256), Err(BadName::Empty));
        assert_eq!(
            check_name(&"a".repeat(257), 256),
            Err(BadName::TooLong {
                bytes: 257,
                limit: 256
            })
        );
        let escaped = check_name("red\u{1b}[31m", 256).unwrap_err();
        assert_eq!(
            escaped.to_string(),
            "holds the control character U+001B at byte 3; it must be printable"
        );
    }

    proptest! {
        #[test]
        fn a_cut_text_is_within_its_limit_and_keeps_both_ends(text in ".{0,400}", limit in 80usize..300) {
            let kept = cut(&text, limit);
            if text.len() <= limit {
                prop_assert_eq!(&kept, &text);
            } else {
                prop_assert!(kept.len() <= limit, "{} > {limit}", kept.len());
                let (head, rest) = kept.split_once(" [... cut: ").expect("a marker");
                prop_assert!(text.starts_with(head));
                let tail = rest.split_once(" ...] ").expect("the marker's end").1;
                prop_assert!(text.ends_with(tail));
                // Only character boundaries (up to 3 bytes each side) keep it short of the limit.
                prop_assert!(kept.len() + 6 >= limit, "{} for {limit}", kept.len());
            }
        }
    }
}
