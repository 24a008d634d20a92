//! Doctor's `dedicated cpus` and `huge pages` lines: enough, short of every slot, short of one
//! machine, CPUs of the flag the host does not have, and a topology that could not be read.

use std::collections::BTreeMap;

use super::tests::{good, status, want};
use super::*;
use crate::options::CpuSet;
use crate::render::placement::{Cell, Topology};
use bigfleet_libvirt_domain::catalog::Placement;

/// A host of 8 CPUs in two cells with a pool of 1,024 pages of 2 MiB, `free` of them free.
fn host(free: u64) -> HostFacts {
    let cell = |id, cpus: &str| Cell {
        id,
        cpus: CpuSet::parse(cpus).unwrap(),
    };
    let topology = Topology {
        cells: vec![cell(0, "0-3"), cell(1, "4-7")],
        pages: BTreeMap::from([(2048, 1024)]),
        devices: Vec::new(),
    };
    HostFacts {
        topology: Some(Probe::Found((topology, BTreeMap::from([(2048, free)])))),
        ..good()
    }
}

/// Two slots of a 2-vCPU, 1 GiB type on dedicated CPUs and huge pages (512 pages each),
/// with `--dedicated-cpus` `cpus`.
fn placed(cpus: &str) -> Expectations {
    let mut want = want();
    want.capacity.dedicated_cpus = CpuSet::parse(cpus).unwrap();
    let slots = &mut want.slots[0].1[0];
    slots.memory_mib = 1024;
    slots.placement = Placement {
        hugepage_kib: Some(2048),
        dedicated_cpus: true,
    };
    want
}

#[test]
fn enough_cpus_and_pages_pass() {
    let report = judge(&placed("4-7"), &[host(1024)]);
    let (verdict, detail, _) = status(&report, "a", "dedicated cpus");
    assert_eq!(verdict, Status::Ok, "{detail}");
    assert_eq!(
        detail,
        "4 CPUs (4-7) for machines needing 4 in all (the largest 2)"
    );
    let (verdict, detail, _) = status(&report, "a", "huge pages");
    assert_eq!(verdict, Status::Ok, "{detail}");
    assert_eq!(
        detail,
        "2048 KiB pages: a pool of 1024, 1024 free; one machine needs 512, every slot 1024"
    );
}

#[test]
fn short_of_every_slot_warns_and_short_of_one_machine_blocks() {
    let report = judge(&placed("6-9"), &[host(600)]);
    let (verdict, detail, fix) = status(&report, "a", "dedicated cpus");
    assert_eq!(verdict, Status::Warn);
    assert!(
        detail.contains("CPUs 8-9 of --dedicated-cpus are not on this host"),
        "{detail}"
    );
    assert!(fix.contains("isolcpus="), "{fix}");
    assert_eq!(status(&report, "a", "huge pages").0, Status::Warn);
    let report = judge(&placed("7"), &[host(100)]);
    let (verdict, detail, _) = status(&report, "a", "dedicated cpus");
    assert_eq!(verdict, Status::Block);
    assert!(
        detail.contains("a machine needs 2: no dedicated machine can be placed here"),
        "{detail}"
    );
    let (verdict, _, fix) = status(&report, "a", "huge pages");
    assert_eq!(verdict, Status::Block);
    assert!(fix.contains("hugepages-2048kB/nr_hugepages"), "{fix}");
}

#[test]
fn no_placement_no_lines_and_an_unreadable_topology_blocks() {
    let report = judge(&want(), &[good()]);
    assert!(
        report
            .checks
            .iter()
            .all(|c| c.check != "dedicated cpus" && c.check != "huge pages")
    );
    let failed = HostFacts {
        topology: Some(Probe::Failed("no capabilities".to_owned())),
        ..good()
    };
    let (verdict, detail, _) = status(&judge(&placed("4-7"), &[failed]), "a", "placement");
    assert_eq!(verdict, Status::Block);
    assert!(detail.ends_with("no capabilities"), "{detail}");
}
