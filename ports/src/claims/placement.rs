//! Where a domain sits on its host, as the books see it: how a machine is placed
//! ([`Placed`]: its pinned CPUs, the shared CPUs, its huge pages and devices), a host's CPUs,
//! huge page pools and devices ([`Topology`]) and what an existing domain holds ([`Held`]).
//! The libvirt adapter reads the last two from libvirt's documents and renders the first.

use std::collections::{BTreeMap, BTreeSet};

use super::{CpuSet, DeviceKey, HostDevice, PlacedDevice};

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
    /// The huge pages it holds: (size in KiB, count), its size `None` resolved to
    /// `default_kib`.
    #[must_use]
    pub fn pages(&self, default_kib: Option<u64>) -> Option<(u64, u64)> {
        let (size, memory_kib) = self.hugepages?;
        let size = size.or(default_kib).filter(|s| *s > 0)?;
        Some((size, memory_kib.div_ceil(size)))
    }
}
