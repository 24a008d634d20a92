//! The shared world of one run: what outlives a provider process. The fault plan and the
//! inventory, the hosts and their nodes, the disk, the history (what was seen to happen,
//! for the checkers), the trace, the run's counters, and the streams and flags the network,
//! the callers and the supervisor share. The provider process itself, the shards' state and
//! the checkers' are not here: each is owned by whoever runs it (`scenario`), so nothing
//! here knows about them. Every lock here is held only for a synchronous step (never
//! across an await), and madsim runs everything on one thread, so the locks only serve the
//! type system.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bigfleet_libvirt_domain::catalog::format_machine_id;
use bigfleet_libvirt_domain::{CapacityType, Machine, MachineId, MachineState, StringMap};
use futures::channel::mpsc::UnboundedSender;
use madsim::runtime::NodeHandle;

use crate::disk::Disk;
use crate::faults::FaultPlan;
use crate::history::{Event, History};
use crate::hosts::Hosts;
use crate::rng::SimRng;
use crate::time::elapsed;
use crate::trace::Trace;

/// The provider label of the simulated deployment.
pub const PROVIDER_LABEL: &str = "sim";

/// Counters for the closing report.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// RPCs the shards sent.
    pub rpcs: u64,
    /// RPCs that got a definite answer.
    pub answered: u64,
    /// RPCs whose outcome the caller could not know.
    pub indefinite: u64,
    /// Host operations executed.
    pub host_operations: u64,
    /// Provider kills (scheduled crashes and supervisor restarts).
    pub crashes: u64,
    /// Calls whose caller gave up while the provider had them in hand.
    pub cancelled: u64,
    /// Host calls a stall held (the host acted or answered only once it resumed).
    pub stall_held: u64,
    /// Lone calls `hosts-keep-serving` judged on another host while one was stalled.
    pub judged_beside_stall: u64,
    /// Lone calls `hosts-keep-serving` judged on a stalled host while it held them.
    pub judged_held: u64,
    /// Lone calls `hosts-keep-serving` judged on a stalled host after it resumed.
    pub judged_after_stall: u64,
}

/// Locks, ignoring poisoning: a panicking run is reported, and its state is still readable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Everything shared by the nodes of one run.
pub struct World {
    /// The run's plan.
    pub plan: FaultPlan,
    /// The provider label.
    pub provider_label: String,
    /// The slots the hosts offer (all Speculative).
    pub inventory: Vec<Machine>,
    trace: Mutex<Trace>,
    history: Mutex<History>,
    hosts: Mutex<Hosts>,
    disk: Mutex<Disk>,
    net_rng: Mutex<SimRng>,
    cancel_rng: Mutex<SimRng>,
    host_nodes: Mutex<Vec<NodeHandle>>,
    supervisor: Mutex<Option<UnboundedSender<String>>>,
    stats: Mutex<Stats>,
    calm: AtomicBool,
    incarnations: AtomicU64,
}

impl World {
    /// The world of `plan`, before any node exists.
    #[must_use]
    pub fn new(plan: FaultPlan, keep_trace: bool) -> Self {
        let inventory = inventory(&plan);
        Self {
            provider_label: PROVIDER_LABEL.to_owned(),
            inventory,
            trace: Mutex::new(Trace::new(keep_trace)),
            history: Mutex::new(History::default()),
            hosts: Mutex::new(Hosts::new(plan.seed, plan.hosts)),
            disk: Mutex::new(Disk::default()),
            net_rng: Mutex::new(SimRng::stream(plan.seed, "network")),
            cancel_rng: Mutex::new(SimRng::stream(plan.seed, "cancel")),
            host_nodes: Mutex::new(Vec::new()),
            supervisor: Mutex::new(None),
            stats: Mutex::new(Stats::default()),
            calm: AtomicBool::new(false),
            incarnations: AtomicU64::new(0),
            plan,
        }
    }

    /// Appends a trace line at the current simulated time.
    pub fn trace(&self, event: impl AsRef<str>) {
        lock(&self.trace).record(elapsed(), event.as_ref());
    }

    /// The trace.
    pub fn trace_log(&self) -> MutexGuard<'_, Trace> {
        lock(&self.trace)
    }

    /// Appends a trace line stamped `at` (a checker reading the history finds a violation
    /// later, possibly after the runtime has stopped, so its line carries its event's time).
    pub fn trace_at(&self, at: Duration, event: impl AsRef<str>) {
        lock(&self.trace).record(at, event.as_ref());
    }

    /// Appends what was seen to happen to the history, at the current simulated time;
    /// returns the event's number.
    pub fn record(&self, event: Event) -> u64 {
        lock(&self.history).push(elapsed(), event)
    }

    /// The history, for the checkers.
    pub fn history(&self) -> MutexGuard<'_, History> {
        lock(&self.history)
    }

    /// The hosts' state.
    pub fn hosts(&self) -> MutexGuard<'_, Hosts> {
        lock(&self.hosts)
    }

    /// The disk.
    pub fn disk(&self) -> MutexGuard<'_, Disk> {
        lock(&self.disk)
    }

    /// The network's decision stream.
    pub fn net_rng(&self) -> MutexGuard<'_, SimRng> {
        lock(&self.net_rng)
    }

    /// The stream that decides which calls their callers give up on, and when.
    pub fn cancel_rng(&self) -> MutexGuard<'_, SimRng> {
        lock(&self.cancel_rng)
    }

    /// The counters.
    pub fn stats(&self) -> MutexGuard<'_, Stats> {
        lock(&self.stats)
    }

    /// Registers the node of the next host.
    pub fn add_host_node(&self, node: NodeHandle) {
        lock(&self.host_nodes).push(node);
    }

    /// The node of host `index`.
    #[must_use]
    pub fn host_node(&self, index: usize) -> NodeHandle {
        lock(&self.host_nodes)[index].clone()
    }

    /// Installs the supervisor's restart-request queue.
    pub fn set_supervisor(&self, queue: UnboundedSender<String>) {
        *lock(&self.supervisor) = Some(queue);
    }

    /// Asks the supervisor to restart the provider process.
    pub fn request_restart(&self, reason: &str) {
        if let Some(queue) = lock(&self.supervisor).as_ref() {
            let _ = queue.unbounded_send(reason.to_owned());
        }
    }

    /// Whether faults have stopped (the quiescence phase).
    #[must_use]
    pub fn calm(&self) -> bool {
        self.calm.load(Ordering::Relaxed)
    }

    /// Stops all faults.
    pub fn set_calm(&self) {
        self.calm.store(true, Ordering::Relaxed);
    }

    /// Starts the plan's faults again after `set_calm` (for tests that calm a world to set
    /// it up, then let one planned fault strike at a moment they choose).
    pub fn end_calm(&self) {
        self.calm.store(false, Ordering::Relaxed);
    }

    /// Numbers provider processes 1, 2, ….
    pub fn next_incarnation(&self) -> u64 {
        self.incarnations.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Whether host `host` is unreachable at `at` (inside one of its outage windows).
    #[must_use]
    pub fn host_unreachable(&self, host: usize, at: Duration) -> bool {
        self.plan.host.outages.iter().any(|w| w.covers(host, at))
    }

    /// When host `host` does what it would do at `at`: at `at`, unless a stall of the host
    /// covers `at` (and faults have not stopped). Then it is frozen, and does it once it
    /// resumes, in the order it would have been done (`Window::resume_at`).
    #[must_use]
    pub fn after_stall(&self, host: usize, at: Duration) -> Duration {
        if self.calm() {
            return at;
        }
        match self.plan.host.stalls.iter().find(|w| w.covers(host, at)) {
            Some(w) => w.resume_at(at),
            None => at,
        }
    }
}

/// The slots: `slots_per_host` Speculative machines on each host, ids in the product's
/// format.
fn inventory(plan: &FaultPlan) -> Vec<Machine> {
    let resources = StringMap::from([
        ("cpu".to_owned(), "2".to_owned()),
        ("memory".to_owned(), "4Gi".to_owned()),
    ]);
    (0..plan.hosts)
        .flat_map(|host| (0..plan.slots_per_host).map(move |slot| (host, slot)))
        .map(|(host, slot)| {
            let zone = format!("zone-{host}");
            let id = format_machine_id(
                PROVIDER_LABEL,
                CapacityType::OnDemand,
                "kvm.small",
                &zone,
                u64::try_from(slot).expect("small"),
            );
            Machine {
                id: MachineId::new(id).expect("non-empty"),
                state: MachineState::Speculative,
                host: None,
                instance_type: "kvm.small".to_owned(),
                zone,
                capacity_type: CapacityType::OnDemand,
                price_per_hour: 0.5,
                interruption_probability: 0.0,
                resources: resources.clone().into(),
                allocatable: resources.clone().into(),
                labels: StringMap::from([("sim/slot".to_owned(), slot.to_string())]).into(),
                last_error: String::new(),
                cluster: String::new(),
                shard_metadata: StringMap::new(),
                encoded: Default::default(),
            }
        })
        .collect()
}
