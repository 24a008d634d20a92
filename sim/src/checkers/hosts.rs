//! Checks after every host effect, read from the history (the hypervisor fake records each
//! operation there with how many hosts then hold a domain for its machine): never more than
//! one domain per machine, across all hosts (a machine belongs to exactly one zone, and each
//! zone is one host).

use std::time::Duration;

use bigfleet_libvirt_domain::MachineId;

use super::Invariant;
use crate::world::World;

/// Checks one operation's effect at `at`: after it, `domains` hosts hold a domain for
/// `machine`.
pub fn on_effect(world: &World, at: Duration, machine: &MachineId, domains: usize) {
    if domains > 1 {
        let detail = format!("machine {machine} has {domains} domains");
        world.violation_at(Invariant::DomainsPerMachine, at, detail);
    }
}
