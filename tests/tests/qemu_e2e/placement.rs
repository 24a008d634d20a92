//! A guest whose memory is the host's huge pages and whose vCPU has a host CPU of its own
//! (docs/placement.md): the tier reserves 2 MiB pages on this host and mounts hugetlbfs in
//! each zone (scripts/qemu-tier/zones.sh). Checked from the host's side: the domain's
//! definition, QEMU's own mappings (`smaps`: the guest's RAM is a hugetlbfs mapping of 2 MiB
//! pages) and its threads' CPU affinity; and after Delete, every page is free again.

use std::path::Path;
use std::time::Instant;

use bigfleet_libvirt_proto::v1alpha1::MachineState as S;

use super::{BOOT, Libvirt, Tier, domain_name};
use crate::harness::*;

/// The guest's memory, in MiB (a whole number of 2 MiB pages).
const MEMORY_MIB: u64 = 384;

/// Free 2 MiB pages on this host.
fn free_pages() -> u64 {
    let text = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .expect("read the host's free huge pages");
    text.trim().parse().expect("a page count")
}

/// The largest mapping of QEMU process `pid` made of 2 MiB pages, in KiB.
fn huge_mapping_kib(pid: u32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("QEMU's smaps");
    let (mut best, mut size) = (0u64, 0u64);
    let field = |line: &str, name: &str| -> Option<u64> {
        let rest = line.strip_prefix(name)?;
        rest.trim().strip_suffix("kB")?.trim().parse().ok()
    };
    for line in smaps.lines() {
        if let Some(kib) = field(line, "Size:") {
            size = kib;
        } else if field(line, "KernelPageSize:") == Some(2048) {
            best = best.max(size);
        }
    }
    best
}

/// Each thread of `pid` by name, with the host CPUs it may run on.
fn thread_affinity(pid: u32) -> Vec<(String, String)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("QEMU's threads");
    let mut found = Vec::new();
    for task in tasks.flatten() {
        let dir = task.path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let allowed = (status.lines())
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap_or("")
            .trim()
            .to_owned();
        found.push((name.trim().to_owned(), allowed));
    }
    found
}

/// The PID of domain `name`'s QEMU, from the pid file libvirt keeps under the zone's root.
fn qemu_pid(root: &Path, name: &str) -> u32 {
    let file = root.join(format!("run/libvirt/qemu/{name}.pid"));
    let text = std::fs::read_to_string(&file).expect("QEMU's pid file");
    text.trim().parse().expect("a pid")
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn a_guest_on_huge_pages_with_a_dedicated_cpu() {
    let _wall = crate::qemu_image::WallTime::start("qemu_e2e::placement");
    let tier = Tier::from_env();
    let dir = tempfile::tempdir().unwrap();
    let mut args = tier.flags(dir.path(), "e2eplace", "qemu");
    std::fs::write(
        dir.path().join("instance-types.json"),
        format!(
            r#"{{ "e2e.tiny": {{ "vcpu": 1, "memory_mib": {MEMORY_MIB}, "hugepages": "2Mi",
                 "dedicated_cpus": true }} }}"#
        ),
    )
    .unwrap();
    args.push("--dedicated-cpus=1".to_owned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start(&args);
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let before = free_pages();
    let pages = MEMORY_MIB / 2;
    assert!(
        before >= pages,
        "the tier reserved too few huge pages: {before} free, the guest needs {pages}"
    );

    let start = Instant::now();
    let accepted = create(&mut c, &id, None).await;
    let (idle, took) = settle(&mut c, &id, accepted, S::Idle, BOOT, start).await;
    println!("placement: Create → Idle {took:.2?}");
    let name = domain_name(&idle);
    let virt = Libvirt::open(Tier::from_env());
    let domain = virt.domain(&name).expect("Create defined the domain");
    let xml = domain.xml_desc(0).expect("the domain's definition");
    assert!(xml.contains("<vcpupin vcpu='0' cpuset='1'/>"), "{xml}");
    assert!(xml.contains("<emulatorpin cpuset='1'/>"), "{xml}");
    assert!(xml.contains("<page size='2048' unit='KiB'"), "{xml}");

    let pid = qemu_pid(&tier.root, &name);
    let mapped = huge_mapping_kib(pid);
    assert!(
        mapped >= MEMORY_MIB * 1024,
        "QEMU's largest 2 MiB-page mapping is {mapped} KiB, not the guest's {MEMORY_MIB} MiB"
    );
    assert!(
        free_pages() <= before - pages,
        "the guest holds its {pages} pages: {} of {before} still free",
        free_pages()
    );
    let threads = thread_affinity(pid);
    let vcpu = (threads.iter())
        .find(|(name, _)| name.starts_with("CPU 0/"))
        .unwrap_or_else(|| panic!("no vCPU thread among {threads:?}"));
    assert_eq!(vcpu.1, "1", "the vCPU runs on host CPU 1 only: {threads:?}");
    let main = threads
        .iter()
        .find(|(n, _)| n.starts_with("qemu"))
        .map(|(_, a)| a.as_str());
    assert_eq!(main, Some("1"), "the emulator threads too: {threads:?}");

    let accepted = delete(&mut c, &id, None).await;
    settle(&mut c, &id, accepted, S::Speculative, BOOT, Instant::now()).await;
    assert!(virt.domain(&name).is_none(), "{name} is undefined");
    assert_eq!(free_pages(), before, "every page is free again");
}
