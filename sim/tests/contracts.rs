//! The simulator's hosts and store against the shared contract suites every adapter runs
//! (simulation builds only: `scripts/sim.sh --ci` runs them with `cargo test --profile sim`
//! under `--cfg madsim`).
//!
//! - `SimHypervisor` (the simulated libvirt hosts, each on its own madsim node) runs the
//!   `Hypervisor` suite in a calm world (no injected faults), and the failed-Create suite in
//!   a world whose hosts refuse every call before dispatch. Its other Create faults are
//!   deliberately outside the contract (a partial Create leaves a defined domain behind and
//!   reports `SideEffects::Applied`, for the provider's compensation to clean), so they are
//!   not run through the suite.
//! - `SimStateStore` (the simulated disk, which outlives provider processes) runs the
//!   reopen and concurrency suites, and the failure suite with an
//!   injected fsync failure: it fails for good (only a new process commits again).
#![cfg(madsim)]

use std::sync::Arc;

use bigfleet_libvirt_ports::Hypervisor;
use bigfleet_libvirt_ports::testkit::{
    DiskFaults, HypervisorCaps, Residue, failed_create_contract, hypervisor_contract,
    state_store_concurrency_contract, state_store_contract, state_store_failure_contract,
};
use bigfleet_libvirt_sim::checkers::Checkers;
use bigfleet_libvirt_sim::fakes::hypervisor::SimHypervisor;
use bigfleet_libvirt_sim::fakes::store::SimStateStore;
use bigfleet_libvirt_sim::faults::FaultPlan;
use bigfleet_libvirt_sim::hosts::zone_index;
use bigfleet_libvirt_sim::rng::Ratio;
use bigfleet_libvirt_sim::world::World;
use futures::FutureExt;

/// Runs `test` in a madsim runtime seeded with `seed`.
fn simulate<F: std::future::Future<Output = ()>>(seed: u64, test: impl FnOnce() -> F) {
    let runtime = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
    runtime.block_on(test());
}

/// A world of `plan` whose hosts each have a madsim node, as a run sets them up.
fn world_with_hosts(plan: FaultPlan) -> Arc<World> {
    let world = Arc::new(World::new(plan, false));
    let handle = madsim::runtime::Handle::current();
    for host in 0..world.plan.hosts {
        let node = handle.create_node().name(format!("host-{host}")).build();
        world.add_host_node(node);
    }
    world
}

/// What the simulated hosts hold for a machine: its domain, and whether it runs.
fn residue(world: &Arc<World>) -> Residue {
    let world = Arc::clone(world);
    Box::new(move |machine| {
        let hosts = world.hosts();
        let held = hosts.domains[zone_index(&machine.zone)]
            .get(&machine.id)
            .map(|d| format!("{} running={}", d.name, d.running))
            .into_iter()
            .collect();
        std::future::ready(held).boxed()
    })
}

#[test]
fn the_simulated_hosts_pass_the_hypervisor_contract() {
    simulate(5, || async {
        let world = world_with_hosts(FaultPlan::draw(5));
        world.set_calm();
        let hv = SimHypervisor::new(Arc::clone(&world));
        hypervisor_contract(&hv, HypervisorCaps { bootstrap: true }, &residue(&world)).await;
        // The hosts recorded every effect and call; the checkers judge them.
        let checkers = Checkers::new(Arc::clone(&world));
        checkers.read_history();
        let violations = checkers.violations();
        assert!(
            violations.is_empty(),
            "the hosts kept one domain per machine and the budget, and answered lone calls \
             in time: {:#?}",
            violations.first
        );
    });
}

#[test]
fn a_refused_simulated_create_leaves_nothing_behind() {
    simulate(6, || async {
        let mut plan = FaultPlan::draw(6);
        plan.host.error = Ratio::new(1, 1);
        plan.host.outages.clear();
        plan.host.stalls.clear();
        let world = world_with_hosts(plan);
        let hv = SimHypervisor::new(Arc::clone(&world));
        let slot = world.inventory[0].clone();
        let error = failed_create_contract(&hv, &residue(&world), &slot).await;
        assert!(
            error.message.contains("injected error"),
            "{}",
            error.message
        );
        assert_eq!(hv.describe().await.unwrap().len(), world.inventory.len());
    });
}

/// A reopen of the simulated disk: a new provider process, numbered 2, 3, ….
fn reopener(world: &Arc<World>) -> impl Fn(SimStateStore) -> std::future::Ready<SimStateStore> {
    let world = Arc::clone(world);
    let incarnation = std::sync::atomic::AtomicU64::new(1);
    move |_| {
        let next = incarnation.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        std::future::ready(SimStateStore::open(Arc::clone(&world), next))
    }
}

#[test]
fn the_simulated_store_passes_the_state_store_contract() {
    simulate(1, || async {
        let world = Arc::new(World::new(FaultPlan::draw(1), false));
        world.set_calm(); // No injected fsync failure inside the suite.
        let store = SimStateStore::open(Arc::clone(&world), 1);
        state_store_contract(store, reopener(&world)).await;
    });
}

#[test]
fn the_simulated_store_passes_the_concurrency_contract() {
    simulate(7, || async {
        let world = Arc::new(World::new(FaultPlan::draw(7), false));
        world.set_calm();
        let store = SimStateStore::open(Arc::clone(&world), 1);
        state_store_concurrency_contract(store, reopener(&world)).await;
    });
}

#[test]
fn the_simulated_store_passes_the_failure_contract() {
    simulate(8, || async {
        let mut plan = FaultPlan::draw(8);
        plan.store.fsync_failure = Ratio::new(1, 1);
        let world = Arc::new(World::new(plan, false));
        world.set_calm(); // Calm while the suite commits what must survive.
        let (down, up) = (Arc::clone(&world), Arc::clone(&world));
        let faults = DiskFaults {
            break_disk: Box::new(move || down.end_calm()),
            heal_disk: Box::new(move || up.set_calm()),
            resumes: false,
        };
        let store = SimStateStore::open(Arc::clone(&world), 1);
        state_store_failure_contract(store, reopener(&world), faults).await;
    });
}
