//! The `StateStore` contract suites: reopen (everything committed is loaded, in commit
//! order), many commits in flight at once, and the failure path (a refused commit is never
//! loaded, and later change sets are refused until `resume`).

use std::future::Future;
use std::sync::Arc;

use bigfleet_libvirt_domain::{
    ChangeSet, Completion, Core, Dispatch, FenceToken, HostRef, Kind, Machine, MachineState,
    MutateRequest, Mutation, Policy, Snapshot, StringMap, Timestamp, TransitionResult,
};

use super::{normalise, speculative};
use crate::store::StateStore;

/// How a test breaks and heals the disk under a store whose commits can fail.
pub struct DiskFaults {
    /// Makes the next commit fail (fill the filesystem, inject an fsync error, …). Commits
    /// of change sets over a few MiB must fail from then on.
    pub break_disk: Box<dyn Fn() + Send + Sync>,
    /// Gives the disk back (grow the filesystem, stop injecting).
    pub heal_disk: Box<dyn Fn() + Send + Sync>,
    /// Whether `resume` ends the refusal (true), or the store fails for good and only a new
    /// process (a reopen) commits again (false): the port allows both.
    pub resumes: bool,
}

/// Change sets a core decides for `machines` Speculative slots under a stream of mutations
/// from three shards (accepted transitions, rejections and bare fence-mark advances), the
/// seed first. The core is returned so callers can decide more on top.
fn decisions(machines: usize, rounds: usize) -> (Core, Vec<ChangeSet>) {
    let slots = (0..machines)
        .map(|i| speculative(&format!("m-{i}")))
        .collect();
    let (mut core, seed) = Core::seed(Policy::default(), slots).expect("seed");
    let mut pending = vec![seed];
    let mut sequence = 0;
    for round in 0..rounds {
        for i in 0..machines {
            sequence += 1;
            let request = match (round + i) % 4 {
                0 => MutateRequest::Create,
                1 => MutateRequest::Configure {
                    cluster: format!("c-{i}"),
                    shard_metadata: StringMap::from([("round".to_owned(), round.to_string())]),
                },
                2 => MutateRequest::Drain {
                    grace_period_seconds: 30,
                },
                _ => MutateRequest::Delete,
            };
            let mutation = Mutation {
                machine_id: format!("m-{}", (i * 7 + round) % machines),
                token: FenceToken {
                    shard_id: format!("s-{}", sequence % 3),
                    epoch: 1,
                    sequence,
                },
                request,
            };
            let now = Timestamp(sequence as u64);
            let decision = core.mutate(mutation, now);
            pending.extend(decision.changes);
            // Most accepted transitions finish (the rest stay in flight), so records move
            // through every state and a later change set often rewrites an earlier one's.
            let dispatch = decision.outcome.ok().and_then(|ack| ack.dispatch);
            if let Some(dispatch) = dispatch.filter(|_| sequence % 5 != 0) {
                pending.extend(core.complete(finished(dispatch), now).1);
            }
        }
    }
    (core, pending)
}

/// A successful end of a dispatched transition.
fn finished(dispatch: Dispatch) -> Completion {
    let result = match dispatch.kind {
        Kind::Create => TransitionResult::Created {
            host: HostRef {
                provider: "contract".to_owned(),
                reference: format!("zone-a/{}", dispatch.machine.id),
            },
            resources: None,
            allocatable: None,
        },
        Kind::Configure => TransitionResult::Configured,
        Kind::Drain => TransitionResult::Drained,
        Kind::Delete => TransitionResult::Deleted,
    };
    Completion {
        machine_id: dispatch.machine.id.clone(),
        kind: dispatch.kind,
        operation_id: dispatch.operation_id,
        result,
    }
}

/// The in-order application of `changes` to an empty snapshot, normalised.
fn applied<'a>(changes: impl IntoIterator<Item = &'a ChangeSet>) -> Snapshot {
    let mut snapshot = Snapshot::default();
    for change in changes {
        snapshot.apply(change);
    }
    normalise(&mut snapshot);
    snapshot
}

async fn loaded<S: StateStore>(store: &S, when: &str) -> Snapshot {
    let mut snapshot = store
        .load()
        .await
        .unwrap_or_else(|e| panic!("load {when}: {e}"));
    normalise(&mut snapshot);
    snapshot
}

/// The `StateStore` contract for reopen: change sets committed in call order are what
/// `load` returns after `reopen` (a new process on the same durable state), a later change
/// set to the same record wins, `load` changes nothing, and commits made after a reopen are
/// loaded after the next one.
///
/// # Panics
/// When the store breaks its contract.
pub async fn state_store_contract<S, F, Fut>(store: S, reopen: F)
where
    S: StateStore,
    F: Fn(S) -> Fut,
    Fut: Future<Output = S>,
{
    let first = store.load().await.expect("load an empty store");
    assert!(first.is_fresh(), "a new store must load as a first boot");
    let (core, pending) = decisions(5, 4);
    assert!(
        pending.len() > 10,
        "the decisions give change sets to commit"
    );
    let settled = core.snapshot();
    assert!(
        settled
            .machines
            .iter()
            .any(|m| m.state != MachineState::Speculative),
        "the decisions leave machines in several states"
    );
    // Enqueue every change set before awaiting any: the order of calls is the commit order.
    let futures: Vec<_> = pending.iter().cloned().map(|c| store.commit(c)).collect();
    for f in futures {
        f.await.expect("commit");
    }
    let store = reopen(store).await;
    let expected = applied(&pending);
    assert_eq!(
        loaded(&store, "after reopen").await,
        expected,
        "load after a reopen must equal the in-order application of every commit"
    );
    let mut decided = core.snapshot();
    normalise(&mut decided);
    assert_eq!(expected, decided, "and that is what the core decided");
    assert_eq!(
        loaded(&store, "a second time").await,
        expected,
        "load must not modify the stored state"
    );
    // Commits after a reopen continue the same durable state.
    let mut later = ChangeSet {
        revision: expected.revision + 1,
        next_operation: expected.next_operation,
        ..ChangeSet::default()
    };
    let record = expected.machines.first().expect("a machine").clone();
    later.machines.push(Arc::new(Machine {
        labels: StringMap::from([("after".to_owned(), "reopen".to_owned())]).into(),
        ..record
    }));
    store
        .commit(later.clone())
        .await
        .expect("commit after reopen");
    let store = reopen(store).await;
    assert_eq!(
        loaded(&store, "after the second reopen").await,
        applied(pending.iter().chain([&later])),
        "a commit made after a reopen must be loaded after the next one"
    );
}

/// The `StateStore` contract for many commits in flight at once: hundreds of change sets
/// are enqueued before any is awaited (as concurrent calls do under group commit); once a
/// commit's future resolves, `load` shows at least everything up to it, always a prefix of
/// the commit order; after a reopen nothing is lost and the order is kept.
///
/// # Panics
/// When the store breaks its contract.
pub async fn state_store_concurrency_contract<S, F, Fut>(store: S, reopen: F)
where
    S: StateStore,
    F: FnOnce(S) -> Fut,
    Fut: Future<Output = S>,
{
    let (_, pending) = decisions(12, 24);
    let count = pending.len();
    assert!(count > 200, "enough change sets to overlap: {count}");
    let prefixes: Vec<Snapshot> = (0..=count).map(|n| applied(&pending[..n])).collect();
    let mut futures: Vec<_> = pending
        .iter()
        .cloned()
        .map(|c| Some(store.commit(c)))
        .collect();
    // Await a few in the middle first, out of order: each must leave a durable prefix that
    // includes it.
    for k in [count / 2, count / 3, count - 1, 0] {
        futures[k]
            .take()
            .expect("each awaited once")
            .await
            .unwrap_or_else(|e| panic!("commit {k} of {count}: {e}"));
        let now = loaded(&store, &format!("after commit {k} resolved")).await;
        let prefix = prefixes.iter().position(|p| *p == now);
        assert!(
            prefix.is_some_and(|n| n > k),
            "once commit {k} of {count} resolved, load must show a prefix of the commit \
             order that includes it (got prefix {prefix:?})"
        );
    }
    let rest = futures.into_iter().flatten();
    for (i, result) in futures::future::join_all(rest)
        .await
        .into_iter()
        .enumerate()
    {
        result.unwrap_or_else(|e| panic!("commit (remaining #{i}): {e}"));
    }
    let store = reopen(store).await;
    assert!(
        loaded(&store, "after reopen").await == prefixes[count],
        "after {count} concurrent commits and a reopen, load must equal their in-order \
         application: nothing lost, nothing reordered"
    );
}

/// A copy of `record` carrying `bytes` of shard metadata: too big for a broken disk.
fn with_payload(record: &Machine, tag: &str, bytes: usize) -> Arc<Machine> {
    Arc::new(Machine {
        shard_metadata: StringMap::from([(tag.to_owned(), "x".repeat(bytes))]),
        ..record.clone()
    })
}

/// Breaks the disk, fails a commit, and checks every later change set is refused, also
/// once the disk is healed, while load keeps answering with `base`.
async fn refuse_after_failure<S: StateStore>(store: &S, faults: &DiskFaults, base: &Snapshot) {
    let record = base.machines[0].clone();
    let refused = |tag: &str, bytes: usize, step: i64| ChangeSet {
        machines: vec![with_payload(&record, tag, bytes)],
        revision: base.revision + step,
        next_operation: base.next_operation,
        ..ChangeSet::default()
    };
    (faults.break_disk)();
    let big = refused("failed", 8 << 20, 1);
    let failed = store.commit(big).await;
    assert!(failed.is_err(), "a commit the disk cannot take must fail");
    let after = store.commit(refused("after-failure", 64, 2)).await;
    assert!(
        after.is_err(),
        "a change set committed after a failed one must be refused (it was decided on top \
         of it) until resume"
    );
    (faults.heal_disk)();
    let healed = store.commit(refused("healed-no-resume", 64, 3)).await;
    assert!(
        healed.is_err(),
        "a healed disk must not end the refusal before resume is called"
    );
    assert_eq!(
        loaded(store, "while refusing").await,
        *base,
        "load keeps answering with the durable state, which no refused change set touched"
    );
}

/// The `StateStore` contract for a failed commit: it fails (its future resolves with an
/// error, never a success), every change set committed after it is refused without being
/// applied, also once the disk is healed, until `resume`; after `resume` commits succeed
/// again (or, for a store that fails for good, only after a reopen). After a reopen the
/// refused change sets are nowhere, and everything acknowledged is there.
///
/// # Panics
/// When the store breaks its contract.
pub async fn state_store_failure_contract<S, F, Fut>(store: S, reopen: F, faults: DiskFaults)
where
    S: StateStore,
    F: Fn(S) -> Fut,
    Fut: Future<Output = S>,
{
    let (_, accepted) = decisions(4, 2);
    for change in &accepted {
        store
            .commit(change.clone())
            .await
            .expect("commit before the failure");
    }
    let base = applied(&accepted);
    let record = base.machines[0].clone();
    refuse_after_failure(&store, &faults, &base).await;
    store.resume();
    let mut fresh = ChangeSet {
        revision: base.revision + 1,
        next_operation: base.next_operation,
        ..ChangeSet::default()
    };
    fresh.machines.push(Arc::new(Machine {
        labels: StringMap::from([("after".to_owned(), "resume".to_owned())]).into(),
        ..record.clone()
    }));
    let resumed = store.commit(fresh.clone()).await;
    let mut expected = match (faults.resumes, resumed) {
        (true, Ok(())) => applied(accepted.iter().chain([&fresh])),
        (true, Err(e)) => panic!("after resume a commit on a healed disk must succeed: {e}"),
        (false, Err(_)) => base.clone(),
        (false, Ok(())) => panic!("a store that fails for good must not commit after resume"),
    };
    let store = reopen(store).await;
    assert_eq!(
        loaded(&store, "after reopen").await,
        expected,
        "after a reopen everything acknowledged is loaded and no refused change set is"
    );
    // A new process (the reopened store) commits again.
    let mut again = fresh.clone();
    again.revision = expected.revision + 1;
    store
        .commit(again.clone())
        .await
        .expect("commit after reopen");
    expected.apply(&again);
    normalise(&mut expected);
    let store = reopen(store).await;
    assert_eq!(
        loaded(&store, "after the last reopen").await,
        expected,
        "a reopened store commits again"
    );
}
