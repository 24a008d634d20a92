//! Shared builders for the domain integration tests: seeded inventories, tokens, mutations,
//! completions and a `drive` helper that walks a machine into any of the eight states through
//! the public API only.
#![allow(dead_code)]

pub mod script;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::{
    Ack, CapacityType, Completion, CompletionOutcome, Core, FenceKey, FenceToken, HostRef, Kind,
    ListQuery, Machine, MachineId, MachineState, MutateDecision, MutateError, MutateRequest,
    Mutation, OperationId, Policy, Snapshot, StringMap, Timeouts, Timestamp, TransitionResult,
};

/// The moment every test call happens at unless it says otherwise.
pub const T0: Timestamp = Timestamp(1_700_000_000_000_000_000);

/// The transition deadline the test policy uses (the certification fault lane's 2 s).
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// `T0` plus `offset`.
pub fn after(offset: Duration) -> Timestamp {
    T0.saturating_add(offset)
}

/// The test policy: Delete supported, zone required, 2 s deadlines, `op` prefix.
pub fn policy() -> Policy {
    Policy {
        timeouts: Timeouts::uniform(TIMEOUT),
        ..Policy::default()
    }
}

/// The id of test machine `i` (`m-000`, `m-001`, …).
pub fn id(i: usize) -> String {
    format!("m-{i:03}")
}

/// `id(i)` as a [`MachineId`].
pub fn mid(i: usize) -> MachineId {
    MachineId::new(id(i)).expect("test ids are non-empty")
}

/// A string map from literal pairs.
pub fn map(pairs: &[(&str, &str)]) -> StringMap {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The host a successful Create of machine `i` lands on.
pub fn host(i: usize) -> HostRef {
    HostRef {
        provider: "libvirt-test".to_owned(),
        reference: format!("z-a/dom-{i:03}"),
    }
}

/// A well-formed Speculative slot: `kvm.small` in `z-a`, on-demand at 0.5/h.
pub fn speculative(i: usize) -> Machine {
    Machine {
        id: mid(i),
        state: MachineState::Speculative,
        host: None,
        instance_type: "kvm.small".to_owned(),
        zone: "z-a".to_owned(),
        capacity_type: CapacityType::OnDemand,
        price_per_hour: 0.5,
        interruption_probability: 0.0,
        resources: map(&[("cpu", "2"), ("memory", "4Gi")]).into(),
        allocatable: map(&[("cpu", "2"), ("memory", "4Gi")]).into(),
        labels: StringMap::new().into(),
        last_error: String::new(),
        cluster: String::new(),
        shard_metadata: StringMap::new(),
        encoded: Default::default(),
    }
}

/// A well-formed machine described as already Idle on `host(i)` (no Create history).
pub fn idle(i: usize) -> Machine {
    Machine {
        state: MachineState::Idle,
        host: Some(host(i)),
        ..speculative(i)
    }
}

/// A core seeded with `n` Speculative machines `m-000..`.
pub fn seeded(n: usize) -> Core {
    seeded_with(policy(), (0..n).map(speculative).collect())
}

/// A core seeded with these records under `policy`.
pub fn seeded_with(policy: Policy, machines: Vec<Machine>) -> Core {
    Core::seed(policy, machines).expect("test seed is valid").0
}

/// The all-zero token that bypasses fencing.
pub fn unfenced() -> FenceToken {
    FenceToken::default()
}

/// A fencing token.
pub fn token(shard: &str, epoch: i64, sequence: i64) -> FenceToken {
    FenceToken {
        shard_id: shard.to_owned(),
        epoch,
        sequence,
    }
}

/// The fence key for (shard, machine id).
pub fn key(shard: &str, machine: &str) -> FenceKey {
    FenceKey {
        shard_id: shard.to_owned(),
        machine_id: machine.to_owned(),
    }
}

/// The default request for `kind` (Configure binds `c-1` with `{k: v}`, Drain grants 30 s).
pub fn request(kind: Kind) -> MutateRequest {
    match kind {
        Kind::Create => MutateRequest::Create,
        Kind::Configure => MutateRequest::Configure {
            cluster: "c-1".to_owned(),
            shard_metadata: map(&[("k", "v")]),
        },
        Kind::Drain => MutateRequest::Drain {
            grace_period_seconds: 30,
        },
        Kind::Delete => MutateRequest::Delete,
    }
}

/// A mutation of `kind` on `machine` with `token`.
pub fn mutation(machine: &str, kind: Kind, token: FenceToken) -> Mutation {
    Mutation {
        machine_id: machine.to_owned(),
        token,
        request: request(kind),
    }
}

/// An unfenced mutation of `kind` on `machine`.
pub fn plain(machine: &str, kind: Kind) -> Mutation {
    mutation(machine, kind, unfenced())
}

/// An unfenced Configure with an explicit binding.
pub fn configure(machine: &str, cluster: &str, shard_metadata: StringMap) -> Mutation {
    let request = MutateRequest::Configure {
        cluster: cluster.to_owned(),
        shard_metadata,
    };
    Mutation {
        machine_id: machine.to_owned(),
        token: unfenced(),
        request,
    }
}

/// Decides `mutation` at `T0`.
pub fn call(core: &mut Core, mutation: Mutation) -> MutateDecision {
    core.mutate(mutation, T0)
}

/// Decides `mutation` and insists it was accepted as a fresh transition.
pub fn accept(core: &mut Core, mutation: Mutation) -> Ack {
    let decision = call(core, mutation);
    let ack = decision.outcome.expect("call accepted");
    assert!(
        ack.dispatch.is_some(),
        "expected a fresh transition, got an idempotent ack"
    );
    ack
}

/// Decides `mutation` and returns its rejection.
pub fn reject(core: &mut Core, mutation: Mutation) -> MutateError {
    call(core, mutation).outcome.expect_err("call rejected")
}

/// Decides `mutation` and returns the ack's operation id.
pub fn op_of(core: &mut Core, mutation: Mutation) -> String {
    call(core, mutation)
        .outcome
        .expect("call succeeded")
        .operation_id
        .to_string()
}

/// The success result for `kind` (Create lands on `host(0)` with no new resource maps).
pub fn success(kind: Kind) -> TransitionResult {
    match kind {
        Kind::Create => TransitionResult::Created {
            host: host(0),
            resources: None,
            allocatable: None,
        },
        Kind::Configure => TransitionResult::Configured,
        Kind::Drain => TransitionResult::Drained,
        Kind::Delete => TransitionResult::Deleted,
    }
}

/// The completion of the transition `ack` dispatched.
pub fn completion_for(ack: &Ack, result: TransitionResult) -> Completion {
    let dispatch = ack.dispatch.as_ref().expect("ack dispatched a transition");
    Completion {
        machine_id: dispatch.machine.id.clone(),
        kind: dispatch.kind,
        operation_id: dispatch.operation_id.clone(),
        result,
    }
}

/// Completes the transition `ack` dispatched, one millisecond after it was dispatched.
pub fn finish(core: &mut Core, ack: &Ack, result: TransitionResult) -> CompletionOutcome {
    core.complete(completion_for(ack, result), after(Duration::from_millis(1)))
        .0
}

/// Completes the transition `ack` dispatched and returns the settled machine.
pub fn settle(core: &mut Core, ack: &Ack, result: TransitionResult) -> Arc<Machine> {
    match finish(core, ack, result) {
        CompletionOutcome::Applied(machine) => machine,
        CompletionOutcome::Dropped => panic!("completion was dropped"),
    }
}

/// Walks a Speculative machine into `target` with unfenced calls, returning the last ack
/// (`None` for Speculative). Failed is reached through a failed Create.
pub fn drive(core: &mut Core, machine: &str, target: MachineState) -> Option<Ack> {
    use MachineState as S;
    let step = |core: &mut Core, kind: Kind| accept(core, plain(machine, kind));
    let last = match target {
        S::Speculative => return None,
        S::Creating => step(core, Kind::Create),
        S::Failed => {
            let ack = step(core, Kind::Create);
            settle(core, &ack, TransitionResult::Failed("boom".to_owned()));
            ack
        }
        S::Idle | S::Configuring | S::Configured | S::Draining | S::Deleting => {
            let ack = step(core, Kind::Create);
            settle(core, &ack, success(Kind::Create));
            match target {
                S::Idle => ack,
                S::Deleting => step(core, Kind::Delete),
                _ => drive_bound(core, machine, target),
            }
        }
    };
    assert_eq!(
        state(core, machine),
        target,
        "drive reached the wrong state"
    );
    Some(last)
}

fn drive_bound(core: &mut Core, machine: &str, target: MachineState) -> Ack {
    let ack = accept(core, plain(machine, Kind::Configure));
    if target == MachineState::Configuring {
        return ack;
    }
    settle(core, &ack, success(Kind::Configure));
    if target == MachineState::Configured {
        return ack;
    }
    accept(core, plain(machine, Kind::Drain))
}

/// The current state of `machine`.
pub fn state(core: &Core, machine: &str) -> MachineState {
    core.get(machine).expect("machine exists").state
}

/// The current record of `machine`.
pub fn get(core: &Core, machine: &str) -> Machine {
    Machine::clone(&core.get(machine).expect("machine exists"))
}

/// The ids of the machines a List returns, as a set.
pub fn listed(core: &Core, query: &ListQuery) -> BTreeSet<String> {
    core.list(query)
        .machines
        .iter()
        .map(|m| m.id.to_string())
        .collect()
}

/// A delta query since `cursor`.
pub fn since(cursor: i64) -> ListQuery {
    ListQuery {
        since_revision: Some(cursor),
        ..ListQuery::default()
    }
}

/// The operation id recorded for (machine, kind), as a string.
pub fn recorded(core: &Core, machine: &str, kind: Kind) -> Option<String> {
    core.operation(&MachineId::new(machine).ok()?, kind)
        .map(OperationId::to_string)
}

/// Metadata the shard might send: a NUL byte, an empty value, unicode and unknown keys.
pub fn awkward_metadata() -> StringMap {
    map(&[
        ("bigfleet.lucy.sh/assigned-priority", "100"),
        ("bigfleet.lucy.sh/assigned-group", "g\u{0}with-nul"),
        ("empty", ""),
        ("节点/区域", "東京 🌸 ü\u{1f}"),
        ("x-shard/unknown", "  spaced  "),
    ])
}

/// A snapshot with every collection sorted, so stores and cores compare structurally.
pub fn normalized(mut snapshot: Snapshot) -> Snapshot {
    snapshot.machines.sort_by(|a, b| a.id.cmp(&b.id));
    snapshot.fences.sort_by(|a, b| a.0.cmp(&b.0));
    snapshot
        .operations
        .sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    snapshot
}
