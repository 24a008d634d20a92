//! The describe mapping without libvirt: slots against scans, drift, and orphans.

use std::collections::{BTreeMap, BTreeSet};

use bigfleet_libvirt_domain::MachineState;

use super::*;
use crate::render::placement::FromDefinition;
use crate::tests::slots;

const P: &str = "libvirt";

/// No slot's record is Failed.
const NONE_DEAD: BTreeSet<String> = BTreeSet::new();

fn tagged(machine_id: &str, running: bool) -> ScannedDomain {
    ScannedDomain {
        running,
        tag: Some(Tag::new(P, machine_id)),
        shape: Shape {
            vcpu: 2,
            memory_mib: 4096,
            disk_bytes: 0,
        },
        held: None,
    }
}

fn view(scan: &Scan, free: Option<Shape>) -> HostView<'_> {
    HostView {
        scan,
        image_bytes: Some(2 << 30),
        free,
        room: None,
    }
}

#[test]
fn slots_map_to_idle_speculative_or_withheld() {
    let slots = slots(P, "a", "kvm.small", 4);
    let id = |i: usize| slots[i].id.to_string();
    let name = |i: usize| domain_name(P, &id(i));
    let mut scan = Scan::default();
    scan.domains.insert(name(0), tagged(&id(0), true));
    scan.domains.insert(name(1), tagged(&id(1), false));
    // Slot 2's name is squatted by a domain tagged for another provider.
    let mut foreign = tagged(&id(2), true);
    foreign.tag = Some(Tag::new("other", &id(2)));
    scan.domains.insert(name(2), foreign);
    // Room for one more kvm.small only.
    let free = Some(Shape {
        vcpu: 2,
        memory_mib: 4096,
        disk_bytes: u64::MAX,
    });
    let views = BTreeMap::from([("a".to_owned(), view(&scan, free))]);
    let catalog = InstanceCatalog::builtin();
    let machines = inventory(P, &slots, &catalog, &views, &NONE_DEAD);
    let states: Vec<(String, MachineState, bool)> = machines
        .iter()
        .map(|m| (m.id.to_string(), m.state, m.host.is_some()))
        .collect();
    assert_eq!(
        states,
        [
            (id(0), MachineState::Idle, true),
            (id(1), MachineState::Speculative, false),
            (id(3), MachineState::Speculative, false),
        ]
    );
    assert_eq!(
        machines[0].host.as_ref().unwrap().reference,
        format!("a/{}", name(0))
    );
}

#[test]
fn capacity_withholds_slots_in_offering_order_and_unscanned_zones_vanish() {
    let mut all = slots(P, "a", "kvm.small", 3);
    all.extend(slots(P, "b", "kvm.small", 2));
    let scan = Scan::default();
    let five_vcpus = Some(Shape {
        vcpu: 5,
        memory_mib: 1 << 20,
        disk_bytes: u64::MAX,
    });
    let views = BTreeMap::from([("a".to_owned(), view(&scan, five_vcpus))]);
    let machines = inventory(P, &all, &InstanceCatalog::builtin(), &views, &NONE_DEAD);
    let ids: Vec<&str> = machines.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, [all[0].id.as_str(), all[1].id.as_str()]);
}

/// A Failed slot is never created again: it is left out and holds no room, so the room it
/// took in offering order goes to the next slot (before, one failed Create of a type whose
/// host fits one machine withheld every other slot of it for good).
#[test]
fn a_dead_slot_holds_no_room() {
    let all = slots(P, "a", "kvm.small", 3);
    let scan = Scan::default();
    let one = Some(Shape {
        vcpu: 2,
        memory_mib: 4096,
        disk_bytes: u64::MAX,
    });
    let views = BTreeMap::from([("a".to_owned(), view(&scan, one))]);
    let catalog = InstanceCatalog::builtin();
    let ids = |dead: &[usize]| -> Vec<String> {
        let dead: BTreeSet<String> = dead.iter().map(|&i| all[i].id.to_string()).collect();
        let machines = inventory(P, &all, &catalog, &views, &dead);
        machines.iter().map(|m| m.id.to_string()).collect()
    };
    assert_eq!(ids(&[]), [all[0].id.to_string()]);
    assert_eq!(ids(&[0]), [all[1].id.to_string()]);
    assert_eq!(ids(&[0, 1]), [all[2].id.to_string()]);
    assert!(ids(&[0, 1, 2]).is_empty());
}

#[test]
fn drift_reports_vanished_and_stopped_known_machines() {
    let slots = slots(P, "a", "kvm.small", 3);
    let id = |i: usize| slots[i].id.to_string();
    let mut scan = Scan::default();
    scan.domains
        .insert(domain_name(P, &id(0)), tagged(&id(0), true));
    scan.domains
        .insert(domain_name(P, &id(1)), tagged(&id(1), false));
    let known = BTreeMap::from([
        (id(0), "a".to_owned()),
        (id(1), "a".to_owned()),
        (id(2), "a".to_owned()),
        ("elsewhere".to_owned(), "b".to_owned()),
    ]);
    let views = BTreeMap::from([("a".to_owned(), view(&scan, None))]);
    let found = drift(P, &known, &views, |_| false);
    assert_eq!(found.len(), 1, "unscanned zone b is not judged");
    assert_eq!(found["a"].stopped, [id(1)]);
    assert_eq!(found["a"].vanished, [id(2)]);
    // A first-boot machine's stopped, unbound domain rests until its Configure; once a
    // Configure bound it to a cluster, stopped is drift again.
    let found = drift(P, &known, &views, |machine| machine == id(1));
    assert!(found["a"].stopped.is_empty(), "{found:?}");
    let mut bound = tagged(&id(1), false);
    bound.tag.as_mut().unwrap().cluster_id = "c1".to_owned();
    scan.domains.insert(domain_name(P, &id(1)), bound);
    let views = BTreeMap::from([("a".to_owned(), view(&scan, None))]);
    let found = drift(P, &known, &views, |machine| machine == id(1));
    assert_eq!(found["a"].stopped, [id(1)]);
}

#[test]
fn orphans_are_ours_unexplained_and_not_in_flight() {
    let slots = slots(P, "a", "kvm.small", 2);
    let slot_ids: BTreeSet<String> = slots.iter().map(|m| m.id.to_string()).collect();
    let stray = "libvirt/OnDemand/kvm.small/a/999";
    let known_extra = "libvirt/OnDemand/kvm.large/a/000";
    let mut scan = Scan::default();
    let slot0 = slots[0].id.to_string();
    scan.domains
        .insert(domain_name(P, &slot0), tagged(&slot0, true));
    scan.domains
        .insert(domain_name(P, stray), tagged(stray, true));
    scan.domains
        .insert(domain_name(P, known_extra), tagged(known_extra, true));
    let mut theirs = tagged("x", true);
    theirs.tag = Some(Tag::new("other", "x"));
    scan.domains.insert("bigfleet-theirs".to_owned(), theirs);
    let slot1 = domain_name(P, slots[1].id.as_str());
    scan.volumes = vec![
        "base.qcow2".to_owned(),
        volumes::overlay_name(&domain_name(P, &slot0)),
        volumes::overlay_name(&slot1),
        volumes::seed_name(&slot1),
        crate::render::spec::data_name(&slot1, "scratch"),
        volumes::overlay_name("bigfleet-theirs-gone"),
        crate::render::spec::data_name("bigfleet-theirs-gone", "scratch"),
    ];
    let known = BTreeMap::from([(known_extra.to_owned(), "a".to_owned())]);
    let in_flight = |name: &str| name == slot1;
    let found = orphans(P, "a", &scan, &slot_ids, &known, &|_| false);
    assert_eq!(
        found,
        [
            Orphan::Domain {
                zone: "a".into(),
                name: domain_name(P, stray),
                machine_id: stray.into(),
            },
            Orphan::Volume {
                zone: "a".into(),
                name: volumes::overlay_name(&slot1),
            },
            Orphan::Volume {
                zone: "a".into(),
                name: volumes::seed_name(&slot1),
            },
            Orphan::Volume {
                zone: "a".into(),
                name: crate::render::spec::data_name(&slot1, "scratch"),
            },
        ]
    );
    let found = orphans(P, "a", &scan, &slot_ids, &known, &in_flight);
    assert_eq!(found.len(), 1, "a Create in flight owns its volumes");
}

#[test]
fn committed_counts_active_and_our_stopped_domains() {
    let mut scan = Scan::default();
    scan.domains.insert("ours-off".into(), tagged("m", false));
    let mut foreign_off = tagged("x", false);
    foreign_off.tag = None;
    scan.domains.insert("foreign-off".into(), foreign_off);
    let mut foreign_on = tagged("y", true);
    foreign_on.tag = None;
    scan.domains.insert("foreign-on".into(), foreign_on);
    let none = CpuSet::default();
    let committed = scan.committed(P, &none, &|tag| if tag.machine_id == "m" { 7 } else { 99 });
    let names: Vec<&str> = committed.keys().map(String::as_str).collect();
    assert_eq!(names, ["foreign-on", "ours-off"]);
    assert_eq!(
        committed["ours-off"].disk_bytes, 7,
        "ours: its type's disks"
    );
    assert_eq!(
        committed["foreign-on"].disk_bytes, 0,
        "theirs: in the foreign volumes"
    );
}

#[test]
fn storage_withholds_slots_whose_disks_do_not_fit_and_roots_smaller_than_the_image() {
    let all = slots(P, "a", "kvm.small", 3);
    let scan = Scan::default();
    // Room for two kvm.small roots (40 GiB each) and not a third.
    let room = Some(Shape {
        vcpu: 100,
        memory_mib: 1 << 20,
        disk_bytes: 100 << 30,
    });
    let views = BTreeMap::from([("a".to_owned(), view(&scan, room))]);
    let machines = inventory(P, &all, &InstanceCatalog::builtin(), &views, &NONE_DEAD);
    assert_eq!(machines.len(), 2);
    // A golden image larger than the type's 40 GiB root: no kvm.small can be made.
    let mut big_image = view(&scan, room);
    big_image.image_bytes = Some(41 << 30);
    let views = BTreeMap::from([("a".to_owned(), big_image)]);
    assert!(inventory(P, &all, &InstanceCatalog::builtin(), &views, &NONE_DEAD).is_empty());
}

#[test]
fn the_pool_room_counts_every_volume_not_of_ours() {
    let mut scan = Scan::default();
    assert_eq!(scan.pool_room(), None, "not read");
    scan.pool = Some((100 << 30, 20 << 30));
    scan.foreign_volumes = BTreeMap::from([
        ("base.qcow2".to_owned(), 10 << 30),
        ("x".to_owned(), 5 << 30),
    ]);
    let room = scan.pool_room().unwrap();
    assert_eq!(
        (room.capacity, room.allocation, room.foreign),
        (100 << 30, 20 << 30, 15 << 30)
    );
}

#[test]
fn what_a_domain_holds_alone_leaves_the_shared_budget_and_becomes_a_claim() {
    let dedicated = CpuSet::parse("4-7").unwrap();
    let held = |xml: &str| Some(Held::parse(xml));
    let mut scan = Scan::default();
    let mut pinned = tagged("m", false);
    pinned.held = held(
        "<domain><memory unit='MiB'>4096</memory><cputune><vcpupin vcpu='0' cpuset='4'/>\
         <vcpupin vcpu='1' cpuset='5'/><emulatorpin cpuset='4-5'/></cputune>\
         <memoryBacking><hugepages><page size='2048'/></hugepages></memoryBacking></domain>",
    );
    scan.domains.insert("pinned".into(), pinned);
    // Someone else's running domain floats over CPUs 0-5: its shape stays shared, and the
    // dedicated CPUs it touches (4-5) count as held.
    let mut floating = tagged("y", true);
    floating.tag = None;
    floating.held = held("<domain><vcpu cpuset='0-5'>2</vcpu></domain>");
    scan.domains.insert("floating".into(), floating);
    let topology = Topology {
        cells: Vec::new(),
        pages: BTreeMap::from([(2048, 4096)]),
        devices: Vec::new(),
    };
    scan.topology = Some((topology, BTreeMap::from([(2048, 1000)])));
    let committed = scan.committed(P, &dedicated, &|_| 0);
    assert_eq!(
        (committed["pinned"].vcpu, committed["pinned"].memory_mib),
        (0, 0)
    );
    assert_eq!(
        (committed["floating"].vcpu, committed["floating"].memory_mib),
        (2, 4096)
    );
    let (claims, running) = scan.claims(P, &dedicated).unwrap();
    assert_eq!(claims["pinned"].cpus.to_string(), "4-5");
    assert_eq!(claims["pinned"].pages, Some((2048, 2048)));
    assert_eq!(claims["floating"].cpus.to_string(), "4-5");
    assert_eq!(
        running,
        BTreeMap::new(),
        "the pinned domain is stopped: it uses no pages yet"
    );
    assert_eq!(Scan::default().claims(P, &dedicated), None);
}
