//! Random command sequences for the property tests, and a harness that runs them against a
//! core while folding every change set into a store snapshot, as the runtime does.

use std::collections::BTreeMap;

use bigfleet_libvirt_domain::{
    ChangeSet, Completion, Core, Dispatch, FenceToken, Kind, MachineId, MachineState, Mutation,
    OperationId, Snapshot, Timestamp, TransitionResult,
};
use proptest::prelude::*;

use super::{T0, id, policy, request, speculative, success, token, unfenced};

/// Machines `m-000..m-002` are seeded; `m-003` only exists once a reconcile adopts it.
pub const MACHINES: usize = 4;
const SEEDED: usize = 3;

/// How a completion ends.
#[derive(Clone, Copy, Debug)]
pub enum Finish {
    /// The kind's success result, in time.
    Success,
    /// The kind's success result, at the deadline (must count as a timeout).
    LateSuccess,
    /// A backend error.
    Fail,
    /// The deadline fired.
    Timeout,
    /// A completion with an operation id nobody minted (must be dropped).
    Stale,
}

/// One command of a random sequence.
#[derive(Clone, Debug)]
pub enum Step {
    /// A mutating call.
    Mutate {
        machine: usize,
        kind: Kind,
        token: FenceToken,
    },
    /// The call that leaves the machine's current stable state (Delete instead of Configure
    /// from Idle when `delete`); Create for any other state.
    Advance {
        machine: usize,
        delete: bool,
        token: FenceToken,
    },
    /// The end of one transition: the `pick`-th still in flight, or (when none is) a
    /// completion for machine `pick` that nobody is waiting for.
    Complete { pick: usize, finish: Finish },
    /// A Describe pass: every known slot priced at `cents`, plus `m-003` when `adopt`.
    Reconcile { cents: u8, adopt: bool },
    /// A provider restart from the store.
    Restart,
}

fn kind() -> impl Strategy<Value = Kind> {
    prop::sample::select(Kind::ALL.to_vec())
}

fn fence_token() -> impl Strategy<Value = FenceToken> {
    prop_oneof![
        2 => Just(unfenced()),
        3 => (prop::sample::select(vec!["s-a", "s-b", ""]), -2i64..4, -3i64..6)
            .prop_map(|(shard, epoch, seq)| token(shard, epoch, seq)),
    ]
}

fn finish() -> impl Strategy<Value = Finish> {
    prop_oneof![
        16 => Just(Finish::Success),
        1 => Just(Finish::LateSuccess),
        2 => Just(Finish::Fail),
        1 => Just(Finish::Timeout),
        1 => Just(Finish::Stale),
    ]
}

/// One random step.
pub fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0..MACHINES, kind(), fence_token())
            .prop_map(|(machine, kind, token)| Step::Mutate { machine, kind, token }),
        12 => (0..MACHINES, any::<bool>(), fence_token())
            .prop_map(|(machine, delete, token)| Step::Advance { machine, delete, token }),
        16 => (0..MACHINES, finish()).prop_map(|(pick, finish)| Step::Complete { pick, finish }),
        2 => (40u8..60, any::<bool>()).prop_map(|(cents, adopt)| Step::Reconcile { cents, adopt }),
        1 => Just(Step::Restart),
    ]
}

/// A random sequence of up to `max` steps.
pub fn steps(max: usize) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(step(), 1..max)
}

/// What one step did, for the laws to check afterwards.
#[derive(Clone, Debug)]
pub struct Record {
    /// The revision before the step (a cursor a poller could hold).
    pub before: i64,
    /// The revision after the step.
    pub after: i64,
    /// The change set the step produced.
    pub changes: Option<ChangeSet>,
    /// Whether the step was a restart.
    pub restart: bool,
}

/// A core plus the store it persists to.
pub struct Harness {
    /// The decision core.
    pub core: Core,
    /// Every change set applied in order, starting from the seed.
    pub store: Snapshot,
    /// The last dispatch per machine id (kept across restarts: those must be dropped).
    pub dispatched: BTreeMap<String, Dispatch>,
    /// One entry per step run.
    pub log: Vec<Record>,
}

impl Harness {
    /// Seeds `m-000..m-002`.
    pub fn new() -> Self {
        let (core, changes) =
            Core::seed(policy(), (0..SEEDED).map(speculative).collect()).expect("seed is valid");
        let mut store = Snapshot::default();
        store.apply(&changes);
        Self {
            core,
            store,
            dispatched: BTreeMap::new(),
            log: Vec::new(),
        }
    }

    /// Runs one step, persists its change set and logs it.
    pub fn run(&mut self, step: &Step) -> Option<ChangeSet> {
        let before = self.core.revision();
        let changes = match step {
            Step::Mutate {
                machine,
                kind,
                token,
            } => self.mutate(*machine, *kind, token.clone()),
            Step::Advance {
                machine,
                delete,
                token,
            } => {
                let kind = self.next_kind(*machine, *delete);
                self.mutate(*machine, kind, token.clone())
            }
            Step::Complete { pick, finish } => self.complete(*pick, *finish),
            Step::Reconcile { cents, adopt } => self.reconcile(*cents, *adopt),
            Step::Restart => self.restart(),
        };
        if let Some(changes) = &changes {
            self.store.apply(changes);
        }
        let restart = matches!(step, Step::Restart);
        let after = self.core.revision();
        self.log.push(Record {
            before,
            after,
            changes: changes.clone(),
            restart,
        });
        changes
    }

    fn mutate(&mut self, machine: usize, kind: Kind, token: FenceToken) -> Option<ChangeSet> {
        let mutation = Mutation {
            machine_id: id(machine),
            token,
            request: request(kind),
        };
        let decision = self.core.mutate(mutation, T0);
        if let Ok(ack) = &decision.outcome {
            if let Some(dispatch) = &ack.dispatch {
                self.dispatched.insert(id(machine), dispatch.clone());
            }
        }
        decision.changes
    }

    fn next_kind(&self, machine: usize, delete: bool) -> Kind {
        match self.core.get(&id(machine)).map(|m| m.state) {
            Some(MachineState::Idle) if delete => Kind::Delete,
            Some(MachineState::Idle) => Kind::Configure,
            Some(MachineState::Configured) => Kind::Drain,
            _ => Kind::Create,
        }
    }

    fn complete(&mut self, pick: usize, finish: Finish) -> Option<ChangeSet> {
        let live: Vec<&Dispatch> = self
            .dispatched
            .values()
            .filter(|d| {
                let current = self.core.get(d.machine.id.as_str()).map(|m| m.state);
                current == Some(d.kind.transitional())
            })
            .collect();
        let (completion, now) = match live.get(pick % live.len().max(1)) {
            Some(d) => completion(d, finish),
            None => match self.dispatched.get(&id(pick)) {
                Some(d) => completion(d, finish),
                None => (orphan(pick), T0),
            },
        };
        self.core.complete(completion, now).1
    }

    fn reconcile(&mut self, cents: u8, adopt: bool) -> Option<ChangeSet> {
        let count = if adopt { MACHINES } else { SEEDED };
        let described = (0..count)
            .map(|i| {
                let mut m = speculative(i);
                m.price_per_hour = f64::from(cents) / 100.0;
                m
            })
            .collect();
        self.core.reconcile(described).changes
    }

    fn restart(&mut self) -> Option<ChangeSet> {
        let (core, changes) = Core::restore(policy(), self.store.clone()).expect("store restores");
        self.core = core;
        changes
    }
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

fn completion(dispatch: &Dispatch, finish: Finish) -> (Completion, Timestamp) {
    let in_time = Timestamp(dispatch.deadline.0 - 1);
    let (result, now, op) = match finish {
        Finish::Success => (
            success(dispatch.kind),
            in_time,
            dispatch.operation_id.clone(),
        ),
        Finish::LateSuccess => (
            success(dispatch.kind),
            dispatch.deadline,
            dispatch.operation_id.clone(),
        ),
        Finish::Fail => (
            TransitionResult::Failed("boom".to_owned()),
            in_time,
            dispatch.operation_id.clone(),
        ),
        Finish::Timeout => (
            TransitionResult::TimedOut,
            dispatch.deadline,
            dispatch.operation_id.clone(),
        ),
        Finish::Stale => (
            success(dispatch.kind),
            in_time,
            OperationId::from_stored("op-0".to_owned()),
        ),
    };
    let machine_id = dispatch.machine.id.clone();
    (
        Completion {
            machine_id,
            kind: dispatch.kind,
            operation_id: op,
            result,
        },
        now,
    )
}

fn orphan(machine: usize) -> Completion {
    Completion {
        machine_id: MachineId::new(id(machine)).expect("non-empty"),
        kind: Kind::Create,
        operation_id: OperationId::from_stored("op-0".to_owned()),
        result: success(Kind::Create),
    }
}
