//! Plain text, before any parser reads it: which characters a terminal would act on, and how
//! deep the brackets of a JSON text nest.
//!
//! Both sit below everything that reads or shows text (the workflow's names and JSON reader,
//! diagnostics, the big-integer scan, jq's output check, the fuzz targets), so that none of
//! those has to reach up into another for them.

/// Control characters (C0, DEL, C1: an escape sequence starts with one) and the invisible
/// characters that reorder or hide text around them (bidirectional overrides and isolates,
/// zero-width spaces and joiners, the byte-order mark).
pub fn is_unprintable(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200B}'..='\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{FEFF}'
        )
}

/// Deepest bracket nesting outside strings and comments.
pub(crate) fn text_nesting_depth(text: &str) -> usize {
    #[derive(PartialEq)]
    enum In {
        Code,
        String { escaped: bool },
        LineComment,
        BlockComment,
    }
    let (mut depth, mut deepest, mut state) = (0usize, 0usize, In::Code);
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        let next = bytes.get(i + 1).copied();
        match state {
            In::String { escaped: true } => state = In::String { escaped: false },
            In::String { escaped: false } => match byte {
                b'\\' => state = In::String { escaped: true },
                b'"' => state = In::Code,
                _ => {}
            },
            In::LineComment if byte == b'\n' => state = In::Code,
            In::LineComment => {}
            In::BlockComment if byte == b'*' && next == Some(b'/') => {
                state = In::Code;
                i += 1;
            }
            In::BlockComment => {}
            In::Code => match (byte, next) {
                (b'"', _) => state = In::String { escaped: false },
                (b'/', Some(b'/')) => state = In::LineComment,
                (b'/', Some(b'*')) => {
                    state = In::BlockComment;
                    i += 1;
                }
                (b'[' | b'{', _) => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                (b']' | b'}', _) => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        i += 1;
    }
    deepest
}
