//! The benchmark's printed table and its JSON (`target/bench/real-libvirt.json`).

use crate::results::say;
use std::time::Duration;

use serde_json::json;

use super::phases::{Agent, C1, C8, Loaded};
use super::{BoxError, Sizes};

/// Everything one run measured.
pub struct Report {
    pub domain_type: &'static str,
    /// libvirt's and QEMU's versions.
    pub versions: (String, String),
    /// The `--host-budget` flag passed, if the binary has it.
    pub budget: Option<String>,
    pub sizes: Sizes,
    pub c1: C1,
    pub c8: C8,
    pub loaded: Loaded,
    /// Create ack → Idle next to the stuck-agent guests, and the provider's phases in each arm.
    pub agent: Agent,
    /// The bare sequence's steps on zone a (median and mean ms of each): volumes, seed
    /// upload, define, start.
    pub steps: serde_json::Value,
    /// The provider's mean define and start phases and lane waits (ms).
    pub provider_phases: serde_json::Value,
    /// The 1-minute load average before and after the run.
    pub load: serde_json::Value,
}

/// The median and the mean of each bare step, in ms, by name (`define`, `define_mean`, …):
/// the provider's phases are histogram means, so the means are what compare with them.
pub fn steps(all: &[[Duration; 4]]) -> serde_json::Value {
    let names = ["volumes", "seed_upload", "define", "start"];
    let mut out = serde_json::Map::new();
    for (i, name) in names.iter().enumerate() {
        let column: Vec<Duration> = all.iter().map(|s| s[i]).collect();
        out.insert((*name).to_owned(), json!(pct(&column, 50.0)));
        let count = u32::try_from(column.len()).unwrap_or(u32::MAX).max(1);
        let mean = column.iter().sum::<Duration>() / count;
        out.insert(format!("{name}_mean"), json!(ms(mean)));
    }
    out.into()
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// The nearest-rank percentile `p` (0–100) of `samples`, in ms.
fn pct(samples: &[Duration], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.clamp(1, sorted.len().max(1)) - 1)
        .map_or(f64::NAN, |d| ms(*d))
}

fn ratio(a: f64, b: f64) -> f64 {
    (a / b * 1000.0).round() / 1000.0
}

fn goal(met: bool) -> &'static str {
    if met { "goal met" } else { "goal missed" }
}

impl Report {
    fn json(&self) -> serde_json::Value {
        let (c1, c8, loaded) = (&self.c1, &self.c8, &self.loaded);
        let create_c1 = pct(&c1.provider, 50.0);
        let bare_c1 = pct(&c1.bare, 50.0);
        let agent_p50 = pct(&self.agent.stuck, 50.0);
        let agent_idle_p50 = pct(&self.agent.idle, 50.0);
        json!({
            "domain_type": self.domain_type,
            "libvirt_version": self.versions.0,
            "qemu_version": self.versions.1,
            // null: the binary has no --host-budget (its fixed per-host limit applies).
            "host_budget": self.budget.as_ref().map(|_| self.sizes.budget),
            // The provider's default for that budget (the bench passes no --host-connections).
            "host_connections": self.budget.as_ref().map(|_| {
                bigfleet_libvirt_ports::lanes::Budget::new(self.sizes.budget, 1)
                    .and_then(|b| bigfleet_libvirt_ports::spread::host_connections(b, None))
                    .ok()
            }),
            "create_c1_ratio": ratio(create_c1, bare_c1),
            "create_c1_p50_ms": create_c1,
            "bare_c1_p50_ms": bare_c1,
            "create_c8_throughput_ratio": ratio(c8.provider_per_s, c8.bare_per_s),
            "create_c8_per_s": (c8.provider_per_s * 100.0).round() / 100.0,
            "bare_c8_per_s": (c8.bare_per_s * 100.0).round() / 100.0,
            "delete_p99_under_create_load_ms": pct(&loaded.delete, 99.0),
            "delete_p99_unloaded_ms": pct(&c1.delete, 99.0),
            "delete_p99_load_ratio": ratio(pct(&loaded.delete, 99.0), pct(&c1.delete, 99.0)),
            "create_p50_ms": pct(&loaded.create, 50.0),
            "deletes_done_before_the_last_queued_create": loaded.deletes_before_creates,
            "agent_poll_isolation": ratio(agent_p50, agent_idle_p50),
            "create_p50_with_stuck_agents_ms": agent_p50,
            "create_p50_beside_idle_guests_ms": agent_idle_p50,
            "create_with_stuck_agents_ms": self.agent.stuck.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
            "create_beside_idle_guests_ms": self.agent.idle.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
            "bare_agent_isolation": ratio(pct(&self.agent.bare_stuck, 50.0), pct(&self.agent.bare_idle, 50.0)),
            "bare_with_stuck_agents_ms": self.agent.bare_stuck.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
            "bare_beside_idle_guests_ms": self.agent.bare_idle.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
            "c8_phases_mean_ms": c8.phases,
            "agent_isolation_phases_mean_ms": {
                "beside_idle_guests": self.agent.idle_phases,
                "with_stuck_agents": self.agent.stuck_phases,
            },
            "c1_provider_ms": c1.provider.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
            "c1_bare_ms": c1.bare.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
            "c8_rounds_per_s": c8.rounds.iter().map(|(p, b)| json!({ "provider": p, "bare": b })).collect::<Vec<_>>(),
            "bare_steps_ms": self.steps,
            "provider_phases_mean_ms": self.provider_phases,
            "load_average_1m": self.load,
            "samples": {
                "c1": c1.provider.len(),
                "c8_creates": c8.count,
                "queued_creates": loaded.create.len(),
                "loaded_deletes": loaded.delete.len(),
                "unloaded_deletes": c1.delete.len(),
                "stuck_agents": self.sizes.stuck,
                "with_stuck_agents": self.agent.stuck.len(),
                "beside_idle_guests": self.agent.idle.len(),
            },
        })
    }
}

/// Prints the table and writes the JSON.
pub fn write(report: &Report) -> Result<(), BoxError> {
    let j = report.json();
    let num = |k: &str| j[k].as_f64().unwrap_or(f64::NAN);
    say!(
        "real-libvirt bench: domain type {}, libvirt {}, QEMU {}, budget {}, load average {}",
        report.domain_type,
        report.versions.0,
        report.versions.1,
        report
            .budget
            .as_deref()
            .unwrap_or("none (no --host-budget flag)"),
        j["load_average_1m"]
    );
    let c1 = num("create_c1_ratio");
    say!(
        "  Create ack→Idle, c1:     {:>9.1} ms p50 vs bare {:>9.1} ms   ratio {c1:.3} (≤ 1.1: {})",
        num("create_c1_p50_ms"),
        num("bare_c1_p50_ms"),
        goal(c1 <= 1.1)
    );
    let c8 = num("create_c8_throughput_ratio");
    say!(
        "  Creates/s, 8 in flight:  {:>9.2} /s     vs bare {:>9.2} /s     ratio {c8:.3} (≥ 1.0: {}; best of rounds {})",
        num("create_c8_per_s"),
        num("bare_c8_per_s"),
        goal(c8 >= 1.0),
        j["c8_rounds_per_s"]
    );
    say!(
        "  the provider's means over its c8 Creates (ms): {}",
        j["c8_phases_mean_ms"]
    );
    let del = num("delete_p99_load_ratio");
    say!(
        "  Delete p99, {} Creates queued: {:>9.1} ms vs unloaded {:>9.1} ms   ratio {del:.3} (≤ 1.3: {}); \
         queued Creates' p50 {:.1} ms; {} of {} Deletes done before the last queued Create",
        report.sizes.queued,
        num("delete_p99_under_create_load_ms"),
        num("delete_p99_unloaded_ms"),
        goal(del <= 1.3),
        num("create_p50_ms"),
        j["deletes_done_before_the_last_queued_create"],
        report.loaded.delete.len()
    );
    let agent = num("agent_poll_isolation");
    say!(
        "  Create beside {} guests with stuck agents: {:>9.1} ms p50 vs beside the same guests Idle {:>9.1} ms   ratio {agent:.3} (≤ 1.2: {}); \
         the bare sequence beside the same guests: ratio {:.3}; the provider's means over each arm (ms): {}",
        report.sizes.stuck,
        num("create_p50_with_stuck_agents_ms"),
        num("create_p50_beside_idle_guests_ms"),
        goal(agent <= 1.2),
        num("bare_agent_isolation"),
        j["agent_isolation_phases_mean_ms"]
    );
    say!(
        "  bare sequence's steps on zone a (p50 and mean ms over all its Creates): {}; the \
         provider's define and start, and each lane's wait for a slot (mean ms over the run): {}",
        j["bare_steps_ms"],
        j["provider_phases_mean_ms"]
    );
    let dir = super::harness::repo_root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("real-libvirt.json");
    std::fs::write(&path, serde_json::to_string_pretty(&j)? + "\n")?;
    say!("real-libvirt bench: wrote {}", path.display());
    Ok(())
}
