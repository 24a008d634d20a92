//! `operations`: the idempotency map.
//!
//! Key: `(&str machine_id, u8 kind)` where kind is 1 create, 2 configure, 3 drain, 4 delete
//! (persisted numbers: never reuse or renumber). Value: `&str` operation id. Records are
//! updatable (a fresh cycle overwrites) and never deleted.

use bigfleet_libvirt_domain::Kind;
use redb::TableDefinition;

/// The table.
pub const TABLE: TableDefinition<(&str, u8), &str> = TableDefinition::new("operations");

/// The persisted number of a kind.
#[must_use]
pub fn encode_kind(kind: Kind) -> u8 {
    match kind {
        Kind::Create => 1,
        Kind::Configure => 2,
        Kind::Drain => 3,
        Kind::Delete => 4,
    }
}

/// The kind of a persisted number, `None` for numbers this build does not know.
#[must_use]
pub fn decode_kind(n: u8) -> Option<Kind> {
    match n {
        1 => Some(Kind::Create),
        2 => Some(Kind::Configure),
        3 => Some(Kind::Drain),
        4 => Some(Kind::Delete),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{decode_kind, encode_kind};
    use bigfleet_libvirt_domain::Kind;

    #[test]
    fn kinds_round_trip_and_unknown_numbers_are_refused() {
        for kind in Kind::ALL {
            assert_eq!(decode_kind(encode_kind(kind)), Some(kind));
        }
        assert_eq!(decode_kind(0), None);
        assert_eq!(decode_kind(5), None);
    }
}
