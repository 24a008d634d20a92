//! Black-box integration tests live in `tests/`; this library is empty.
