//! Provider launches per conformance profile. Every test starts its own process, so tests
//! never share fence marks or slots and can run in parallel. Each profile launches the
//! backend the test's thread chose (`backend.rs`): the fake by default, or the libvirt
//! backend on libvirt's test driver.

use super::Server;
use super::backend::{self, Backend};

/// Fast fake latencies keep the suite quick while transitional states stay observable.
const FAST: [&str; 2] = ["--fake-delay-min=5ms", "--fake-delay-max=40ms"];

/// The core/cloud profile: on-demand fake with Delete, 64 Speculative slots.
pub fn core() -> Server {
    core_with(&[])
}

/// The core profile plus extra flags.
pub fn core_with(extra: &[&str]) -> Server {
    launch(64, &FAST, extra)
}

/// The core profile with `seed` slots (the scale lane's 4000).
pub fn seeded(seed: u32) -> Server {
    launch(seed, &FAST, &[])
}

/// The core profile with the fake's latencies between `min` and `max` (e.g. `"150ms"`), so
/// transitional states last long enough to be read; on the test driver the backend's own
/// latencies stand.
pub fn slowed(min: &str, max: &str) -> Server {
    let (min, max) = (
        format!("--fake-delay-min={min}"),
        format!("--fake-delay-max={max}"),
    );
    launch(64, &[min.as_str(), max.as_str()], &[])
}

/// The fault profile: fault hooks on and a 2 s transition timeout, as the fault lane runs.
pub fn fault() -> Server {
    core_with(&["--fake-fault-hooks", "--transition-timeout=2s"])
}

/// The bare-metal profile: a fixed free pool without Delete.
pub fn bare_metal() -> Server {
    core_with(&["--capacity-type=bare_metal"])
}

/// Starts the provider named `certify` with `seed` slots on this thread's backend: the fake
/// with `fake` (its latency flags) and `extra`, or the test driver with `extra`.
fn launch(seed: u32, fake: &[&str], extra: &[&str]) -> Server {
    let seeded = format!("--seed-count={seed}");
    let common = ["--provider=certify", seeded.as_str()];
    match backend::current() {
        Backend::Fake => {
            let mut args = vec!["--use-fake-backend"];
            args.extend(common);
            args.extend(fake);
            args.extend(extra);
            Server::start(&args)
        }
        Backend::TestDriver => {
            let dir = tempfile::tempdir().expect("a scratch directory");
            let flags = backend::test_driver_flags(dir.path());
            let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
            args.extend(common);
            args.extend(extra);
            let server = Server::start(&args).holding(dir);
            let serving = server.log_text();
            assert!(
                serving.contains(r#""libvirt_backend":"libvirt""#),
                "the test-driver profile must serve from the libvirt backend: {serving}"
            );
            server
        }
        Backend::Real(launch) => launch(seed, extra),
    }
}
