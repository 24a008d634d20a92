//! The simulated shards: realistic lifecycle traffic on one shared inventory.
//!
//! Each shard runs a few concurrent workers that pick machines from the shard's view and
//! drive them Speculative → Create → Configure → Drain → Delete, with transport retries
//! (a fresh sequence number per attempt), idempotent re-sends, an occasional out-of-position
//! or unknown-machine call, and Get polling until a transition settles. Several shards
//! compete for the same slots. When a shard restarts (a planned event), its new process
//! takes a higher epoch and the old one lives on for a while as a zombie: it keeps working
//! from its stale view with its old epoch. A watcher per shard maintains a view from
//! `since_revision` deltas for the whole run.

mod calls;
mod watcher;

use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::{Kind, StringMap};
use bigfleet_libvirt_proto::v1alpha1 as pb;

pub use calls::{Incarnation, Payload};
pub use watcher::{WatcherView, Watchers, delta as watcher_delta, run_watcher};

use crate::net::{Answer, Outcome};
use crate::rng::Ratio;
use crate::time::elapsed;
use crate::world::World;

/// The metadata key every simulated Configure carries with its cluster id, so a record's
/// binding can be checked for consistency wherever it is seen.
pub const CLUSTER_KEY: &str = "bigfleet.lucy.sh/assigned-group";

/// Attempts per mutating call (each with a fresh token).
const ATTEMPTS_MAX: u32 = 4;

/// Runs shard `shard` until the fault phase ends and its processes have finished; its
/// watcher keeps its view in `watchers`.
pub async fn run_shard(world: Arc<World>, shard: usize, watchers: Arc<Watchers>) {
    let watcher = madsim::task::spawn(run_watcher(Arc::clone(&world), shard, watchers));
    let mut restarts: Vec<Duration> = world
        .plan
        .shard_restarts
        .iter()
        .filter(|(s, _)| *s == shard)
        .map(|(_, at)| *at)
        .collect();
    restarts.sort();
    let mut processes = Vec::new();
    for epoch in 1.. {
        let incarnation = Arc::new(Incarnation::new(Arc::clone(&world), shard, epoch));
        let workers: Vec<_> = (0..world.plan.workers)
            .map(|_| madsim::task::spawn(work(Arc::clone(&incarnation))))
            .collect();
        processes.extend(workers);
        let restart_at = restarts
            .get(usize::try_from(epoch - 1).expect("small"))
            .copied();
        let Some(restart_at) = restart_at.filter(|at| *at < world.plan.fault_phase) else {
            break;
        };
        madsim::time::sleep(restart_at.saturating_sub(elapsed())).await;
        let life = {
            let (low, high) = world.plan.zombie_life;
            incarnation
                .rng
                .lock()
                .expect("rng lock")
                .duration(low, high)
        };
        *incarnation.zombie_until.lock().expect("zombie lock") = Some(elapsed() + life);
        world.trace(format!(
            "shard-{shard} restarts with epoch {}; epoch {epoch} lingers as a zombie for {:.1}s",
            epoch + 1,
            life.as_secs_f64()
        ));
    }
    for process in processes {
        let _ = process.await;
    }
    let _ = watcher.await;
}

fn stopping(incarnation: &Incarnation) -> bool {
    let zombie_over = incarnation
        .zombie_until
        .lock()
        .expect("zombie lock")
        .is_some_and(|until| elapsed() >= until);
    incarnation.world.calm() || zombie_over
}

/// One worker of one process.
async fn work(incarnation: Arc<Incarnation>) {
    let mut refreshed_at: Option<Duration> = None;
    while !stopping(&incarnation) {
        if refreshed_at.is_none_or(|at| elapsed() >= at + Duration::from_secs(3))
            && incarnation.refresh().await
        {
            refreshed_at = Some(elapsed());
        }
        let Some((id, kind, payload)) = choose(&incarnation) else {
            pause(
                &incarnation,
                Duration::from_millis(200),
                Duration::from_secs(1),
            )
            .await;
            continue;
        };
        let claimed = incarnation
            .in_flight
            .lock()
            .expect("lock")
            .insert(id.clone());
        if !claimed {
            continue;
        }
        let accepted = mutate(&incarnation, &id, kind, &payload).await;
        if accepted {
            settle(&incarnation, &id).await;
        }
        incarnation.in_flight.lock().expect("lock").remove(&id);
        pause(
            &incarnation,
            Duration::from_millis(10),
            Duration::from_millis(500),
        )
        .await;
    }
}

async fn pause(incarnation: &Incarnation, low: Duration, high: Duration) {
    let wait = incarnation
        .rng
        .lock()
        .expect("rng lock")
        .duration(low, high);
    madsim::time::sleep(wait).await;
}

/// Picks the next call from the view: a step forward for some machine, an idempotent
/// re-send, or (rarely) a call that must be refused.
fn choose(incarnation: &Incarnation) -> Option<(String, Kind, Payload)> {
    use pb::MachineState as S;
    let view = incarnation.view.lock().expect("view lock");
    let in_flight = incarnation.in_flight.lock().expect("lock");
    let mut rng = incarnation.rng.lock().expect("rng lock");
    if rng.chance(Ratio::new(1, 40)) {
        let ghost = format!("sim/ghost/{}", rng.between(0, 3));
        return Some((ghost, Kind::Create, Payload::None));
    }
    let mut options: Vec<(String, Kind)> = Vec::new();
    for (id, machine) in view.iter().filter(|(id, _)| !in_flight.contains(*id)) {
        let state = S::try_from(machine.state).unwrap_or(S::Unspecified);
        let kinds: &[Kind] = match state {
            S::Speculative => &[Kind::Create, Kind::Create, Kind::Create],
            S::Idle => &[Kind::Configure, Kind::Configure, Kind::Delete, Kind::Create],
            S::Configured => &[Kind::Drain, Kind::Drain, Kind::Configure],
            S::Creating => &[Kind::Create],
            S::Configuring => &[Kind::Configure],
            S::Draining => &[Kind::Drain],
            S::Deleting => &[Kind::Delete],
            S::Failed | S::Unspecified => &[],
        };
        options.extend(kinds.iter().map(|k| (id.clone(), *k)));
    }
    if options.is_empty() {
        return None;
    }
    let (id, mut kind) = rng.pick(&options).clone();
    if rng.chance(Ratio::new(1, 30)) {
        kind = *rng.pick(&Kind::ALL); // Probably out of position: must be refused cleanly.
    }
    let payload = match kind {
        Kind::Configure => {
            // Unique per call (retries reuse it), so an echoed binding names its request.
            let cluster = format!("cluster-{}-{:08x}", incarnation.shard, rng.next_u64() >> 32);
            let metadata = StringMap::from([
                (CLUSTER_KEY.to_owned(), cluster.clone()),
                (
                    "bigfleet.lucy.sh/assigned-priority".to_owned(),
                    rng.between(0, 9).to_string(),
                ),
                (
                    "sim/nonce".to_owned(),
                    format!("{:x}\u{0}é\t", rng.next_u64()),
                ),
            ]);
            Payload::Configure { cluster, metadata }
        }
        Kind::Drain => Payload::Drain(i64::try_from(rng.between(0, 60)).expect("small") - 5),
        Kind::Create | Kind::Delete => Payload::None,
    };
    Some((id, kind, payload))
}

/// Sends one mutating call with transport retries; returns whether a transition was
/// acknowledged (accepted or already under way).
async fn mutate(incarnation: &Incarnation, id: &str, kind: Kind, payload: &Payload) -> bool {
    for attempt in 1..=ATTEMPTS_MAX {
        match incarnation.mutate(id, kind, payload).await {
            Outcome::Answered(Ok(Answer::Ack(_))) => return true,
            Outcome::Answered(Err(status)) if status.code() != tonic::Code::Unavailable => {
                return false;
            }
            _ => {
                let base = Duration::from_millis(200) * attempt;
                pause(incarnation, base, base * 4).await;
            }
        }
    }
    false
}

/// Polls Get until the machine leaves its transitional state (or a bound passes).
async fn settle(incarnation: &Incarnation, id: &str) {
    let give_up = elapsed() + incarnation.world.plan.transition_timeout * 4;
    while elapsed() < give_up {
        pause(
            incarnation,
            Duration::from_millis(300),
            Duration::from_secs(2),
        )
        .await;
        if let Some(machine) = incarnation.get(id).await {
            let state = pb::MachineState::try_from(machine.state).unwrap_or_default();
            if !matches!(
                state,
                pb::MachineState::Creating
                    | pb::MachineState::Configuring
                    | pb::MachineState::Draining
                    | pb::MachineState::Deleting
            ) {
                return;
            }
        }
    }
}
