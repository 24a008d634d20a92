//! Fencing (docs/contract.md §3, certification B301–B305): per (shard, machine) marks,
//! strictly-newer signed lexicographic comparison, the zero-token bypass and the check order.

mod common;

use bigfleet_libvirt_domain::{
    Core, FenceMark, Kind, ListQuery, MachineState, MutateError, Policy, TransitionResult,
};
use common::*;

/// A fenced Create of `machine` under (shard, e, s); `Ok(())` on any non-fencing outcome.
fn fenced_create(core: &mut Core, shard: &str, e: i64, s: i64, machine: &str) -> Result<(), ()> {
    match call(core, mutation(machine, Kind::Create, token(shard, e, s))).outcome {
        Err(MutateError::Fenced { .. }) => Err(()),
        _ => Ok(()),
    }
}

fn mark(e: i64, s: i64) -> FenceMark {
    FenceMark {
        epoch: e,
        sequence: s,
    }
}

#[test]
fn zero_token_bypasses_the_fence_entirely() {
    let mut core = seeded(1);
    for _ in 0..3 {
        let decision = call(&mut core, plain(&id(0), Kind::Create));
        assert!(decision.outcome.is_ok());
        assert!(decision.changes.is_none_or(|c| c.fences.is_empty()));
    }
    assert!(
        core.snapshot().fences.is_empty(),
        "the zero token must not write a mark"
    );
}

#[test]
fn empty_shard_with_non_zero_numbers_is_fenced_under_the_empty_shard() {
    for (e, s) in [(0, 1), (1, 0), (-1, 0), (0, -1)] {
        let mut core = seeded(1);
        assert_eq!(
            fenced_create(&mut core, "", e, s, &id(0)),
            Ok(()),
            "({e},{s}) first contact"
        );
        assert_eq!(core.fence_mark(&key("", &id(0))), Some(mark(e, s)));
        assert_eq!(
            fenced_create(&mut core, "", e, s, &id(0)),
            Err(()),
            "({e},{s}) replay"
        );
    }
}

#[test]
fn first_contact_accepts_any_values_including_zero_and_negative() {
    let firsts = [(0, 0), (-5, -5), (i64::MIN, i64::MIN), (-1, 7), (3, -9)];
    for (e, s) in firsts {
        let mut core = seeded(1);
        let decision = call(&mut core, mutation(&id(0), Kind::Create, token("s", e, s)));
        assert!(
            decision.outcome.is_ok(),
            "({e},{s}) must be accepted on first contact"
        );
        assert_eq!(core.fence_mark(&key("s", &id(0))), Some(mark(e, s)));
        assert_eq!(
            fenced_create(&mut core, "s", e, s, &id(0)),
            Err(()),
            "({e},{s}) replay"
        );
    }
}

#[test]
fn b303_strict_lexicographic_order_on_one_pair() {
    let mut core = seeded(1);
    assert_eq!(fenced_create(&mut core, "b303", 2, 5, &id(0)), Ok(()));
    let table: [(i64, i64, bool); 16] = [
        (2, 5, false),
        (2, 4, false),
        (1, 9, false),
        (1, 99_999, false),
        (2, 6, true),
        (2, 6, false),
        (2, 5, false),
        (3, 0, true),
        (3, 0, false),
        (2, 999_999, false),
        (3, 1, true),
        (4, 0, true),
        (4, 0, false),
        (10, 7, true),
        (10, 7, false),
        (9, 999, false),
    ];
    for (row, (e, s, ok)) in table.into_iter().enumerate() {
        let got = fenced_create(&mut core, "b303", e, s, &id(0));
        assert_eq!(got.is_ok(), ok, "row {row}: ({e},{s})");
    }
    assert_eq!(core.fence_mark(&key("b303", &id(0))), Some(mark(10, 7)));
}

#[test]
fn maximal_token_is_a_valid_mark_and_nothing_passes_it() {
    let mut core = seeded(1);
    assert_eq!(
        fenced_create(&mut core, "s", i64::MAX, i64::MAX, &id(0)),
        Ok(())
    );
    for (e, s) in [
        (i64::MAX, i64::MAX),
        (i64::MAX, i64::MAX - 1),
        (0, 0),
        (i64::MIN, i64::MIN),
    ] {
        assert_eq!(
            fenced_create(&mut core, "s", e, s, &id(0)),
            Err(()),
            "({e},{s})"
        );
    }
    assert_eq!(
        core.fence_mark(&key("s", &id(0))),
        Some(mark(i64::MAX, i64::MAX))
    );
}

#[test]
fn higher_epoch_accepts_lower_and_negative_sequences() {
    let mut core = seeded(1);
    assert_eq!(fenced_create(&mut core, "s", 1, 1000, &id(0)), Ok(()));
    assert_eq!(fenced_create(&mut core, "s", 2, -50, &id(0)), Ok(()));
    assert_eq!(fenced_create(&mut core, "s", 2, -51, &id(0)), Err(()));
    assert_eq!(fenced_create(&mut core, "s", 2, -49, &id(0)), Ok(()));
}

#[test]
fn b302_cross_shard_marks_are_independent() {
    let mut core = seeded(3);
    let (a, b, c) = (id(0), id(1), id(2));
    assert_eq!(fenced_create(&mut core, "A", 9, 9, &a), Ok(()));
    assert_eq!(fenced_create(&mut core, "B", 7, 3, &b), Ok(()));
    assert_eq!(fenced_create(&mut core, "C", 1, 1, &c), Ok(()));
    assert_eq!(fenced_create(&mut core, "A", 1, 1, &a), Err(()));
    assert_eq!(fenced_create(&mut core, "B", 7, 3, &b), Err(()));
    assert_eq!(fenced_create(&mut core, "C", 1, 1, &c), Err(()));
    assert_eq!(fenced_create(&mut core, "B", 7, 4, &b), Ok(()));
}

#[test]
fn b302_cross_machine_marks_within_one_shard_are_independent() {
    let mut core = seeded(2);
    let (a, b) = (id(0), id(1));
    assert_eq!(fenced_create(&mut core, "D", 5, 30, &a), Ok(()));
    assert_eq!(
        fenced_create(&mut core, "D", 5, 7, &b),
        Ok(()),
        "lower seq on another machine"
    );
    assert_eq!(fenced_create(&mut core, "D", 5, 7, &b), Err(()));
    assert_eq!(fenced_create(&mut core, "D", 5, 30, &a), Err(()));
    assert_eq!(fenced_create(&mut core, "D", 4, 999, &b), Err(()));
}

#[test]
fn different_shards_on_one_machine_keep_separate_marks() {
    let mut core = seeded(1);
    assert_eq!(fenced_create(&mut core, "A", 5, 5, &id(0)), Ok(()));
    assert_eq!(fenced_create(&mut core, "B", 1, 1, &id(0)), Ok(()));
    assert_eq!(core.fence_mark(&key("A", &id(0))), Some(mark(5, 5)));
    assert_eq!(core.fence_mark(&key("B", &id(0))), Some(mark(1, 1)));
}

#[test]
fn b301_fence_runs_before_not_found_and_marks_unknown_ids() {
    let mut core = seeded(1);
    let ghost = "conformance-b301-ghost-machine";
    let rev = core.revision();
    let decision = call(&mut core, mutation(ghost, Kind::Create, token("S", 5, 5)));
    assert!(matches!(
        decision.outcome,
        Err(MutateError::NotFound { .. })
    ));
    let changes = decision.changes.expect("the mark advance is persisted");
    assert_eq!(changes.fences, vec![(key("S", ghost), mark(5, 5))]);
    assert!(changes.machines.is_empty() && changes.operations.is_empty());
    for kind in Kind::ALL {
        let err = reject(&mut core, mutation(ghost, kind, token("S", 1, 1)));
        assert!(matches!(err, MutateError::Fenced { .. }), "{kind}: {err:?}");
    }
    let err = reject(&mut core, mutation(ghost, Kind::Create, token("S", 9, 9)));
    assert!(matches!(err, MutateError::NotFound { .. }));
    assert_eq!(
        core.revision(),
        rev,
        "fence-only advances never bump the revision"
    );
}

#[test]
fn mark_advances_and_is_persisted_on_an_idempotent_ok() {
    let mut core = seeded(1);
    let first = accept(&mut core, mutation(&id(0), Kind::Create, token("s", 1, 1)));
    let decision = call(&mut core, mutation(&id(0), Kind::Create, token("s", 1, 2)));
    let ack = decision.outcome.expect("idempotent retry");
    assert_eq!(ack.operation_id, first.operation_id);
    assert!(ack.dispatch.is_none());
    let changes = decision.changes.expect("mark advance persisted");
    assert_eq!(changes.fences, vec![(key("s", &id(0)), mark(1, 2))]);
    assert!(changes.machines.is_empty() && changes.operations.is_empty());
}

#[test]
fn mark_advances_on_an_out_of_position_rejection_without_touching_the_machine() {
    let mut core = seeded(1);
    let rev = core.revision();
    let decision = call(&mut core, mutation(&id(0), Kind::Drain, token("s", 3, 3)));
    assert!(matches!(
        decision.outcome,
        Err(MutateError::OutOfPosition { .. })
    ));
    let changes = decision.changes.expect("mark advance persisted");
    assert_eq!(changes.fences, vec![(key("s", &id(0)), mark(3, 3))]);
    assert!(changes.machines.is_empty());
    assert_eq!(state(&core, &id(0)), MachineState::Speculative);
    assert_eq!(core.revision(), rev);
}

#[test]
fn stale_token_is_rejected_with_no_changes_and_nothing_applied() {
    let mut core = seeded(1);
    call(&mut core, mutation(&id(0), Kind::Drain, token("s", 3, 3)));
    let before = core.snapshot();
    let decision = call(&mut core, mutation(&id(0), Kind::Create, token("s", 3, 2)));
    let expected = MutateError::Fenced {
        key: key("s", &id(0)),
        presented: mark(3, 2),
        mark: mark(3, 3),
    };
    assert_eq!(decision.outcome, Err(expected));
    assert_eq!(decision.changes, None);
    assert_eq!(core.snapshot(), before, "a fenced call changes nothing");
    let ack = accept(&mut core, mutation(&id(0), Kind::Create, token("s", 3, 4)));
    assert_eq!(
        ack.operation_id.as_str(),
        "op-1",
        "the fenced call minted nothing"
    );
}

#[test]
fn fence_precedes_idempotency_so_a_zombie_gets_no_cached_op() {
    let mut core = seeded(1);
    let ack = accept(&mut core, mutation(&id(0), Kind::Create, token("s", 1, 1)));
    settle(&mut core, &ack, success(Kind::Create));
    let err = reject(&mut core, mutation(&id(0), Kind::Create, token("s", 1, 1)));
    assert!(matches!(err, MutateError::Fenced { .. }), "{err:?}");
}

#[test]
fn mark_stays_advanced_when_the_accepted_transition_fails() {
    let mut core = seeded(1);
    let ack = accept(&mut core, mutation(&id(0), Kind::Create, token("s", 3, 7)));
    settle(
        &mut core,
        &ack,
        TransitionResult::Failed("hypervisor down".to_owned()),
    );
    assert_eq!(state(&core, &id(0)), MachineState::Failed);
    for s in [7, 6] {
        let err = reject(&mut core, mutation(&id(0), Kind::Create, token("s", 3, s)));
        assert!(
            matches!(err, MutateError::Fenced { .. }),
            "(3,{s}): {err:?}"
        );
    }
    let err = reject(&mut core, mutation(&id(0), Kind::Create, token("s", 3, 8)));
    assert!(
        matches!(err, MutateError::OutOfPosition { .. }),
        "fresh token on Failed: {err:?}"
    );
}

#[test]
fn unsupported_delete_is_refused_before_the_fence() {
    let policy = Policy {
        delete_supported: false,
        ..policy()
    };
    let mut core = seeded_with(policy, vec![idle(0)]);
    for machine in [id(0), "ghost".to_owned()] {
        let decision = call(
            &mut core,
            mutation(&machine, Kind::Delete, token("s", 1, 1)),
        );
        assert_eq!(
            decision.outcome,
            Err(MutateError::DeleteUnsupported),
            "{machine}"
        );
        assert_eq!(decision.changes, None);
        assert_eq!(
            core.fence_mark(&key("s", &machine)),
            None,
            "{machine}: mark must not move"
        );
    }
    assert_eq!(state(&core, &id(0)), MachineState::Idle);
    assert_eq!(
        fenced_create(&mut core, "s", 1, 1, &id(0)),
        Ok(()),
        "(1,1) is still first contact"
    );
}

#[test]
fn delete_on_an_unknown_id_is_not_found_when_supported() {
    let mut core = seeded(1);
    let err = reject(
        &mut core,
        mutation("b215-ghost", Kind::Delete, token("s", 1, 1)),
    );
    assert_eq!(
        err,
        MutateError::NotFound {
            machine_id: "b215-ghost".to_owned()
        }
    );
}

#[test]
fn empty_machine_id_is_refused_first_with_no_mark() {
    let policy = Policy {
        delete_supported: false,
        ..policy()
    };
    for p in [policy, common::policy()] {
        let mut core = seeded_with(p, vec![speculative(0)]);
        for kind in Kind::ALL {
            let decision = call(&mut core, mutation("", kind, token("s", 1, 1)));
            assert_eq!(
                decision.outcome,
                Err(MutateError::MissingMachineId),
                "{kind}"
            );
            assert_eq!(decision.changes, None, "{kind}");
        }
        assert!(core.snapshot().fences.is_empty());
    }
}

#[test]
fn configure_without_a_cluster_is_refused_before_the_fence() {
    let mut core = seeded(1);
    drive(&mut core, &id(0), MachineState::Idle);
    let before = core.snapshot();
    for machine in [id(0), "ghost".to_owned()] {
        let mut m = configure(&machine, "", map(&[("k", "v")]));
        m.token = token("s", 1, 1);
        let decision = call(&mut core, m);
        assert_eq!(
            decision.outcome,
            Err(MutateError::MissingClusterId),
            "{machine}"
        );
        assert_eq!(decision.changes, None);
    }
    assert_eq!(
        core.snapshot(),
        before,
        "no mark, no binding, no state change"
    );
}

#[test]
fn reads_are_never_fenced() {
    let mut core = seeded(1);
    call(&mut core, mutation(&id(0), Kind::Create, token("s", 9, 9)));
    let err = reject(&mut core, mutation(&id(0), Kind::Drain, token("s", 1, 1)));
    assert!(matches!(err, MutateError::Fenced { .. }));
    assert_eq!(state(&core, &id(0)), MachineState::Creating);
    assert_eq!(core.list(&ListQuery::default()).machines.len(), 1);
}

#[test]
fn fenced_error_names_the_pair_and_both_tokens() {
    let mut core = seeded(1);
    call(&mut core, mutation(&id(0), Kind::Create, token("s", 2, 5)));
    let text = reject(&mut core, mutation(&id(0), Kind::Create, token("s", 1, 9))).to_string();
    assert!(
        text.contains("stale fencing token (1, 9)") && text.contains("(2, 5)"),
        "{text}"
    );
    assert!(text.contains("m-000") && text.contains("\"s\""), "{text}");
}

#[test]
fn oversized_ids_are_refused_before_any_mark_is_read_or_minted() {
    let mut core = seeded(1);
    let huge = "x".repeat(bigfleet_libvirt_domain::MAX_ID_BYTES + 1);
    for kind in [Kind::Create, Kind::Configure, Kind::Drain, Kind::Delete] {
        let decision = call(&mut core, mutation(&huge, kind, token("s", 1, 1)));
        assert_eq!(
            decision.outcome.unwrap_err(),
            MutateError::IdTooLong {
                field: "machine_id",
                length: huge.len()
            }
        );
        assert!(decision.changes.is_none(), "{kind}: nothing to persist");
        let decision = call(&mut core, mutation(&id(0), kind, token(&huge, 1, 1)));
        assert_eq!(
            decision.outcome.unwrap_err(),
            MutateError::IdTooLong {
                field: "shard_id",
                length: huge.len()
            }
        );
        assert!(decision.changes.is_none(), "{kind}: nothing to persist");
    }
    assert!(core.snapshot().fences.is_empty(), "no mark was minted");
    // At the limit an id is an id like any other: an unknown one mints its mark.
    let at_limit = "y".repeat(bigfleet_libvirt_domain::MAX_ID_BYTES);
    let decision = call(
        &mut core,
        mutation(&at_limit, Kind::Create, token("s", 1, 1)),
    );
    assert!(matches!(
        decision.outcome,
        Err(MutateError::NotFound { .. })
    ));
    assert_eq!(core.snapshot().fences.len(), 1);
}
