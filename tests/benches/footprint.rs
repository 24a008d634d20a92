//! Footprint benchmark: what one provider process costs in memory, start-up time, state-file
//! size and exit time, and how fast it answers an idempotent replay next to a Get.
//!
//! Two parts, printed in one run:
//!
//! 1. **The real binary** (`footprint/process.rs`), on the fake backend with no simulated
//!    latency, at 8,000 and 100,000 machines, in memory and with `--state`: RSS (VmRSS from
//!    /proc) after ready and after one full List, RSS per machine over an empty process,
//!    start to ready (the "serving" log line) and to the first full List answered, restart on
//!    the state file to the first full List, state-file size and bytes per machine, how much
//!    the file grows for one Configure, SIGTERM to exit, and the throughput of a no-token
//!    Create replay next to Get at 64 concurrent clients.
//! 2. **A per-component heap breakdown** (`footprint/heap.rs`): in this process, a counting
//!    global allocator measures the live bytes each component adds when built the way the
//!    binary builds it: the inventory, the fake hypervisor, the domain core, the in-memory
//!    store, the provider as a whole, the List memo after one full List, and the fence and
//!    operation records a mutation adds.
//!
//! The binary measured is the one Cargo builds for the benchmark: under `cargo bench` the
//! release profile, so the figures are the ones an operator sees (`$BIGFLEET_LIBVIRT_RELEASE_BIN`
//! points it at another build).
//!
//! Run: `cargo bench -p bigfleet-libvirt --bench footprint`.
//! `BENCH_QUICK=1` (or a start without `--bench`, as `cargo test --benches` does) runs only
//! 8,000 machines and shorter throughput windows; `BENCH_FOOTPRINT_SIZES=8000,100000` picks
//! the sizes; `BENCH_FOOTPRINT_PARTS=heap` (or `process`) runs one part only (the heap part
//! needs no release binary); `BENCH_FOOTPRINT_ARGS` adds flags to every provider started
//! (e.g. `--log-level=warn`). Numbers are printed, never asserted.

// Black-box tests and benchmarks measure wall time and spawn freely: the product's bans on raw
// time, spawning and hash collections (clippy.toml) do not apply to them.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

#[path = "footprint/heap.rs"]
mod heap;
#[path = "footprint/process.rs"]
mod process;
#[path = "common/results.rs"]
mod results;

use crate::results::say;
use std::alloc::System;

use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

/// Counts every allocation of this process (the in-process breakdown reads it).
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The goal figures of the footprint work, printed next to each measured number.
pub(crate) mod goal {
    /// RSS after seeding and one full List at 100k machines, MiB.
    pub const RSS_MIB: f64 = 170.0;
    /// RSS per machine over the empty process, KiB.
    pub const KIB_PER_MACHINE: f64 = 1.7;
    /// Start to first full List, in memory, ms.
    pub const START_MS: f64 = 500.0;
    /// Restart on a state file to first full List, ms.
    pub const RESTART_MS: f64 = 550.0;
    /// State file at 100k machines, MB.
    pub const STATE_MB: f64 = 28.0;
    /// SIGTERM to exit with nothing in flight, ms.
    pub const EXIT_MS: f64 = 100.0;
    /// No-token Create replay throughput as a share of Get's, at least.
    pub const REPLAY_SHARE: f64 = 0.9;
}

fn quick() -> bool {
    let flag = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    flag || !std::env::args().any(|a| a == "--bench")
}

fn sizes() -> Vec<usize> {
    if let Ok(list) = std::env::var("BENCH_FOOTPRINT_SIZES") {
        let parsed: Vec<usize> = list
            .split(',')
            .filter_map(|s| s.trim().replace('_', "").parse().ok())
            .collect();
        if !parsed.is_empty() {
            return parsed;
        }
    }
    if quick() {
        vec![8_000]
    } else {
        vec![8_000, 100_000]
    }
}

fn main() -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let sizes = sizes();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    say!(
        "footprint benchmark; load average at start: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let parts = std::env::var("BENCH_FOOTPRINT_PARTS").unwrap_or_default();
    let wanted = |part: &str| parts.is_empty() || parts.split(',').any(|p| p.trim() == part);
    if wanted("process") {
        runtime.block_on(process::run(&sizes, quick()))?;
    }
    if wanted("heap") {
        for &machines in &sizes {
            runtime.block_on(heap::run(machines))?;
        }
    }
    results::write("footprint")
}
