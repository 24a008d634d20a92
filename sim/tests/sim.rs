//! The simulator's own tests (simulation builds only: `scripts/sim.sh --ci` runs them with
//! `cargo test --profile sim` under `--cfg madsim`).
//!
//! - Determinism: the same seed gives the same trace hash, another seed another one.
//! - (The contract suites every adapter runs are in `contracts.rs`.)
//! - Targeted scenarios on the same harness, each stating its goal and method.
#![cfg(madsim)]

use std::time::Duration;

use bigfleet_libvirt_ports::lanes::Budget;
use bigfleet_libvirt_sim::faults::{FaultPlan, Window};
use bigfleet_libvirt_sim::rng::Ratio;
use bigfleet_libvirt_sim::scenario::{RunReport, run_plan, run_seed};
use bigfleet_libvirt_sim::verdict::Invariant;

/// Runs on a fresh thread, as the runner does (madsim seeds std's HashMap keys per thread).
fn on_own_thread(run: impl FnOnce() -> RunReport + Send + 'static) -> RunReport {
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(run)
        .unwrap()
        .join()
        .unwrap()
}

/// Whether some trace line contains `needle` (runs with `keep_trace`).
fn traced(report: &RunReport, needle: &str) -> bool {
    report
        .trace
        .as_ref()
        .expect("the run kept its trace")
        .iter()
        .any(|line| line.contains(needle))
}

fn assert_clean(report: &RunReport) {
    assert!(
        report.violations.is_empty(),
        "seed {} broke invariants: {:#?}\n{}",
        report.seed,
        report.violations.first,
        report.tail.join("\n")
    );
}

#[test]
fn one_seed_twice_gives_the_same_trace_and_another_seed_does_not() {
    let a = on_own_thread(|| run_seed(3, false));
    let b = on_own_thread(|| run_seed(3, false));
    let c = on_own_thread(|| run_seed(4, false));
    assert_clean(&a);
    assert_eq!(
        (a.digest.as_str(), a.trace_lines),
        (b.digest.as_str(), b.trace_lines)
    );
    assert_ne!(a.digest, c.digest);
}

#[test]
fn madsim_finds_no_divergent_random_draw() {
    madsim::runtime::Runtime::check_determinism(5, madsim::Config::default(), || {
        bigfleet_libvirt_sim::scenario::current_seed()
    });
}

/// A plan with no faults at all, for targeted scenarios to switch on one thing.
fn quiet_plan(seed: u64) -> FaultPlan {
    let mut plan = FaultPlan::draw(seed);
    let host = &mut plan.host;
    for rate in [
        &mut host.error,
        &mut host.spike,
        &mut host.hang,
        &mut host.lost_reply,
    ] {
        *rate = Ratio::NEVER;
    }
    host.partial_create = Ratio::NEVER;
    host.outages.clear();
    host.stalls.clear();
    plan.net.drop_request = Ratio::NEVER;
    plan.net.drop_reply = Ratio::NEVER;
    plan.net.partitions.clear();
    plan.net.cancel = Ratio::NEVER;
    plan.store.fsync_failure = Ratio::NEVER;
    plan.crashes.clear();
    plan.shard_restarts.clear();
    plan
}

/// Goal: a Create whose reply is lost after the host made the domain leaves no domain
/// behind. Method: every hypervisor reply is lost, so every Create fails indefinitely and
/// only the provider's compensating delete can remove what the host created.
#[test]
fn lost_create_replies_leave_no_domain_behind() {
    let mut plan = quiet_plan(11);
    plan.host.lost_reply = Ratio::new(1, 1);
    let report = on_own_thread(move || run_plan(plan, true));
    assert_clean(&report);
    assert!(
        traced(&report, "create sim/OnDemand"),
        "Creates reached the hosts"
    );
    assert!(
        traced(&report, "fault=LostReply -> ok"),
        "hosts acted with the reply lost"
    );
}

/// Goal: a caller that gives up never wedges a machine: every accepted transition ends by
/// its deadline (`transition-deadline`) and the run converges. Method: no other fault, but a
/// third of all calls are dropped by the provider before, during or after their commit,
/// with fsyncs slow enough that many drops land while the decision waits for the disk.
#[test]
fn callers_that_give_up_wedge_no_machine() {
    let mut plan = quiet_plan(13);
    plan.net.cancel = Ratio::new(1, 3);
    plan.store.fsync = (Duration::from_millis(5), Duration::from_millis(40));
    plan.store.slow_fsync = Ratio::new(1, 10);
    let report = on_own_thread(move || run_plan(plan, true));
    assert_clean(&report);
    assert!(
        traced(&report, "caller gave up with the call in hand: Create"),
        "some Create lost its caller after its handler ran"
    );
    assert!(
        traced(&report, "caller gave up before its handler ran"),
        "some call lost its caller before the provider looked at it"
    );
    assert!(report.stats.cancelled > 0);
}

/// Goal: provider crashes at arbitrary points lose no acknowledged mutation and leave no
/// transition hanging. Method: no other fault, but a crash every few seconds.
#[test]
fn frequent_crashes_lose_nothing_acknowledged() {
    let mut plan = quiet_plan(12);
    plan.crashes = (1..=20).map(|i| Duration::from_secs(3 * i)).collect();
    plan.fault_phase = Duration::from_secs(65);
    let report = on_own_thread(move || run_plan(plan, false));
    assert_clean(&report);
    assert!(report.stats.crashes >= 20);
}

/// Goal: madsim-tonic's transport failures reach the shards as what they mean: a call to
/// a provider that is down is refused (it certainly did nothing), one whose provider dies
/// with it in hand is indefinite. Method: crashes every few seconds with restarts slow
/// enough that calls land in the gaps, many workers so that some call is always in flight.
#[test]
fn a_killed_provider_refuses_new_calls_and_resets_open_ones() {
    let mut plan = quiet_plan(15);
    plan.workers = 4;
    plan.crashes = (1..=15).map(|i| Duration::from_secs(4 * i)).collect();
    plan.restart_delay = (Duration::from_secs(1), Duration::from_secs(2));
    plan.fault_phase = Duration::from_secs(65);
    let report = on_own_thread(move || run_plan(plan, true));
    assert_clean(&report);
    assert!(
        traced(&report, ") refused"),
        "some call found nobody listening"
    );
    assert!(
        traced(&report, ") indefinite (connection reset)"),
        "some call lost its provider mid-flight"
    );
}

/// Goal: a zombie shard (an older epoch of a restarted shard) is fenced wherever the new
/// process has acted. Method: shard 0 restarts early and its old process lingers a minute.
#[test]
fn zombie_shards_are_fenced() {
    let mut plan = quiet_plan(13);
    plan.shard_restarts = vec![(0, Duration::from_secs(10)), (0, Duration::from_secs(30))];
    plan.zombie_life = (Duration::from_secs(60), Duration::from_secs(60));
    let report = on_own_thread(move || run_plan(plan, true));
    assert_clean(&report);
    assert!(traced(&report, "lingers as a zombie"));
    assert!(
        traced(&report, ") FailedPrecondition"),
        "some zombie call was fenced"
    );
}

/// Goal: a host that is unreachable for a while, and a shard partitioned from the
/// provider, delay work but break nothing. Method: long outages on every host and a
/// partition of every shard, nothing else.
#[test]
fn outages_and_partitions_heal() {
    let mut plan = quiet_plan(14);
    let window = |target| Window {
        target,
        start: Duration::from_secs(20),
        end: Duration::from_secs(50),
    };
    plan.host.outages = (0..plan.hosts).map(window).collect();
    plan.net.partitions = (0..plan.shards).map(window).collect();
    plan.store.slow_fsync = Ratio::NEVER;
    let report = on_own_thread(move || run_plan(plan, true));
    assert_clean(&report);
    assert!(traced(&report, "host unreachable"));
    // Only the partitions make calls indefinite in this plan (whether the lost ones are
    // traced mutations or untraced Gets and Lists depends on the schedule).
    assert!(report.stats.indefinite > 0, "partitioned calls were lost");
}

/// Goal: a host that stops answering for longer than the product's liveness window holds
/// up no other host, and serves again once it resumes (`hosts-keep-serving`), with every
/// other invariant intact when the calls it held all complete at once (issue 37). Method:
/// no other fault, busy shards, a 35 s stall of host 0 early in the fault phase.
#[test]
fn a_stalled_host_holds_up_no_other_and_serves_again() {
    let mut plan = quiet_plan(17);
    plan.workers = 3;
    plan.fault_phase = Duration::from_secs(120);
    plan.host.stalls = vec![Window {
        target: 0,
        start: Duration::from_secs(20),
        end: Duration::from_secs(55),
    }];
    let report = on_own_thread(move || run_plan(plan, true));
    assert_clean(&report);
    assert!(
        traced(&report, "held by a stall until 55."),
        "the stall held calls"
    );
    let s = report.stats;
    assert!(s.stall_held > 0, "{s:?}");
    assert!(s.judged_beside_stall > 0, "other hosts were judged: {s:?}");
    assert!(s.judged_held > 0, "a call host 0 held was judged: {s:?}");
    assert!(s.judged_after_stall > 0, "host 0 was judged after: {s:?}");
}

/// No faults, busy shards, hosts that serve one request per connection at a time and slow
/// service, and a provider budget of 3 built past `Budget::new`'s checks, over
/// `connections` connections per host.
fn budget_of_three_on_one_request_hosts(connections: usize) -> RunReport {
    let mut plan = quiet_plan(16);
    plan.workers = 3;
    plan.host.service = (Duration::from_millis(200), Duration::from_millis(800));
    plan.libvirtd.max_client_requests = vec![1; plan.hosts];
    plan.libvirtd.budget = Budget { host: 3, agent: 1 };
    plan.libvirtd.connections = connections;
    on_own_thread(move || run_plan(plan, true))
}

/// Goal: the `host-budget` invariant sees a provider that keeps more in flight on a host
/// than its libvirtd's `max_client_requests`, and the host makes the surplus wait in the
/// daemon instead of running it. Method: no faults, busy shards, hosts that serve one
/// request per connection at a time and slow service, and a provider budget of 3 built
/// past `Budget::new`'s checks (the misconfiguration `doctor` warns about).
#[test]
fn a_budget_over_max_client_requests_is_caught_and_queued_in_the_daemon() {
    let report = budget_of_three_on_one_request_hosts(1);
    assert!(
        report
            .violations
            .counts
            .contains_key(&Invariant::HostBudget),
        "over max_client_requests was not reported: {:?}",
        report.violations.counts
    );
    assert!(
        report
            .violations
            .first
            .iter()
            .any(|v| v.detail.contains("max_client_requests 1")),
        "{:#?}",
        report.violations.first
    );
    assert!(
        traced(&report, "the request waits in the daemon"),
        "some request waited for a daemon worker"
    );
}

/// Goal: several connections per host let a budget above one connection's
/// `max_client_requests` run without any connection exceeding it. Method: as above (hosts
/// that serve one request per connection, a budget of 3), but three connections per host:
/// the product's spread puts one call on each, so the `host-budget` invariant holds and no
/// request waits in the daemon.
#[test]
fn a_budget_spread_over_enough_connections_keeps_every_connection_within_its_limit() {
    let report = budget_of_three_on_one_request_hosts(3);
    assert!(
        !report
            .violations
            .counts
            .contains_key(&Invariant::HostBudget),
        "{:#?}",
        report.violations.first
    );
    assert!(
        !traced(&report, "the request waits in the daemon"),
        "a request waited for a daemon worker"
    );
    assert!(report.stats.host_operations > 0, "{:?}", report.stats);
}
