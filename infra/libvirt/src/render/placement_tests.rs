//! The placement documents: a host's topology read from its capabilities, what a domain's
//! definition binds, and the elements a placed domain gets (read back as written).

use std::collections::BTreeMap;

use bigfleet_libvirt_ports::claims::Pinning;

use super::*;

/// Two cells of four CPUs, 2 MiB pools of 512 and 256 pages, a 1 GiB pool of 2 in cell 1.
const CAPABILITIES: &str = "<capabilities><host>
  <cpu><arch>x86_64</arch><pages unit='KiB' size='4'/><pages unit='KiB' size='2048'/></cpu>
  <topology><cells num='2'>
    <cell id='0'>
      <memory unit='KiB'>8388608</memory>
      <pages unit='KiB' size='4'>1048576</pages>
      <pages unit='KiB' size='2048'>512</pages>
      <distances><sibling id='0' value='10'/><sibling id='1' value='20'/></distances>
      <cpus num='4'>
        <cpu id='0' socket_id='0' core_id='0' siblings='0'/><cpu id='1' socket_id='0' core_id='1' siblings='1'/>
        <cpu id='2' socket_id='0' core_id='2' siblings='2'/><cpu id='3' socket_id='0' core_id='3' siblings='3'/>
      </cpus>
    </cell>
    <cell id='1'>
      <pages unit='KiB' size='2048'>256</pages>
      <pages unit='GiB' size='1'>2</pages>
      <cpus num='4'><cpu id='4'/><cpu id='5'/><cpu id='6'/><cpu id='7'/></cpus>
    </cell>
  </cells></topology>
</host></capabilities>";

#[test]
fn topology_reads_cells_cpus_and_huge_page_pools() {
    let topology = Topology::parse(CAPABILITIES).unwrap();
    assert_eq!(topology.cells.len(), 2);
    assert_eq!(topology.cells[0].cpus.to_string(), "0-3");
    assert_eq!(
        (topology.cells[1].id, topology.cells[1].cpus.to_string()),
        (1, "4-7".into())
    );
    assert_eq!(topology.cpus().to_string(), "0-7");
    assert_eq!(
        topology.pages,
        BTreeMap::from([(2048, 768), (1 << 20, 2)]),
        "4 KiB pages are not huge pages"
    );
    assert_eq!(topology.default_page_kib(), Some(2048));
    assert_eq!(
        Topology::parse("<capabilities><host/></capabilities>"),
        None
    );
    assert_eq!(Topology::parse("not xml"), None);
}

#[test]
fn held_reads_every_binding_and_the_huge_pages() {
    let xml = "<domain type='kvm'><name>x</name>
      <memory unit='MiB'>1024</memory>
      <vcpu placement='static' cpuset='0-1'>2</vcpu>
      <memoryBacking><hugepages><page size='2' unit='MiB'/></hugepages></memoryBacking>
      <cputune><vcpupin vcpu='0' cpuset='4'/><vcpupin vcpu='1' cpuset='5'/>
        <emulatorpin cpuset='6'/></cputune></domain>";
    let held = Held::parse(xml);
    assert_eq!(held.pinned.to_string(), "0-1,4-6");
    assert_eq!(held.hugepages, Some((Some(2048), 1 << 20)));
    assert_eq!(held.pages(None), Some((2048, 512)));
    let default_size = "<domain><memory>4194304</memory>\
                        <memoryBacking><hugepages/></memoryBacking></domain>";
    let held = Held::parse(default_size);
    assert!(held.pinned.is_empty());
    assert_eq!(held.pages(Some(1 << 20)), Some((1 << 20, 4)));
    assert_eq!(held.pages(None), None, "no size known: nothing counted");
    assert_eq!(
        Held::parse("<domain><memory>1</memory></domain>"),
        Held::default()
    );
    assert_eq!(Held::parse("garbage"), Held::default());
}

#[test]
fn placement_renders_pins_numa_and_huge_pages() {
    let placed = Placed {
        pinning: Some(Pinning {
            cpus: vec![4, 5],
            cell: Some(1),
        }),
        shared: Some(CpuSet::parse("0-3").unwrap()),
        hugepage_kib: None,
        devices: Vec::new(),
    };
    assert_eq!(placed.vcpu_cpuset(), "", "a pinned domain needs no cpuset");
    assert_eq!(
        placed.elements(),
        "
  <cputune>
    <vcpupin vcpu='0' cpuset='4'/>
    <vcpupin vcpu='1' cpuset='5'/>
    <emulatorpin cpuset='4-5'/>
  </cputune>
  <numatune>
    <memory mode='strict' nodeset='1'/>
  </numatune>"
    );
    let huge = Placed {
        hugepage_kib: Some(2048),
        ..placed.clone()
    };
    assert!(
        huge.elements()
            .contains("<hugepages><page size='2048' unit='KiB'/></hugepages>")
    );
    assert!(
        huge.elements()
            .contains("<memory mode='preferred' nodeset='1'/>")
    );
    let shared = Placed {
        pinning: None,
        ..placed
    };
    assert_eq!(shared.vcpu_cpuset(), " cpuset='0-3'");
    assert_eq!(shared.elements(), "");
    assert_eq!(Placed::default().vcpu_cpuset(), "");
    // What this module renders, it reads back.
    let xml = format!(
        "<domain><memory unit='MiB'>64</memory><vcpu{}>2</vcpu>{}</domain>",
        shared.vcpu_cpuset(),
        huge.elements()
    );
    let held = Held::parse(&xml);
    assert_eq!(held.pinned.to_string(), "0-5");
    assert_eq!(held.pages(None), Some((2048, 32)));
}
