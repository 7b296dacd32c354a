//! The one escape every input-derived string passes before it reaches a terminal: text from an
//! input (a snapshot's allocator settings, a file name, a process's command line) may hold escape
//! sequences that would move the cursor, retitle the window or hide lines (issue 23). [`escape`]
//! keeps newlines and tabs and writes every other C0 control, DEL and C1 control as `\xHH` /
//! `\u{HH}`, so what is printed is what the input holds, visibly.

use std::borrow::Cow;

fn is_control(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t') || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with its control characters made visible (newlines and tabs kept); borrowed when there
/// is nothing to escape.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_control(c) {
            let n = c as u32;
            if n < 0x80 {
                out.push_str(&format!("\\x{n:02x}"));
            } else {
                out.push_str(&format!("\\u{{{n:x}}}"));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::escape;

    /// Issue 23: a snapshot's allocator settings reached the terminal raw, escape sequences
    /// included.
    #[test]
    fn regression_escape_sequences_from_an_input_are_made_visible() {
        assert_eq!(escape("expandable_segments:True\n\tok"), "expandable_segments:True\n\tok");
        assert!(matches!(escape("plain"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(escape("a\x1b]0;owned\x07b\x1b[2Jc\rd\u{9b}e\u{202e}f"), "a\\x1b]0;owned\\x07b\\x1b[2Jc\\x0dd\\u{9b}e\\u{202e}f");
    }
}
