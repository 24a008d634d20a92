//! Proves the generated types decode bytes laid out by hand from the contract's field
//! table. The fencing-token field numbers differ in every request message, so each request
//! type gets its own hand-built encoding; a field number off by one would decode as an
//! unknown field and leave the value at its default.

use bigfleet_libvirt_proto::v1alpha1 as pb;
use prost::Message;

/// Field key for (number, wire type): varint 0, length-delimited 2, 64-bit 1.
fn key(field: u32, wire_type: u32) -> Vec<u8> {
    varint(u64::from((field << 3) | wire_type))
}

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

fn string(field: u32, s: &[u8]) -> Vec<u8> {
    let mut out = key(field, 2);
    out.extend(varint(s.len() as u64));
    out.extend_from_slice(s);
    out
}

fn int(field: u32, v: i64) -> Vec<u8> {
    let mut out = key(field, 0);
    out.extend(varint(v as u64));
    out
}

fn double(field: u32, v: f64) -> Vec<u8> {
    let mut out = key(field, 1);
    out.extend_from_slice(&v.to_le_bytes());
    out
}

fn map_entry(field: u32, k: &str, v: &str) -> Vec<u8> {
    let mut entry = string(1, k.as_bytes());
    entry.extend(string(2, v.as_bytes()));
    string(field, &entry)
}

fn concat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn create_request_fields_are_1_3_4_5() {
    let bytes = concat(&[
        string(1, b"m-1"),
        string(3, b"shard-a"),
        int(4, 7),
        int(5, -3),
    ]);
    let decoded = pb::CreateRequest::decode(bytes.as_slice()).unwrap();
    assert_eq!(decoded.machine_id, "m-1");
    assert_eq!(decoded.shard_id, "shard-a");
    assert_eq!((decoded.shard_epoch, decoded.sequence_number), (7, -3));
    assert_eq!(
        decoded.encode_to_vec(),
        bytes,
        "re-encoding is byte for byte"
    );
}

#[test]
fn configure_request_fields_are_1_to_7() {
    let bytes = concat(&[
        string(1, b"m-2"),
        string(2, b"cluster-x"),
        string(3, &[0, 1, 2, 0xff]),
        string(4, b"shard-b"),
        int(5, 2),
        int(6, 9),
        map_entry(7, "bigfleet.lucy.sh/assigned-group", "rack\0gang-7"),
    ]);
    let decoded = pb::ConfigureRequest::decode(bytes.as_slice()).unwrap();
    assert_eq!(decoded.machine_id, "m-2");
    assert_eq!(decoded.cluster_id, "cluster-x");
    assert_eq!(decoded.bootstrap_blob, vec![0, 1, 2, 0xff]);
    assert_eq!(decoded.shard_id, "shard-b");
    assert_eq!((decoded.shard_epoch, decoded.sequence_number), (2, 9));
    assert_eq!(
        decoded.shard_metadata["bigfleet.lucy.sh/assigned-group"],
        "rack\0gang-7"
    );
}

#[test]
fn drain_request_fields_are_1_to_5() {
    let bytes = concat(&[
        string(1, b"m-3"),
        int(2, -5),
        string(3, b"s"),
        int(4, 4),
        int(5, 1),
    ]);
    let decoded = pb::DrainRequest::decode(bytes.as_slice()).unwrap();
    assert_eq!(decoded.machine_id, "m-3");
    assert_eq!(decoded.grace_period_seconds, -5);
    assert_eq!(decoded.shard_id, "s");
    assert_eq!((decoded.shard_epoch, decoded.sequence_number), (4, 1));
}

#[test]
fn delete_request_fields_are_1_to_4_and_field_1_is_machine_ref_compatible() {
    let bytes = concat(&[
        string(1, b"m-4"),
        string(2, b"s"),
        int(3, i64::MAX),
        int(4, i64::MAX),
    ]);
    let decoded = pb::DeleteRequest::decode(bytes.as_slice()).unwrap();
    assert_eq!(decoded.machine_id, "m-4");
    assert_eq!(decoded.shard_id, "s");
    assert_eq!(
        (decoded.shard_epoch, decoded.sequence_number),
        (i64::MAX, i64::MAX)
    );
    let old_style = pb::MachineRef::decode(string(1, b"m-4").as_slice()).unwrap();
    let as_delete = pb::DeleteRequest::decode(old_style.encode_to_vec().as_slice()).unwrap();
    assert_eq!(as_delete.machine_id, "m-4");
}

#[test]
fn list_filter_fields_are_1_4_5_and_2_3_are_reserved() {
    // states is a packed repeated enum: one length-delimited field 1.
    let packed = string(1, &[1, 3, 99]);
    let bytes = concat(&[packed, int(4, 2), string(5, b"42")]);
    let decoded = pb::ListFilter::decode(bytes.as_slice()).unwrap();
    assert_eq!(
        decoded.states,
        vec![1, 3, 99],
        "unknown enum numbers decode"
    );
    assert_eq!(decoded.max_results, 2);
    assert_eq!(decoded.since_revision, b"42");
    // Old zone/instance_type filters (2, 3) are skipped as unknown fields.
    let old = concat(&[string(2, b"zone-a"), string(3, b"kvm.small")]);
    assert_eq!(
        pb::ListFilter::decode(old.as_slice()).unwrap(),
        pb::ListFilter::default()
    );
}

#[test]
fn machine_and_ack_fields_match_the_contract_numbers() {
    let host = concat(&[string(1, b"libvirt"), string(2, b"rack1/bigfleet-abc")]);
    let resources = map_entry(1, "cpu", "2");
    let machine = concat(&[
        string(1, b"m-5"),
        int(2, 5),
        string(3, &host),
        string(4, b"kvm.small"),
        string(5, b"rack1"),
        int(6, 3),
        double(7, 0.25),
        double(8, 0.05),
        string(9, &resources),
        map_entry(10, "pool", "a"),
        string(12, b"boom"),
        string(13, &resources),
        string(14, b"cluster-y"),
        map_entry(15, "k", "v"),
    ]);
    let m = pb::Machine::decode(machine.as_slice()).unwrap();
    assert_eq!(m.id, "m-5");
    assert_eq!(m.state, pb::MachineState::Configured as i32);
    assert_eq!(m.host.as_ref().unwrap().r#ref, "rack1/bigfleet-abc");
    assert_eq!(
        (m.instance_type.as_str(), m.zone.as_str()),
        ("kvm.small", "rack1")
    );
    assert_eq!(m.capacity_type, pb::CapacityType::OnDemand as i32);
    assert_eq!((m.price_per_hour, m.interruption_probability), (0.25, 0.05));
    assert_eq!(m.resources.unwrap().resources["cpu"], "2");
    assert_eq!(m.labels["pool"], "a");
    assert_eq!(m.last_error, "boom");
    assert_eq!(m.allocatable.unwrap().resources["cpu"], "2");
    assert_eq!(m.cluster, "cluster-y");
    assert_eq!(m.shard_metadata["k"], "v");
    // Field 11 (removed transition_started_unix_nanos) is skipped.
    let with_11 = concat(&[string(1, b"m-6"), int(11, 123)]);
    assert_eq!(pb::Machine::decode(with_11.as_slice()).unwrap().id, "m-6");
    let ack = concat(&[string(1, b"op-7"), string(2, &machine)]);
    let ack = pb::TransitionAck::decode(ack.as_slice()).unwrap();
    assert_eq!(ack.operation_id, "op-7");
    assert_eq!(ack.machine.unwrap().id, "m-5");
    let list = concat(&[string(1, &string(1, b"m-7")), string(2, b"17")]);
    let list = pb::MachineList::decode(list.as_slice()).unwrap();
    assert_eq!(
        (list.machines[0].id.as_str(), list.revision.as_slice()),
        ("m-7", &b"17"[..])
    );
}

#[test]
fn enums_carry_the_contract_numbers() {
    use pb::{CapacityType as C, MachineState as S};
    let states = [
        (S::Unspecified, 0),
        (S::Speculative, 1),
        (S::Creating, 2),
        (S::Idle, 3),
        (S::Configuring, 4),
        (S::Configured, 5),
        (S::Draining, 6),
        (S::Deleting, 7),
        (S::Failed, 8),
    ];
    for (state, n) in states {
        assert_eq!(state as i32, n);
    }
    let capacities = [
        (C::Unspecified, 0),
        (C::BareMetal, 1),
        (C::Reserved, 2),
        (C::OnDemand, 3),
        (C::Spot, 4),
    ];
    for (capacity, n) in capacities {
        assert_eq!(capacity as i32, n);
    }
}

mod encoded_list {
    use bigfleet_libvirt_proto::v1alpha1 as pb;
    use bigfleet_libvirt_proto::wire::EncodedMachineList;
    use proptest::collection::{btree_map, vec};
    use proptest::prelude::*;
    use prost::Message;

    fn text() -> impl Strategy<Value = String> {
        "[a-z0-9./ -]{0,24}"
    }

    fn machine() -> impl Strategy<Value = pb::Machine> {
        let host = proptest::option::of(
            (text(), text()).prop_map(|(provider, r#ref)| pb::HostRef { provider, r#ref }),
        );
        let map = || btree_map(text(), text(), 0..4);
        (
            (text(), 0..8i32, host, text(), text(), 0..3i32),
            (
                0.0..1e6f64,
                0.0..1.0f64,
                map(),
                map(),
                text(),
                text(),
                map(),
            ),
        )
            .prop_map(
                |(
                    (id, state, host, instance_type, zone, capacity_type),
                    (price, interruption, labels, metadata, last_error, cluster, resources),
                )| pb::Machine {
                    id,
                    state,
                    host,
                    instance_type,
                    zone,
                    capacity_type,
                    price_per_hour: price,
                    interruption_probability: interruption,
                    resources: Some(pb::Resources {
                        resources: resources.into_iter().collect(),
                    }),
                    labels: labels.into_iter().collect(),
                    last_error,
                    allocatable: None,
                    cluster,
                    shard_metadata: metadata.into_iter().collect(),
                },
            )
    }

    proptest! {
        /// The spliced encoding is byte for byte prost's encoding of the same list, and
        /// decodes back to it.
        #[test]
        fn splicing_pre_encoded_machines_is_prosts_encoding(
            machines in vec(machine(), 0..12),
            revision in vec(any::<u8>(), 0..10),
        ) {
            let list = pb::MachineList { machines, revision };
            let encoded = EncodedMachineList::from_list(&list);
            let spliced = encoded.encode_to_vec();
            prop_assert_eq!(spliced.len(), encoded.encoded_len());
            prop_assert_eq!(&spliced, &list.encode_to_vec());
            // (Maps are HashMaps in the generated code: compare values, not re-encodings.)
            prop_assert_eq!(encoded.to_list().unwrap(), list);
        }

        /// Written in pieces of any target size, the encoding is the same bytes, and every
        /// piece but one that holds a single larger machine stays near its target.
        #[test]
        fn pieces_concatenate_to_the_whole_encoding(
            machines in vec(machine(), 0..12),
            revision in vec(any::<u8>(), 0..10),
            target in 1usize..400,
        ) {
            let list = pb::MachineList { machines, revision };
            let encoded = std::sync::Arc::new(EncodedMachineList::from_list(&list));
            let mut pieces = bigfleet_libvirt_proto::wire::Pieces::new(encoded.clone());
            let mut joined = Vec::new();
            while let Some(piece) = pieces.next_piece(target) {
                prop_assert!(!piece.is_empty());
                joined.extend_from_slice(&piece);
            }
            prop_assert_eq!(joined, encoded.encode_to_vec());
            prop_assert!(pieces.next_piece(target).is_none());
        }
    }
}
