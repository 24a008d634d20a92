//! Contract test suites every adapter runs (one suite, many adapters), behind the `testkit`
//! feature: `store` for the `StateStore` port, `hypervisor` for the `Hypervisor` port.
//! Each suite checks the MUSTs its port documents through the port itself, and panics
//! naming the rule an implementation broke. `doubles` holds the test doubles of the ports
//! that the crate's own unit tests share.

#[cfg(test)]
pub(crate) mod doubles;
mod hypervisor;
mod store;

use bigfleet_libvirt_domain::{Machine, MachineId, MachineState, Snapshot, StringMap};

pub use hypervisor::{HypervisorCaps, Residue, failed_create_contract, hypervisor_contract};
pub use store::{
    DiskFaults, state_store_concurrency_contract, state_store_contract,
    state_store_failure_contract,
};

/// A Speculative machine for contract tests.
#[must_use]
pub fn speculative(id: &str) -> Machine {
    Machine {
        id: MachineId::new(id).expect("non-empty id"),
        state: MachineState::Speculative,
        host: None,
        instance_type: "kvm.small".to_owned(),
        zone: "zone-a".to_owned(),
        capacity_type: bigfleet_libvirt_domain::CapacityType::OnDemand,
        price_per_hour: 0.5,
        interruption_probability: 0.0,
        resources: StringMap::from([("cpu".to_owned(), "2".to_owned())]).into(),
        allocatable: StringMap::new().into(),
        labels: StringMap::new().into(),
        last_error: String::new(),
        cluster: String::new(),
        shard_metadata: StringMap::new(),
        encoded: Default::default(),
    }
}

/// Sorts a snapshot's lists so two snapshots compare by content.
pub fn normalise(snapshot: &mut Snapshot) {
    snapshot.machines.sort_by(|a, b| a.id.cmp(&b.id));
    snapshot.fences.sort();
    snapshot.operations.sort();
}
