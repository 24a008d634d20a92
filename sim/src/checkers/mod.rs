//! Invariant checkers, kept apart from the workload (docs/design.md §5.6). They observe the world
//! after every step: each answer as it leaves the provider (`online`), each durable commit
//! (`durable`), each host effect and each request arriving at a host (`hosts`), read from the history the fakes append
//! to (`crate::history`; no fake calls a checker), each provider restart (`restart`), and
//! once more after faults stop and the provider has converged (`quiescence`).
//!
//! The [`Ledger`] is the checkers' model of what clients were told: the highest token of
//! each (shard, machine) that got a definite non-fenced answer, every token sent,
//! the operation ids acknowledged, and the highest List revision answered.

pub mod deadlines;
pub mod durable;
pub mod hosts;
pub mod online;
pub mod quiescence;
pub mod restart;
pub mod spans;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bigfleet_libvirt_domain::{
    CapacityType, FenceMark, HostRef, Kind, Machine, MachineId, MachineState, StringMap,
};
use bigfleet_libvirt_proto::v1alpha1 as pb;

use crate::history::{Entry, Event};
use crate::world::World;

/// Checks every event the history holds that no checker has read yet, in order. Called on
/// every answer leaving the provider, at every restart, at quiescence and when the run ends.
pub fn read_history(world: &World) {
    let entries = world.history().take_unread();
    for Entry { at, event } in entries {
        match event {
            Event::Durable(steps) => durable::on_commit(world, at, &steps),
            Event::HostEffect { machine, domains } => {
                hosts::on_effect(world, at, &machine, domains);
            }
            Event::HostLoad {
                host,
                connection,
                in_flight,
            } => hosts::on_load(world, at, host, connection, in_flight),
            Event::Span(seen) => spans::on_span(world, at, &seen),
        }
    }
}

/// The metadata key every simulated Configure carries with its cluster id, so a record's
/// binding can be checked for consistency wherever it is seen.
pub const CLUSTER_KEY: &str = "bigfleet.lucy.sh/assigned-group";

/// The invariants, each with the name a failure report uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariant {
    /// A stale token is never applied.
    StaleTokenApplied,
    /// FAILED_PRECONDITION means a stale token and nothing else.
    FreshTokenFenced,
    /// Never more than one domain per machine.
    DomainsPerMachine,
    /// Every accepted transition ends in its target or FAILED with a non-empty last_error.
    TransitionOutcome,
    /// No answer reflects state a crash could take back.
    DurableBeforeAnswer,
    /// No acknowledged mutation is lost across restarts.
    AckedSurvivesRestart,
    /// `cluster` and `shard_metadata` are present exactly while bound.
    Binding,
    /// Revisions only grow and since_revision never misses a change.
    Revisions,
    /// The provider never has more requests in flight on a host than its budget, nor than
    /// the host's `max_client_requests`.
    HostBudget,
    /// After quiescence no domain exists that the state does not know about.
    OrphanDomain,
    /// No accepted transition stays transitional past its deadline and the sweep's grace.
    TransitionDeadline,
    /// Every span a transition's work opens is in the trace of the call that accepted it.
    SpansInCallTrace,
    /// After faults stop, the provider converges within the budget.
    Convergence,
    /// The provider never panics (its own assertions hold).
    Panic,
}

impl Invariant {
    /// The short name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::StaleTokenApplied => "stale-token-applied",
            Self::FreshTokenFenced => "fresh-token-fenced",
            Self::DomainsPerMachine => "one-domain-per-machine",
            Self::TransitionOutcome => "transition-outcome",
            Self::DurableBeforeAnswer => "durable-before-answer",
            Self::AckedSurvivesRestart => "acked-survives-restart",
            Self::Binding => "binding-while-bound",
            Self::Revisions => "revisions",
            Self::HostBudget => "host-budget",
            Self::OrphanDomain => "no-orphan-domain",
            Self::TransitionDeadline => "transition-deadline",
            Self::SpansInCallTrace => "spans-in-call-trace",
            Self::Convergence => "convergence",
            Self::Panic => "no-panic",
        }
    }

    /// What it promises.
    #[must_use]
    pub fn promise(self) -> &'static str {
        match self {
            Self::StaleTokenApplied => "a stale fencing token is never applied",
            Self::FreshTokenFenced => "FAILED_PRECONDITION is returned for stale tokens only",
            Self::DomainsPerMachine => "never more than one domain per machine",
            Self::TransitionOutcome => {
                "every accepted transition ends in its target or FAILED with a last_error"
            }
            Self::DurableBeforeAnswer => "no answer reflects state a crash could take back",
            Self::AckedSurvivesRestart => "no acknowledged mutation is lost across restarts",
            Self::Binding => "cluster and shard_metadata are present exactly while bound",
            Self::Revisions => "revisions only grow and since_revision never misses a change",
            Self::HostBudget => {
                "the provider keeps within its host budget and libvirtd's max_client_requests"
            }
            Self::OrphanDomain => "after quiescence no domain exists that the state does not know",
            Self::TransitionDeadline => {
                "no accepted transition outlives its deadline by more than the sweep's grace"
            }
            Self::SpansInCallTrace => {
                "every span a transition's work opens is under the accepting call's rpc span"
            }
            Self::Convergence => "after faults stop the provider converges within the budget",
            Self::Panic => "the provider never panics (its own assertions hold)",
        }
    }
}

/// One broken invariant.
#[derive(Clone, Debug)]
pub struct Violation {
    /// Which.
    pub invariant: Invariant,
    /// When (simulated time since the start).
    pub at: Duration,
    /// What was seen.
    pub detail: String,
}

/// Every violation of a run (the first few kept in full).
#[derive(Clone, Debug, Default)]
pub struct Violations {
    /// The first violations, in order.
    pub first: Vec<Violation>,
    /// How many of each.
    pub counts: BTreeMap<Invariant, u64>,
}

impl Violations {
    const KEPT: usize = 20;

    /// Records one.
    pub fn push(&mut self, invariant: Invariant, at: Duration, detail: String) {
        *self.counts.entry(invariant).or_default() += 1;
        if self.first.len() < Self::KEPT {
            self.first.push(Violation {
                invariant,
                at,
                detail,
            });
        }
    }

    /// Whether the run was clean.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

/// (shard id, machine id).
pub type FenceScope = (String, String);

/// What clients were told, as far as the checkers can know.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// Highest token per (shard, machine) that got a definite non-fenced answer.
    pub acked_marks: BTreeMap<FenceScope, FenceMark>,
    /// Every token sent per (shard, machine).
    pub sent: BTreeMap<FenceScope, BTreeSet<FenceMark>>,
    /// Highest operation number acknowledged per (machine, kind).
    pub acked_ops: BTreeMap<(String, Kind), u64>,
    /// Highest List revision answered.
    pub max_revision: i64,
    /// The machines whose durable record is transitional, with the simulated time the
    /// transition became durable and its state (`deadlines`).
    pub in_flight: BTreeMap<MachineId, (Duration, MachineState)>,
}

/// The `n` of an operation id `op-n`.
#[must_use]
pub fn op_number(id: &str) -> Option<u64> {
    id.rsplit_once('-').and_then(|(_, n)| n.parse().ok())
}

/// A wire machine as a domain record, for the shape and binding rules.
#[must_use]
pub fn from_wire(m: &pb::Machine) -> Option<Machine> {
    let map = |r: &Option<pb::Resources>| -> StringMap {
        r.as_ref()
            .map(|r| {
                r.resources
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    Some(Machine {
        id: MachineId::new(m.id.clone()).ok()?,
        state: MachineState::from_wire(m.state)?,
        host: m.host.as_ref().map(|h| HostRef {
            provider: h.provider.clone(),
            reference: h.r#ref.clone(),
        }),
        instance_type: m.instance_type.clone(),
        zone: m.zone.clone(),
        capacity_type: CapacityType::from_wire(m.capacity_type),
        price_per_hour: m.price_per_hour,
        interruption_probability: m.interruption_probability,
        resources: map(&m.resources).into(),
        allocatable: map(&m.allocatable).into(),
        labels: m
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        last_error: m.last_error.clone(),
        cluster: m.cluster.clone(),
        shard_metadata: m
            .shard_metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        encoded: Default::default(),
    })
}

/// Whether the state holds a cluster binding.
#[must_use]
pub fn bound_state(state: MachineState) -> bool {
    matches!(
        state,
        MachineState::Configuring | MachineState::Configured | MachineState::Draining
    )
}

/// How a record breaks the shape its state implies or the "bound exactly while bound"
/// rule, if it does.
#[must_use]
pub fn binding_problem(m: &Machine) -> Option<String> {
    if let Some(problem) = m.shape_violation() {
        return Some(problem);
    }
    let has_cluster = !m.cluster.is_empty();
    let has_metadata = !m.shard_metadata.is_empty();
    let consistent = m.shard_metadata.get(CLUSTER_KEY) == Some(&m.cluster);
    let ok = match m.state {
        s if bound_state(s) => has_cluster && consistent,
        // A failed Configure or Drain keeps its binding; other failures have none.
        MachineState::Failed => has_cluster == has_metadata && (!has_cluster || consistent),
        _ => !has_cluster && !has_metadata,
    };
    (!ok).then(|| {
        format!(
            "machine {} is {} with cluster {:?} and shard_metadata {:?}",
            m.id, m.state, m.cluster, m.shard_metadata
        )
    })
}
