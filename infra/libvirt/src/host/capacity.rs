//! Host capacity accounting (docs/design.md §4.3): what a host can run, what is already
//! committed on it, and whether one more machine fits.
//!
//! A host's allocatable shape is its node info minus the operator's reserve, times the
//! allocation ratios. Committed is every domain the last scan saw that uses (or will use)
//! resources: any active domain, plus our own domains even when shut off, since Configure
//! powers them back on. Creates in flight hold a reservation from the capacity check until
//! they finish, so two concurrent Creates cannot both take the last slot; a reservation
//! replaces the scanned entry of the same name, so nothing is counted twice.

use std::collections::BTreeMap;

use crate::options::CapacityPolicy;

/// A vCPU/memory pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// Virtual CPUs.
    pub vcpu: u64,
    /// Memory in MiB.
    pub memory_mib: u64,
}

impl Shape {
    fn fits_in(self, free: Shape) -> bool {
        self.vcpu <= free.vcpu && self.memory_mib <= free.memory_mib
    }

    fn minus(self, other: Shape) -> Shape {
        Shape {
            vcpu: self.vcpu.saturating_sub(other.vcpu),
            memory_mib: self.memory_mib.saturating_sub(other.memory_mib),
        }
    }

    fn plus(self, other: Shape) -> Shape {
        Shape {
            vcpu: self.vcpu.saturating_add(other.vcpu),
            memory_mib: self.memory_mib.saturating_add(other.memory_mib),
        }
    }
}

/// What libvirt's node info says about the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node {
    /// Active physical CPUs.
    pub cpus: u32,
    /// Memory in KiB.
    pub memory_kib: u64,
}

/// The shape `policy` lets the provider allocate on `node`.
#[must_use]
pub fn allocatable(node: Node, policy: &CapacityPolicy) -> Shape {
    let cpus = f64::from(node.cpus.saturating_sub(policy.reserve_cpu));
    let memory = (node.memory_kib / 1024).saturating_sub(policy.reserve_memory_mib);
    // Both products are non-negative and far below 2^53, so the casts are exact enough.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    Shape {
        vcpu: (cpus * policy.cpu_ratio).floor() as u64,
        memory_mib: (memory as f64 * policy.memory_ratio).floor() as u64,
    }
}

/// One host's books: node, committed domains and reservations in flight.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    node: Option<Node>,
    committed: BTreeMap<String, Shape>,
    pending: BTreeMap<String, Shape>,
}

impl Ledger {
    /// Replaces the node info and the committed domains with a fresh scan. Reservations
    /// in flight are kept.
    pub fn refresh(&mut self, node: Node, committed: BTreeMap<String, Shape>) {
        self.node = Some(node);
        self.committed = committed;
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
        self.node
            .map(|node| allocatable(node, policy).minus(self.used()))
    }

    /// Whether a domain of this name is being created right now.
    #[must_use]
    pub fn is_pending(&self, name: &str) -> bool {
        self.pending.contains_key(name)
    }

    /// Reserves `shape` for the domain `name`, or explains why it does not fit.
    ///
    /// # Errors
    /// The refusal, naming the shape asked for, what is left and how the budget is made.
    pub fn reserve(
        &mut self,
        name: &str,
        shape: Shape,
        policy: &CapacityPolicy,
    ) -> Result<(), String> {
        if let (Some(node), Some(free)) = (self.node, self.free(policy)) {
            if !shape.fits_in(free) {
                let total = allocatable(node, policy);
                return Err(format!(
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
                ));
            }
        }
        self.pending.insert(name.to_owned(), shape);
        Ok(())
    }

    /// A Create finished: its reservation becomes a committed domain.
    pub fn commit(&mut self, name: &str) {
        if let Some(shape) = self.pending.remove(name) {
            self.committed.insert(name.to_owned(), shape);
        }
    }

    /// A Create failed and rolled back: its reservation is dropped.
    pub fn release(&mut self, name: &str) {
        self.pending.remove(name);
    }

    /// A domain was deleted.
    pub fn forget(&mut self, name: &str) {
        self.committed.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: Node = Node {
        cpus: 8,
        memory_kib: 16 * 1024 * 1024,
    };

    fn shape(vcpu: u64, memory_mib: u64) -> Shape {
        Shape { vcpu, memory_mib }
    }

    #[test]
    fn allocatable_applies_reserve_then_ratio() {
        let policy = CapacityPolicy::default();
        assert_eq!(allocatable(NODE, &policy), shape(28, 14336));
        let lean = CapacityPolicy {
            reserve_cpu: 10,
            reserve_memory_mib: 1 << 30,
            cpu_ratio: 2.0,
            memory_ratio: 1.5,
        };
        assert_eq!(allocatable(NODE, &lean), shape(0, 0));
    }

    #[test]
    fn reservations_refuse_what_does_not_fit_and_count_once() {
        let policy = CapacityPolicy {
            reserve_cpu: 0,
            reserve_memory_mib: 0,
            cpu_ratio: 1.0,
            memory_ratio: 1.0,
        };
        let mut ledger = Ledger::default();
        ledger.refresh(
            NODE,
            BTreeMap::from([("foreign".to_owned(), shape(2, 4096))]),
        );
        ledger.reserve("a", shape(4, 8192), &policy).unwrap();
        assert_eq!(ledger.free(&policy), Some(shape(2, 4096)));
        let refusal = ledger.reserve("b", shape(4, 2048), &policy).unwrap_err();
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
        ledger.refresh(NODE, seen);
        assert_eq!(ledger.used(), shape(6, 12288));
        ledger.commit("a");
        assert_eq!(ledger.used(), shape(6, 12288));
        ledger.forget("a");
        ledger.reserve("c", shape(2, 1024), &policy).unwrap();
        ledger.release("c");
        assert_eq!(ledger.used(), shape(2, 4096));
        assert!(!ledger.is_pending("c"));
    }

    #[test]
    fn an_unknown_node_does_not_refuse() {
        let mut ledger = Ledger::default();
        let policy = CapacityPolicy::default();
        assert_eq!(ledger.free(&policy), None);
        ledger.reserve("a", shape(1000, 1 << 40), &policy).unwrap();
        assert!(ledger.is_pending("a"));
    }
}
