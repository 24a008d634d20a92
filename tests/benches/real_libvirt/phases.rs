//! The benchmark's phases, each next to its yardstick measured in the same run.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1::MachineState as S;

use super::bare::{self, Bare};
use super::drive::{self, Timed, all, create_timed, delete_timed, wide};
use super::{BoxError, Sizes, phase_means, phase_sums};
use crate::harness::{Client, Server, create};

/// Create ack → Idle at concurrency 1, alternating with the bare sequence, each machine
/// removed again before the next is made (so every sample sees a host without our guests);
/// the provider's machine by a Delete, timed: the unloaded Delete.
pub struct C1 {
    pub provider: Vec<Duration>,
    pub bare: Vec<Duration>,
    pub delete: Vec<Duration>,
}

pub async fn c1(
    c: &Client,
    side: &Arc<Bare>,
    ids: &[String],
    sizes: &Sizes,
) -> Result<C1, BoxError> {
    let (mut provider, mut bare, mut delete) = (Vec::new(), Vec::new(), Vec::new());
    for (n, id) in ids.iter().take(sizes.c1).enumerate() {
        let side2 = Arc::clone(side);
        bare.push(
            tokio::task::spawn_blocking(move || {
                let took = side2.create(n)?;
                side2.remove(n)?;
                Ok::<_, BoxError>(took)
            })
            .await??,
        );
        provider.push(create_timed(c.clone(), id.clone()).await?.done);
        delete.push(delete_timed(c.clone(), id.clone()).await?.done);
    }
    Ok(C1 {
        provider,
        bare,
        delete,
    })
}

/// Creates per second, `width` in flight across both zones, next to the bare sequence run
/// as wide (half the workers on each zone's connection). Two rounds, alternating sides; each
/// side's best round counts (on a shared machine other work only ever slows a round down).
pub struct C8 {
    pub provider_per_s: f64,
    pub bare_per_s: f64,
    pub count: usize,
    /// Every round's Creates/s: (provider, bare).
    pub rounds: Vec<(f64, f64)>,
    /// The provider's means (ms) over its rounds' Creates: define, start, each lane's wait.
    pub phases: serde_json::Value,
}

pub async fn c8(
    c: &Client,
    server: &Server,
    sides: &[Arc<Bare>],
    a: &[String],
    b: &[String],
    sizes: &Sizes,
) -> Result<C8, BoxError> {
    let per_zone = sizes.c8_per_zone;
    let per_side_width = (sizes.c8_width / 2).max(1);
    // Interleaved, so each zone gets half the workers' next ids.
    let ids: Vec<String> = (0..per_zone)
        .flat_map(|i| [a[i].clone(), b[i].clone()])
        .collect();
    let count = ids.len();
    let mut rounds = Vec::new();
    // The provider's phase sums over its rounds' Creates only (not the Deletes between).
    let mut totals: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for round in 0..2 {
        let first = 100 + round * per_zone;
        let sides2: Vec<Arc<Bare>> = sides.to_vec();
        let (_, bare_wall) = tokio::task::spawn_blocking(move || {
            bare::run(&sides2, first, per_zone, per_side_width)
        })
        .await??;
        let sides2: Vec<Arc<Bare>> = sides.to_vec();
        tokio::task::spawn_blocking(move || bare::remove(&sides2, first, per_zone)).await??;
        let sums = phase_sums(server).await;
        let (_, wall) = wide(c, &ids, sizes.c8_width, create_timed).await?;
        for (name, (sum, count)) in phase_sums(server).await {
            let (sum0, count0) = sums.get(&name).copied().unwrap_or((0.0, 0.0));
            let entry = totals.entry(name).or_insert((0.0, 0.0));
            entry.0 += sum - sum0;
            entry.1 += count - count0;
        }
        all(c, &ids, delete_timed).await?;
        rounds.push((
            count as f64 / wall.as_secs_f64(),
            count as f64 / bare_wall.as_secs_f64(),
        ));
    }
    let best = |pick: fn(&(f64, f64)) -> f64| rounds.iter().map(pick).fold(0.0, f64::max);
    Ok(C8 {
        provider_per_s: best(|r| r.0),
        bare_per_s: best(|r| r.1),
        count,
        rounds,
        phases: phase_means(&BTreeMap::new(), &totals),
    })
}

/// Deletes while `queued` Creates are in flight on the same zone.
pub struct Loaded {
    pub delete: Vec<Duration>,
    pub create: Vec<Duration>,
    /// How many of the Deletes finished before the last Create that was acked ahead of them.
    pub deletes_before_creates: usize,
}

pub async fn delete_under_load(
    c: &Client,
    ids: &[String],
    sizes: &Sizes,
) -> Result<Loaded, BoxError> {
    let (victims, load) = ids[..sizes.deletes + sizes.queued].split_at(sizes.deletes);
    all(c, victims, create_timed).await?;
    // Every Create acked first, so all of them are queued on the host before any Delete.
    let mut acks = Vec::new();
    for id in load {
        let mut c = c.clone();
        let id = id.clone();
        acks.push(tokio::spawn(async move {
            create(&mut c, &id, None)
                .await
                .map_err(|e| format!("Create {id}: {e}"))?;
            Ok::<_, BoxError>(Instant::now())
        }));
    }
    let mut acked = Vec::new();
    for ack in acks {
        acked.push(ack.await??);
    }
    let idle: Vec<_> = load
        .iter()
        .map(|id| {
            let (mut c, id) = (c.clone(), id.clone());
            tokio::spawn(async move { drive::reach(&mut c, &id, S::Idle).await })
        })
        .collect();
    let deleted = all(c, victims, delete_timed).await?;
    let mut create = Vec::new();
    let mut last_idle = Instant::now() - Duration::from_secs(3600);
    for (task, acked) in idle.into_iter().zip(&acked) {
        let at = task.await??;
        create.push(at - *acked);
        last_idle = last_idle.max(at);
    }
    all(c, load, delete_timed).await?;
    Ok(Loaded {
        delete: deleted.iter().map(|t: &Timed| t.done).collect(),
        create,
        deletes_before_creates: deleted.iter().filter(|t| t.at < last_idle).count(),
    })
}

/// Create ack → Idle, one at a time, while `stuck` guests of the same zone wait for an
/// agent that never answers (Configure sent, the guest booted with `bigfleet.agent=off`),
/// next to the same Creates with those guests running Idle (no agent calls), so the only
/// difference is the agent polling. Those machines are left Configuring; the caller removes
/// them. Each arm also keeps the provider's phase and lane-wait means over its own Creates,
/// which say where a difference goes.
pub struct Agent {
    /// With the guests Idle.
    pub idle: Vec<Duration>,
    /// With their agents stuck.
    pub stuck: Vec<Duration>,
    /// The provider's means (ms) over each arm: define, start, each lane's wait.
    pub idle_phases: serde_json::Value,
    pub stuck_phases: serde_json::Value,
    /// The bare sequence's Creates in each arm (each removed at once), beside the same
    /// guests: whether a difference is the provider's or the host's.
    pub bare_idle: Vec<Duration>,
    pub bare_stuck: Vec<Duration>,
}

/// `count` bare Creates on `side`, one at a time, each removed at once; numbered from
/// `first`.
async fn bare_series(
    side: &Arc<Bare>,
    first: usize,
    count: usize,
) -> Result<Vec<Duration>, BoxError> {
    let side = Arc::clone(side);
    tokio::task::spawn_blocking(move || {
        let mut times = Vec::new();
        for n in first..first + count {
            times.push(side.create(n)?);
            side.remove(n)?;
        }
        Ok::<_, BoxError>(times)
    })
    .await?
}

pub async fn agent_isolation(
    c: &Client,
    server: &Server,
    side: &Arc<Bare>,
    ids: &[String],
    sizes: &Sizes,
) -> Result<Agent, BoxError> {
    let (stuck, rest) = ids[..sizes.stuck + 2 * sizes.c1].split_at(sizes.stuck);
    let (before, measured) = rest.split_at(sizes.c1);
    all(c, stuck, create_timed).await?;
    let mut idle = Vec::new();
    let start = phase_sums(server).await;
    for id in before {
        idle.push(create_timed(c.clone(), id.clone()).await?.done);
    }
    let idle_phases = phase_means(&start, &phase_sums(server).await);
    let bare_idle = bare_series(side, 300, sizes.c1).await?;
    for id in stuck {
        drive::configure_acked(c.clone(), id.clone()).await?;
    }
    // Let every stuck Configure reach its agent wait (the first pings time out after 2 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut times = Vec::new();
    let start = phase_sums(server).await;
    for id in measured {
        times.push(create_timed(c.clone(), id.clone()).await?.done);
    }
    let stuck_phases = phase_means(&start, &phase_sums(server).await);
    let bare_stuck = bare_series(side, 400, sizes.c1).await?;
    Ok(Agent {
        idle,
        stuck: times,
        idle_phases,
        stuck_phases,
        bare_idle,
        bare_stuck,
    })
}
