//! One module per redb table: its definition, the layout of its keys and values, and the
//! codecs with their round-trip property tests. The schema version in `meta` covers every
//! table; values that are free-form (machines) also carry their own version byte.

pub mod fences;
pub mod machines;
pub mod meta;
pub mod operations;
