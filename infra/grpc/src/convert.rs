//! Conversions between wire messages and domain values, one function per request type.
//! Past this module nothing handles raw proto types.

// prost represents proto maps as HashMap; this edge converts them to and from BTreeMap.
#![allow(clippy::disallowed_types)]

use std::hash::BuildHasher;

use bigfleet_libvirt_domain::{
    FenceToken, HostRef, ListPage, ListQuery, Machine, MutateRequest, Mutation, StringMap,
};
use bigfleet_libvirt_ports::BootstrapBlob;
use bigfleet_libvirt_proto::v1alpha1 as pb;
use bigfleet_libvirt_proto::wire::EncodedMachineList;

/// A Create request as a domain mutation.
#[must_use]
pub fn create(request: pb::CreateRequest) -> Mutation {
    Mutation {
        machine_id: request.machine_id,
        token: token(
            request.shard_id,
            request.shard_epoch,
            request.sequence_number,
        ),
        request: MutateRequest::Create,
    }
}

/// A Configure request as a domain mutation plus the blob, which never enters the core.
#[must_use]
pub fn configure(request: pb::ConfigureRequest) -> (Mutation, BootstrapBlob) {
    let mutation = Mutation {
        machine_id: request.machine_id,
        token: token(
            request.shard_id,
            request.shard_epoch,
            request.sequence_number,
        ),
        request: MutateRequest::Configure {
            cluster: request.cluster_id,
            shard_metadata: to_map(request.shard_metadata),
        },
    };
    (mutation, BootstrapBlob::new(request.bootstrap_blob))
}

/// A Drain request as a domain mutation.
#[must_use]
pub fn drain(request: pb::DrainRequest) -> Mutation {
    Mutation {
        machine_id: request.machine_id,
        token: token(
            request.shard_id,
            request.shard_epoch,
            request.sequence_number,
        ),
        request: MutateRequest::Drain {
            grace_period_seconds: request.grace_period_seconds,
        },
    }
}

/// A Delete request as a domain mutation.
#[must_use]
pub fn delete(request: pb::DeleteRequest) -> Mutation {
    Mutation {
        machine_id: request.machine_id,
        token: token(
            request.shard_id,
            request.shard_epoch,
            request.sequence_number,
        ),
        request: MutateRequest::Delete,
    }
}

/// A List filter as a domain query (the rules are the domain's, [`ListQuery::from_filter`]).
#[must_use]
pub fn list_query(filter: &pb::ListFilter) -> ListQuery {
    ListQuery::from_filter(&filter.states, filter.max_results, &filter.since_revision)
}

fn token(shard_id: String, epoch: i64, sequence: i64) -> FenceToken {
    FenceToken {
        shard_id,
        epoch,
        sequence,
    }
}

fn to_map<S: BuildHasher>(map: std::collections::HashMap<String, String, S>) -> StringMap {
    map.into_iter().collect()
}

fn resources(map: &StringMap) -> Option<pb::Resources> {
    (!map.is_empty()).then(|| pb::Resources {
        resources: to_proto_map(map),
    })
}

fn to_proto_map(map: &StringMap) -> std::collections::HashMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// A domain machine on the wire. `host`, `resources` and `allocatable` are emitted only
/// when they carry something, as the reference does.
#[must_use]
pub fn machine(machine: &Machine) -> pb::Machine {
    pb::Machine {
        id: machine.id.to_string(),
        state: machine.state as i32,
        host: machine.host.as_ref().filter(|h| h.is_set()).map(host),
        instance_type: machine.instance_type.clone(),
        zone: machine.zone.clone(),
        capacity_type: machine.capacity_type as i32,
        price_per_hour: machine.price_per_hour,
        interruption_probability: machine.interruption_probability,
        resources: resources(&machine.resources),
        labels: to_proto_map(&machine.labels),
        last_error: machine.last_error.clone(),
        allocatable: resources(&machine.allocatable),
        cluster: machine.cluster.clone(),
        shard_metadata: to_proto_map(&machine.shard_metadata),
    }
}

fn host(host: &HostRef) -> pb::HostRef {
    pb::HostRef {
        provider: host.provider.clone(),
        r#ref: host.reference.clone(),
    }
}

/// A List page as the wire response. Each version of a record is converted and encoded
/// once, on the first List that returns it; later Lists reuse the bytes (the record's memo
/// is emptied whenever it changes).
#[must_use]
pub fn encoded_list(page: &ListPage) -> EncodedMachineList {
    EncodedMachineList {
        machines: page
            .machines
            .iter()
            .map(|m| {
                m.encoded
                    .get_or_init(|| EncodedMachineList::encode_machine(&machine(m)))
            })
            .collect(),
        revision: revision(page.revision),
    }
}

/// A revision counter as the opaque cursor bytes (ASCII decimal).
#[must_use]
pub fn revision(revision: i64) -> Vec<u8> {
    revision.to_string().into_bytes()
}
