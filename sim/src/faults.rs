//! The fault plan of one run, drawn from the seed before anything runs (swarm testing:
//! each fault class is off in about half the runs, and its rate is drawn per run).
//!
//! Rates are rational probabilities. Windows (host outages, partitions) and process events
//! (provider crashes, shard restarts) are absolute times inside the fault phase; nothing
//! fires after it, which is what lets the quiescence phase demand convergence.

use std::fmt;
use std::time::Duration;

use bigfleet_libvirt_ports::lanes::{Budget, LIBVIRTD_DEFAULT_MAX_CLIENT_REQUESTS};
use bigfleet_libvirt_ports::spread;

use crate::rng::{Ratio, SimRng};

/// A closed interval of simulated time (since the start of the run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Which host or shard it concerns.
    pub target: usize,
    /// When it starts.
    pub start: Duration,
    /// When it ends.
    pub end: Duration,
}

impl Window {
    /// Whether `at` lies inside the window.
    #[must_use]
    pub fn covers(&self, target: usize, at: Duration) -> bool {
        self.target == target && self.start <= at && at < self.end
    }

    /// Whether the window concerns `target` at some time in `[from, to]`.
    #[must_use]
    pub fn overlaps(&self, target: usize, from: Duration, to: Duration) -> bool {
        self.target == target && self.start <= to && from < self.end
    }

    /// When a host resuming from this stall does the work it would have done at `at`
    /// (inside the window): after the end, in the same order, everything within
    /// [`RESUME_SPREAD`]-th of the stall's length.
    #[must_use]
    pub fn resume_at(&self, at: Duration) -> Duration {
        self.end + at.saturating_sub(self.start) / RESUME_SPREAD
    }

    /// When a host resuming from this stall has done all the work it held.
    #[must_use]
    pub fn resumed_by(&self) -> Duration {
        self.resume_at(self.end)
    }
}

/// A host resuming from a stall does what it held within this fraction of the stall's
/// length after its end (a frozen process catching up, not a burst at one instant, so that
/// the operations it held on one domain keep their order).
pub const RESUME_SPREAD: u32 = 1000;

/// Hypervisor call faults, drawn once per call.
#[derive(Clone, Debug)]
pub struct HostFaults {
    /// The call fails before it reaches the host (nothing happened).
    pub error: Ratio,
    /// The call takes far longer than usual (possibly past the deadline).
    pub spike: Ratio,
    /// The host acts much later and never answers (past the deadline).
    pub hang: Ratio,
    /// The host acts, the reply is lost (an indefinite error).
    pub lost_reply: Ratio,
    /// Create defines the domain but fails to start it (`SideEffects::Applied`).
    pub partial_create: Ratio,
    /// One step of a Create (a volume, the seed's upload, the define, the start), drawn
    /// uniformly, fails; the product's step runner (`ports::steps`) rolls back the rest.
    pub step_failure: Ratio,
    /// Data disks per machine (0..=3): each Create makes this many volumes beside the
    /// overlay and the seed.
    pub data_disks: usize,
    /// Usual service time of a host operation.
    pub service: (Duration, Duration),
    /// Hosts unreachable for a while (target = host index).
    pub outages: Vec<Window>,
    /// Whole-host stalls (target = host index): the host takes every call and answers none
    /// (a frozen libvirtd) for longer than the product's liveness window, then resumes and
    /// completes every call it held. At most one per run, so one host at a time.
    pub stalls: Vec<Window>,
}

/// libvirtd's limit on each host and the provider's budget against it (not faults: the
/// limits the provider must keep to).
#[derive(Clone, Debug)]
pub struct Libvirtd {
    /// Each host's `max_client_requests`: requests of one client connection a host serves
    /// at once; more wait in the daemon until one finishes.
    pub max_client_requests: Vec<usize>,
    /// The provider's per-host budget (`--host-budget`, `--agent-budget`), drawn up to
    /// [`MOST_HOST_BUDGET`] and validated by the product's `Budget::new`.
    pub budget: Budget,
    /// The provider's connections per host (`--host-connections`): the product's default
    /// for the budget, or a count drawn between what keeps every connection within the
    /// smallest limit and the budget, validated by the product's `host_connections`.
    pub connections: usize,
}

/// The largest `--host-budget` drawn (libvirtd's default `max_workers` is 20).
pub const MOST_HOST_BUDGET: u64 = 8;

/// libvirtd's default `max_workers`: the calls one daemon executes at once, all clients
/// together. No host may have more of the provider's calls in flight.
pub const LIBVIRTD_DEFAULT_MAX_WORKERS: usize = 20;

impl Libvirtd {
    /// Draws the limits of `hosts` hosts, a budget, and connections that spread the
    /// budget's calls so that no connection exceeds the smallest limit.
    fn draw(rng: &mut SimRng, hosts: usize) -> Self {
        let default = u64::try_from(LIBVIRTD_DEFAULT_MAX_CLIENT_REQUESTS).expect("small");
        let max_client_requests: Vec<usize> = (0..hosts)
            .map(|_| {
                let limit = if rng.chance(Ratio::new(1, 2)) {
                    default
                } else {
                    rng.between(2, 8)
                };
                usize::try_from(limit).expect("small")
            })
            .collect();
        let lowest = max_client_requests.iter().copied().min().unwrap_or(2);
        let host = rng.between(1, MOST_HOST_BUDGET);
        let agent = rng.between(1, host);
        let budget = Budget::new(
            usize::try_from(host).expect("small"),
            usize::try_from(agent).expect("small"),
        )
        .expect("the drawn budget is valid");
        Self {
            max_client_requests,
            budget,
            connections: spread::host_connections(budget, None)
                .expect("the default is valid")
                .max(budget.host.div_ceil(lowest)),
        }
    }

    /// Half the runs keep the product's default connections; the others draw a count
    /// between the fewest that keep within the smallest limit and the budget. Drawn last in
    /// the plan, so the draws before it stay as they were.
    fn draw_connections(&mut self, rng: &mut SimRng) {
        if rng.chance(Ratio::new(1, 2)) {
            return;
        }
        let lowest = self.max_client_requests.iter().copied().min().unwrap_or(2);
        let fewest = u64::try_from(self.budget.host.div_ceil(lowest)).expect("small");
        let most = u64::try_from(self.budget.host).expect("small");
        let drawn = usize::try_from(rng.between(fewest, most)).expect("small");
        self.connections =
            spread::host_connections(self.budget, Some(drawn)).expect("a valid count");
    }
}

/// Shard ↔ provider network faults.
#[derive(Clone, Debug)]
pub struct NetFaults {
    /// One-way delay range.
    pub delay: (Duration, Duration),
    /// A request is lost (never delivered).
    pub drop_request: Ratio,
    /// A reply is lost (the call becomes indefinite).
    pub drop_reply: Ratio,
    /// A shard cut off from the provider (target = shard index).
    pub partitions: Vec<Window>,
    /// The caller gives up on a call the provider has received (a client deadline, a
    /// reset stream): the provider drops the call's handler at a drawn point before, during
    /// or after its commit, and the caller learns nothing.
    pub cancel: Ratio,
}

/// Durability faults of the simulated store.
#[derive(Clone, Debug)]
pub struct StoreFaults {
    /// Usual fsync time.
    pub fsync: (Duration, Duration),
    /// An fsync takes 50–500 ms.
    pub slow_fsync: Ratio,
    /// An fsync fails: the store fails stop and the supervisor restarts the process.
    pub fsync_failure: Ratio,
}

/// Everything one run does, derived from its seed.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// The run's seed.
    pub seed: u64,
    /// Number of hosts (one zone each).
    pub hosts: usize,
    /// Speculative slots per host.
    pub slots_per_host: usize,
    /// Number of shards.
    pub shards: usize,
    /// Concurrent workers per shard incarnation.
    pub workers: usize,
    /// How long faults are injected and traffic runs.
    pub fault_phase: Duration,
    /// Every transition deadline (`--transition-timeout`).
    pub transition_timeout: Duration,
    /// The shards' RPC deadline.
    pub rpc_timeout: Duration,
    /// Background reconcile period.
    pub reconcile_interval: Duration,
    /// Hypervisor faults.
    pub host: HostFaults,
    /// Network faults.
    pub net: NetFaults,
    /// Store faults.
    pub store: StoreFaults,
    /// libvirtd's limits and the provider's budget.
    pub libvirtd: Libvirtd,
    /// When the provider is killed.
    pub crashes: Vec<Duration>,
    /// How long a killed provider stays down.
    pub restart_delay: (Duration, Duration),
    /// (shard, time): the shard restarts with a new epoch; the old process lives on as a
    /// zombie for a while.
    pub shard_restarts: Vec<(usize, Duration)>,
    /// How long a zombie keeps sending.
    pub zombie_life: (Duration, Duration),
}

const HOST_RATES: &[Ratio] = &[
    Ratio::new(1, 200),
    Ratio::new(1, 50),
    Ratio::new(1, 20),
    Ratio::new(1, 10),
];
const NET_RATES: &[Ratio] = &[Ratio::new(1, 500), Ratio::new(1, 100), Ratio::new(1, 30)];
const CANCEL_RATES: &[Ratio] = &[Ratio::new(1, 50), Ratio::new(1, 10), Ratio::new(1, 3)];
const STORE_FAIL_RATES: &[Ratio] = &[Ratio::new(1, 2000), Ratio::new(1, 500)];

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

impl FaultPlan {
    /// Draws the plan of run `seed`.
    #[must_use]
    pub fn draw(seed: u64) -> Self {
        let mut rng = SimRng::stream(seed, "plan");
        let hosts = usize::try_from(rng.between(2, 4)).expect("small");
        let shards = usize::try_from(rng.between(2, 4)).expect("small");
        let fault_phase = secs(rng.between(60, 180));
        let transition_timeout = secs(rng.between(5, 30));
        let mut host = HostFaults {
            error: rng.swarm_rate(HOST_RATES),
            spike: rng.swarm_rate(HOST_RATES),
            hang: rng.swarm_rate(HOST_RATES),
            lost_reply: rng.swarm_rate(HOST_RATES),
            partial_create: rng.swarm_rate(HOST_RATES),
            // Drawn last (below), so adding them left every other draw as it was.
            step_failure: Ratio::NEVER,
            data_disks: 0,
            service: (ms(rng.between(5, 50)), ms(rng.between(100, 1500))),
            outages: windows(&mut rng, hosts, fault_phase, secs(30)),
            // Drawn last (below), so adding this class left every other draw as it was.
            stalls: Vec::new(),
        };
        let mut net = NetFaults {
            delay: (Duration::from_micros(200), ms(rng.between(1, 50))),
            drop_request: rng.swarm_rate(NET_RATES),
            drop_reply: rng.swarm_rate(NET_RATES),
            partitions: windows(&mut rng, shards, fault_phase, secs(20)),
            // Drawn last (below), so adding this class left every other draw as it was.
            cancel: Ratio::NEVER,
        };
        let store = StoreFaults {
            fsync: (Duration::from_micros(100), ms(rng.between(1, 20))),
            slow_fsync: rng.swarm_rate(&[Ratio::new(1, 100), Ratio::new(1, 10)]),
            fsync_failure: rng.swarm_rate(STORE_FAIL_RATES),
        };
        let crashes = events(&mut rng, fault_phase, 5);
        let shard_restarts = events(&mut rng, fault_phase, 3)
            .into_iter()
            .map(|at| (rng.index(shards), at))
            .collect();
        let slots_per_host = usize::try_from(rng.between(3, 6)).expect("small");
        let workers = usize::try_from(rng.between(1, 3)).expect("small");
        let reconcile_interval = secs(rng.between(5, 30));
        let restart_delay = (ms(200), secs(rng.between(1, 10)));
        let zombie_life = (secs(1), secs(rng.between(5, 60)));
        net.cancel = rng.swarm_rate(CANCEL_RATES);
        // Drawn after everything else, so adding it left the earlier draws as they were.
        let mut libvirtd = Libvirtd::draw(&mut rng, hosts);
        host.stalls = stall(&mut rng, hosts, fault_phase);
        libvirtd.draw_connections(&mut rng);
        host.step_failure = rng.swarm_rate(HOST_RATES);
        host.data_disks = usize::try_from(rng.between(0, 3)).expect("small");
        Self {
            seed,
            hosts,
            slots_per_host,
            shards,
            workers,
            fault_phase,
            transition_timeout,
            rpc_timeout: secs(5),
            reconcile_interval,
            host,
            net,
            store,
            libvirtd,
            crashes,
            restart_delay,
            shard_restarts,
            zombie_life,
        }
    }
}

/// Up to three windows per target in about half the runs, inside the fault phase.
fn windows(rng: &mut SimRng, targets: usize, phase: Duration, longest: Duration) -> Vec<Window> {
    if rng.chance(Ratio::new(1, 2)) {
        return Vec::new();
    }
    let count = rng.between(1, 3);
    let mut windows: Vec<Window> = (0..count)
        .map(|_| {
            let start = rng.duration(secs(2), phase.saturating_sub(secs(2)));
            let end = (start + rng.duration(secs(1), longest)).min(phase);
            Window {
                target: rng.index(targets),
                start,
                end,
            }
        })
        .collect();
    windows.sort_by_key(|w| (w.start, w.target));
    windows
}

/// The shortest and longest whole-host stall: past the product's liveness window (a probe
/// every 5 s, 20 s without an answer marks the host unreachable) and past libvirt's client
/// keepalive window (5 s × 3 misses) that once crashed the provider (issue 37).
pub const STALL: (Duration, Duration) = (Duration::from_secs(25), Duration::from_secs(40));
/// Fault-phase time left after a stall ends, so the workers still start transitions on the
/// host that resumed before faults stop.
const AFTER_STALL: Duration = Duration::from_secs(15);

/// One whole-host stall in about half the runs, on one host, ending [`AFTER_STALL`] before
/// the fault phase does.
fn stall(rng: &mut SimRng, hosts: usize, phase: Duration) -> Vec<Window> {
    if rng.chance(Ratio::new(1, 2)) {
        return Vec::new();
    }
    let target = rng.index(hosts);
    let length = rng.duration(STALL.0, STALL.1);
    let latest = phase.saturating_sub(length + AFTER_STALL).max(secs(2));
    let start = rng.duration(secs(2), latest);
    vec![Window {
        target,
        start,
        end: start + length,
    }]
}

/// Up to `most` event times inside the fault phase (none in about a quarter of the runs).
fn events(rng: &mut SimRng, phase: Duration, most: u64) -> Vec<Duration> {
    if rng.chance(Ratio::new(1, 4)) {
        return Vec::new();
    }
    let count = rng.between(1, most);
    let mut times: Vec<Duration> = (0..count).map(|_| rng.duration(secs(2), phase)).collect();
    times.sort();
    times
}

fn show_windows(f: &mut fmt::Formatter<'_>, name: &str, windows: &[Window]) -> fmt::Result {
    write!(f, " {name}=[")?;
    for (i, w) in windows.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let (start, end) = (w.start.as_secs_f64(), w.end.as_secs_f64());
        write!(f, "{sep}{}@{start:.1}-{end:.1}s", w.target)?;
    }
    f.write_str("]")
}

impl fmt::Display for FaultPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (h, n, s) = (&self.host, &self.net, &self.store);
        write!(
            f,
            "hosts={} slots/host={} shards={} workers={} fault_phase={}s transition_timeout={}s \
             reconcile={}s",
            self.hosts,
            self.slots_per_host,
            self.shards,
            self.workers,
            self.fault_phase.as_secs(),
            self.transition_timeout.as_secs(),
            self.reconcile_interval.as_secs(),
        )?;
        write!(
            f,
            "\n  hypervisor: error={} spike={} hang={} lost_reply={} partial_create={} \
             step_failure={} data_disks={} service={:?}..{:?}",
            h.error,
            h.spike,
            h.hang,
            h.lost_reply,
            h.partial_create,
            h.step_failure,
            h.data_disks,
            h.service.0,
            h.service.1
        )?;
        show_windows(f, "outages", &h.outages)?;
        show_windows(f, "stalls", &h.stalls)?;
        let l = &self.libvirtd;
        write!(
            f,
            "\n  libvirtd: max_client_requests={:?} host_budget={} agent_budget={} \
             host_connections={}",
            l.max_client_requests, l.budget.host, l.budget.agent, l.connections
        )?;
        write!(
            f,
            "\n  network: delay<={:?} drop_request={} drop_reply={} cancel={}",
            n.delay.1, n.drop_request, n.drop_reply, n.cancel
        )?;
        show_windows(f, "partitions", &n.partitions)?;
        write!(
            f,
            "\n  store: fsync<={:?} slow_fsync={} fsync_failure={}",
            s.fsync.1, s.slow_fsync, s.fsync_failure
        )?;
        let crashes: Vec<String> = self
            .crashes
            .iter()
            .map(|t| format!("{:.1}s", t.as_secs_f64()))
            .collect();
        let restarts: Vec<String> = self
            .shard_restarts
            .iter()
            .map(|(shard, t)| format!("{shard}@{:.1}s", t.as_secs_f64()))
            .collect();
        write!(
            f,
            "\n  process: provider_crashes=[{}] restart_delay<={:?} shard_restarts=[{}] \
             zombie_life<={:?}",
            crashes.join(","),
            self.restart_delay.1,
            restarts.join(","),
            self.zombie_life.1
        )
    }
}
