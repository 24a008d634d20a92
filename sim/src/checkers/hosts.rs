//! Checks after every host effect, read from the history (the hypervisor fake records each
//! operation there with how many hosts then hold a domain for its machine): never more than
//! one domain per machine, across all hosts (a machine belongs to exactly one zone, and each
//! zone is one host). And after every request that arrives at a host (recorded with the
//! requests of its provider connection then in flight there): no connection of the
//! provider ever has more in flight than the host's modelled libvirtd
//! `max_client_requests`, and the provider never has more in flight on a host, all its
//! connections together, than its own budget (`--host-budget`) nor than libvirtd's
//! `max_workers`.

use std::time::Duration;

use bigfleet_libvirt_domain::MachineId;

use super::Checkers;
use crate::faults::LIBVIRTD_DEFAULT_MAX_WORKERS;
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
/// connection `connection` not yet finished, and `host_in_flight` of all that provider
/// process's connections to it.
pub fn on_load(
    checkers: &Checkers,
    at: Duration,
    host: usize,
    connection: u64,
    (in_flight, host_in_flight): (usize, usize),
) {
    let libvirtd = &checkers.world().plan.libvirtd;
    let budget = libvirtd.budget.host;
    let limit = libvirtd.max_client_requests[host];
    if in_flight > limit {
        let detail = format!(
            "connection {connection} had {in_flight} requests in flight on zone-{host} \
             (max_client_requests {limit}, {} connections per host)",
            libvirtd.connections
        );
        checkers.violation_at(Invariant::HostBudget, at, detail);
    }
    if host_in_flight > budget || host_in_flight > LIBVIRTD_DEFAULT_MAX_WORKERS {
        let detail = format!(
            "the provider had {host_in_flight} requests in flight on zone-{host} (host budget \
             {budget}, max_workers {LIBVIRTD_DEFAULT_MAX_WORKERS})"
        );
        checkers.violation_at(Invariant::HostBudget, at, detail);
    }
}
