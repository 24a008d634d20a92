//! Provider launches per conformance profile. Every test starts its own process, so tests
//! never share fence marks or slots and can run in parallel.

use super::Server;

/// Fast fake latencies keep the suite quick while transitional states stay observable.
const FAST: [&str; 2] = ["--fake-delay-min=5ms", "--fake-delay-max=40ms"];

/// The core/cloud profile: on-demand fake with Delete, 64 Speculative slots.
pub fn core() -> Server {
    core_with(&[])
}

/// The core profile plus extra flags.
pub fn core_with(extra: &[&str]) -> Server {
    let mut args = vec![
        "--use-fake-backend",
        "--provider=certify",
        "--seed-count=64",
    ];
    args.extend(FAST);
    args.extend(extra);
    Server::start(&args)
}

/// The fault profile: fault hooks on and a 2 s transition timeout, as the fault lane runs.
pub fn fault() -> Server {
    core_with(&["--fake-fault-hooks", "--transition-timeout=2s"])
}

/// The bare-metal profile: a fixed free pool without Delete.
pub fn bare_metal() -> Server {
    core_with(&["--capacity-type=bare_metal"])
}
