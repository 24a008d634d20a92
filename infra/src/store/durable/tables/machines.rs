//! `machines`: every machine record.
//!
//! Key: `&str` machine id. Value: one version byte, then the record. Version 1 is the JSON
//! form of the domain `Machine` (states and capacity types by name, so reordering an enum
//! can never change a stored meaning). Records are updatable (whole-record upserts) and
//! never deleted: Delete returns a slot to Speculative.

use bigfleet_libvirt_domain::Machine;
use redb::TableDefinition;

/// The table.
pub const TABLE: TableDefinition<&str, &[u8]> = TableDefinition::new("machines");

const VERSION_1: u8 = 1;

/// Why a stored record could not be read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The value is empty.
    #[error("empty value")]
    Empty,
    /// The version byte is not one this build reads.
    #[error("unknown record version {0}")]
    UnknownVersion(u8),
    /// The body does not parse.
    #[error("malformed record: {0}")]
    Malformed(String),
}

/// Encodes a record as version 1.
///
/// # Panics
/// Never for a record that passed validation (finite numbers); a NaN would be a bug.
#[must_use]
pub fn encode(machine: &Machine) -> Vec<u8> {
    let mut out = vec![VERSION_1];
    serde_json::to_writer(&mut out, machine).expect("a validated machine record serializes");
    out
}

/// Decodes a record of any version this build reads.
///
/// # Errors
/// When the value is empty, of an unknown version, or malformed.
pub fn decode(bytes: &[u8]) -> Result<Machine, DecodeError> {
    let (&version, body) = bytes.split_first().ok_or(DecodeError::Empty)?;
    match version {
        VERSION_1 => {
            serde_json::from_slice(body).map_err(|e| DecodeError::Malformed(e.to_string()))
        }
        other => Err(DecodeError::UnknownVersion(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::{DecodeError, decode, encode};
    use bigfleet_libvirt_domain::{
        CapacityType, HostRef, Machine, MachineId, MachineState, StringMap,
    };
    use proptest::prelude::*;

    fn map() -> impl Strategy<Value = StringMap> {
        proptest::collection::btree_map(".{0,12}", ".{0,12}", 0..4)
    }

    prop_compose! {
        fn machine()(
            id in ".{1,24}",
            state in proptest::sample::select(MachineState::ALL.to_vec()),
            host in proptest::option::of((".{0,8}", ".{0,16}")),
            instance_type in ".{0,12}",
            zone in ".{0,8}",
            capacity in 0i32..5,
            price in 0.0f64..1e6,
            probability in 0.0f64..=1.0,
            (resources, allocatable, labels, shard_metadata) in (map(), map(), map(), map()),
            (last_error, cluster) in (".{0,20}", ".{0,12}"),
        ) -> Machine {
            Machine {
                id: MachineId::new(id).unwrap(),
                state,
                host: host.map(|(provider, reference)| HostRef { provider, reference }),
                instance_type,
                zone,
                capacity_type: CapacityType::from_wire(capacity),
                price_per_hour: price,
                interruption_probability: probability,
                resources: resources.into(),
                allocatable: allocatable.into(),
                labels: labels.into(),
                last_error,
                cluster,
                shard_metadata,
                encoded: Default::default(),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn machine_records_round_trip_exactly(m in machine()) {
            prop_assert_eq!(decode(&encode(&m)).unwrap(), m);
        }
    }

    #[test]
    fn unknown_versions_and_garbage_are_refused() {
        assert_eq!(decode(&[]), Err(DecodeError::Empty));
        assert_eq!(
            decode(&[9, b'{', b'}']),
            Err(DecodeError::UnknownVersion(9))
        );
        assert!(matches!(decode(&[1, b'x']), Err(DecodeError::Malformed(_))));
    }
}
