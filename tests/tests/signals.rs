//! SIGTERM at any moment is a clean shutdown. Kubernetes sends it whenever it reschedules a
//! pod, including while the provider is still starting; a handler installed only once the
//! provider serves would leave the default action (death by the signal) in place until then.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::*;

/// A SIGTERM that arrives while the provider seeds a large inventory (after its first log
/// line, long before it serves) ends in a clean exit, status 0, not death by the signal.
#[test]
fn sigterm_during_start_up_is_a_clean_shutdown() {
    let mut child = Command::new(binary())
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
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bigfleet-libvirt");
    // The first log line comes before seeding starts: the process is starting up.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    stderr.read_line(&mut first).unwrap();
    assert!(!first.contains("serving CapacityProvider"), "{first}");
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    child.stderr = Some(stderr.into_inner());
    let (status, rest) = exit_within(child, Duration::from_secs(120));
    let status = status.expect("exited within 120 s of SIGTERM");
    assert_eq!(
        status.code(),
        Some(0),
        "a SIGTERM during start-up must be a clean exit, got {status:?}\n{first}{rest}"
    );
    assert!(rest.contains("shutting down"), "{rest}");
}
