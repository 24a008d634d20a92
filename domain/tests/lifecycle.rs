//! Completions (docs/contract.md §2.2, §5, §6): success edges and their post-effects, failures,
//! timeouts, late and stale results, Failed as a sink, and the cluster binding.

mod common;

use std::time::Duration;

use bigfleet_libvirt_domain::{
    Completion, CompletionOutcome, HostRef, Kind, ListQuery, MachineState, MutateError,
    MutateRequest, Mutation, OperationId, Policy, Timeouts, TransitionResult,
};
use common::*;

#[test]
fn full_lifecycle_walks_the_four_entry_edges() {
    let mut core = seeded(1);
    let m = id(0);
    let mut seen = Vec::new();
    for kind in [Kind::Create, Kind::Configure, Kind::Drain, Kind::Delete] {
        let ack = accept(&mut core, plain(&m, kind));
        seen.push(ack.machine.state);
        seen.push(settle(&mut core, &ack, success(kind)).state);
    }
    use MachineState as S;
    let expected = [S::Creating, S::Idle, S::Configuring, S::Configured];
    assert_eq!(seen[..4], expected);
    assert_eq!(
        seen[4..],
        [S::Draining, S::Idle, S::Deleting, S::Speculative]
    );
    assert_eq!(get(&core, &m).host, None, "Delete clears the host");
}

#[test]
fn create_attaches_the_host_and_replaces_maps_only_when_given() {
    let mut core = seeded(2);
    let fresh = map(&[("cpu", "8")]);
    let cases = [
        (None, None),
        (Some(fresh.clone()), Some(map(&[("gpu", "1")]))),
    ];
    for (i, (resources, allocatable)) in cases.into_iter().enumerate() {
        let ack = accept(&mut core, plain(&id(i), Kind::Create));
        let result = TransitionResult::Created {
            host: host(i),
            resources: resources.clone(),
            allocatable: allocatable.clone(),
        };
        let machine = settle(&mut core, &ack, result);
        assert_eq!(machine.state, MachineState::Idle);
        assert_eq!(machine.host, Some(host(i)));
        assert_eq!(
            machine.resources,
            resources.unwrap_or_else(|| speculative(i).resources.into())
        );
        assert_eq!(
            machine.allocatable,
            allocatable.unwrap_or_else(|| speculative(i).allocatable.into())
        );
    }
}

#[test]
fn create_without_a_host_fails_instead_of_reaching_idle() {
    let mut core = seeded(1);
    let ack = accept(&mut core, plain(&id(0), Kind::Create));
    let result = TransitionResult::Created {
        host: HostRef::default(),
        resources: None,
        allocatable: None,
    };
    let machine = settle(&mut core, &ack, result);
    assert_eq!(machine.state, MachineState::Failed);
    assert!(
        machine.last_error.contains("no host"),
        "{}",
        machine.last_error
    );
    assert_eq!(machine.host, None);
}

#[test]
fn binding_is_attached_at_accept_and_kept_through_draining() {
    let mut core = seeded(1);
    let m = id(0);
    drive(&mut core, &m, MachineState::Idle);
    let ack = accept(&mut core, configure(&m, "c-prod", awkward_metadata()));
    let bound = |machine: &bigfleet_libvirt_domain::Machine| {
        machine.cluster == "c-prod" && machine.shard_metadata == awkward_metadata()
    };
    assert_eq!(ack.machine.state, MachineState::Configuring);
    assert!(bound(&ack.machine), "ack carries the binding");
    assert!(bound(&ack.dispatch.as_ref().expect("dispatched").machine));
    assert!(bound(&get(&core, &m)), "Get while Configuring");
    assert!(bound(&settle(&mut core, &ack, success(Kind::Configure))));
    let configured = ListQuery {
        states: Some([MachineState::Configured].into()),
        ..ListQuery::default()
    };
    assert!(core.list(&configured).machines.iter().all(|x| bound(x)));
    let drain = accept(&mut core, plain(&m, Kind::Drain));
    assert!(bound(&drain.machine), "Drain ack still carries the binding");
    let idle = settle(&mut core, &drain, success(Kind::Drain));
    assert!(
        idle.cluster.is_empty() && idle.shard_metadata.is_empty(),
        "cleared together"
    );
}

#[test]
fn metadata_is_stored_verbatim() {
    let mut core = seeded(1);
    drive(&mut core, &id(0), MachineState::Idle);
    let md = awkward_metadata();
    assert!(md.values().any(|v| v.contains('\0')) && md.values().any(String::is_empty));
    let ack = accept(&mut core, configure(&id(0), "c", md.clone()));
    settle(&mut core, &ack, success(Kind::Configure));
    assert_eq!(get(&core, &id(0)).shard_metadata, md);
    let mut core = seeded(1);
    drive(&mut core, &id(0), MachineState::Idle);
    let ack = accept(&mut core, configure(&id(0), "c", Default::default()));
    assert!(
        ack.machine.shard_metadata.is_empty(),
        "an empty map round-trips as empty"
    );
}

#[test]
fn delete_ack_still_has_the_host() {
    let mut core = seeded(1);
    let ack = drive(&mut core, &id(0), MachineState::Deleting).expect("dispatched");
    assert_eq!(ack.machine.host, Some(host(0)));
}

#[test]
fn dispatch_carries_kind_op_deadline_and_grace_verbatim() {
    let mut core = seeded(1);
    drive(&mut core, &id(0), MachineState::Configured);
    let request = MutateRequest::Drain {
        grace_period_seconds: -7,
    };
    let mutation = Mutation {
        machine_id: id(0),
        token: unfenced(),
        request,
    };
    let ack = core.mutate(mutation, T0).outcome.expect("accepted");
    let dispatch = ack.dispatch.expect("dispatched");
    assert_eq!(dispatch.kind, Kind::Drain);
    assert_eq!(dispatch.operation_id, ack.operation_id);
    assert_eq!(dispatch.deadline, after(TIMEOUT));
    assert_eq!(dispatch.timeout, TIMEOUT);
    assert_eq!(
        dispatch.grace_period_seconds, -7,
        "negative grace passes through"
    );
}

#[test]
fn failure_keeps_the_message_and_an_empty_one_gets_a_fallback() {
    for (message, expect_verbatim) in [("libvirt: domain not found", true), ("", false)] {
        let mut core = seeded(1);
        let ack = accept(&mut core, plain(&id(0), Kind::Create));
        let machine = settle(
            &mut core,
            &ack,
            TransitionResult::Failed(message.to_owned()),
        );
        assert_eq!(machine.state, MachineState::Failed);
        assert!(!machine.last_error.is_empty());
        assert_eq!(
            machine.last_error == message,
            expect_verbatim,
            "{:?}",
            machine.last_error
        );
    }
}

#[test]
fn timeout_text_names_the_kind_and_duration() {
    use MachineState as S;
    for (kind, state) in [
        (Kind::Create, S::Creating),
        (Kind::Configure, S::Configuring),
        (Kind::Drain, S::Draining),
        (Kind::Delete, S::Deleting),
    ] {
        let mut core = seeded(1);
        let ack = drive(&mut core, &id(0), state).expect("dispatched");
        let machine = settle(&mut core, &ack, TransitionResult::TimedOut);
        let text = format!(
            "{} transition timed out after 2s: context deadline exceeded",
            kind.name()
        );
        assert_eq!(machine.last_error, text);
    }
}

#[test]
fn success_at_or_after_the_deadline_counts_as_a_timeout() {
    for (offset, on_time) in [
        (TIMEOUT - Duration::from_nanos(1), true),
        (TIMEOUT, false),
        (TIMEOUT * 9, false),
    ] {
        let mut core = seeded(1);
        let ack = accept(&mut core, plain(&id(0), Kind::Create));
        let outcome = core
            .complete(completion_for(&ack, success(Kind::Create)), after(offset))
            .0;
        let CompletionOutcome::Applied(machine) = outcome else {
            panic!("dropped")
        };
        let state = if on_time {
            MachineState::Idle
        } else {
            MachineState::Failed
        };
        assert_eq!(machine.state, state, "at {offset:?}");
        if !on_time {
            assert!(
                machine
                    .last_error
                    .starts_with("create transition timed out after 2s")
            );
        }
    }
}

#[test]
fn b704_late_success_after_a_timeout_is_dropped() {
    let mut core = seeded(1);
    let ack = accept(&mut core, plain(&id(0), Kind::Create));
    let failed = settle(&mut core, &ack, TransitionResult::TimedOut);
    let before = core.snapshot();
    let (outcome, changes) = core.complete(completion_for(&ack, success(Kind::Create)), T0);
    assert_eq!(outcome, CompletionOutcome::Dropped);
    assert_eq!(changes, None);
    assert_eq!(core.snapshot(), before);
    assert_eq!(get(&core, &id(0)).last_error, failed.last_error);
}

#[test]
fn stale_completions_are_dropped_without_changes() {
    let mut core = seeded(1);
    let ack = accept(&mut core, plain(&id(0), Kind::Create));
    let good = completion_for(&ack, success(Kind::Create));
    let wrong_op = Completion {
        operation_id: OperationId::from_stored("op-99".into()),
        ..good.clone()
    };
    let wrong_kind = Completion {
        kind: Kind::Delete,
        result: success(Kind::Delete),
        ..good.clone()
    };
    let ghost = Completion {
        machine_id: mid(7),
        ..good.clone()
    };
    let before = core.snapshot();
    for stale in [wrong_op, wrong_kind, ghost] {
        assert_eq!(
            core.complete(stale.clone(), T0),
            (CompletionOutcome::Dropped, None),
            "{stale:?}"
        );
    }
    assert_eq!(core.snapshot(), before);
    assert!(matches!(
        core.complete(good.clone(), T0).0,
        CompletionOutcome::Applied(_)
    ));
    assert_eq!(
        core.complete(good, T0),
        (CompletionOutcome::Dropped, None),
        "second delivery"
    );
}

#[test]
fn completion_bumps_the_revision_once_and_reports_the_record() {
    let mut core = seeded(1);
    let ack = accept(&mut core, plain(&id(0), Kind::Create));
    let rev = core.revision();
    let (outcome, changes) = core.complete(completion_for(&ack, success(Kind::Create)), T0);
    let changes = changes.expect("completion persists");
    assert_eq!(core.revision(), rev + 1);
    assert_eq!(changes.revision, rev + 1);
    let CompletionOutcome::Applied(machine) = outcome else {
        panic!("dropped")
    };
    assert_eq!(changes.machines, vec![machine]);
    assert!(changes.fences.is_empty() && changes.operations.is_empty());
}

#[test]
fn failed_transitions_keep_what_they_had() {
    use MachineState as S;
    let cases = [
        (S::Creating, false, false),
        (S::Configuring, true, true),
        (S::Draining, true, true),
        (S::Deleting, true, false),
    ];
    for (state, has_host, bound) in cases {
        let mut core = seeded(1);
        let ack = drive(&mut core, &id(0), state).expect("dispatched");
        let machine = settle(&mut core, &ack, TransitionResult::Failed("x".to_owned()));
        assert_eq!(machine.has_host(), has_host, "{state}");
        assert_eq!(!machine.cluster.is_empty(), bound, "{state}");
        assert_eq!(
            machine.shard_metadata == map(&[("k", "v")]),
            bound,
            "{state}"
        );
    }
}

#[test]
fn failed_is_a_sink_for_every_mutation() {
    let mut core = seeded(1);
    let ack = drive(&mut core, &id(0), MachineState::Configuring).expect("dispatched");
    settle(
        &mut core,
        &ack,
        TransitionResult::Failed("bootstrap exploded".to_owned()),
    );
    let before = core.snapshot();
    for kind in Kind::ALL {
        for token in [unfenced(), token("s", 1, i64::from(kind as u8))] {
            let err = reject(&mut core, mutation(&id(0), kind, token));
            assert!(
                matches!(err, MutateError::OutOfPosition { .. }),
                "{kind}: {err:?}"
            );
        }
    }
    let after = get(&core, &id(0));
    assert_eq!(after.state, MachineState::Failed);
    assert_eq!(after.last_error, "bootstrap exploded");
    assert_eq!(core.revision(), before.revision);
    assert_eq!(
        normalized(core.snapshot()).machines,
        normalized(before).machines
    );
}

#[test]
fn each_kind_times_out_with_its_own_deadline() {
    let timeouts = Timeouts {
        create: Duration::from_millis(250),
        configure: Duration::from_millis(2500),
        drain: Duration::from_secs(90),
        delete: Duration::from_secs(3600),
    };
    let policy = Policy {
        timeouts,
        ..policy()
    };
    use MachineState as S;
    let cases = [
        (S::Creating, "create transition timed out after 250ms"),
        (S::Configuring, "configure transition timed out after 2.5s"),
        (S::Draining, "drain transition timed out after 1m30s"),
        (S::Deleting, "delete transition timed out after 1h0m0s"),
    ];
    for (state, prefix) in cases {
        let mut core = seeded_with(policy.clone(), vec![speculative(0)]);
        let ack = drive(&mut core, &id(0), state).expect("dispatched");
        let dispatch = ack.dispatch.as_ref().expect("dispatched");
        assert_eq!(
            dispatch.deadline,
            T0.saturating_add(dispatch.timeout),
            "{state}"
        );
        let machine = settle(&mut core, &ack, TransitionResult::TimedOut);
        assert_eq!(
            machine.last_error,
            format!("{prefix}: context deadline exceeded")
        );
    }
}

#[test]
fn default_policy_matches_the_libvirt_provider() {
    let policy = Policy::default();
    assert!(policy.delete_supported && policy.require_zone);
    assert_eq!(policy.operation_prefix, "op");
    let minutes = |kind| policy.timeouts.for_kind(kind).as_secs() / 60;
    let got: Vec<u64> = Kind::ALL.into_iter().map(minutes).collect();
    assert_eq!(got, [5, 8, 15, 5]);
}
