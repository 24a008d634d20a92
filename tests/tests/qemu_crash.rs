//! Issue 45 — crashes with the host still running: the provider (with `--state`) over the
//! tier's two real libvirtd daemons is SIGKILLed while a Create, a Configure, a Drain and a
//! Delete run at once, at a different delay after their acks in each round, and restarted on
//! the same state file while the daemons and their QEMU guests go on. What the restarted
//! provider must make of what it finds is in docs/contract.md §5 ("Restart recovery") and
//! docs/libvirt.md §5.10 (leftovers); docs/conformance.md §8 lists the checks:
//!
//! - every acknowledged operation survives: its machine is at the target, and a replay (with
//!   a newer token) returns the acknowledged operation id, or it is Failed with the restart's
//!   reason; nothing is left transitional; a binding (cluster and `shard_metadata`) survives
//!   with its running guest;
//! - a stale token's Delete of a running machine is fenced and leaves its domain running;
//! - once settled, every domain and volume the test did not find at its start belongs to a
//!   machine that has a host (Idle, Configured, or Failed with its host; the machines have a
//!   data disk beside the overlay, the seed and the console log), every Idle or
//!   Configured machine has exactly one domain, running, on its own zone's host, and no
//!   machine without a host has one (an interrupted Create is compensated); an interrupted
//!   Delete's volumes without their domain are collected as orphans (`--gc-orphans` with a
//!   1 s grace); the drift gauges then read no orphan and no stopped domain.
//!
//! The kill delays are spread over the steps of the four sequences (a seeded shuffle, printed;
//! `BIGFLEET_TEST_SEED` overrides it), and each kill point prints what the hosts showed at the
//! kill (domain defined, running, volumes), which is where in its sequence the call was.
//!
//! Needs the real-QEMU tier (`#[ignore]`d in the ordinary suite; `scripts/qemu-tier/run.sh
//! ci` runs it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use tonic::Code;

use crate::harness::*;
use crate::qemu_zones::*;

/// Rounds of four kill points each.
const ROUNDS: usize = 8;
/// Slots per zone: enough for every round to replace the machines its kills left Failed.
const SLOTS: u32 = 16;
/// The kill delays (after the four acks) are spread over [0, SPREAD): a Create or Delete of a
/// tiny guest takes 0.3–0.8 s here, a Configure 0.5–5 s (most of it the freshly booted
/// guest's agent), so the late rounds find some calls done.
const SPREAD: Duration = Duration::from_millis(1600);
/// How long the hosts may take to settle after a restart (compensation, orphan collection).
const SETTLE_HOSTS: Duration = Duration::from_secs(90);
/// How long after a restart the hosts are looked at before they count as settled: two
/// reconciles (`--reconcile-interval=2s`).
const LOOKED: Duration = Duration::from_secs(5);
/// The restart-recovery reason.
const INTERRUPTED: &str = "interrupted by a provider restart";

/// The four calls of a round, and the state each one ends in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Create,
    Configure,
    Drain,
    Delete,
}

impl Call {
    fn target(self) -> S {
        match self {
            Call::Create | Call::Drain => S::Idle,
            Call::Configure => S::Configured,
            Call::Delete => S::Speculative,
        }
    }

    async fn send(
        self,
        c: &mut Client,
        id: &str,
        token: Token,
    ) -> Result<pb::TransitionAck, tonic::Status> {
        match self {
            Call::Create => create(c, id, token).await,
            Call::Configure => configure(c, id, "crash-cluster", &[("crash", "1")], token).await,
            Call::Drain => drain(c, id, 5, token).await,
            Call::Delete => delete(c, id, token).await,
        }
    }
}

/// The campaign: the tier, the provider's flags and state file, the fencing shard's next
/// sequence number, and what the test learnt.
struct Campaign {
    tier: Tier,
    args: Vec<String>,
    server: Server,
    shard: String,
    sequence: i64,
    /// Domain and volume names that were on each zone before the campaign (other groups').
    before: BTreeMap<&'static str, (BTreeSet<String>, BTreeSet<String>)>,
    /// Each machine's domain name, learnt from its host reference.
    names: BTreeMap<String, String>,
    /// Each machine's zone.
    zones: BTreeMap<String, &'static str>,
}

impl Campaign {
    fn start(dir: &Path) -> Self {
        let tier = Tier::from_env();
        let state = dir.join("crash.redb");
        let extra = [
            format!("--state={}", state.display()),
            "--gc-orphans".to_owned(),
            "--orphan-grace=1s".to_owned(),
            "--reconcile-interval=2s".to_owned(),
            // 2 host CPUs hold 8 one-vCPU machines at the default ratio of 4.
            "--cpu-allocation-ratio=16".to_owned(),
        ];
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        // A label of its own: domains an earlier, failed run left are not this provider's.
        let label = format!("crash{}", std::process::id());
        // A data disk too, so each machine has four volumes a crash can strand.
        let disk = r#""data_disks": [{"size_gib": 1}]"#;
        let args = tier.provider_args_shaped(dir, &label, (SLOTS, SLOTS), disk, &extra);
        let before = [&tier.a, &tier.b]
            .into_iter()
            .map(|zone| {
                let host = Libvirt::open(&tier, zone);
                let domains = host.domains().into_iter().collect();
                (zone.label, (domains, host.volumes().into_iter().collect()))
            })
            .collect();
        let server = launch(&args);
        Self {
            zones: BTreeMap::new(),
            tier,
            args,
            server,
            shard: unique_shard("crash"),
            sequence: 0,
            before,
            names: BTreeMap::new(),
        }
    }

    /// Learns every slot's zone.
    async fn learn_zones(&mut self) {
        let mut c = self.server.client().await;
        for m in list_all(&mut c).await.machines {
            let zone = if m.zone == "rackA" { "rackA" } else { "rackB" };
            self.zones.insert(m.id, zone);
        }
        assert_eq!(
            self.zones.len(),
            2 * SLOTS as usize,
            "every slot is offered"
        );
    }

    fn token(&mut self) -> Token {
        self.sequence += 1;
        tok(&self.shard, 1, self.sequence)
    }

    /// The machines in `state`, in id order, alternating the zones.
    async fn in_state(&self, state: S) -> Vec<String> {
        let mut c = self.server.client().await;
        let machines = list(&mut c, &[state], 0, b"").await.machines;
        let (a, b): (Vec<_>, Vec<_>) = machines.into_iter().partition(|m| m.zone == "rackA");
        let mut ids = Vec::new();
        for i in 0..a.len().max(b.len()) {
            ids.extend(a.get(i).map(|m| m.id.clone()));
            ids.extend(b.get(i).map(|m| m.id.clone()));
        }
        ids
    }

    /// Walks `id` with `call` (uninterrupted) to its target.
    async fn walk(&mut self, call: Call, id: &str) {
        let token = self.token();
        let mut c = self.server.client().await;
        call.send(&mut c, id, token)
            .await
            .expect("a preparing call is accepted");
        let machine = reach(&mut c, id, call.target(), BOOT).await;
        self.learn(&machine);
    }

    fn learn(&mut self, machine: &pb::Machine) {
        if host_set(machine) {
            self.names.insert(machine.id.clone(), domain_name(machine));
        }
    }

    /// One machine for each call of a round: a Speculative, two Idle and a Configured one,
    /// made from Speculative slots where the last round left too few.
    async fn cast(&mut self) -> Vec<(Call, String)> {
        let mut speculative = self.in_state(S::Speculative).await;
        let mut idle = self.in_state(S::Idle).await;
        let configured = self.in_state(S::Configured).await;
        // Configure and Delete take an Idle machine each, and Drain one more when no machine
        // is Configured yet.
        while idle.len() < 2 + usize::from(configured.is_empty()) {
            let id = speculative.remove(0);
            self.walk(Call::Create, &id).await;
            idle.push(id);
        }
        let to_drain = match configured.first() {
            Some(id) => id.clone(),
            None => {
                let id = idle.pop().expect("an Idle machine to configure");
                self.walk(Call::Configure, &id).await;
                id
            }
        };
        // The Configure takes the machine created last, whose guest may still be booting.
        let to_configure = idle.pop().expect("an Idle machine to configure");
        vec![
            (Call::Create, speculative.remove(0)),
            (Call::Configure, to_configure),
            (Call::Drain, to_drain),
            (Call::Delete, idle.remove(0)),
        ]
    }
}

fn launch(args: &[String]) -> Server {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&args)
}

/// What one kill point found and left.
struct KillPoint {
    round: usize,
    call: Call,
    delay: Duration,
    /// What the machine's zone showed at the kill.
    at_kill: String,
    /// The state after the restart.
    after: S,
}

/// What a zone shows of one domain and the volumes named after it.
fn facts(host: &Libvirt, name: &str) -> String {
    let volumes = host
        .volumes()
        .iter()
        .filter(|v| v.starts_with(name))
        .count();
    let domain = match host.domain(name) {
        None => "no domain",
        Some(d) if d.is_active().unwrap_or(false) => "running",
        Some(_) => "defined, off",
    };
    format!("{domain}, {volumes} volume(s)")
}

impl Campaign {
    fn zone(&self, label: &str) -> &Zone {
        if label == "rackA" {
            &self.tier.a
        } else {
            &self.tier.b
        }
    }

    /// Domains on `label`'s host that were not there before the campaign.
    fn new_domains(&self, label: &'static str) -> BTreeSet<String> {
        let host = Libvirt::open(&self.tier, self.zone(label));
        let before = &self.before[label].0;
        host.domains()
            .into_iter()
            .filter(|d| !before.contains(d))
            .collect()
    }

    /// What `id`'s zone shows of its domain now: by its known name, or (a Create that has
    /// not returned) a new domain no known machine explains.
    fn at_kill(&self, id: &str) -> String {
        let zone = self.zones[id];
        let host = Libvirt::open(&self.tier, self.zone(zone));
        let known: BTreeSet<&String> = self.names.values().collect();
        let name = self
            .names
            .get(id)
            .cloned()
            .or_else(|| (self.new_domains(zone).into_iter()).find(|d| !known.contains(d)));
        name.map_or_else(|| "no domain".to_owned(), |n| facts(&host, &n))
    }

    /// One round: the four calls at once, a kill `delay` after their acks, a restart, and
    /// the checks of what survived.
    async fn round(&mut self, round: usize, delay: Duration) -> Vec<KillPoint> {
        let cast = self.cast().await;
        let tokens: Vec<Token> = cast.iter().map(|_| self.token()).collect();
        let mut clients = Vec::new();
        for _ in &cast {
            clients.push(self.server.client().await);
        }
        let sends = (cast.iter().zip(tokens).zip(clients.iter_mut()))
            .map(|(((call, id), token), c)| call.send(c, id, token));
        let acks: Vec<String> = futures::future::join_all(sends)
            .await
            .into_iter()
            .map(|ack| ack.expect("every call of a round is accepted").operation_id)
            .collect();
        tokio::time::sleep(delay).await;
        self.server.kill();
        let mut seen = Vec::new();
        for (_, id) in &cast {
            seen.push(self.at_kill(id));
        }
        self.server = launch(&self.args);
        let mut points = Vec::new();
        for (((call, id), acked), at_kill) in cast.into_iter().zip(acks).zip(seen) {
            let after = self.survived(call, &id, &acked).await;
            points.push(KillPoint {
                round,
                call,
                delay,
                at_kill,
                after,
            });
        }
        self.fenced_delete_leaves_a_running_domain().await;
        self.settled().await;
        points
    }
}

impl Campaign {
    /// Checks that `call` of `id`, acknowledged as `acked`, survived the kill: at its
    /// target (and a replay returns `acked`), or Failed with the restart's reason (and a
    /// replay is refused, Failed being terminal). Returns the state.
    async fn survived(&mut self, call: Call, id: &str, acked: &str) -> S {
        let mut c = self.server.client().await;
        let machine = get(&mut c, id)
            .await
            .expect("an acknowledged machine is known");
        let now = state(&machine);
        // The binding survives with the guest: a Configured machine, or one whose Configure
        // or Drain the kill cut off, keeps the cluster and the exact metadata it was given.
        if now == S::Configured || (now == S::Failed && !machine.cluster.is_empty()) {
            assert_eq!(machine.cluster, "crash-cluster", "{call:?} of {id}");
            let metadata: Vec<(&str, &str)> = (machine.shard_metadata.iter())
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            assert_eq!(metadata, [("crash", "1")], "{call:?} of {id}");
        }
        let token = self.token();
        let replay = call.send(&mut c, id, token).await;
        if now == call.target() {
            let replay = replay.expect("a replay at the target is accepted");
            assert_eq!(
                replay.operation_id, acked,
                "{call:?} of {id}: a replay after the restart returns the acknowledged id"
            );
            self.learn(&machine);
        } else {
            assert_eq!(
                now,
                S::Failed,
                "{call:?} of {id} after the restart: neither at {:?} nor Failed",
                call.target()
            );
            assert!(
                machine.last_error.contains(INTERRUPTED),
                "{call:?} of {id}: {}",
                machine.last_error
            );
            assert_eq!(code(&replay), Code::Aborted, "{call:?} of Failed {id}");
        }
        now
    }

    /// A Delete with the shard's first (long stale) token on a machine whose domain runs is
    /// fenced, and the domain still runs.
    async fn fenced_delete_leaves_a_running_domain(&mut self) {
        let mut c = self.server.client().await;
        let mut running = list(&mut c, &[S::Idle, S::Configured], 0, b"")
            .await
            .machines;
        if running.is_empty() {
            // Every call of the round was cut off: make one.
            let id = self.in_state(S::Speculative).await.remove(0);
            self.walk(Call::Create, &id).await;
            running.push(get(&mut c, &id).await.unwrap());
        }
        let machine = &running[0];
        let stale = tok(&self.shard, 1, 1);
        let refused = delete(&mut c, &machine.id, stale).await;
        assert_eq!(
            code(&refused),
            Code::FailedPrecondition,
            "a stale Delete is fenced"
        );
        let after = get(&mut c, &machine.id).await.unwrap();
        assert_eq!(
            state(&after),
            state(machine),
            "the fenced Delete changed nothing"
        );
        let host = Libvirt::open(&self.tier, self.zone(self.zones[&machine.id]));
        let domain = host
            .domain(&domain_name(machine))
            .expect("its domain is there");
        assert!(domain.is_active().unwrap(), "and still runs");
    }

    /// Waits until the hosts agree with the state file ([`Campaign::violations`] is empty),
    /// and no sooner than two reconciles after the restart, so the drift gauges and the
    /// orphan collection have looked.
    async fn settled(&self) {
        let start = Instant::now();
        loop {
            let found = self.violations().await;
            if found.is_empty() && start.elapsed() >= LOOKED {
                println!(
                    "crash: hosts settled {:?} after the restart",
                    start.elapsed()
                );
                return;
            }
            if start.elapsed() >= SETTLE_HOSTS {
                let log = self.server.log_text();
                let warnings: Vec<&str> = (log.lines())
                    .filter(|l| l.contains("\"WARN\"") || l.contains("\"ERROR\""))
                    .collect();
                panic!(
                    "the hosts disagree with the state file after {SETTLE_HOSTS:?}: {found:#?}\n\
                     the provider's warnings:\n{}",
                    warnings[warnings.len().saturating_sub(40)..].join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// What the hosts show that the state file does not explain.
    async fn violations(&self) -> Vec<String> {
        let mut c = self.server.client().await;
        let mut found = Vec::new();
        let mut owners: BTreeMap<String, &'static str> = BTreeMap::new();
        for m in list_all(&mut c).await.machines {
            let zone = self.zones[&m.id];
            let now = state(&m);
            if matches!(
                now,
                S::Creating | S::Configuring | S::Draining | S::Deleting
            ) {
                found.push(format!("{} is {now:?} after the restart", m.id));
            }
            if !host_set(&m) {
                continue;
            }
            let name = domain_name(&m);
            owners.insert(name.clone(), zone);
            if matches!(now, S::Idle | S::Configured) {
                let host = Libvirt::open(&self.tier, self.zone(zone));
                match host.domain(&name) {
                    Some(d) if d.is_active().unwrap_or(false) => {}
                    _ => found.push(format!("{} is {now:?} without a running domain", m.id)),
                }
            }
        }
        for zone in ["rackA", "rackB"] {
            self.zone_violations(zone, &owners, &mut found).await;
        }
        found
    }

    /// The domains and volumes of `zone` no machine with a host explains, and its drift
    /// gauges.
    async fn zone_violations(
        &self,
        zone: &'static str,
        owners: &BTreeMap<String, &'static str>,
        found: &mut Vec<String>,
    ) {
        let host = Libvirt::open(&self.tier, self.zone(zone));
        let domains: BTreeSet<String> = host.domains().into_iter().collect();
        for name in self.new_domains(zone) {
            if owners.get(&name) != Some(&zone) {
                found.push(format!(
                    "domain {name} on {zone} has no machine with a host there"
                ));
            }
        }
        let before = &self.before[zone].1;
        for volume in host.volumes().into_iter().filter(|v| !before.contains(v)) {
            // A volume is named `<domain>-…`; a domain name is `bigfleet-` and 24 hex digits.
            let owner = volume.get(..33).unwrap_or(&volume);
            if !domains.contains(owner) {
                found.push(format!("volume {volume} on {zone} has no domain"));
            }
        }
        for kind in ["orphan_domain", "orphan_volume", "stopped"] {
            let drift = gauge(&self.server, DRIFT, &[("zone", zone), ("kind", kind)]).await;
            if drift != 0.0 {
                found.push(format!("the drift gauge says {drift} {kind} on {zone}"));
            }
        }
    }

    /// Removes every domain and volume the campaign made.
    fn clean_up(&self) {
        for zone in ["rackA", "rackB"] {
            let host = Libvirt::open(&self.tier, self.zone(zone));
            for name in self.new_domains(zone) {
                host.remove(&name);
            }
            let before = &self.before[zone].1;
            let pool = host.pool();
            for volume in host.volumes().into_iter().filter(|v| !before.contains(v)) {
                let _ = pool
                    .lookup_storage_vol_by_name(&volume)
                    .and_then(|v| v.delete(0));
            }
        }
    }
}

const DRIFT: &str = "bigfleet_libvirt_substrate_drift";

/// The round delays: one from each of `ROUNDS` equal parts of [0, SPREAD), in a seeded
/// order.
fn delays(seed: u64) -> Vec<Duration> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let part = SPREAD / u32::try_from(ROUNDS).unwrap();
    let mut delays: Vec<Duration> = (0..ROUNDS)
        .map(|i| part * u32::try_from(i).unwrap() + part.mul_f64(unit(&mut rng)))
        .collect();
    for i in (1..delays.len()).rev() {
        let j = usize::try_from(rng.next_u64() % (i as u64 + 1)).unwrap();
        delays.swap(i, j);
    }
    delays
}

fn unit(rng: &mut Xoshiro256PlusPlus) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let x = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    x
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn sigkill_at_every_step_with_the_hosts_running() {
    let seed = std::env::var("BIGFLEET_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(45);
    println!("crash: seed {seed} (BIGFLEET_TEST_SEED overrides it)");
    let dir = tempfile::tempdir().unwrap();
    let mut campaign = Campaign::start(dir.path());
    campaign.learn_zones().await;
    let started = Instant::now();
    let mut points = Vec::new();
    for (round, delay) in delays(seed).into_iter().enumerate() {
        points.extend(campaign.round(round, delay).await);
    }
    for p in &points {
        println!(
            "crash: round {} {:?} killed {:?} after the ack; the host showed {}; after the restart {:?}",
            p.round, p.call, p.delay, p.at_kill, p.after
        );
    }
    let failed = points.iter().filter(|p| p.after == S::Failed).count();
    println!(
        "crash: {} kill points, {failed} cut a call off, {} found it done; {:?} in all",
        points.len(),
        points.len() - failed,
        started.elapsed()
    );
    campaign.clean_up();
    assert!(points.len() >= 20, "at least 20 kill points");
}
