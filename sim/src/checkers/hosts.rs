//! Checks after every host effect, read from the history (the hypervisor fake records each
//! operation there with how many hosts then hold a domain for its machine): never more than
//! one domain per machine, across all hosts (a machine belongs to exactly one zone, and each
//! zone is one host). And after every request that arrives at a host (recorded with the
//! requests of its provider connection then in flight there): the provider never has more
//! in flight on a host than its own budget (`--host-budget`), nor than the host's modelled
//! libvirtd `max_client_requests`.

use std::time::Duration;

use bigfleet_libvirt_domain::MachineId;

use super::Checkers;
use crate::verdict::Invariant;

/// Checks one operation's effect at `at`: after it, `domains` hosts hold a domain for
/// `machine`.
pub fn on_effect(checkers: &Checkers, at: Duration, machine: &MachineId, domains: usize) {
    if domains > 1 {
        let detail = format!("machine {machine} has {domains} domains");
        checkers.violation_at(Invariant::DomainsPerMachine, at, detail);
    }
}

/// Checks one arrival at `at`: host `host` then had `in_flight` requests of the provider
/// connection `connection` not yet finished.
pub fn on_load(checkers: &Checkers, at: Duration, host: usize, connection: u64, in_flight: usize) {
    let libvirtd = &checkers.world().plan.libvirtd;
    let budget = libvirtd.budget.host;
    let limit = libvirtd.max_client_requests[host];
    if in_flight > budget || in_flight > limit {
        let detail = format!(
            "connection {connection} had {in_flight} requests in flight on zone-{host} \
             (host budget {budget}, max_client_requests {limit})"
        );
        checkers.violation_at(Invariant::HostBudget, at, detail);
    }
}
