//! The fault lane's behaviours (docs/conformance.md §4) provoked for real on the tier's
//! libvirtd: the fake injects its faults through hooks, here the guest's own hooks fail or
//! answer late (`scripts/qemu-tier/bootstrap` and `drain`: a cluster id starting with
//! `fail-` fails the bootstrap hook, `late-` makes it succeed 25 s later, `drainfail-` fails
//! the drain hook). In the group `on_real_libvirtd` with the behaviour modules' twins.

use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use tonic::Code;

use crate::harness::backend::{Backend, run_on};
use crate::harness::profiles::core_with;
use crate::harness::*;

/// Runs `body` with the profiles launching on the tier.
fn real(body: fn()) {
    run_on(Backend::Real(super::launch), body);
}

/// B705 and B707 on a Failed machine: every mutating call is refused `ABORTED` and changes
/// nothing, and Get and `List(FAILED)` read the same record every time.
async fn failed_is_terminal_and_reads_the_same(c: &mut Client, id: &str) {
    let failed = get(c, id).await.unwrap();
    assert_eq!(state(&failed), S::Failed);
    let calls = [
        code(&create(c, id, None).await),
        code(&configure(c, id, "again", &[], None).await),
        code(&drain(c, id, 0, None).await),
        code(&delete(c, id, None).await),
    ];
    assert_eq!(calls, [Code::Aborted; 4], "B705: Failed refuses every call");
    for _ in 0..5 {
        assert_eq!(
            get(c, id).await.unwrap(),
            failed,
            "B707: Get reads the same"
        );
        let listed = list(c, &[S::Failed], 0, b"").await.machines;
        let found = listed.iter().find(|m| m.id == id);
        assert_eq!(found, Some(&failed), "B707: List(FAILED) reads the same");
    }
}

#[test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
fn b701_b705_b707_a_failing_bootstrap_hook_fails_the_configure_for_good() {
    real(b701_body);
}

#[tokio::main(flavor = "current_thread")]
async fn b701_body() {
    let server = core_with(&[]);
    let mut c = server.client().await;
    let id = walk_to_idle(&server, &mut c).await;
    configure(&mut c, &id, "fail-b701", &[("k", "v")], None)
        .await
        .expect("Configure is accepted");
    let failed = reach(&mut c, &id, S::Failed, SETTLE).await;
    assert!(
        failed.last_error.contains("exit") && failed.last_error.contains("hook-failure"),
        "B701: the hook's failure is the reason: {}",
        failed.last_error
    );
    assert_eq!(
        failed.cluster, "fail-b701",
        "a failed Configure keeps its binding"
    );
    never_reaches(&mut c, &id, S::Configuring, Duration::from_secs(2)).await;
    failed_is_terminal_and_reads_the_same(&mut c, &id).await;
}

#[test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
fn b704_a_bootstrap_that_succeeds_after_the_deadline_changes_nothing() {
    real(b704_body);
}

#[tokio::main(flavor = "current_thread")]
async fn b704_body() {
    let server = core_with(&["--transition-timeout=20s"]);
    let mut c = server.client().await;
    let id = walk_to_idle(&server, &mut c).await;
    configure(&mut c, &id, "late-b704", &[], None)
        .await
        .expect("Configure is accepted");
    let failed = reach(&mut c, &id, S::Failed, Duration::from_secs(25)).await;
    assert!(
        failed
            .last_error
            .contains("configure transition timed out after 20s"),
        "{}",
        failed.last_error
    );
    // The hook returns about 25 s after it started, inside the next 10 s.
    stays_in(&mut c, &id, S::Failed, Duration::from_secs(12)).await;
    let after = get(&mut c, &id).await.unwrap();
    assert_eq!(after, failed, "the late success changed nothing");
}

#[test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
fn b706_a_failing_drain_hook_fails_the_drain_and_never_sticks_in_draining() {
    real(b706_body);
}

#[tokio::main(flavor = "current_thread")]
async fn b706_body() {
    let server = core_with(&[]);
    let mut c = server.client().await;
    let id = walk_to_configured(&server, &mut c, "drainfail-b706", &[("k", "v")]).await;
    drain(&mut c, &id, 0, None)
        .await
        .expect("Drain is accepted");
    let failed = reach(&mut c, &id, S::Failed, SETTLE).await;
    assert!(
        failed.last_error.starts_with("drain: ")
            && failed.last_error.contains("the node would not drain"),
        "{}",
        failed.last_error
    );
    assert_eq!(
        failed.cluster, "drainfail-b706",
        "a failed Drain keeps its binding"
    );
    failed_is_terminal_and_reads_the_same(&mut c, &id).await;
}
