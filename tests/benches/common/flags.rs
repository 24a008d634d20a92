//! The flags both benchmarks start the provider with: the binary's defaults, the fake
//! backend with no latency, and a fresh loopback port. Parsed from the same declarations
//! the binary's command line flattens, so every default is the binary's own.

use bigfleet_libvirt_app::launch::Flags;

/// The binary's flags for the zero-latency fake with `seed_count` Speculative slots on
/// `127.0.0.1:0`, no `--state`, no HTTP side server and no reconcile loop.
pub(crate) fn fake(seed_count: usize) -> Flags {
    let seed_count = seed_count.to_string();
    Flags::parse_args([
        "--addr=127.0.0.1:0",
        "--libvirt-backend=fake",
        "--use-fake-backend=true",
        "--seed-count",
        seed_count.as_str(),
        "--reconcile-interval=0",
        "--metrics-addr=",
        "--reflection=false",
        "--fake-delay-min=0",
        "--fake-delay-max=0",
    ])
    .unwrap_or_else(|e| panic!("the benchmarks' flags must parse: {e}"))
}
