//! Placeholder; written next.
