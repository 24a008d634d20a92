//! Part 7: a SIGTERM closes the state file cleanly. The process leaves its inventory unfreed
//! at exit (freeing it took most of the time from SIGTERM to exit), so the file must be
//! closed on purpose first: a file left open reads as not closed cleanly, and needs a
//! repair, which walks the whole file, before the next start can use it.

use std::time::{Duration, Instant};

use pb::MachineState as S;

use super::*;
use crate::harness::*;

/// After SIGTERM (exit status 0) the file opens read-only without repair, and a restart on
/// it serves every acknowledged decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_the_state_file_cleanly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("exit.redb");
    let args = lane_args(&path, 2_000, &[]);
    let mut server = boot(&args);
    let mut c = server.client().await;
    let idle = walk_to_idle(&server, &mut c).await;
    drop(c);
    server.terminate();
    let signalled = Instant::now();
    let code = server.wait(Duration::from_secs(60));
    println!(
        "SIGTERM to exit with 2,000 machines: {:?} (this build's profile)",
        signalled.elapsed()
    );
    assert_eq!(
        code,
        Some(0),
        "exit after SIGTERM; log:\n{}",
        server.log_text()
    );
    // What `state inspect` reports: a file left open reads as not closed cleanly.
    let inspected = bigfleet_libvirt_redb::inspect(&path).expect("inspect the state file");
    assert!(
        inspected.closed_cleanly,
        "the state file was not closed cleanly at exit"
    );
    let server = boot(&args);
    let mut c = server.client().await;
    let machine = get(&mut c, &idle).await.expect("Get after the restart");
    assert_eq!(state(&machine), S::Idle, "{machine:?}");
}
