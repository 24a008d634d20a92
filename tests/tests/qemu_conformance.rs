//! Issue 45 — the conformance behaviours on real libvirtd: the launcher the behaviour
//! modules' `on_real_libvirtd!(…)` lists use (`harness/backend.rs`). Each launch is the
//! binary over the tier's two real daemons (zones rackA and rackB) with busybox guests of
//! the type `e2e.tiny` (a direct kernel boot under TCG, with qemu-ga and the recording
//! bootstrap and drain hooks: `qemu_zones`), so every Create boots a real QEMU guest, every
//! Configure runs the bootstrap hook through the guest agent and every Drain the drain hook.
//!
//! The fault lane's behaviours, provoked with real faults of the guest's hooks, are in
//! `on_real_libvirtd.rs` beside this file.
//!
//! A launch has a provider label of its own and, once its process is stopped, removes every
//! domain and volume that appeared on either host while it ran, so the behaviours (run one
//! at a time by the tier) never see each other's guests.

mod on_real_libvirtd;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::harness::*;
use crate::qemu_zones::*;

/// Slots per zone at most: enough for every behaviour listed, few enough that the guests
/// they boot fit the 2-core machine.
const MAX_PER_ZONE: u32 = 8;

/// What a host holds: its domain names and volume names.
type Holding = (BTreeSet<String>, BTreeSet<String>);

fn holding(host: &Libvirt) -> Holding {
    (
        host.domains().into_iter().collect(),
        host.volumes().into_iter().collect(),
    )
}

/// Starts the provider over the tier's zones a and b with `seed` slots (split between the
/// zones, at most [`MAX_PER_ZONE`] each) and `extra` flags.
pub fn launch(seed: u32, extra: &[&str]) -> Server {
    static LAUNCHES: AtomicU32 = AtomicU32::new(0);
    let tier = Tier::from_env();
    let dir = tempfile::tempdir().expect("a scratch directory");
    let per_zone = (seed / 2).clamp(2, MAX_PER_ZONE);
    let label = format!(
        "conf{}n{}",
        std::process::id(),
        LAUNCHES.fetch_add(1, Ordering::Relaxed)
    );
    let before: Vec<Holding> = [&tier.a, &tier.b]
        .into_iter()
        .map(|zone| holding(&Libvirt::open(&tier, zone)))
        .collect();
    // 2 host CPUs hold 8 one-vCPU machines at the default ratio of 4.
    let mut flags = vec!["--cpu-allocation-ratio=16"];
    flags.extend(extra);
    let server = tier.provider(dir.path(), &label, (per_zone, per_zone), &flags);
    server
        .holding(dir)
        .after_stop(move || remove_new(&tier, &before))
}

/// Waits until the pool of `host` can be refreshed: a volume job the stopped provider
/// started (an upload, a copy) runs on in the daemon, and a refresh is refused meanwhile.
fn quiet_pool(host: &Libvirt) {
    let start = Instant::now();
    while let Err(e) = host.pool().refresh(0) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the pool is still busy after 60 s: {e}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Removes every domain and volume of zones a and b that `before` does not list.
fn remove_new(tier: &Tier, before: &[Holding]) {
    for (zone, (domains, volumes)) in [&tier.a, &tier.b].into_iter().zip(before) {
        let host = Libvirt::open(tier, zone);
        quiet_pool(&host);
        for name in holding(&host).0.difference(domains) {
            host.remove(name);
        }
        let pool = host.pool();
        for volume in holding(&host).1.difference(volumes) {
            let found = pool.lookup_storage_vol_by_name(volume);
            found
                .and_then(|v| v.delete(0))
                .unwrap_or_else(|e| panic!("remove volume {volume} a launch made: {e}"));
        }
    }
}
