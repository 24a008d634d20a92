//! The real-libvirt benchmark: the `bigfleet-libvirt` binary driven over gRPC against the
//! real-QEMU tier's two libvirtd zones (scripts/qemu-tier/run.sh), each number next to the
//! bare sequence of the same libvirt calls (`real_libvirt/bare.rs`) measured in the same run.
//!
//! - `create_c1_ratio`: Create ack → Idle at concurrency 1 ÷ the bare sequence (medians).
//!   Idle does not wait for the guest agent (Configure does), so neither side does.
//! - `create_c8_throughput_ratio`: Creates/s with 8 in flight across both zones ÷ the bare
//!   sequence run 8-wide (4 threads on each zone's connection).
//! - `delete_p99_under_create_load_ms` / `create_p50_ms`: Delete ack → Speculative while 12
//!   Creates are queued on the same zone, and those Creates' ack → Idle; next to the
//!   unloaded Delete's p99 (`delete_p99_unloaded_ms`).
//! - `agent_poll_isolation`: Create ack → Idle while 4 guests of the same zone wait in
//!   Configure for an agent that never answers (every guest boots with `bigfleet.agent=off`,
//!   which scripts/qemu-tier/init honours) ÷ the same Creates beside the same 4 guests
//!   running Idle (medians), so the guests' own CPU is on both sides and only the agent
//!   polling differs; the bare sequence is timed beside the same guests in both arms too
//!   (`bare_agent_isolation`), and each arm keeps the provider's phase means.
//!
//! `kvm` where a KVM guest starts in the zone (a probe of the bare sequence, with the
//! named CPU model `REAL_LIBVIRT_KVM_CPU`, default `kvm64`: host-passthrough aborts QEMU 7.2
//! on nested KVM), else `qemu`. `--host-budget` is passed only when the binary lists it.
//! Numbers are printed and written to `target/bench/real-libvirt.json`; nothing is
//! asserted: it fails only when a call errors. The p99 of a handful of samples is their
//! maximum. Sizes: `REAL_LIBVIRT_C1` (3), `REAL_LIBVIRT_C8_PER_ZONE` (4),
//! `REAL_LIBVIRT_QUEUED` (12), `REAL_LIBVIRT_DELETES` (2), `REAL_LIBVIRT_STUCK` (4),
//! `REAL_LIBVIRT_BUDGET` (the product's default `--host-budget`). The defaults keep the run within 90 s on the 2-core machine
//! (docs/benchmarks.md: how many samples each ratio rests on); the earlier ones (5, 8, 16,
//! 4, 8) took about 200 s and gave ratios within the same spread.
//!
//! Run inside a started tier: `scripts/bench/real-libvirt.sh` (the tier's `ci` runs it).

#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

#[path = "real_libvirt/bare.rs"]
mod bare;
#[path = "real_libvirt/drive.rs"]
mod drive;
#[allow(unused_imports)]
#[path = "../tests/harness/mod.rs"]
mod harness;
#[path = "real_libvirt/phases.rs"]
mod phases;
#[allow(dead_code)]
#[path = "../tests/qemu_zones.rs"]
mod qemu_zones;
#[path = "real_libvirt/report.rs"]
mod report;
#[path = "common/results.rs"]
mod results;

use crate::results::say;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::bare::Bare;
use crate::qemu_zones::{Libvirt, Tier, ids_in};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const LABEL: &str = "realbench";

/// How many samples each phase takes.
#[derive(Clone, Debug)]
pub struct Sizes {
    pub c1: usize,
    pub c8_per_zone: usize,
    pub c8_width: usize,
    pub queued: usize,
    pub deletes: usize,
    pub stuck: usize,
    pub budget: usize,
}

fn size(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl Sizes {
    fn from_env() -> Self {
        Self {
            c1: size("REAL_LIBVIRT_C1", 3),
            c8_per_zone: size("REAL_LIBVIRT_C8_PER_ZONE", 4),
            c8_width: 8,
            queued: size("REAL_LIBVIRT_QUEUED", 12),
            deletes: size("REAL_LIBVIRT_DELETES", 2),
            stuck: size("REAL_LIBVIRT_STUCK", 4),
            budget: size(
                "REAL_LIBVIRT_BUDGET",
                bigfleet_libvirt_ports::lanes::DEFAULT_HOST_BUDGET,
            ),
        }
    }

    /// Slots each zone needs at once: (zone a, zone b).
    fn slots(&self) -> (usize, usize) {
        let a = [
            self.c1,
            self.c8_per_zone,
            self.queued + self.deletes,
            self.stuck + 2 * self.c1,
        ];
        (a.into_iter().max().unwrap_or(1), self.c8_per_zone)
    }
}

fn main() -> Result<(), BoxError> {
    if std::env::var_os("BIGFLEET_QEMU_URI").is_none() || !std::env::args().any(|a| a == "--bench")
    {
        say!(
            "real-libvirt bench: skipped: run it inside the real-QEMU tier (scripts/bench/real-libvirt.sh)"
        );
        return Ok(());
    }
    virt::error::clear_error_callback();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let mut tier = Tier::from_env();
    tier.cmdline = format!("{} bigfleet.agent=off", tier.cmdline);
    let started = std::time::Instant::now();
    let outcome = runtime.block_on(run(&mut tier, dir.path()));
    let cleanup_started = std::time::Instant::now();
    // Whatever happened, nothing this run made stays on the hosts.
    let cleaned = cleanup(&tier);
    say!(
        "real-libvirt bench: clean-up took {:.1?}; the whole run {:.1?}",
        cleanup_started.elapsed(),
        started.elapsed()
    );
    let report = outcome?;
    cleaned?;
    report::write(&report)?;
    results::write("real_libvirt (scripts/bench/real-libvirt.sh)")
}

/// Picks the domain type: `kvm` when a bare KVM domain starts in zone a, else `qemu`. The
/// tier's own verdict (`BIGFLEET_QEMU_KVM`, from a guest that must print within 40 s) comes
/// first: on a host where KVM starts QEMU but no guest runs (nested `kvm_pvm`), a started
/// domain proves nothing, and the bench's later KVM starts then hang.
fn probe(tier: &mut Tier) -> Result<(Option<String>, String), BoxError> {
    if let Ok(verdict) = std::env::var("BIGFLEET_QEMU_KVM") {
        if !verdict.starts_with("yes") {
            tier.domain_type = "qemu";
            return Ok((
                None,
                format!("the tier says KVM cannot run guests ({verdict}); using qemu (TCG)"),
            ));
        }
    }
    let cpu = std::env::var("REAL_LIBVIRT_KVM_CPU").unwrap_or_else(|_| "kvm64".to_owned());
    tier.domain_type = "kvm";
    let side = Bare::open(tier, &tier.a, Some(&cpu), &format!("{LABEL}-probe"))?;
    let outcome = side.create(0);
    side.remove(0)?;
    match outcome {
        Ok(_) => Ok((Some(cpu), "a KVM guest started".to_owned())),
        Err(e) => {
            tier.domain_type = "qemu";
            Ok((
                None,
                format!("KVM did not start a guest ({e}); using qemu (TCG)"),
            ))
        }
    }
}

/// Whether the binary has `--host-budget` (the per-host lanes); its flag when it has.
fn budget_flag(sizes: &Sizes) -> Option<String> {
    let help = std::process::Command::new(harness::binary())
        .arg("--help")
        .output()
        .ok()?;
    String::from_utf8_lossy(&help.stdout)
        .contains("--host-budget")
        .then(|| format!("--host-budget={}", sizes.budget))
}

async fn run(tier: &mut Tier, dir: &std::path::Path) -> Result<report::Report, BoxError> {
    let started = std::time::Instant::now();
    let sizes = Sizes::from_env();
    let load_before = loadavg();
    let (cpu, why) = probe(tier)?;
    say!(
        "real-libvirt bench: domain type {} ({why})",
        tier.domain_type
    );
    let budget = budget_flag(&sizes);
    match &budget {
        Some(flag) => {
            say!("real-libvirt bench: the binary has --host-budget; passing {flag}")
        }
        None => say!(
            "real-libvirt bench: the binary has no --host-budget (fixed per-host limit); passing none"
        ),
    }
    let mut extra = vec!["--cpu-allocation-ratio=64".to_owned()];
    extra.extend(cpu.iter().map(|cpu| format!("--cpu={cpu}")));
    extra.extend(budget.clone());
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let (slots_a, slots_b) = sizes.slots();
    let server = tier.provider(dir, LABEL, (slots_a as u32, slots_b as u32), &extra);
    let mut c = server.client().await;
    let (a, b) = (
        ids_in(&mut c, tier.a.label).await,
        ids_in(&mut c, tier.b.label).await,
    );
    let mut sides = vec![
        Bare::open(tier, &tier.a, cpu.as_deref(), &format!("{LABEL}-bare-a"))?,
        Bare::open(tier, &tier.b, cpu.as_deref(), &format!("{LABEL}-bare-b"))?,
    ];
    // Warm both paths once; the bare seed gets as many bytes as the provider's seed.
    let seed = warm(&mut c, tier, &a[0], &sides[0]).await?;
    for side in &mut sides {
        side.seed_bytes = seed;
    }
    let sides: Vec<Arc<Bare>> = sides.into_iter().map(Arc::new).collect();
    say!("real-libvirt bench: warmed up; seed volume {seed} bytes");
    let mut clock = PhaseClock::start(started);
    let c1 = phases::c1(&c, &sides[0], &a, &sizes).await?;
    clock.lap("c1");
    let c8 = phases::c8(&c, &server, &sides, &a, &b, &sizes).await?;
    clock.lap("c8");
    let loaded = phases::delete_under_load(&c, &a, &sizes).await?;
    clock.lap("delete_under_load");
    let agent = phases::agent_isolation(&c, &server, &sides[0], &a, &sizes).await?;
    clock.lap("agent_isolation");
    let phases = phase_means(&BTreeMap::new(), &phase_sums(&server).await);
    let load = serde_json::json!({ "before": load_before, "after": loadavg() });
    Ok(report::Report {
        domain_type: tier.domain_type,
        versions: versions(tier)?,
        budget,
        sizes,
        c1,
        c8,
        loaded,
        agent,
        provider_phases: phases,
        load,
        steps: report::steps(
            &sides[0]
                .steps
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        ),
    })
}

/// Prints how long each phase of the run took (the warm-up and set-up are the first lap),
/// so the run's time can be read phase by phase.
struct PhaseClock(std::time::Instant);

impl PhaseClock {
    fn start(run_started: std::time::Instant) -> Self {
        let mut clock = Self(run_started);
        clock.lap("set-up and warm-up");
        clock
    }

    fn lap(&mut self, phase: &str) {
        say!("real-libvirt bench: {phase} took {:.1?}", self.0.elapsed());
        self.0 = std::time::Instant::now();
    }
}

/// One provider Create and Delete and one bare Create on zone a; returns the size of the
/// provider's seed volume.
async fn warm(
    c: &mut harness::Client,
    tier: &Tier,
    id: &str,
    side: &Bare,
) -> Result<usize, BoxError> {
    drive::create_timed(c.clone(), id.to_owned()).await?;
    let name = drive::domain_of(c, id).await?;
    let zone = Libvirt::open(tier, &tier.a);
    let seed = zone
        .pool()
        .lookup_storage_vol_by_name(&format!("{name}-cidata.iso"))
        .and_then(|v| v.info())
        .map_err(|e| format!("the provider's seed volume of {name}: {e}"))?
        .capacity;
    drive::delete_timed(c.clone(), id.to_owned()).await?;
    side.create(0)?;
    side.remove(0)?;
    Ok(usize::try_from(seed)?)
}

/// The provider's `define` and `start` phase histograms and each lane's wait for a slot (all
/// zones together), from its `/metrics`, as (sum s, count) by name (`define`, `start`,
/// `create_lane_wait`, …): read twice, they give the means of what happened in between.
pub async fn phase_sums(server: &harness::Server) -> BTreeMap<String, (f64, f64)> {
    let mut out = BTreeMap::new();
    let Some(addr) = server.metrics_addr else {
        return out;
    };
    let text = harness::scrape::scrape(addr).await.text;
    let total = |prefix: &str, label: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    for phase in ["define", "start"] {
        let name = "bigfleet_libvirt_phase_duration_seconds";
        let label = format!("phase=\"{phase}\"}}");
        let sum = total(&format!("{name}_sum{{"), &label);
        let count = total(&format!("{name}_count{{"), &label);
        out.insert(phase.to_owned(), (sum, count));
    }
    for lane in ["create", "teardown", "read", "agent"] {
        let name = "bigfleet_libvirt_host_queue_wait_seconds";
        let label = format!("lane=\"{lane}\"}}");
        let sum = total(&format!("{name}_sum{{"), &label);
        let count = total(&format!("{name}_count{{"), &label);
        out.insert(format!("{lane}_lane_wait"), (sum, count));
    }
    out
}

/// The mean (ms) of each series over what happened between the readings `before` and
/// `after` (all of the run when `before` is empty), and how many it averages.
pub fn phase_means(
    before: &BTreeMap<String, (f64, f64)>,
    after: &BTreeMap<String, (f64, f64)>,
) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (name, (sum, count)) in after {
        let (sum0, count0) = before.get(name).copied().unwrap_or((0.0, 0.0));
        let (sum, count) = (sum - sum0, count - count0);
        if count > 0.0 {
            out.insert(
                name.clone(),
                serde_json::json!((sum / count * 1e6).round() / 1e3),
            );
            out.insert(format!("{name}_count"), serde_json::json!(count));
        }
    }
    out.into()
}

/// The machine's 1-minute load average (the other work the numbers shared it with).
fn loadavg() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// The libvirt library and QEMU versions of zone a, as `major.minor.micro`.
fn versions(tier: &Tier) -> Result<(String, String), BoxError> {
    let conn = virt::connect::Connect::open(Some(&tier.a.uri))?;
    let dotted = |v: u32| format!("{}.{}.{}", v / 1_000_000, v / 1000 % 1000, v % 1000);
    Ok((dotted(conn.lib_version()?), dotted(conn.hyp_version()?)))
}

/// Removes every domain (and its volumes) this run made on either zone.
fn cleanup(tier: &Tier) -> Result<(), BoxError> {
    for zone in [&tier.a, &tier.b] {
        let host = Libvirt::open(tier, zone);
        // The provider's and the bare domains all carry an ownership tag naming a provider
        // label that starts with LABEL.
        let ours = |name: &String| {
            host.domain(name)
                .and_then(|d| d.xml_desc(0).ok())
                .is_some_and(|xml| xml.contains(&format!(":provider>{LABEL}")))
        };
        let names: Vec<String> = host.domains().into_iter().filter(|n| ours(n)).collect();
        // Stop the guests first, all at once (one thread and connection each): a destroy
        // waits for its QEMU to exit, and one at a time that took a fifth of the run.
        std::thread::scope(|scope| {
            for name in &names {
                scope.spawn(move || {
                    if let Some(domain) = Libvirt::open(tier, zone).domain(name) {
                        // As in `remove`, which tries again: a failure shows as its undefine failing.
                        let _ = domain.destroy();
                    }
                });
            }
        });
        for name in &names {
            host.remove(name);
        }
    }
    Ok(())
}
