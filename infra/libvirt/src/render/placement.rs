//! Where a domain's vCPUs and memory sit on its host, as documents: the elements a
//! [`Placed`] adds to a domain (`<vcpu cpuset>`, `<cputune>`, `<numatune>`,
//! `<memoryBacking>`), and the two documents read back: the host's CPU and huge page
//! topology from its capabilities ([`Topology`]), and what an existing domain holds
//! ([`Held`]: CPUs, huge pages, passthrough devices) from its definition.

pub use bigfleet_libvirt_ports::claims::{Cell, Held, Placed, Topology};

use crate::options::CpuSet;
use crate::render::passthrough::{self, DeviceElement, PlacedDevice};

/// The elements a [`Placed`] adds to a domain definition.
pub trait PlacedXml {
    /// The `cpuset` attribute of `<vcpu>` (with its leading space), or nothing.
    fn vcpu_cpuset(&self) -> String;
    /// The passthrough devices' elements, for inside `<devices>`.
    fn device_elements(&self) -> String;
    /// The elements after `<vcpu>`: `<memoryBacking>`, `<cputune>` and `<numatune>`, each
    /// on a line of its own, or nothing.
    fn elements(&self) -> String;
}

impl PlacedXml for Placed {
    fn vcpu_cpuset(&self) -> String {
        match &self.shared {
            Some(set) if !set.is_empty() && self.pinning.is_none() => format!(" cpuset='{set}'"),
            _ => String::new(),
        }
    }

    fn device_elements(&self) -> String {
        self.devices.iter().map(PlacedDevice::to_xml).collect()
    }

    fn elements(&self) -> String {
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

/// A host's [`Topology`] read from its capabilities.
pub trait FromCapabilities: Sized {
    /// Reads `<capabilities>`: `host/topology/cells/cell` with their `cpus/cpu@id` and
    /// `pages` (per size, in KiB). `None` when the document does not parse or has no cells.
    fn parse(capabilities: &str) -> Option<Self>;
}

impl FromCapabilities for Topology {
    fn parse(capabilities: &str) -> Option<Self> {
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

/// What a domain holds ([`Held`]), read from its definition.
pub trait FromDefinition {
    /// Reads a domain definition; an unreadable one holds nothing.
    fn parse(domain_xml: &str) -> Self;
}

impl FromDefinition for Held {
    fn parse(domain_xml: &str) -> Self {
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
}

#[cfg(test)]
#[path = "placement_tests.rs"]
mod tests;
