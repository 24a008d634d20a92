//! Part 2: Strong B1006: a transition held open across a SIGKILL comes back FAILED with the
//! restart-recovery last_error.

use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;

use super::*;
use crate::harness::*;

/// docs/conformance.md §5.2 against our own binary: a Configure held open by the `fault-timeout`
/// hook (30 s deadline) is cut off by SIGKILL; after the restart a single Get shows FAILED with the
/// restart-recovery last_error, and the record keeps its cluster, metadata and host.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn b1006_strong_interrupted_configure_comes_back_failed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let args = lane_args(
        &dir.path().join("fault-state.redb"),
        64,
        &["--fake-fault-hooks", "--transition-timeout=30s"],
    );
    let mut server = boot(&args);
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    create(&mut c, &id, None).await.expect("Create ack");
    let idle = reach(&mut c, &id, S::Idle, WALK).await;
    let ack = configure_map(
        &mut c,
        &id,
        "fault-timeout",
        md(&[("b1006/k", "v")]),
        b"# b1006\n".to_vec(),
        None,
    )
    .await
    .expect("the fault-timeout Configure ack must succeed");
    assert!(!ack.operation_id.is_empty());
    let seen = reach(&mut c, &id, S::Configuring, Duration::from_secs(5)).await;
    assert_eq!(seen.cluster, "fault-timeout");
    sigkill(&mut server);

    let server = boot(&args);
    let mut c = server.client().await;
    let m = get(&mut c, &id).await.expect("Get after restart");
    assert_eq!(
        state(&m),
        S::Failed,
        "B1006: not FAILED after restart: {m:?}"
    );
    assert!(
        !m.last_error.is_empty(),
        "B1006: FAILED with an empty last_error"
    );
    assert!(
        is_interrupted(&m.last_error, "configure"),
        "B1006: last_error {:?} is not the configure restart-recovery message ({:?})",
        m.last_error,
        interrupted("configure")
    );
    assert_eq!(
        m.cluster, "fault-timeout",
        "the FAILED record lost its cluster"
    );
    assert_eq!(
        m.shard_metadata,
        md(&[("b1006/k", "v")]),
        "the FAILED record lost its metadata"
    );
    assert_eq!(
        m.host, idle.host,
        "the FAILED record lost or changed its host"
    );
    // Recovery is not a transition the shard can re-drive: the same Configure is refused.
    let retry = configure_map(
        &mut c,
        &id,
        "fault-timeout",
        md(&[("b1006/k", "v")]),
        b"# b1006\n".to_vec(),
        None,
    )
    .await;
    assert_eq!(
        code(&retry),
        OUT_OF_POSITION,
        "FAILED must be terminal: {retry:?}"
    );
}
