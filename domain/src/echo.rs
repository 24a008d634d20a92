//! Bounded echo of caller-supplied strings.
//!
//! Ids, shard ids and other strings a caller sends end up in status messages and log lines.
//! A caller controls their size, so they are never echoed whole: [`Echo`] prints at most
//! [`ECHO_BYTES`] bytes of one, escaped (quotes, backslashes and control characters come
//! out as Rust escapes), followed by the full length when it was cut. Ids longer than
//! [`MAX_ID_BYTES`] are refused outright, before any decision is taken on them.

use std::fmt;

/// The longest `machine_id`, `shard_id` or Get `id` accepted, in bytes. The ids this provider
/// mints are well under 200 bytes, so 1 KiB leaves room for any sane naming scheme.
pub const MAX_ID_BYTES: usize = 1024;

/// How many bytes of a caller-supplied string a message or log line repeats.
pub const ECHO_BYTES: usize = 128;

/// A caller-supplied string as messages show it: quoted and escaped, cut after
/// [`ECHO_BYTES`] bytes (on a character boundary) with the total length appended.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Echo<'a>(pub &'a str);

impl fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0;
        if text.len() <= ECHO_BYTES {
            return write!(f, "{text:?}");
        }
        let mut end = ECHO_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        write!(f, "{:?}… ({} bytes)", &text[..end], text.len())
    }
}

impl fmt::Debug for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Like [`Echo`], but a short string that needs no escaping is shown bare (no quotes), as
/// log and span fields carry ids; anything else is shown exactly as [`Echo`] shows it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct EchoField<'a>(pub &'a str);

impl fmt::Display for EchoField<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0;
        let plain = |c: char| !c.is_control() && c != '"' && c != '\\';
        if text.len() <= ECHO_BYTES && text.chars().all(plain) {
            f.write_str(text)
        } else {
            fmt::Display::fmt(&Echo(text), f)
        }
    }
}

impl fmt::Debug for EchoField<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::{ECHO_BYTES, Echo, EchoField};

    #[test]
    fn fields_are_bare_unless_they_need_escaping_or_cutting() {
        assert_eq!(
            EchoField("libvirt/OnDemand/kvm.small/a/0").to_string(),
            "libvirt/OnDemand/kvm.small/a/0"
        );
        assert_eq!(EchoField("a\nb").to_string(), "\"a\\nb\"");
        let long = "y".repeat(300);
        assert_eq!(EchoField(&long).to_string(), Echo(&long).to_string());
    }

    #[test]
    fn short_strings_are_quoted_and_escaped_whole() {
        assert_eq!(Echo("m-1").to_string(), "\"m-1\"");
        assert_eq!(Echo("a\"b\n\0").to_string(), "\"a\\\"b\\n\\0\"");
    }

    #[test]
    fn long_strings_are_cut_with_their_length() {
        let long = "x".repeat(1 << 20);
        let shown = Echo(&long).to_string();
        assert_eq!(
            shown,
            format!("\"{}\"… (1048576 bytes)", "x".repeat(ECHO_BYTES))
        );
    }

    #[test]
    fn the_cut_never_splits_a_character() {
        let long = "é".repeat(100); // 200 bytes, 2 per character
        let shown = Echo(&long).to_string();
        assert_eq!(shown, format!("\"{}\"… (200 bytes)", "é".repeat(64)));
    }
}
