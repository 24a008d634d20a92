//! Doctor's `dedicated cpus` and `huge pages` lines (one per page size) (docs/placement.md): whether a host has
//! the CPUs of `--dedicated-cpus` and the huge page pools the served types ask for, from the
//! same capabilities and free page counts the provider's scans read.

use std::collections::BTreeMap;

use super::facts::{Expectations, HostFacts, Probe, Slots};
use super::report::{Check, Status, check};
use crate::options::CpuSet;
use crate::render::placement::Topology;

/// The placement lines of one host; none when nothing holds part of a host alone.
pub(super) fn placement(want: &Expectations, host: &HostFacts, slots: &[Slots]) -> Vec<Check> {
    let zone = host.zone.as_str();
    let Some(probe) = &host.topology else {
        return Vec::new();
    };
    let (topology, free) = match probe {
        Probe::Found(found) => found,
        Probe::Missing | Probe::Unsupported(_) | Probe::Failed(_) => {
            let why = match probe {
                Probe::Unsupported(e) | Probe::Failed(e) => e.clone(),
                _ => "no answer".to_owned(),
            };
            return vec![check(
                zone,
                "placement",
                Status::Block,
                format!("cannot read the host's CPU and huge page topology: {why}"),
                "check `virsh capabilities` and `virsh freepages --all` on the host",
            )];
        }
    };
    let mut out = Vec::new();
    let dedicated = &want.capacity.dedicated_cpus;
    if !dedicated.is_empty() || slots.iter().any(|s| s.placement.dedicated_cpus) {
        out.push(dedicated_cpus(zone, dedicated, topology, slots));
    }
    let mut sizes: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for s in slots {
        if let (Some(size), Some(pages)) =
            (s.placement.hugepage_kib, s.placement.pages(s.memory_mib))
        {
            let (one, all) = sizes.entry(size).or_default();
            *one = (*one).max(pages);
            *all = all.saturating_add(pages.saturating_mul(s.count as u64));
        }
    }
    for (size, (one, all)) in sizes {
        let pool = topology.pages.get(&size).copied().unwrap_or(0);
        let free = free.get(&size).copied().unwrap_or(pool);
        out.push(huge_pages(zone, size, pool, free, one, all));
    }
    out
}

fn dedicated_cpus(zone: &str, dedicated: &CpuSet, topology: &Topology, slots: &[Slots]) -> Check {
    let host = topology.cpus();
    let have = dedicated.and(&host);
    let absent = dedicated.minus(&host);
    let typed = slots.iter().filter(|s| s.placement.dedicated_cpus);
    let one = typed.clone().map(|s| s.vcpu).max().unwrap_or(0);
    let all: u64 = typed.map(|s| s.vcpu.saturating_mul(s.count as u64)).sum();
    let count = have.len() as u64;
    let fix = "isolate more of the host's CPUs from its own work (isolcpus=, CPUAffinity=) and \
               list them in --dedicated-cpus";
    if count < one {
        let detail = format!(
            "--dedicated-cpus gives {count} of this host's CPUs ({}), and a machine needs {one}: \
             no dedicated machine can be placed here",
            if have.is_empty() {
                "none".to_owned()
            } else {
                have.to_string()
            }
        );
        return check(zone, "dedicated cpus", Status::Block, detail, fix);
    }
    let mut detail =
        format!("{count} CPUs ({have}) for machines needing {all} in all (the largest {one})");
    if !absent.is_empty() {
        detail.push_str(&format!(
            "; CPUs {absent} of --dedicated-cpus are not on this host"
        ));
    }
    let status = if count < all || !absent.is_empty() {
        Status::Warn
    } else {
        Status::Ok
    };
    let fix = if status == Status::Ok { "" } else { fix };
    check(zone, "dedicated cpus", status, detail, fix)
}

fn huge_pages(zone: &str, size: u64, pool: u64, free: u64, one: u64, all: u64) -> Check {
    let fix = format!(
        "reserve {size} KiB pages on the host (sysctl vm.nr_hugepages, or \
         /sys/kernel/mm/hugepages/hugepages-{size}kB/nr_hugepages; 1 GiB pages at boot with \
         hugepagesz=1G hugepages=N), mount hugetlbfs for that size and restart libvirtd"
    );
    let detail = format!(
        "{size} KiB pages: a pool of {pool}, {free} free; one machine needs {one}, every slot \
         {all}"
    );
    let status = if free < one {
        Status::Block
    } else if free < all {
        Status::Warn
    } else {
        Status::Ok
    };
    let fix = if status == Status::Ok {
        String::new()
    } else {
        fix
    };
    check(zone, "huge pages", status, detail, &fix)
}
