//! Property laws over random command sequences (mutations with random tokens, completions
//! on time / late / failed / stale, reconciles and restarts), plus model-based fence tests
//! in the style of certification B1201 and B1204.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use bigfleet_libvirt_domain::{Ack, Core, FenceKey, FenceMark, Kind, MachineState, MutateError};
use common::script::{Finish, Harness, MACHINES, Step, steps};
use common::*;
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    }
}

fn marks(core: &Core) -> BTreeMap<FenceKey, FenceMark> {
    core.snapshot().fences.into_iter().collect()
}

proptest! {
    #![proptest_config(config())]

    /// The store contract: folding every change set into a snapshot, in order, reproduces
    /// `core.snapshot()` after every step, and every persisted record is in shape.
    #[test]
    fn applying_change_sets_reproduces_the_snapshot(script in steps(60)) {
        let mut harness = Harness::new();
        for step in &script {
            harness.run(step);
            let core = normalized(harness.core.snapshot());
            prop_assert_eq!(normalized(harness.store.clone()), core.clone(), "after {:?}", step);
            for machine in &core.machines {
                prop_assert_eq!(machine.shape_violation(), None);
            }
        }
    }

    /// Every step bumps the revision exactly once per record it persists, so fence-only
    /// advances, retries, rejections and dropped completions never move it.
    #[test]
    fn revision_moves_once_per_persisted_record(script in steps(60)) {
        let mut harness = Harness::new();
        for step in &script {
            let changes = harness.run(step);
            let record = harness.log.last().expect("logged");
            let persisted = changes.as_ref().map_or(0, |c| c.machines.len());
            prop_assert_eq!(record.after - record.before, i64::try_from(persisted).unwrap());
            if let Some(changes) = changes {
                prop_assert_eq!(changes.revision, record.after);
            }
        }
    }

    /// Fence marks never decrease and never disappear, whatever happens (restarts included).
    #[test]
    fn fence_marks_never_decrease(script in steps(60)) {
        let mut harness = Harness::new();
        let mut seen = marks(&harness.core);
        for step in &script {
            harness.run(step);
            let now = marks(&harness.core);
            for (key, old) in &seen {
                let new = now.get(key);
                prop_assert!(new.is_some_and(|n| n >= old), "{:?}: {:?} -> {:?}", key, old, new);
            }
            seen = now;
        }
    }

    /// A delta from any cursor a poller held never misses a machine modified after it; without
    /// an intervening restart it returns exactly those machines.
    #[test]
    fn since_revision_never_misses_a_change(script in steps(50)) {
        let mut harness = Harness::new();
        for step in &script {
            harness.run(step);
        }
        let log = &harness.log;
        for (i, record) in log.iter().enumerate() {
            let later = &log[i..];
            let changed: BTreeSet<String> = later
                .iter()
                .filter_map(|r| r.changes.as_ref())
                .flat_map(|c| c.machines.iter().map(|m| m.id.to_string()))
                .collect();
            let page = harness.core.list(&since(record.before)).machines;
            let delta: BTreeSet<String> = page.iter().map(|m| m.id.to_string()).collect();
            prop_assert_eq!(page.len(), delta.len(), "a delta lists each machine once");
            prop_assert!(changed.is_subset(&delta), "cursor {}: {:?} ⊄ {:?}", record.before, changed, delta);
            if !later.iter().any(|r| r.restart) {
                prop_assert_eq!(&delta, &changed, "cursor {}", record.before);
            }
        }
    }

    /// Repeating a call that succeeded is the same as making it once: same op id, no new
    /// dispatch, no new revision, and nothing persisted but a fresher fence mark.
    #[test]
    fn a_repeated_successful_call_equals_one_call(
        script in steps(40), machine in 0..MACHINES, kind in prop::sample::select(Kind::ALL.to_vec()),
    ) {
        let mut harness = Harness::new();
        for step in &script {
            harness.run(step);
        }
        let core = &mut harness.core;
        let first = call(core, mutation(&id(machine), kind, token("law", 1, 1)));
        let after_first = core.snapshot();
        let second = call(core, mutation(&id(machine), kind, token("law", 1, 2)));
        match (&first.outcome, &second.outcome) {
            (Ok(a), Ok(b)) => {
                prop_assert_eq!(&a.operation_id, &b.operation_id);
                prop_assert!(b.dispatch.is_none());
                prop_assert_eq!(&a.machine.state, &b.machine.state);
            }
            (Err(a), Err(b)) => prop_assert_eq!(std::mem::discriminant(a), std::mem::discriminant(b)),
            other => prop_assert!(false, "first and second disagree: {:?}", other),
        }
        let changes = second.changes.expect("the fresher mark is persisted");
        prop_assert!(changes.machines.is_empty() && changes.operations.is_empty());
        let mut after_second = core.snapshot();
        after_second.fences = after_first.fences.clone();
        prop_assert_eq!(normalized(after_second), normalized(after_first));
    }
}

/// The B1201 token generator: one of six branches around the current mark.
fn b1201_next(mark: Option<(i64, i64)>, branch: u8, a: i64, b: i64) -> (i64, i64) {
    let Some((e, s)) = mark else {
        return (1 + a.rem_euclid(3), 1 + b.rem_euclid(3));
    };
    let (e, s) = match branch % 6 {
        0 => (e, s),
        1 => (e, s + b.rem_euclid(5) - 2),
        2 => (e + a.rem_euclid(3) - 1, s + b.rem_euclid(5) - 2),
        3 => (e + 1, b.rem_euclid(3)),
        4 => (e, s + 1 + b.rem_euclid(3)),
        _ => (1 + a.rem_euclid(6), b.rem_euclid(8)),
    };
    if e <= 0 && s <= 0 { (e, 1) } else { (e, s) }
}

fn fenced(outcome: &Result<Ack, MutateError>) -> bool {
    matches!(outcome, Err(MutateError::Fenced { .. }))
}

proptest! {
    #![proptest_config(config())]

    /// B1201: one (shard, machine), a random token stream around the mark (negative
    /// sequences included), checked against a running-max oracle at every step.
    #[test]
    fn b1201_fence_matches_a_running_max_oracle(
        draws in prop::collection::vec((any::<u8>(), any::<i64>(), any::<i64>()), 240),
    ) {
        let mut core = seeded(1);
        let mut oracle: Option<(i64, i64)> = None;
        for (step, (branch, a, b)) in draws.into_iter().enumerate() {
            let (e, s) = b1201_next(oracle, branch, a, b);
            let newer = oracle.is_none_or(|m| (e, s) > m);
            let decision = call(&mut core, mutation(&id(0), Kind::Create, token("b1201", e, s)));
            prop_assert_eq!(!fenced(&decision.outcome), newer, "step {}: ({}, {}) vs {:?}", step, e, s, oracle);
            if newer {
                oracle = Some((e, s));
            }
            let mark = core.fence_mark(&key("b1201", &id(0))).map(|m| (m.epoch, m.sequence));
            prop_assert_eq!(mark, oracle);
        }
    }

    /// B1204: several shards interleaved on shared machines, one oracle mark per pair; the
    /// only rejections are fencing ones, and a brand-new shard is always accepted.
    #[test]
    fn b1204_interleaved_shards_match_per_pair_oracles(
        draws in prop::collection::vec((0..3usize, 0..4usize, any::<u8>(), -1i64..=1, -1i64..=1), 200),
    ) {
        let mut core = seeded(4);
        let mut oracle: BTreeMap<(usize, usize), (i64, i64)> = BTreeMap::new();
        for (shard, machine, branch, de, ds) in draws {
            let (e, s) = match oracle.get(&(shard, machine)) {
                None => (1 + de.abs(), 1 + ds.abs()),
                Some(&(e, s)) => match branch % 4 {
                    0 => (e, s),
                    1 => (e, s + ds),
                    2 => (e + 1, ds.abs()),
                    _ => (e + de, s + ds),
                },
            };
            let (e, s) = if e <= 0 && s <= 0 { (e, 1) } else { (e, s) };
            let newer = oracle.get(&(shard, machine)).is_none_or(|m| (e, s) > *m);
            let shard_id = format!("shard-{shard}");
            let decision = call(&mut core, mutation(&id(machine), Kind::Create, token(&shard_id, e, s)));
            prop_assert_eq!(!fenced(&decision.outcome), newer, "{} on {}: ({}, {})", shard_id, machine, e, s);
            if let Err(error) = &decision.outcome {
                prop_assert!(matches!(error, MutateError::Fenced { .. }), "{:?}", error);
            }
            if newer {
                oracle.insert((shard, machine), (e, s));
            }
        }
        let decision = call(&mut core, mutation(&id(0), Kind::Create, token("brand-new", 1, 1)));
        prop_assert!(decision.outcome.is_ok());
    }
}

#[test]
fn b1201_generator_can_produce_negative_sequences() {
    assert_eq!(b1201_next(Some((2, 0)), 1, 0, 0), (2, -2));
    assert_eq!(
        b1201_next(Some((1, 0)), 2, 0, 0),
        (0, 1),
        "clamped: epoch 0 seq -2 → seq 1"
    );
    assert_eq!(b1201_next(None, 0, -1, 5), (3, 3));
    let mut core = seeded(1);
    call(&mut core, mutation(&id(0), Kind::Create, token("n", 2, 0)));
    let decision = call(&mut core, mutation(&id(0), Kind::Create, token("n", 2, -2)));
    assert!(
        fenced(&decision.outcome),
        "lower negative sequence in the same epoch is stale"
    );
}

#[test]
fn harness_exercises_every_step_kind() {
    let mut harness = Harness::new();
    let script = [
        Step::Mutate {
            machine: 0,
            kind: Kind::Create,
            token: token("s-a", 1, 1),
        },
        Step::Complete {
            pick: 0,
            finish: Finish::Success,
        },
        Step::Reconcile {
            cents: 55,
            adopt: true,
        },
        Step::Mutate {
            machine: 3,
            kind: Kind::Create,
            token: unfenced(),
        },
        Step::Restart,
    ];
    for step in &script {
        harness.run(step);
    }
    assert_eq!(harness.core.len(), MACHINES);
    assert_eq!(state(&harness.core, &id(0)), MachineState::Idle);
    assert_eq!(
        state(&harness.core, &id(3)),
        MachineState::Failed,
        "Creating at the restart"
    );
    assert_eq!(
        normalized(harness.store.clone()),
        normalized(harness.core.snapshot())
    );
}
