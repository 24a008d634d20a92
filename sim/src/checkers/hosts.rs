//! Checks after every host effect: never more than one domain per machine, across all
//! hosts (a machine belongs to exactly one zone, and each zone is one host).

use std::collections::BTreeMap;

use super::Invariant;
use crate::world::World;

/// Checks the hosts right after an operation executed on one of them.
pub fn on_effect(world: &World) {
    world.stats().host_operations += 1;
    let duplicates: Vec<String> = {
        let hosts = world.hosts();
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for domains in &hosts.domains {
            for id in domains.keys() {
                *seen.entry(id.as_str()).or_default() += 1;
            }
        }
        seen.into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(id, n)| format!("machine {id} has {n} domains"))
            .collect()
    };
    for detail in duplicates {
        world.violation(Invariant::DomainsPerMachine, detail);
    }
}
