//! Part 6: Restored machines continue their lifecycle after a restart.

use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;

use super::*;
use crate::harness::*;

/// Polls until `want` or FAILED; FAILED is a failure showing last_error.
async fn reach_or_fail(c: &mut Client, id: &str, want: S) -> pb::Machine {
    let start = Instant::now();
    loop {
        let m = get(c, id).await.expect("Get");
        assert_ne!(
            state(&m),
            S::Failed,
            "{id} FAILED instead of reaching {want:?}: {:?}",
            m.last_error
        );
        if state(&m) == want {
            return m;
        }
        assert!(start.elapsed() < WALK, "{id} did not reach {want:?}: {m:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// After a restart an Idle machine can still be configured and a Configured one drained:
/// the restored records must be usable, not only readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restored_machines_continue_their_lifecycle() {
    let dir = tempfile::tempdir().expect("temp dir");
    let args = lane_args(&dir.path().join("restored.redb"), 16, &[]);
    let mut server = boot(&args);
    let mut c = server.client().await;
    let idle = walk_to_idle(&server, &mut c).await;
    let bound = walk_to_configured(&server, &mut c, "restored", &[("r/k", "v")]).await;
    sigkill(&mut server);

    let server = boot(&args);
    let mut c = server.client().await;
    configure(&mut c, &idle, "after-restart", &[("a/k", "v")], None)
        .await
        .expect("Configure on a restored Idle machine");
    let m = reach_or_fail(&mut c, &idle, S::Configured).await;
    assert_eq!(m.cluster, "after-restart");
    drain(&mut c, &bound, 5, None)
        .await
        .expect("Drain on a restored Configured machine");
    let m = reach_or_fail(&mut c, &bound, S::Idle).await;
    assert!(m.cluster.is_empty() && m.shard_metadata.is_empty());
    delete(&mut c, &bound, None).await.expect("Delete");
    reach_or_fail(&mut c, &bound, S::Speculative).await;
}
