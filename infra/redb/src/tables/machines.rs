//! `machines`: every machine record.
//!
//! Key: `&str` machine id. Value: one version byte, then the record.
//! - Version 2 (written since schema 2): the record as a protobuf message of its own
//!   ([`Stored`]), states and capacity types by their wire numbers, which the contract fixes
//!   forever, and without the id (it is the key). About a quarter of version 1's size.
//! - Version 1 (schema 1 files): the JSON form of the domain `Machine`, states and capacity
//!   types by name. Still read, so an older file migrates (see `super::super::migrate`).
//!
//! Records are updatable (whole-record upserts) and never deleted: Delete returns a slot to
//! Speculative.

use bigfleet_libvirt_domain::{CapacityType, HostRef, Machine, MachineId, MachineState, StringMap};
use prost::Message;
use redb::TableDefinition;

/// The table.
pub const TABLE: TableDefinition<&str, &[u8]> = TableDefinition::new("machines");

/// The JSON record of schema 1.
pub const VERSION_1: u8 = 1;
/// The protobuf record of schema 2.
pub const VERSION_2: u8 = 2;

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

/// A version 2 record. Field numbers are the format: never reuse or renumber one. (Field 1
/// is not used: the id is the record's key.)
#[derive(Clone, PartialEq, Message)]
struct Stored {
    /// `MachineState` wire number.
    #[prost(int32, tag = "2")]
    state: i32,
    /// Absent when the record has no host (distinct from a host with empty fields).
    #[prost(message, optional, tag = "3")]
    host: Option<StoredHost>,
    #[prost(string, tag = "4")]
    instance_type: String,
    #[prost(string, tag = "5")]
    zone: String,
    /// `CapacityType` wire number.
    #[prost(int32, tag = "6")]
    capacity_type: i32,
    #[prost(double, tag = "7")]
    price_per_hour: f64,
    #[prost(double, tag = "8")]
    interruption_probability: f64,
    #[prost(btree_map = "string, string", tag = "9")]
    resources: StringMap,
    #[prost(btree_map = "string, string", tag = "10")]
    allocatable: StringMap,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: StringMap,
    #[prost(string, tag = "12")]
    last_error: String,
    #[prost(string, tag = "13")]
    cluster: String,
    #[prost(btree_map = "string, string", tag = "14")]
    shard_metadata: StringMap,
}

#[derive(Clone, PartialEq, Message)]
struct StoredHost {
    #[prost(string, tag = "1")]
    provider: String,
    #[prost(string, tag = "2")]
    reference: String,
}

/// Encodes a record as version 2.
#[must_use]
pub fn encode(machine: &Machine) -> Vec<u8> {
    let stored = Stored {
        state: machine.state as i32,
        host: machine.host.as_ref().map(|h| StoredHost {
            provider: h.provider.clone(),
            reference: h.reference.clone(),
        }),
        instance_type: machine.instance_type.clone(),
        zone: machine.zone.clone(),
        capacity_type: machine.capacity_type as i32,
        price_per_hour: machine.price_per_hour,
        interruption_probability: machine.interruption_probability,
        resources: machine.resources.to_map(),
        allocatable: machine.allocatable.to_map(),
        labels: machine.labels.to_map(),
        last_error: machine.last_error.clone(),
        cluster: machine.cluster.clone(),
        shard_metadata: machine.shard_metadata.clone(),
    };
    let mut out = Vec::with_capacity(1 + stored.encoded_len());
    out.push(VERSION_2);
    stored
        .encode(&mut out)
        .expect("a vector grows to hold any record");
    out
}

/// Encodes a record as version 1, the JSON of schema 1 (the migration tests write old files).
///
/// # Panics
/// Never for a record that passed validation (finite numbers); a NaN would be a bug.
#[cfg(test)]
#[must_use]
pub fn encode_v1(machine: &Machine) -> Vec<u8> {
    let mut out = vec![VERSION_1];
    serde_json::to_writer(&mut out, machine).expect("a validated machine record serializes");
    out
}

/// Decodes the record stored under the key `id`, of any version this build reads.
///
/// # Errors
/// When the value is empty, of an unknown version, or malformed, or a version 1 record
/// names another id than its key.
pub fn decode(id: &str, bytes: &[u8]) -> Result<Machine, DecodeError> {
    let (&version, body) = bytes.split_first().ok_or(DecodeError::Empty)?;
    match version {
        VERSION_2 => decode_v2(id, body),
        VERSION_1 => {
            let machine: Machine =
                serde_json::from_slice(body).map_err(|e| DecodeError::Malformed(e.to_string()))?;
            if machine.id.as_str() != id {
                return Err(DecodeError::Malformed(format!(
                    "the record names machine {:?}",
                    machine.id.as_str()
                )));
            }
            Ok(machine)
        }
        other => Err(DecodeError::UnknownVersion(other)),
    }
}

fn decode_v2(id: &str, body: &[u8]) -> Result<Machine, DecodeError> {
    let stored = Stored::decode(body).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    let id = MachineId::new(id)
        .map_err(|_| DecodeError::Malformed("the machine id (its key) is empty".to_owned()))?;
    let state = MachineState::from_wire(stored.state)
        .ok_or_else(|| DecodeError::Malformed(format!("unknown machine state {}", stored.state)))?;
    Ok(Machine {
        id,
        state,
        host: stored.host.map(|h| HostRef {
            provider: h.provider,
            reference: h.reference,
        }),
        instance_type: stored.instance_type,
        zone: stored.zone,
        capacity_type: CapacityType::from_wire(stored.capacity_type),
        price_per_hour: stored.price_per_hour,
        interruption_probability: stored.interruption_probability,
        resources: stored.resources.into(),
        allocatable: stored.allocatable.into(),
        labels: stored.labels.into(),
        last_error: stored.last_error,
        cluster: stored.cluster,
        shard_metadata: stored.shard_metadata,
        encoded: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::{DecodeError, decode, encode, encode_v1};
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
            let id = m.id.as_str();
            prop_assert_eq!(decode(id, &encode(&m)).unwrap(), m.clone());
            prop_assert_eq!(decode(id, &encode_v1(&m)).unwrap(), m.clone());
            prop_assert!(decode("another", &encode_v1(&m)).is_err() || id == "another");
        }
    }

    #[test]
    fn unknown_versions_and_garbage_are_refused() {
        assert_eq!(decode("m", &[]), Err(DecodeError::Empty));
        assert_eq!(
            decode("m", &[9, b'{', b'}']),
            Err(DecodeError::UnknownVersion(9))
        );
        assert!(matches!(
            decode("m", &[1, b'x']),
            Err(DecodeError::Malformed(_))
        ));
        assert!(matches!(
            decode("m", &[2, 0xff]),
            Err(DecodeError::Malformed(_))
        ));
        // A state number the contract does not define is refused, never guessed.
        assert_eq!(
            decode("m", &[2, 0x10, 42]),
            Err(DecodeError::Malformed(
                "unknown machine state 42".to_owned()
            ))
        );
    }
}
