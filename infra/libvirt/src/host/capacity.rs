//! Host capacity accounting (docs/design.md §4.3): what a host can run, what is already
//! committed on it, and whether one more machine fits.
//!
//! A host's allocatable shape is its node info minus the operator's reserve, times the
//! allocation ratios, and its storage pool's capacity times `--disk-allocation-ratio` less
//! the volumes no domain of the shape accounts for (other users' volumes, the golden image,
//! leftovers). Committed is every domain the last scan saw that uses (or will use)
//! resources: any active domain, plus our own domains even when shut off, since Configure
//! powers them back on; a domain's disk is the virtual size of the volumes named after it.
//! Creates in flight hold a reservation from the capacity check until they finish, so two
//! concurrent Creates cannot both take the last slot; a reservation replaces the scanned
//! entry of the same name, so nothing is counted twice. Disks are counted at their virtual
//! size, as thin volumes may grow to it.

use std::collections::BTreeMap;

use bigfleet_libvirt_ports::claims::{Ask, Claim, Claims};

use crate::options::CapacityPolicy;
use crate::render::placement::Placed;

/// vCPUs, memory and disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// Virtual CPUs.
    pub vcpu: u64,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Disk: the virtual size of its volumes, in bytes.
    pub disk_bytes: u64,
}

impl Shape {
    /// Whether this shape fits in `free`.
    #[must_use]
    pub fn fits_in(self, free: Shape) -> bool {
        self.vcpu <= free.vcpu
            && self.memory_mib <= free.memory_mib
            && self.disk_bytes <= free.disk_bytes
    }

    /// This shape less `other`, each part at least 0.
    #[must_use]
    pub fn minus(self, other: Shape) -> Shape {
        Shape {
            vcpu: self.vcpu.saturating_sub(other.vcpu),
            memory_mib: self.memory_mib.saturating_sub(other.memory_mib),
            disk_bytes: self.disk_bytes.saturating_sub(other.disk_bytes),
        }
    }

    fn plus(self, other: Shape) -> Shape {
        Shape {
            vcpu: self.vcpu.saturating_add(other.vcpu),
            memory_mib: self.memory_mib.saturating_add(other.memory_mib),
            disk_bytes: self.disk_bytes.saturating_add(other.disk_bytes),
        }
    }
}

/// What the last scan read of the host's storage pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolRoom {
    /// The pool's capacity in bytes.
    pub capacity: u64,
    /// Bytes the pool has allocated (what is written, for thin volumes).
    pub allocation: u64,
    /// The virtual size of the volumes no committed domain accounts for, in bytes.
    pub foreign: u64,
}

/// What libvirt's node info says about the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node {
    /// Active physical CPUs.
    pub cpus: u32,
    /// Memory in KiB.
    pub memory_kib: u64,
}

/// The shape `policy` lets the provider allocate on `node` with storage pool `pool`, less
/// what is `carved` out for machines that hold resources alone (dedicated CPUs, huge page
/// pools); disk is unbounded while the pool is not known.
#[must_use]
pub fn allocatable(
    node: Node,
    pool: Option<PoolRoom>,
    policy: &CapacityPolicy,
    carved: Carved,
) -> Shape {
    let cpus = node
        .cpus
        .saturating_sub(carved.cpus)
        .saturating_sub(policy.reserve_cpu);
    let memory = (node.memory_kib / 1024)
        .saturating_sub(carved.memory_mib)
        .saturating_sub(policy.reserve_memory_mib);
    // The products are non-negative; the casts saturate at u64::MAX, and below 2^53 they
    // are exact enough.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    Shape {
        vcpu: (f64::from(cpus) * policy.cpu_ratio).floor() as u64,
        memory_mib: (memory as f64 * policy.memory_ratio).floor() as u64,
        disk_bytes: pool.map_or(u64::MAX, |pool| {
            let offered = (pool.capacity as f64 * policy.disk_ratio).floor() as u64;
            offered.saturating_sub(pool.foreign)
        }),
    }
}

/// What the shared budget leaves out: the host's dedicated CPUs and its huge page pools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Carved {
    /// Host CPUs of `--dedicated-cpus`.
    pub cpus: u32,
    /// Memory in huge page pools, in MiB.
    pub memory_mib: u64,
}

/// `bytes` in GiB, one decimal.
fn gib(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let value = bytes as f64 / f64::from(1u32 << 30);
    format!("{value:.1}")
}

/// One host's books: node, pool, committed domains and reservations in flight, and the
/// dedicated CPUs and huge pages machines hold alone ([`Claims`]).
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    node: Option<Node>,
    pool: Option<PoolRoom>,
    committed: BTreeMap<String, Shape>,
    pending: BTreeMap<String, Shape>,
    claims: Claims,
    /// Scans begun so far ([`Ledger::begin_scan`]).
    scans: u64,
    /// Domains committed since some scan began: how many scans had begun then, and what
    /// they hold. A scan that began before the commit may have missed the domain.
    recent: BTreeMap<String, (u64, Shape, Option<Claim>)>,
}

impl Ledger {
    /// A scan of this host is about to read its domains: the ticket to hand back to
    /// [`Ledger::refresh`] with what it read.
    pub fn begin_scan(&mut self) -> u64 {
        self.scans += 1;
        self.scans
    }

    /// Replaces the node info and the committed domains with what the scan of `ticket`
    /// read. Reservations in flight are kept, and so are domains committed after that scan
    /// began, as their commit left them: the scan may have missed them, or read an older
    /// definition of the same name (deleted and made again while it ran), which must not
    /// replace what the new one holds. The next scan reads them.
    /// `pool` is `None` when the pool could not be read (its last reading is kept).
    pub fn refresh(
        &mut self,
        ticket: u64,
        node: Node,
        committed: BTreeMap<String, Shape>,
        pool: Option<PoolRoom>,
    ) {
        self.node = Some(node);
        self.committed = committed;
        if pool.is_some() {
            self.pool = pool;
        }
        self.recent.retain(|_, (at, _, _)| *at >= ticket);
        for (name, (_, shape, claim)) in &self.recent {
            self.committed.insert(name.clone(), *shape);
            self.claims.keep_or_forget(name, claim.as_ref());
        }
    }

    /// Fills the books of what domains hold alone from a scan of `ticket` that read only
    /// them (a Create that came before the host's first describe, right after a restart):
    /// `claims` by domain, the host's `free` huge pages and those its `running` domains
    /// hold. A domain committed after that scan began keeps its claim, as in
    /// [`Ledger::refresh`]; the shared budget waits for describe.
    pub fn refresh_claims(
        &mut self,
        ticket: u64,
        claims: BTreeMap<String, Claim>,
        (free, running): (&BTreeMap<u64, u64>, &BTreeMap<u64, u64>),
    ) {
        self.claims.refresh(claims, free, running);
        for (name, (at, _, claim)) in &self.recent {
            if *at >= ticket {
                self.claims.keep_or_forget(name, claim.as_ref());
            }
        }
    }

    /// The dedicated CPUs and huge pages, for a scan to replace and the metrics to read.
    pub fn claims_mut(&mut self) -> &mut Claims {
        &mut self.claims
    }

    /// The dedicated CPUs and huge pages.
    #[must_use]
    pub fn claims(&self) -> &Claims {
        &self.claims
    }

    /// The pool as last read.
    #[must_use]
    pub fn pool(&self) -> Option<PoolRoom> {
        self.pool
    }

    /// What the shared budget leaves out on this host under `policy`.
    fn carved(&self, policy: &CapacityPolicy) -> Carved {
        let Some(topology) = self.claims.topology() else {
            return Carved::default();
        };
        let dedicated = policy.dedicated_cpus.and(&topology.cpus()).len();
        let pages_kib = (topology.pages.iter()).fold(0u64, |sum, (size, count)| {
            sum.saturating_add(size.saturating_mul(*count))
        });
        Carved {
            cpus: u32::try_from(dedicated).unwrap_or(u32::MAX),
            memory_mib: pages_kib / 1024,
        }
    }

    /// What the host offers in all, or `None` before the node is known.
    #[must_use]
    pub fn allocatable(&self, policy: &CapacityPolicy) -> Option<Shape> {
        (self.node).map(|node| allocatable(node, self.pool, policy, self.carved(policy)))
    }

    /// Records the node info (at connect time).
    pub fn set_node(&mut self, node: Node) {
        self.node = Some(node);
    }

    /// Everything committed or reserved.
    #[must_use]
    pub fn used(&self) -> Shape {
        let scanned = self
            .committed
            .iter()
            .filter(|(name, _)| !self.pending.contains_key(*name))
            .fold(Shape::default(), |sum, (_, s)| sum.plus(*s));
        self.pending.values().fold(scanned, |sum, s| sum.plus(*s))
    }

    /// What is still free, or `None` before the node is known.
    #[must_use]
    pub fn free(&self, policy: &CapacityPolicy) -> Option<Shape> {
        self.allocatable(policy)
            .map(|total| total.minus(self.used()))
    }

    /// Whether a domain of this name is being created right now.
    #[must_use]
    pub fn is_pending(&self, name: &str) -> bool {
        self.pending.contains_key(name)
    }

    /// Reserves `shape` (its shared part) and `ask` (what it holds alone) for the domain
    /// `name`, and says where it goes; or explains why it does not fit.
    ///
    /// # Errors
    /// The refusal, naming what was asked for, what is left and how the budget is made.
    pub fn reserve(
        &mut self,
        name: &str,
        shape: Shape,
        ask: &Ask,
        policy: &CapacityPolicy,
    ) -> Result<Placed, String> {
        if let (Some(node), Some(free)) = (self.node, self.free(policy)) {
            if !shape.fits_in(free) {
                let total = allocatable(node, self.pool, policy, self.carved(policy));
                return Err(refusal(shape, free, total, node, self.pool, policy));
            }
        }
        let placed = self.claims.grant(name, ask, &policy.dedicated_cpus)?;
        self.pending.insert(name.to_owned(), shape);
        Ok(placed)
    }

    /// A Create finished: its reservation becomes a committed domain.
    pub fn commit(&mut self, name: &str) {
        if let Some(shape) = self.pending.remove(name) {
            self.committed.insert(name.to_owned(), shape);
            let claim = self.claims.commit(name);
            self.recent
                .insert(name.to_owned(), (self.scans, shape, claim));
        }
    }

    /// A Create failed and rolled back: its reservation is dropped.
    pub fn release(&mut self, name: &str) {
        self.pending.remove(name);
        self.claims.release(name);
    }

    /// A domain was deleted.
    pub fn forget(&mut self, name: &str) {
        self.committed.remove(name);
        self.claims.forget(name);
        self.recent.remove(name);
    }
}

/// Why `shape` does not fit in `free` of `total`.
fn refusal(
    shape: Shape,
    free: Shape,
    total: Shape,
    node: Node,
    pool: Option<PoolRoom>,
    policy: &CapacityPolicy,
) -> String {
    let mut why = format!(
        "needs {} vCPU and {} MiB but only {} vCPU and {} MiB are free of {} vCPU \
         and {} MiB allocatable (node {} CPUs and {} MiB, minus \
         --host-reserve-cpu {} and --host-reserve-memory-mib {}, times \
         --cpu-allocation-ratio {} and --memory-allocation-ratio {})",
        shape.vcpu,
        shape.memory_mib,
        free.vcpu,
        free.memory_mib,
        total.vcpu,
        total.memory_mib,
        node.cpus,
        node.memory_kib / 1024,
        policy.reserve_cpu,
        policy.reserve_memory_mib,
        policy.cpu_ratio,
        policy.memory_ratio,
    );
    if let Some(pool) = pool.filter(|_| shape.disk_bytes > free.disk_bytes) {
        why = format!(
            "needs {} GiB of disk but only {} GiB are free of {} GiB allocatable \
             in the storage pool (capacity {} GiB times --disk-allocation-ratio \
             {}, less {} GiB of volumes no machine here accounts for); {why}",
            gib(shape.disk_bytes),
            gib(free.disk_bytes),
            gib(total.disk_bytes),
            gib(pool.capacity),
            policy.disk_ratio,
            gib(pool.foreign),
        );
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: Node = Node {
        cpus: 8,
        memory_kib: 16 * 1024 * 1024,
    };

    fn shape(vcpu: u64, memory_mib: u64) -> Shape {
        Shape {
            vcpu,
            memory_mib,
            disk_bytes: 0,
        }
    }

    #[test]
    fn allocatable_applies_reserve_then_ratio() {
        let policy = CapacityPolicy::default();
        assert_eq!(
            allocatable(NODE, None, &policy, Carved::default()),
            Shape {
                disk_bytes: u64::MAX,
                ..shape(28, 14336)
            }
        );
        let lean = CapacityPolicy {
            reserve_cpu: 10,
            reserve_memory_mib: 1 << 30,
            cpu_ratio: 2.0,
            memory_ratio: 1.5,
            disk_ratio: 1.0,
            ..CapacityPolicy::default()
        };
        assert_eq!(
            allocatable(NODE, None, &lean, Carved::default()),
            Shape {
                disk_bytes: u64::MAX,
                ..shape(0, 0)
            }
        );
    }

    #[test]
    fn reservations_refuse_what_does_not_fit_and_count_once() {
        let policy = CapacityPolicy {
            reserve_cpu: 0,
            reserve_memory_mib: 0,
            cpu_ratio: 1.0,
            memory_ratio: 1.0,
            disk_ratio: 1.0,
            ..CapacityPolicy::default()
        };
        let mut ledger = Ledger::default();
        let ticket = ledger.begin_scan();
        ledger.refresh(
            ticket,
            NODE,
            BTreeMap::from([("foreign".to_owned(), shape(2, 4096))]),
            None,
        );
        ledger
            .reserve("a", shape(4, 8192), &Ask::default(), &policy)
            .unwrap();
        let free = ledger.free(&policy).unwrap();
        assert_eq!((free.vcpu, free.memory_mib), (2, 4096));
        assert_eq!(
            free.disk_bytes,
            u64::MAX,
            "no pool read: disk is not limited"
        );
        let refusal = ledger
            .reserve("b", shape(4, 2048), &Ask::default(), &policy)
            .unwrap_err();
        assert!(refusal.contains("needs 4 vCPU and 2048 MiB"), "{refusal}");
        assert!(
            refusal.contains("only 2 vCPU and 4096 MiB are free"),
            "{refusal}"
        );
        // A scan that already sees "a" does not count it twice while it is reserved.
        let seen = BTreeMap::from([
            ("foreign".to_owned(), shape(2, 4096)),
            ("a".to_owned(), shape(4, 8192)),
        ]);
        let ticket = ledger.begin_scan();
        ledger.refresh(ticket, NODE, seen, None);
        assert_eq!(ledger.used(), shape(6, 12288));
        ledger.commit("a");
        assert_eq!(ledger.used(), shape(6, 12288));
        ledger.forget("a");
        ledger
            .reserve("c", shape(2, 1024), &Ask::default(), &policy)
            .unwrap();
        ledger.release("c");
        assert_eq!(ledger.used(), shape(2, 4096));
        assert!(!ledger.is_pending("c"));
    }

    #[test]
    fn disks_count_against_the_pool_times_its_ratio_less_foreign_volumes() {
        let policy = CapacityPolicy {
            reserve_cpu: 0,
            reserve_memory_mib: 0,
            cpu_ratio: 1.0,
            memory_ratio: 1.0,
            disk_ratio: 2.0,
            ..CapacityPolicy::default()
        };
        let disk = |vcpu, gib: u64| Shape {
            disk_bytes: gib << 30,
            ..shape(vcpu, 1024)
        };
        let pool = PoolRoom {
            capacity: 100 << 30,
            allocation: 30 << 30,
            foreign: 10 << 30,
        };
        let mut ledger = Ledger::default();
        let ours = BTreeMap::from([("ours".to_owned(), disk(1, 60))]);
        let ticket = ledger.begin_scan();
        ledger.refresh(ticket, NODE, ours, Some(pool));
        // 100 GiB × 2 − 10 GiB foreign − 60 GiB of ours: 130 GiB free.
        assert_eq!(ledger.free(&policy).unwrap().disk_bytes, 130 << 30);
        ledger
            .reserve("a", disk(1, 100), &Ask::default(), &policy)
            .unwrap();
        let refusal = ledger
            .reserve("b", disk(1, 40), &Ask::default(), &policy)
            .unwrap_err();
        assert!(
            refusal.starts_with("needs 40.0 GiB of disk but only 30.0 GiB are free of 190.0 GiB"),
            "{refusal}"
        );
        assert!(refusal.contains("--disk-allocation-ratio 2"), "{refusal}");
        // A scan that could not read the pool keeps the last reading.
        let ticket = ledger.begin_scan();
        ledger.refresh(ticket, NODE, BTreeMap::new(), None);
        assert_eq!(ledger.pool(), Some(pool));
    }

    #[test]
    fn an_unknown_node_does_not_refuse() {
        let mut ledger = Ledger::default();
        let policy = CapacityPolicy::default();
        assert_eq!(ledger.free(&policy), None);
        ledger
            .reserve("a", shape(1000, 1 << 40), &Ask::default(), &policy)
            .unwrap();
        assert!(ledger.is_pending("a"));
    }
}
