//! Where a domain's vCPUs and memory sit on its host, as documents: the elements a
//! [`Placed`] adds to a domain (`<vcpu cpuset>`, `<cputune>`, `<numatune>`,
//! `<memoryBacking>`), and the two documents read back: the host's CPU and huge page
//! topology from its capabilities ([`Topology`]), and what an existing domain holds
//! ([`Held`]: CPUs, huge pages, passthrough devices) from its definition.

use std::collections::{BTreeMap, BTreeSet};

use crate::options::CpuSet;
use crate::render::passthrough::{self, DeviceKey, HostDevice, PlacedDevice};

/// How a domain is placed on its host's CPUs and memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placed {
    /// One host CPU per vCPU (dedicated CPUs), and the NUMA cell they share.
    pub pinning: Option<Pinning>,
    /// The host CPUs a machine without dedicated CPUs may run on (every CPU of the host but
    /// `--dedicated-cpus`); `None`: any.
    pub shared: Option<CpuSet>,
    /// Guest memory from huge pages of this size (KiB).
    pub hugepage_kib: Option<u64>,
    /// Passthrough devices claimed for it.
    pub devices: Vec<PlacedDevice>,
}

/// Dedicated host CPUs: `cpus[i]` runs vCPU `i` (and the emulator threads run on them all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pinning {
    /// The host CPU of each vCPU, in vCPU order.
    pub cpus: Vec<u32>,
    /// The NUMA cell every one of them is in, when they fit in one.
    pub cell: Option<u32>,
}

impl Placed {
    /// The `cpuset` attribute of `<vcpu>` (with its leading space), or nothing.
    #[must_use]
    pub fn vcpu_cpuset(&self) -> String {
        match &self.shared {
            Some(set) if !set.is_empty() && self.pinning.is_none() => format!(" cpuset='{set}'"),
            _ => String::new(),
        }
    }

    /// The passthrough devices' elements, for inside `<devices>`.
    #[must_use]
    pub fn device_elements(&self) -> String {
        self.devices.iter().map(PlacedDevice::to_xml).collect()
    }

    /// The elements after `<vcpu>`: `<memoryBacking>`, `<cputune>` and `<numatune>`, each
    /// on a line of its own, or nothing.
    #[must_use]
    pub fn elements(&self) -> String {
        let mut out = String::new();
        if let Some(kib) = self.hugepage_kib {
            out.push_str(&format!(
                "\n  <memoryBacking>\n    <hugepages><page size='{kib}' unit='KiB'/></hugepages>\n  </memoryBacking>"
            ));
        }
        let Some(pinning) = &self.pinning else {
            return out;
        };
        out.push_str("\n  <cputune>");
        for (vcpu, cpu) in pinning.cpus.iter().enumerate() {
            out.push_str(&format!("\n    <vcpupin vcpu='{vcpu}' cpuset='{cpu}'/>"));
        }
        let all: CpuSet = pinning.cpus.iter().copied().collect();
        out.push_str(&format!(
            "\n    <emulatorpin cpuset='{all}'/>\n  </cputune>"
        ));
        if let Some(cell) = pinning.cell {
            // Huge pages come from the host's pools as a whole (the ledger counts them per
            // host): `preferred` lets the kernel take them from another cell rather than
            // fail the start; ordinary memory is held to the vCPUs' cell.
            let mode = if self.hugepage_kib.is_some() {
                "preferred"
            } else {
                "strict"
            };
            out.push_str(&format!(
                "\n  <numatune>\n    <memory mode='{mode}' nodeset='{cell}'/>\n  </numatune>"
            ));
        }
        out
    }
}

/// The smallest page size counted as a huge page pool, in KiB.
const MIN_HUGE_PAGE_KIB: u64 = 64;

/// One NUMA cell of a host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    /// The cell id.
    pub id: u32,
    /// Its CPUs.
    pub cpus: CpuSet,
}

/// A host's CPUs by NUMA cell and its huge page pools, from its capabilities, and its
/// passthrough devices, from its node devices (read only when device classes are declared).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    /// The cells, by id.
    pub cells: Vec<Cell>,
    /// Huge pages in all cells by page size in KiB (sizes of 64 KiB and up only: the base
    /// page is not a pool): the pool's size in pages.
    pub pages: BTreeMap<u64, u64>,
    /// PCI devices, VFs and mediated devices, in libvirt's order.
    pub devices: Vec<HostDevice>,
}

impl Topology {
    /// Every CPU of the host.
    #[must_use]
    pub fn cpus(&self) -> CpuSet {
        let mut all = CpuSet::default();
        for cell in &self.cells {
            all.extend(&cell.cpus);
        }
        all
    }

    /// The host's default huge page size: the smallest it has a pool size for.
    #[must_use]
    pub fn default_page_kib(&self) -> Option<u64> {
        self.pages.keys().next().copied()
    }

    /// A host of `cpus` CPUs (ids from 0) in one cell, without huge page pools: what a host
    /// whose capabilities list no NUMA cell is taken for (libvirt's test driver on a node
    /// file).
    #[must_use]
    pub fn flat(cpus: u32) -> Self {
        Self {
            cells: vec![Cell {
                id: 0,
                cpus: (0..cpus).collect(),
            }],
            ..Self::default()
        }
    }

    /// Reads `<capabilities>`: `host/topology/cells/cell` with their `cpus/cpu@id` and
    /// `pages` (per size, in KiB). `None` when the document does not parse or has no cells.
    #[must_use]
    pub fn parse(capabilities: &str) -> Option<Self> {
        let document = roxmltree::Document::parse(capabilities).ok()?;
        let mut topology = Self::default();
        let cells = (document.descendants()).filter(|n| n.has_tag_name("cell"));
        for cell in cells.filter(|c| c.parent().is_some_and(|p| p.has_tag_name("cells"))) {
            let id = cell.attribute("id")?.parse().ok()?;
            let cpus = (cell.descendants())
                .filter(|n| n.has_tag_name("cpu"))
                .filter_map(|n| n.attribute("id")?.parse().ok())
                .collect();
            for pages in (cell.children()).filter(|n| n.has_tag_name("pages")) {
                let size = kib(pages.attribute("size"), pages.attribute("unit"))?;
                let count: u64 = pages.text().unwrap_or("0").trim().parse().ok()?;
                if size >= MIN_HUGE_PAGE_KIB {
                    *topology.pages.entry(size).or_default() += count;
                }
            }
            topology.cells.push(Cell { id, cpus });
        }
        (!topology.cells.is_empty()).then_some(topology)
    }
}

/// A size attribute in KiB (`unit` as libvirt writes it: `KiB` when absent).
fn kib(size: Option<&str>, unit: Option<&str>) -> Option<u64> {
    let size: u64 = size?.parse().ok()?;
    let scale = match unit.unwrap_or("KiB") {
        "b" | "bytes" => return Some(size / 1024),
        "KiB" | "k" | "K" => 1,
        "MiB" | "M" | "m" => 1 << 10,
        "GiB" | "G" | "g" => 1 << 20,
        _ => return None,
    };
    size.checked_mul(scale)
}

/// `node`'s first child element called `name`.
fn child<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.children().find(|n| n.has_tag_name(name))
}

/// What an existing domain holds of its host, read from its definition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Every host CPU its vCPUs or emulator threads are bound to (`<vcpu cpuset>`,
    /// `<vcpupin>`, `<emulatorpin>`); empty: none (it may run anywhere).
    pub pinned: CpuSet,
    /// Its memory is backed by huge pages: their size in KiB (`None` inside: the host's
    /// default size), and the memory in KiB.
    pub hugepages: Option<(Option<u64>, u64)>,
    /// Its passthrough devices.
    pub devices: BTreeSet<DeviceKey>,
}

impl Held {
    /// Reads a domain definition; an unreadable one holds nothing.
    #[must_use]
    pub fn parse(domain_xml: &str) -> Self {
        let Ok(document) = roxmltree::Document::parse(domain_xml) else {
            return Self::default();
        };
        let root = document.root_element();
        let mut pinned = CpuSet::default();
        let mut bind = |set: Option<&str>| {
            if let Some(set) = set.and_then(|s| CpuSet::parse(s).ok()) {
                pinned.extend(&set);
            }
        };
        bind(child(root, "vcpu").and_then(|v| v.attribute("cpuset")));
        if let Some(tune) = child(root, "cputune") {
            for pin in (tune.children())
                .filter(|n| n.has_tag_name("vcpupin") || n.has_tag_name("emulatorpin"))
            {
                bind(pin.attribute("cpuset"));
            }
        }
        let hugepages = child(root, "memoryBacking")
            .and_then(|backing| child(backing, "hugepages"))
            .map(|huge| {
                let page = (huge.children()).find(|n| n.has_tag_name("page"));
                let size = page.and_then(|p| kib(p.attribute("size"), p.attribute("unit")));
                let memory = child(root, "memory")
                    .and_then(|m| kib(m.text().map(str::trim), m.attribute("unit")))
                    .unwrap_or(0);
                (size, memory)
            });
        Self {
            pinned,
            hugepages,
            devices: passthrough::held(root),
        }
    }

    /// The huge pages it holds: (size in KiB, count), its size `None` resolved to
    /// `default_kib`.
    #[must_use]
    pub fn pages(&self, default_kib: Option<u64>) -> Option<(u64, u64)> {
        let (size, memory_kib) = self.hugepages?;
        let size = size.or(default_kib).filter(|s| *s > 0)?;
        Some((size, memory_kib.div_ceil(size)))
    }
}

#[cfg(test)]
#[path = "placement_tests.rs"]
mod tests;
