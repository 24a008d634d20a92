//! What one machine holds of a host alone: dedicated CPUs (`--dedicated-cpus`), huge pages
//! and passthrough devices (`--device-classes`). The project's placement guide (docs/placement.md) explains why no CPU, page
//! or device is ever given to two machines.
//!
//! The host's own domain definitions are the books. A scan reads every domain that holds
//! resources (running, or ours even when stopped) and what its definition binds: the host
//! CPUs of `<vcpu cpuset>`, `<vcpupin>` and `<emulatorpin>` that lie in the dedicated set,
//! its huge pages (`<memoryBacking>`) and its `<hostdev>` and `<interface type='hostdev'>`
//! devices (any domain's, ours or not: a device a foreign domain holds is never offered). Between scans, a Create in flight holds a
//! *pending* claim, made and checked under the host ledger's lock, until its domain is
//! defined (then the definition holds it) or it rolls back. A claim is concrete: the CPUs
//! are chosen when it is made, and the domain's XML names them.
//!
//! A scan that began before a Create committed cannot see that domain yet; its claim is kept
//! until a scan that began after the commit replaces it (see `Ledger::begin_scan`).
//! Huge pages used by anything but the host's domains (the host's own processes) are
//! counted as taken: the pool's size, less its free pages, less what running domains hold.

use std::collections::{BTreeMap, BTreeSet};

use bigfleet_libvirt_domain::catalog::{DeviceClasses, DeviceSource};

use super::{CpuSet, DeviceKey, Held, HostDevice, Pinning, Placed, PlacedDevice, Topology};

/// What a machine of some type asks for beyond its shared shape.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ask {
    /// vCPUs to pin to dedicated CPUs, one each; 0 for a shared machine.
    pub dedicated: u32,
    /// Huge pages: (size in KiB, count).
    pub pages: Option<(u64, u64)>,
    /// Passthrough devices: a count per device class.
    pub devices: BTreeMap<String, u32>,
}

/// What one domain holds alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claim {
    /// Dedicated host CPUs bound to it.
    pub cpus: CpuSet,
    /// Huge pages: (size in KiB, count).
    pub pages: Option<(u64, u64)>,
    /// Passthrough devices.
    pub devices: BTreeSet<DeviceKey>,
}

impl Claim {
    /// What a domain whose definition binds `held` holds: its CPUs inside `dedicated` (a
    /// CPU outside it is a shared one), and its huge pages (a definition without a page
    /// size uses the host's default, `default_page_kib`).
    #[must_use]
    pub fn scanned(held: &Held, dedicated: &CpuSet, default_page_kib: Option<u64>) -> Self {
        Self {
            cpus: held.pinned.and(dedicated),
            pages: held.pages(default_page_kib),
            devices: held.devices.clone(),
        }
    }
}

/// What is free of a host's dedicated CPUs and huge pages, counted down as the inventory
/// offers slots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Room {
    /// Free dedicated CPUs.
    pub cpus: u64,
    /// Free huge pages by size (KiB).
    pub pages: BTreeMap<u64, u64>,
    /// Free devices by class.
    pub devices: BTreeMap<String, u64>,
}

impl Room {
    /// Takes what `ask` needs, if it is all there.
    pub fn take(&mut self, ask: &Ask) -> bool {
        let cpus = u64::from(ask.dedicated);
        let pages_ok = ask
            .pages
            .is_none_or(|(size, count)| self.pages.get(&size).copied().unwrap_or(0) >= count);
        let devices_ok = (ask.devices.iter()).all(|(class, count)| {
            self.devices.get(class).copied().unwrap_or(0) >= u64::from(*count)
        });
        if cpus > self.cpus || !pages_ok || !devices_ok {
            return false;
        }
        for (class, count) in &ask.devices {
            if let Some(free) = self.devices.get_mut(class) {
                *free -= u64::from(*count);
            }
        }
        self.cpus -= cpus;
        if let Some((size, count)) = ask.pages {
            if let Some(free) = self.pages.get_mut(&size) {
                *free -= count;
            }
        }
        true
    }
}

/// A host's dedicated CPUs, huge pages and passthrough devices, and who holds them.
#[derive(Clone, Debug, Default)]
pub struct Claims {
    topology: Option<Topology>,
    /// The host's usable devices of each declared class (as of the last topology read).
    pool: BTreeMap<String, Vec<HostDevice>>,
    /// The VLAN tag of each VF class that has one.
    vlans: BTreeMap<String, u16>,
    /// Huge pages taken by anything but domains, by size, as of the last scan.
    outside: BTreeMap<u64, u64>,
    committed: BTreeMap<String, Claim>,
    pending: BTreeMap<String, Claim>,
    /// A scan has read the host's domains into the books ([`Claims::refresh`]).
    scanned: bool,
}

impl Claims {
    /// The host's topology, once read.
    #[must_use]
    pub fn topology(&self) -> Option<&Topology> {
        self.topology.as_ref()
    }

    /// Records the host's topology (read by a scan, or by a Create that needed it first),
    /// and sorts its devices into `classes` (a device no class matches, or one that cannot
    /// be passed through, is in no class).
    pub fn set_topology(&mut self, topology: Topology, classes: &DeviceClasses) {
        self.pool = (classes.iter())
            .map(|(name, class)| {
                let devices = (topology.devices.iter())
                    .filter(|d| d.is(&class.source) && d.unusable().is_none())
                    .cloned()
                    .collect();
                (name.to_owned(), devices)
            })
            .collect();
        self.vlans = (classes.iter())
            .filter_map(|(name, class)| match class.source {
                DeviceSource::Vf {
                    vlan: Some(tag), ..
                } => Some((name.to_owned(), tag)),
                _ => None,
            })
            .collect();
        self.topology = Some(topology);
    }

    /// The devices of `class` on this host that no domain holds, by address.
    #[must_use]
    pub fn free_devices(&self, class: &str) -> Vec<&HostDevice> {
        let mut held = BTreeSet::new();
        for claim in self.all() {
            held.extend(claim.devices.iter());
        }
        (self.pool.get(class).into_iter().flatten())
            .filter(|d| !held.contains(&d.key))
            .collect()
    }

    /// Per declared class: the host's usable devices and how many are held.
    #[must_use]
    pub fn device_counts(&self) -> BTreeMap<String, (u64, u64)> {
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        (self.pool.iter())
            .map(|(class, devices)| {
                let free = count(self.free_devices(class).len());
                let total = count(devices.len());
                (class.clone(), (total, total.saturating_sub(free)))
            })
            .collect()
    }

    /// Replaces the committed claims with a scan's: `committed` (by domain), `free_pages`
    /// (the host's free huge pages by size) and `running_pages` (what its running domains
    /// hold by size). Pending claims are kept.
    pub fn refresh(
        &mut self,
        committed: BTreeMap<String, Claim>,
        free_pages: &BTreeMap<u64, u64>,
        running_pages: &BTreeMap<u64, u64>,
    ) {
        self.committed = committed;
        self.scanned = true;
        let pools = self.topology.as_ref().map(|t| t.pages.clone());
        self.outside = (pools.unwrap_or_default().into_iter())
            .map(|(size, total)| {
                let free = free_pages.get(&size).copied().unwrap_or(total);
                let running = running_pages.get(&size).copied().unwrap_or(0);
                (size, total.saturating_sub(free).saturating_sub(running))
            })
            .collect();
    }

    /// Whether a scan has read the host's domains into the books: until one has, nothing is
    /// granted (a process that just started knows nothing of the domains an earlier one
    /// made, and would give their CPUs and devices again).
    #[must_use]
    pub fn scanned(&self) -> bool {
        self.scanned
    }

    /// The domains whose Create holds a pending claim (in flight, not yet committed or
    /// released).
    pub fn in_flight(&self) -> impl Iterator<Item = &str> {
        self.pending.keys().map(String::as_str)
    }

    /// Keeps `name`'s claim in the books (a scan that could not see it yet).
    pub fn keep(&mut self, name: &str, claim: Claim) {
        self.committed.insert(name.to_owned(), claim);
    }

    /// Sets the committed domain `name`'s claim to what its Create committed: `claim`, or
    /// nothing held alone (`None`), whatever a scan read for that name before.
    pub fn keep_or_forget(&mut self, name: &str, claim: Option<&Claim>) {
        match claim {
            Some(claim) => self.keep(name, claim.clone()),
            None => self.forget(name),
        }
    }

    /// Every claim, each name counted once (a pending claim replaces a scanned one).
    fn all(&self) -> impl Iterator<Item = &Claim> {
        let scanned = (self.committed.iter())
            .filter(|(name, _)| !self.pending.contains_key(*name))
            .map(|(_, claim)| claim);
        scanned.chain(self.pending.values())
    }

    /// The dedicated CPUs of `dedicated` on this host that no domain holds.
    #[must_use]
    pub fn free_cpus(&self, dedicated: &CpuSet) -> CpuSet {
        let Some(topology) = &self.topology else {
            return CpuSet::default();
        };
        let mut held = CpuSet::default();
        for claim in self.all() {
            held.extend(&claim.cpus);
        }
        dedicated.and(&topology.cpus()).minus(&held)
    }

    /// Huge pages of `size` KiB that no one holds.
    #[must_use]
    pub fn free_pages(&self, size: u64) -> u64 {
        let total = (self.topology.as_ref())
            .and_then(|t| t.pages.get(&size).copied())
            .unwrap_or(0);
        let held = (self.all())
            .filter_map(|claim| claim.pages.filter(|(s, _)| *s == size))
            .fold(0u64, |sum, (_, count)| sum.saturating_add(count));
        let outside = self.outside.get(&size).copied().unwrap_or(0);
        total.saturating_sub(outside).saturating_sub(held)
    }

    /// What is free now, or `None` before the topology is known.
    #[must_use]
    pub fn room(&self, dedicated: &CpuSet) -> Option<Room> {
        let topology = self.topology.as_ref()?;
        Some(Room {
            cpus: u64::try_from(self.free_cpus(dedicated).len()).unwrap_or(u64::MAX),
            pages: (topology.pages.keys())
                .map(|size| (*size, self.free_pages(*size)))
                .collect(),
            devices: (self.pool.keys())
                .map(|class| {
                    let free = self.free_devices(class).len();
                    (class.clone(), u64::try_from(free).unwrap_or(u64::MAX))
                })
                .collect(),
        })
    }

    /// Decides and holds `name`'s claim for `ask`, or says why the host cannot give it.
    /// A shared machine on a host with dedicated CPUs is kept to the others.
    ///
    /// # Errors
    /// The refusal: what was asked, what is free, and the flag or host setting behind it.
    pub fn grant(&mut self, name: &str, ask: &Ask, dedicated: &CpuSet) -> Result<Placed, String> {
        if dedicated.is_empty() && *ask == Ask::default() {
            return Ok(Placed::default());
        }
        let Some(topology) = self.topology.as_ref() else {
            return Err(
                "the host's CPU, huge page and device topology has not been read yet (its \
                        first scan is running); try again"
                    .to_owned(),
            );
        };
        if !self.scanned {
            return Err(
                "the host's domains have not been read into its books yet (read them first: \
                 a scan, as describe makes)"
                    .to_owned(),
            );
        }
        let mut placed = Placed {
            shared: (!dedicated.is_empty()).then(|| topology.cpus().minus(dedicated)),
            ..Placed::default()
        };
        if let Some((size, count)) = ask.pages {
            let free = self.free_pages(size);
            if count > free {
                return Err(format!(
                    "needs {count} huge pages of {size} KiB but only {free} are free of the \
                     host's {} (reserve more: vm.nr_hugepages, or \
                     /sys/kernel/mm/hugepages/hugepages-{size}kB/nr_hugepages)",
                    topology.pages.get(&size).copied().unwrap_or(0)
                ));
            }
            placed.hugepage_kib = Some(size);
        }
        if ask.dedicated > 0 {
            if dedicated.is_empty() {
                return Err(
                    "its type asks for dedicated CPUs and --dedicated-cpus names \
                            none: set it to the host CPUs such machines may hold (e.g. 4-15)"
                        .to_owned(),
                );
            }
            placed.pinning = Some(self.pick(ask.dedicated, dedicated)?);
        }
        for (class, count) in &ask.devices {
            placed.devices.extend(self.pick_devices(class, *count)?);
        }
        let claim = Claim {
            cpus: (placed.pinning.iter())
                .flat_map(|p| p.cpus.iter().copied())
                .collect(),
            pages: ask.pages,
            devices: placed.devices.iter().map(|d| d.key.clone()).collect(),
        };
        self.pending.insert(name.to_owned(), claim);
        Ok(placed)
    }

    /// `count` free dedicated CPUs: within one NUMA cell when one has enough (the cell with
    /// the fewest that still fits, so larger holes stay whole), else the lowest free ones.
    fn pick(&self, count: u32, dedicated: &CpuSet) -> Result<Pinning, String> {
        let free = self.free_cpus(dedicated);
        let want = usize::try_from(count).unwrap_or(usize::MAX);
        if free.len() < want {
            return Err(format!(
                "needs {count} dedicated CPUs but only {} of --dedicated-cpus {dedicated} are \
                 free on this host ({})",
                free.len(),
                if free.is_empty() {
                    "none".to_owned()
                } else {
                    free.to_string()
                }
            ));
        }
        let cells = self.topology.as_ref().map_or(&[][..], |t| &t.cells[..]);
        let best = (cells.iter())
            .map(|cell| (cell.id, free.and(&cell.cpus)))
            .filter(|(_, room)| room.len() >= want)
            .min_by_key(|(id, room)| (room.len(), *id));
        let (cell, from) = match best {
            Some((id, room)) => (Some(id), room),
            None => (None, free),
        };
        Ok(Pinning {
            cpus: from.iter().take(want).collect(),
            cell,
        })
    }

    /// `count` free devices of `class`, the first by address.
    fn pick_devices(&self, class: &str, count: u32) -> Result<Vec<PlacedDevice>, String> {
        let free = self.free_devices(class);
        let want = usize::try_from(count).unwrap_or(usize::MAX);
        if free.len() < want {
            let total = self.pool.get(class).map_or(0, Vec::len);
            return Err(format!(
                "needs {count} devices of class {class:?} but {} of the host's {total} usable \
                 ones are free (doctor lists the host's devices and why any is unusable)",
                free.len()
            ));
        }
        Ok((free.into_iter().take(want))
            .map(|d| PlacedDevice {
                key: d.key.clone(),
                vf: d.vf,
                vlan: self.vlans.get(class).copied().filter(|_| d.vf),
            })
            .collect())
    }

    /// A Create finished: its pending claim is now the domain's (until a scan reads it).
    pub fn commit(&mut self, name: &str) -> Option<Claim> {
        let claim = self.pending.remove(name)?;
        self.committed.insert(name.to_owned(), claim.clone());
        Some(claim)
    }

    /// A Create rolled back: its pending claim is dropped.
    pub fn release(&mut self, name: &str) {
        self.pending.remove(name);
    }

    /// A domain was deleted.
    pub fn forget(&mut self, name: &str) {
        self.committed.remove(name);
    }

    /// Dedicated CPUs held and huge pages held, by size (for the metrics).
    #[must_use]
    pub fn held(&self) -> (usize, BTreeMap<u64, u64>) {
        let mut cpus = CpuSet::default();
        let mut pages: BTreeMap<u64, u64> = BTreeMap::new();
        for claim in self.all() {
            cpus.extend(&claim.cpus);
            if let Some((size, count)) = claim.pages {
                *pages.entry(size).or_default() += count;
            }
        }
        (cpus.len(), pages)
    }
}
