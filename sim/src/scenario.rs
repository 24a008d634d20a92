//! One run: the nodes, the fault phase with its supervisor, then quiescence and the final
//! checks. [`run_seed`] wraps it in a madsim runtime seeded with the run's seed and a
//! simulated-time limit, and turns a panic anywhere in the simulation into a report.
//!
//! The run owns what does not outlive a provider process or belongs to no node: the
//! serving process (`server::Serving`), the watchers' views (`workload::Watchers`) and the
//! checkers (`checkers::Checkers`), which read the world's history on their watches, at
//! quiescence and at the end. This is the one file that runs the checkers.
//!
//! Nodes: one per host (host-side work runs there and survives provider crashes), one for
//! the provider (its init task is `server::run_provider`, so `Handle::restart` starts a new
//! process from the durable state), one per shard. The supervisor runs on the main node:
//! it kills the provider at the planned crash times and restarts it after a seeded delay,
//! and restarts it on request (an injected fsync failure, noticed after a probe delay).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use futures::{FutureExt, StreamExt};
use madsim::runtime::{Handle, Runtime};
use madsim::task::{JoinHandle, NodeId};
use tracing_subscriber::layer::SubscriberExt as _;

use crate::checkers::{self, Checkers, quiescence};
use crate::faults::FaultPlan;
use crate::history::Event;
use crate::net;
use crate::rng::SimRng;
use crate::server::{self, Serving};
use crate::spans::SpanWatch;
use crate::time::elapsed;
use crate::trace::Trace;
use crate::verdict::{Invariant, Violations};
use crate::workload::{self, Watchers};
use crate::world::{Stats, World};

/// A wall-clock-free backstop: a run that has not ended by then failed to converge.
const TIME_LIMIT: Duration = Duration::from_secs(4 * 60 * 60);
/// How long the shards may take to finish their last calls after faults stop.
const SHARD_DRAIN_BUDGET: Duration = Duration::from_secs(10 * 60);

/// What one run produced.
#[derive(Debug)]
pub struct RunReport {
    /// The seed.
    pub seed: u64,
    /// The plan drawn from it.
    pub plan: FaultPlan,
    /// Every broken invariant.
    pub violations: Violations,
    /// SHA-256 of the event trace.
    pub digest: String,
    /// Number of trace lines.
    pub trace_lines: u64,
    /// The last trace lines.
    pub tail: Vec<String>,
    /// Every trace line, with `--trace`.
    pub trace: Option<Vec<String>>,
    /// Counters.
    pub stats: Stats,
    /// Simulated time the run took.
    pub simulated: Duration,
}

/// Runs seed `seed` to the end.
#[must_use]
pub fn run_seed(seed: u64, keep_trace: bool) -> RunReport {
    run_plan(FaultPlan::draw(seed), keep_trace)
}

/// Runs `plan` (a drawn plan, or a hand-written one for a targeted scenario) to the end,
/// with madsim seeded by `plan.seed`.
#[must_use]
pub fn run_plan(plan: FaultPlan, keep_trace: bool) -> RunReport {
    let seed = plan.seed;
    let world = Arc::new(World::new(plan.clone(), keep_trace));
    let checkers = Arc::new(Checkers::new(Arc::clone(&world)));
    let (driven, judging) = (Arc::clone(&world), Arc::clone(&checkers));
    // The span layer records on this run's thread only (each seed runs on a thread of its
    // own). The runtime is made under it too: madsim opens its node spans as it builds them.
    let spans = tracing_subscriber::registry().with(SpanWatch::new(Arc::clone(&world)));
    let outcome = tracing::subscriber::with_default(spans, || {
        let mut runtime = Runtime::with_seed_and_config(seed, madsim::Config::default());
        runtime.set_time_limit(TIME_LIMIT);
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            runtime.block_on(drive(driven, judging))
        }));
        drop(runtime);
        outcome
    });
    let simulated = match outcome {
        Ok(simulated) => simulated,
        Err(panic) => {
            let recorded = LAST_PANIC.with(|last| last.borrow_mut().take());
            let (at, message) =
                recorded.unwrap_or_else(|| (Duration::ZERO, panic_message(panic.as_ref())));
            checkers.violations().push(Invariant::Panic, at, message);
            at
        }
    };
    // What happened since the checkers last read the history is checked before the verdict.
    checkers.read_history();
    let mut trace: std::sync::MutexGuard<'_, Trace> = world.trace_log();
    RunReport {
        seed,
        plan,
        violations: checkers.violations().clone(),
        digest: trace.digest(),
        trace_lines: trace.len(),
        tail: trace.tail(),
        trace: trace.take_all(),
        stats: *world.stats(),
        simulated,
    }
}

/// The scenario of the current madsim seed, for `Runtime::check_determinism`.
pub async fn current_seed() {
    let seed = Handle::current().seed();
    let world = Arc::new(World::new(FaultPlan::draw(seed), false));
    let checkers = Arc::new(Checkers::new(Arc::clone(&world)));
    drive(world, checkers).await;
}

std::thread_local! {
    /// The simulated time and place of the last panic on this thread (see
    /// [`install_panic_hook`]).
    static LAST_PANIC: std::cell::RefCell<Option<(Duration, String)>> =
        const { std::cell::RefCell::new(None) };
}

/// Replaces the default panic hook (which would print every expected panic of a bug hunt)
/// with one that remembers when and where the simulation panicked, for the report.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let at = madsim::time::TimeHandle::try_current().map_or(Duration::ZERO, |t| t.elapsed());
        let place = info
            .location()
            .map_or_else(String::new, |l| format!(" at {l}"));
        let message = format!("{}{place}", panic_message(info.payload()));
        LAST_PANIC.with(|last| *last.borrow_mut() = Some((at, message)));
    }));
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// The whole run, judged by `checkers`; returns the simulated time it took.
async fn drive(world: Arc<World>, checkers: Arc<Checkers>) -> Duration {
    let handle = Handle::current();
    let serving = Serving::default();
    let watchers = Arc::new(Watchers::new(world.plan.shards));
    for host in 0..world.plan.hosts {
        let node = handle.create_node().name(format!("host-{host}")).build();
        world.add_host_node(node);
    }
    let (requests, restart_requests) = mpsc::unbounded();
    world.set_supervisor(requests.clone());
    let (init, published) = (Arc::clone(&world), serving.clone());
    let provider = handle
        .create_node()
        .name("provider")
        .ip(net::PROVIDER_IP)
        .init(move || server::run_provider(Arc::clone(&init), published.clone()))
        .build();
    let shards = start_shards(&handle, &world, &watchers);
    drop(madsim::task::spawn(drift_prices(Arc::clone(&world))));
    drop(madsim::task::spawn(checkers::deadlines::watch(Arc::clone(
        &checkers,
    ))));
    drop(madsim::task::spawn(checkers::serving::watch(Arc::clone(
        &checkers,
    ))));
    drop(madsim::task::spawn(supervise(
        Arc::clone(&world),
        handle.clone(),
        (provider.id(), serving.clone()),
        restart_requests,
    )));
    madsim::time::sleep(world.plan.fault_phase).await;
    world.set_calm();
    world.trace("faults stop: hosts healed, partitions repaired, no more crashes");
    let drained = futures::future::join_all(shards);
    futures::select_biased! {
        _ = drained.fuse() => {}
        () = madsim::time::sleep(SHARD_DRAIN_BUDGET).fuse() => {
            checkers.violation(Invariant::Convergence, "the shards did not finish their calls");
        }
    }
    let kills = world.stats().crashes;
    let _ = requests.unbounded_send("final restart".to_owned());
    let give_up = elapsed() + SHARD_DRAIN_BUDGET;
    while (world.stats().crashes == kills || serving.get().is_none()) && elapsed() < give_up {
        madsim::time::sleep(Duration::from_millis(100)).await;
    }
    // The auditor calls the provider over the network too, from a node of its own.
    let auditor = handle
        .create_node()
        .name("auditor")
        .ip(net::AUDITOR_IP)
        .build();
    let audit = Arc::clone(&checkers);
    let _ = auditor
        .spawn(async move { quiescence::run(&audit, &serving, &watchers).await })
        .await;
    world.trace(format!("end stats={:?}", *world.stats()));
    elapsed()
}

/// A node for each shard, running it (`workload::run_shard`); their tasks.
fn start_shards(
    handle: &Handle,
    world: &Arc<World>,
    watchers: &Arc<Watchers>,
) -> Vec<JoinHandle<()>> {
    (0..world.plan.shards)
        .map(|shard| {
            let node = handle
                .create_node()
                .name(format!("shard-{shard}"))
                .ip(net::shard_ip(shard))
                .build();
            node.spawn(workload::run_shard(
                Arc::clone(world),
                shard,
                Arc::clone(watchers),
            ))
        })
        .collect()
}

/// Kills the provider (its node, and the process `serving` publishes) at the planned crash
/// times (during the fault phase) and on request, restarting it after a seeded delay.
async fn supervise(
    world: Arc<World>,
    handle: Handle,
    (provider, serving): (NodeId, Serving),
    mut requests: mpsc::UnboundedReceiver<String>,
) {
    let mut rng = SimRng::stream(world.plan.seed, "supervisor");
    let mut crashes = world.plan.crashes.clone().into_iter().peekable();
    loop {
        let next_crash = crashes.peek().copied();
        let wait = next_crash.map_or(Duration::from_secs(3600), |at| at.saturating_sub(elapsed()));
        let reason = futures::select_biased! {
            reason = requests.next() => match reason {
                Some(reason) => {
                    // A failed process is noticed by a liveness probe, not at once: until
                    // then it answers UNAVAILABLE.
                    if reason != "final restart" {
                        madsim::time::sleep(rng.duration(Duration::from_millis(100), Duration::from_secs(5))).await;
                    }
                    reason
                }
                None => return,
            },
            () = madsim::time::sleep(wait).fuse() => {
                if next_crash.is_none() {
                    continue;
                }
                crashes.next();
                "planned crash".to_owned()
            }
        };
        world.stats().crashes += 1;
        handle.kill(provider);
        serving.set(None);
        world.record(Event::Killed);
        let (low, high) = world.plan.restart_delay;
        let down = rng.duration(low, high);
        world.trace(format!(
            "provider killed ({reason}); down for {:.3}s",
            down.as_secs_f64()
        ));
        madsim::time::sleep(down).await;
        handle.restart(provider);
    }
}

/// Now and then a slot's price changes on its host, so reconcile has facts to refresh.
async fn drift_prices(world: Arc<World>) {
    let mut rng = SimRng::stream(world.plan.seed, "prices");
    while !world.calm() {
        let wait = rng.duration(Duration::from_secs(10), Duration::from_secs(40));
        madsim::time::sleep(wait).await;
        let slot = rng.pick(&world.inventory).id.clone();
        *world.hosts().price_drift.entry(slot.clone()).or_default() += 1;
        world.trace(format!("price of {slot} drifts"));
    }
}
