//! The verdict of a run: the invariants the checkers hold the provider to, each with the
//! name a failure report uses, and the violations found. The checkers (`checkers`) find
//! them; the runner prints them.

use std::collections::BTreeMap;
use std::time::Duration;

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
    /// A host that is not stalled answers a lone call in its usual time: a stall holds up
    /// no other host, and a stalled host serves again once it resumes.
    HostsKeepServing,
    /// After quiescence no domain exists that the state does not know about.
    OrphanDomain,
    /// After quiescence every volume belongs to a domain on its host (a failed Create rolls
    /// back every volume it made, and Delete removes them all).
    VolumeWithoutDomain,
    /// No configuration holding a join blob outlives its machine's Configured → Idle.
    BlobAfterIdle,
    /// After quiescence no host holds the domain of a machine whose Delete failed.
    FailedDeleteLeftover,
    /// No dedicated CPU or passthrough device is ever held by two machines, and no claim
    /// outlives the Create that made it unless its domain holds it.
    ClaimsHeldOnce,
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
            Self::HostsKeepServing => "hosts-keep-serving",
            Self::OrphanDomain => "no-orphan-domain",
            Self::VolumeWithoutDomain => "no-volume-without-domain",
            Self::BlobAfterIdle => "no-blob-after-idle",
            Self::FailedDeleteLeftover => "nothing-after-failed-delete",
            Self::ClaimsHeldOnce => "claims-held-once",
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
            Self::HostsKeepServing => {
                "a stalled host holds up no other host and serves again once it resumes"
            }
            Self::OrphanDomain => "after quiescence no domain exists that the state does not know",
            Self::VolumeWithoutDomain => "after quiescence every volume belongs to a domain",
            Self::BlobAfterIdle => {
                "no configuration holding a join blob outlives its machine's Configured -> Idle"
            }
            Self::FailedDeleteLeftover => {
                "after quiescence no host holds the domain of a machine whose Delete failed"
            }
            Self::ClaimsHeldOnce => {
                "no CPU or device is held by two machines, and a rolled-back claim is released"
            }
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
