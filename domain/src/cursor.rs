//! List cursors: the revision counter as ASCII decimal (docs/contract.md §8).

/// Parses a `since_revision` cursor as a base-10 signed 64-bit integer with an optional
/// leading sign. Anything else (empty, letters, binary, trailing junk, overflow) yields
/// `None`, which callers treat as "no cursor": a full list, never an error.
#[must_use]
pub fn parse_cursor(bytes: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(bytes).ok()?;
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<i64>().ok()
}

#[cfg(test)]
mod tests {
    use super::parse_cursor;

    #[test]
    fn decimal_cursors_parse_and_junk_does_not() {
        assert_eq!(parse_cursor(b"42"), Some(42));
        assert_eq!(parse_cursor(b"+7"), Some(7));
        assert_eq!(parse_cursor(b"-3"), Some(-3));
        assert_eq!(parse_cursor(b"9223372036854775807"), Some(i64::MAX));
        for junk in [
            &b""[..],
            b"+",
            b"-",
            b"42!",
            b"~42",
            b"not-a-real-cursor",
            b"\x00\xff",
        ] {
            assert_eq!(parse_cursor(junk), None, "{junk:?}");
        }
        assert_eq!(parse_cursor(b"9223372036854775808"), None);
        assert_eq!(parse_cursor(b" 42"), None);
    }
}
