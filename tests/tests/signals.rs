//! SIGTERM at any moment is a clean shutdown. Kubernetes sends it whenever it reschedules a
//! pod, including while the provider is still starting; a handler installed only once the
//! provider serves would leave the default action (death by the signal) in place until then.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;

/// The provider's JSON log line that says it serves.
const SERVING: &str = "serving CapacityProvider";

/// A SIGTERM that arrives while the provider seeds a large inventory (after its first log
/// line, before it serves) ends in a clean exit, status 0, not death by the signal.
///
/// The log goes to a file, not a pipe: what a file holds once `kill` has returned is exactly
/// what the provider had written before the signal was sent, so the test can show that the
/// signal landed before the "serving" line, during start-up.
#[test]
fn sigterm_during_start_up_is_a_clean_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("stderr.log");
    let child = Command::new(binary())
        .args([
            "--use-fake-backend",
            "--seed-count=100000",
            "--addr=127.0.0.1:0",
            "--metrics-addr=127.0.0.1:0",
            "--log-format=json",
        ])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .expect("spawn bigfleet-libvirt");
    let log = || std::fs::read_to_string(&log_path).expect("read the provider's log");
    // The first log line comes before seeding starts: the process is starting up.
    let start = Instant::now();
    while !log().contains('\n') {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no log line within 30 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let before_the_signal = log();
    assert!(
        !before_the_signal.contains(SERVING),
        "the SIGTERM landed after the provider served, not during start-up (seed more to \
         widen the window):\n{before_the_signal}"
    );
    let (status, _) = exit_within(child, Duration::from_secs(120));
    let status = status.expect("exited within 120 s of SIGTERM");
    let all = log();
    assert_eq!(
        status.code(),
        Some(0),
        "a SIGTERM during start-up must be a clean exit, got {status:?}\n{all}"
    );
    assert!(all.contains("shutting down"), "{all}");
}
