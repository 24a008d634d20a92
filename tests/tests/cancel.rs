//! Callers that give up: with `--state`, a Create, Configure, Drain or Delete whose caller's
//! deadline expires while the provider commits its decision still ends — the machine reaches
//! the call's target (or FAILED with a reason) within the transition deadline — and a retry
//! afterwards is answered with one stable operation id. Before the fix such a machine stayed
//! transitional until the next restart.
//!
//! The caller gives up the way a shard does: the request carries a `grpc-timeout` shorter
//! than the commit, so the provider itself drops the call's future at that instant. The
//! deadlines are spread from 50 µs to 20 ms over the machines, so some calls are dropped
//! before they are decided, some while their decision is being made durable, and some answer
//! in time; the test requires every phase to have had calls of the middle kind.

use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use tonic::Code;

use crate::harness::profiles::core_with;
use crate::harness::*;

/// Machines cancelled per phase.
const MACHINES: usize = 32;
/// The provider's transition deadline in this test.
const TRANSITION: Duration = Duration::from_secs(3);
/// How long a dropped call's machine may take to settle: its deadline, the deadline
/// sweep's grace and polling slack.
const SETTLE_BY: Duration = Duration::from_secs(6);

/// One mutating call of the phase under test, with a fresh token and a caller deadline.
async fn call(
    c: &mut Client,
    kind: &str,
    id: &str,
    token: (String, i64, i64),
    deadline: Option<Duration>,
) -> Result<pb::TransitionAck, tonic::Status> {
    let (shard_id, shard_epoch, sequence_number) = token;
    macro_rules! send {
        ($method:ident, $request:expr) => {{
            let mut request = tonic::Request::new($request);
            if let Some(deadline) = deadline {
                request.set_timeout(deadline);
            }
            c.$method(request).await.map(tonic::Response::into_inner)
        }};
    }
    match kind {
        "Create" => send!(
            create,
            pb::CreateRequest {
                machine_id: id.to_owned(),
                shard_id,
                shard_epoch,
                sequence_number,
            }
        ),
        "Configure" => send!(
            configure,
            pb::ConfigureRequest {
                machine_id: id.to_owned(),
                cluster_id: "c-cancel".to_owned(),
                bootstrap_blob: b"# cancel\n".to_vec(),
                shard_id,
                shard_epoch,
                sequence_number,
                shard_metadata: md(&[("k", "v")]),
            }
        ),
        "Drain" => send!(
            drain,
            pb::DrainRequest {
                machine_id: id.to_owned(),
                grace_period_seconds: 0,
                shard_id,
                shard_epoch,
                sequence_number,
            }
        ),
        "Delete" => send!(
            delete,
            pb::DeleteRequest {
                machine_id: id.to_owned(),
                shard_id,
                shard_epoch,
                sequence_number,
            }
        ),
        other => unreachable!("no such call {other}"),
    }
}

/// What the phases do: the call, the state it starts from, its transitional state, its
/// target.
const PHASES: [(&str, S, S, S); 4] = [
    ("Create", S::Speculative, S::Creating, S::Idle),
    ("Configure", S::Idle, S::Configuring, S::Configured),
    ("Drain", S::Configured, S::Draining, S::Idle),
    ("Delete", S::Idle, S::Deleting, S::Speculative),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_calls_cancelled_mid_commit_reach_their_target_and_keep_their_operation_id() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state.redb");
    let transition = format!("--transition-timeout={}s", TRANSITION.as_secs());
    let server = core_with(&[&format!("--state={}", file.display()), &transition]);
    let mut c = server.client().await;
    let ids = pick_n(&server, &mut c, MACHINES).await;
    let shard = unique_shard("cancel");
    let mut sequence = 0;
    let mut token = || {
        sequence += 1;
        (shard.clone(), 1, sequence)
    };
    for (kind, source, transitional, target) in PHASES {
        let mut dropped_after_decision = 0;
        for (index, id) in ids.iter().enumerate() {
            // 50 µs, 100 µs, ... spread to about 20 ms over the machines.
            let micros = 50 * (1u64 << (index % 9));
            let deadline = Duration::from_micros(micros + 37 * index as u64);
            let answer = call(&mut c, kind, id, token(), Some(deadline)).await;
            let seen = state(&get(&mut c, id).await.expect("Get"));
            match code(&answer) {
                Code::Ok => continue,
                Code::DeadlineExceeded | Code::Cancelled => {}
                other => panic!("{kind} {id}: unexpected answer {other:?}: {answer:?}"),
            }
            if seen == transitional || seen == target {
                dropped_after_decision += 1;
            } else {
                assert_eq!(
                    seen, source,
                    "{kind} {id}: a call never decided changes nothing"
                );
            }
        }
        assert!(
            dropped_after_decision > 0,
            "{kind}: no call was dropped after its decision; the test did not exercise its case"
        );
        for id in &ids {
            // A machine whose call was dropped before its decision still needs one.
            if state(&get(&mut c, id).await.expect("Get")) == source {
                call(&mut c, kind, id, token(), None)
                    .await
                    .unwrap_or_else(|e| panic!("{kind} {id} accepted on a retry: {e:?}"));
            }
        }
        for id in &ids {
            let settled = reach(&mut c, id, target, SETTLE_BY).await;
            assert!(settled.last_error.is_empty(), "{id}: {settled:?}");
            // Retries are answered from the record, with one stable operation id.
            let first = call(&mut c, kind, id, token(), None).await;
            let again = call(&mut c, kind, id, token(), None).await;
            let (first, again) = (first.expect("retry"), again.expect("retry"));
            assert!(!first.operation_id.is_empty());
            assert_eq!(first.operation_id, again.operation_id, "{kind} {id}");
            assert_eq!(
                state(&get(&mut c, id).await.unwrap()),
                target,
                "{kind} {id}"
            );
        }
        println!(
            "{kind}: {dropped_after_decision} of {MACHINES} calls dropped after their decision"
        );
    }
}
