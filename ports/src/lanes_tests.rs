//! The lanes on tokio's paused clock: each "call" takes a slot, holds it for a simulated
//! duration and gives it back, while a counter wrapped around the call checks the budget.

// Tests simulate call durations on tokio's paused clock and run calls as tasks.
#![allow(clippy::disallowed_methods)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

/// What the calls did: per call, its lane and when it got its slot; and the peak in flight.
#[derive(Default)]
struct Log {
    granted: Vec<(Lane, Duration, usize)>,
    in_flight: [usize; 4],
    peak_total: usize,
    peak_agent: usize,
}

struct Rig {
    lanes: Arc<Lanes>,
    budget: Budget,
    log: Arc<Mutex<Log>>,
    start: tokio::time::Instant,
}

impl Rig {
    fn new(host: usize, agent: usize) -> Self {
        let budget = Budget::new(host, agent).unwrap();
        Self {
            lanes: Lanes::new("z", budget, Arc::new(NoObserver)),
            budget,
            log: Arc::default(),
            start: tokio::time::Instant::now(),
        }
    }

    /// Starts call number `tag` of `lane` that holds its slot for `hold` once it has one.
    fn call(&self, lane: Lane, hold: Duration, tag: usize) -> tokio::task::JoinHandle<()> {
        let (lanes, log, start, budget) = (
            Arc::clone(&self.lanes),
            Arc::clone(&self.log),
            self.start,
            self.budget,
        );
        tokio::spawn(async move {
            let permit = lanes.acquire(lane).await;
            assert_eq!(permit.lane(), lane);
            {
                let mut log = log.lock().unwrap();
                log.in_flight[lane.index()] += 1;
                let total: usize = log.in_flight.iter().sum();
                assert!(total <= budget.host, "{total} in flight over {budget:?}");
                log.peak_total = log.peak_total.max(total);
                log.peak_agent = log.peak_agent.max(log.in_flight[Lane::Agent.index()]);
                log.granted.push((lane, start.elapsed(), tag));
            }
            tokio::time::sleep(hold).await;
            log.lock().unwrap().in_flight[lane.index()] -= 1;
            drop(permit);
        })
    }

    fn granted(&self) -> Vec<(Lane, Duration, usize)> {
        self.log.lock().unwrap().granted.clone()
    }
}

/// Lets every spawned task run up to its next wait, without moving the clock.
async fn settle() {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
}

const SEC: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn a_delete_overtakes_sixteen_queued_creates() {
    let rig = Rig::new(4, 1);
    // A describe holds a slot too, so the budget is full once the Delete has its slot.
    let mut tasks = vec![rig.call(Lane::Read, 100 * SEC, 100)];
    tasks.extend((0..18).map(|i| rig.call(Lane::Create, 10 * SEC, i)));
    settle().await;
    assert_eq!(rig.lanes.queued()[Lane::Create.index()], 16);
    // One Delete finds its reserved slot at once.
    tasks.push(rig.call(Lane::Teardown, 15 * SEC, 1000));
    settle().await;
    assert_eq!(rig.lanes.in_flight(), [1, 2, 1, 0]);
    // A second Delete waits for the budget, then goes before all 16 queued Creates.
    tasks.push(rig.call(Lane::Teardown, SEC, 1001));
    for task in tasks {
        task.await.unwrap();
    }
    let granted = rig.granted();
    let position = |tag| granted.iter().position(|g| g.2 == tag).unwrap();
    assert_eq!(granted[position(1000)].1, Duration::ZERO);
    assert_eq!(granted[position(1001)].1, 10 * SEC, "{granted:?}");
    let creates_before: usize = granted[..position(1001)]
        .iter()
        .filter(|g| g.0 == Lane::Create)
        .count();
    assert_eq!(creates_before, 2, "{granted:?}");
}

#[tokio::test(start_paused = true)]
async fn stuck_agent_calls_hold_only_the_agent_share() {
    let rig = Rig::new(4, 1);
    // Eight guests whose agent never answers: each call runs into a long timeout.
    let mut tasks: Vec<_> = (0..8)
        .map(|i| rig.call(Lane::Agent, 3600 * SEC, i))
        .collect();
    settle().await;
    assert_eq!(rig.lanes.in_flight()[Lane::Agent.index()], 1);
    // A Create's define/start, a describe and a Delete all still proceed at once.
    tasks.push(rig.call(Lane::Create, SEC, 100));
    tasks.push(rig.call(Lane::Read, SEC, 101));
    tasks.push(rig.call(Lane::Teardown, SEC, 102));
    settle().await;
    let granted = rig.granted();
    for tag in [100, 101, 102] {
        let found = granted.iter().find(|g| g.2 == tag).unwrap();
        assert_eq!(found.1, Duration::ZERO, "{granted:?}");
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(rig.log.lock().unwrap().peak_agent, 1);
}

/// A deterministic mix of lanes and durations (a small linear congruential generator).
fn mix(seed: u64, count: usize) -> Vec<(Lane, Duration)> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let lane = Lane::ALL[usize::try_from(state >> 62).unwrap()];
            let hold = Duration::from_millis(1 + (state >> 40) % 5000);
            (lane, hold)
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_budget_is_never_exceeded() {
    for host in 1..=6 {
        for agent in 1..=host {
            let rig = Rig::new(host, agent);
            let mut tasks = Vec::new();
            for (i, (lane, hold)) in mix((host * 10 + agent) as u64, 120).into_iter().enumerate() {
                tasks.push(rig.call(lane, hold, i));
                if i % 7 == 0 {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
            for task in tasks {
                task.await.unwrap();
            }
            let log = rig.log.lock().unwrap();
            assert_eq!(log.granted.len(), 120);
            // The mix saturates the host: the checked bound is reached, not just respected.
            assert_eq!(log.peak_total, host, "budget {host}/{agent}");
            assert!(log.peak_agent <= agent, "budget {host}/{agent}");
            assert_eq!(rig.lanes.in_flight(), [0; 4]);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn reads_progress_under_a_create_storm() {
    let rig = Rig::new(4, 1);
    let mut tasks: Vec<_> = (0..64)
        .map(|i| rig.call(Lane::Create, 5 * SEC, i))
        .collect();
    settle().await;
    // A describe every 2 s while 62 Creates wait: each gets its slot at once.
    for i in 0..20 {
        tasks.push(rig.call(Lane::Read, Duration::from_millis(500), 1000 + i));
        tokio::time::sleep(2 * SEC).await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    let granted = rig.granted();
    let reads: Vec<_> = granted.iter().filter(|g| g.0 == Lane::Read).collect();
    assert_eq!(reads.len(), 20);
    for (i, read) in reads.iter().enumerate() {
        assert_eq!(read.1, 2 * SEC * u32::try_from(i).unwrap(), "{reads:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn no_lane_starves_under_a_teardown_storm() {
    // One slot, so every grant is a choice between the lanes.
    let rig = Rig::new(1, 1);
    let mut tasks = vec![rig.call(Lane::Teardown, SEC, 0)];
    settle().await;
    tasks.extend((1..40).map(|i| rig.call(Lane::Teardown, SEC, i)));
    tasks.push(rig.call(Lane::Create, SEC, 100));
    tasks.push(rig.call(Lane::Agent, SEC, 101));
    tasks.push(rig.call(Lane::Read, SEC, 102));
    for task in tasks {
        task.await.unwrap();
    }
    let granted = rig.granted();
    let order: Vec<Lane> = granted.iter().map(|g| g.0).collect();
    // The running Delete, then bursts of TEARDOWN_BURST Deletes, each followed by one
    // other lane in turn: read, agent, create.
    let burst = [Lane::Teardown; TEARDOWN_BURST];
    let mut expected = vec![Lane::Teardown];
    for other in ROUND {
        expected.extend(burst.iter().copied());
        expected.push(other);
    }
    assert_eq!(order[..expected.len()], expected[..], "{order:?}");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_wait_leaves_the_queue_and_frees_nothing_twice() {
    let rig = Rig::new(2, 1);
    let running = rig.lanes.acquire(Lane::Create).await;
    let mut waiting = Box::pin(rig.lanes.acquire(Lane::Create));
    assert!(futures::poll!(&mut waiting).is_pending());
    assert_eq!(rig.lanes.queued()[Lane::Create.index()], 1);
    drop(waiting);
    assert_eq!(rig.lanes.queued(), [0; 4]);
    // A wait granted but dropped before it looked gives its slot back.
    let held = rig.lanes.acquire(Lane::Teardown).await;
    let mut late = Box::pin(rig.lanes.acquire(Lane::Teardown));
    assert!(futures::poll!(&mut late).is_pending());
    drop(running);
    assert_eq!(rig.lanes.in_flight(), [2, 0, 0, 0]);
    drop(late);
    assert_eq!(rig.lanes.in_flight(), [1, 0, 0, 0]);
    drop(held);
    assert_eq!(rig.lanes.in_flight(), [0; 4]);
}

#[tokio::test(start_paused = true)]
async fn try_acquire_takes_only_a_free_slot_and_never_jumps_its_lanes_queue() {
    let rig = Rig::new(4, 1);
    let first = rig.lanes.acquire(Lane::Create).await;
    let second = rig.lanes.acquire(Lane::Create).await;
    let teardown = rig.lanes.acquire(Lane::Teardown).await;
    // The read lane's reserved slot is free: the probe may take it.
    let probe = rig
        .lanes
        .try_acquire(Lane::Read)
        .expect("the read lane's slot is free");
    assert_eq!(rig.lanes.in_flight(), [1, 2, 1, 0]);
    // The budget is full: nothing more, whatever the lane.
    assert!(rig.lanes.try_acquire(Lane::Read).is_none());
    assert!(rig.lanes.try_acquire(Lane::Teardown).is_none());
    // A read waiting in its queue keeps its turn when a slot frees.
    let mut waiting = Box::pin(rig.lanes.acquire(Lane::Read));
    assert!(futures::poll!(&mut waiting).is_pending());
    drop(first);
    assert!(
        rig.lanes.try_acquire(Lane::Read).is_none(),
        "the freed slot went to the queued read"
    );
    let std::task::Poll::Ready(read) = futures::poll!(&mut waiting) else {
        panic!("the queued read was not granted the freed slot");
    };
    assert_eq!(rig.lanes.in_flight(), [1, 1, 2, 0]);
    drop((second, teardown, probe));
    assert_eq!(rig.lanes.in_flight(), [0, 0, 1, 0]);
    drop(read);
}

#[test]
fn budgets_are_validated() {
    assert!(
        Budget::new(0, 1)
            .unwrap_err()
            .contains("--host-budget must be at least 1")
    );
    assert!(
        Budget::new(4, 0)
            .unwrap_err()
            .contains("--agent-budget must be between 1")
    );
    assert!(Budget::new(4, 5).unwrap_err().contains("--host-budget (4)"));
    assert_eq!(Budget::new(1, 1).unwrap(), Budget { host: 1, agent: 1 });
    assert_eq!(Budget::default(), Budget { host: 7, agent: 1 });
}

#[test]
fn reservations_shape_each_lane_at_the_default_budget() {
    let budget = Budget::default();
    let most = |lane: Lane| {
        let mut in_flight = [0; 4];
        while budget.fits(lane, &in_flight) {
            in_flight[lane.index()] += 1;
        }
        in_flight[lane.index()]
    };
    assert_eq!(most(Lane::Teardown), 6);
    assert_eq!(most(Lane::Read), 5);
    assert_eq!(most(Lane::Create), 4);
    assert_eq!(most(Lane::Agent), 1);
    // With Creates holding all they may, two Deletes and a read still start.
    let mut in_flight = [0; 4];
    in_flight[Lane::Create.index()] = 4;
    assert!(!budget.fits(Lane::Create, &in_flight));
    assert!(budget.fits(Lane::Teardown, &in_flight));
    in_flight[Lane::Teardown.index()] = 1;
    assert!(budget.fits(Lane::Teardown, &in_flight));
    assert!(budget.fits(Lane::Read, &in_flight));
}
