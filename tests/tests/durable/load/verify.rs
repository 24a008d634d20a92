//! Part 4: SIGKILL under concurrent load, after each restart: every shape the acknowledged
//! history allows, the checks (a)–(f) against them, and the test that drives the rounds.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use tonic::Code;

use super::*;

/// One expected post-restart shape.
#[derive(Clone, Debug)]
struct Outcome {
    state: S,
    binding: Option<Binding>,
    host: bool,
    /// The kind whose restart-recovery message last_error must be.
    interrupted: Option<Kind>,
    /// Whether it means the indefinite call was applied.
    applied: bool,
}

fn settled(state: S, binding: Option<Binding>) -> Outcome {
    Outcome {
        state,
        binding,
        host: matches!(state, S::Idle | S::Configured),
        interrupted: None,
        applied: false,
    }
}

/// Where an accepted `kind` can be after a restart: finished, or cut off.
fn accepted(kind: Kind, at_accept: Option<Binding>, applied: bool) -> [Outcome; 2] {
    let done_binding = if kind == Kind::Configure {
        at_accept.clone()
    } else {
        None
    };
    let done = Outcome {
        applied,
        ..settled(kind.target(), done_binding)
    };
    let cut = Outcome {
        state: S::Failed,
        binding: match kind {
            Kind::Configure | Kind::Drain => at_accept,
            _ => None,
        },
        host: kind != Kind::Create,
        interrupted: Some(kind),
        applied,
    };
    [done, cut]
}

/// (b) Every shape the acknowledged history (plus an indefinite call) allows.
fn allowed(model: &Model) -> Vec<Outcome> {
    let mut out = match &model.base {
        Base::Settled { state, binding } => vec![settled(*state, binding.clone())],
        Base::Pending { kind, binding } => accepted(*kind, binding.clone(), false).to_vec(),
    };
    if let Some(ind) = model.indefinite.as_ref().filter(|i| i.fresh) {
        out.extend(accepted(ind.kind, ind.binding.clone(), true));
    }
    out
}

fn matches(o: &Outcome, m: &pb::Machine) -> bool {
    let binding_ok = match &o.binding {
        Some(b) => m.cluster == b.cluster && m.shard_metadata == b.md,
        None => m.cluster.is_empty() && m.shard_metadata.is_empty(),
    };
    let error_ok = match o.interrupted {
        Some(kind) => is_interrupted(&m.last_error, kind.name()),
        None => m.last_error.is_empty(),
    };
    state(m) == o.state && host_set(m) == o.host && binding_ok && error_ok
}

/// A machine no longer worked on; its record must never change again.
struct Parked {
    model: Model,
    record: pb::Machine,
}

#[derive(Debug, Default)]
struct Verdict {
    failed_by_restart: usize,
    applied_indefinite: usize,
    parked_now: usize,
    head: i64,
}

/// After a restart: checks (a)–(f) for every machine, learns the op ids of indefinite calls
/// that were applied, and parks FAILED / Configured machines.
#[allow(clippy::too_many_arguments)]
async fn verify_restart(
    c: &mut Client,
    tasks: &mut [Task],
    parked: &mut BTreeMap<String, Parked>,
    touched: &BTreeSet<String>,
    shared: &Shared,
    prev_head: i64,
    fresh_acked: u64,
    lifetime: usize,
) -> Verdict {
    let listed = list_all(c).await;
    assert_eq!(
        listed.machines.len(),
        LOAD_SEED_COUNT,
        "inventory size changed"
    );
    let by_id: BTreeMap<String, pb::Machine> = listed
        .machines
        .iter()
        .map(|m| (m.id.clone(), m.clone()))
        .collect();
    assert_eq!(by_id.len(), LOAD_SEED_COUNT, "duplicate ids in List");
    // (f) Nothing transitional right after the restart (no traffic yet).
    let stuck: Vec<(&String, S)> = by_id
        .values()
        .filter(|m| transitional(state(m)))
        .map(|m| (&m.id, state(m)))
        .collect();
    assert!(
        stuck.is_empty(),
        "(f) transitional right after restart: {stuck:?}"
    );
    // (e) Untouched machines are pristine.
    for m in by_id.values().filter(|m| !touched.contains(&m.id)) {
        assert!(
            state(m) == S::Speculative
                && !host_set(m)
                && m.cluster.is_empty()
                && m.shard_metadata.is_empty()
                && m.last_error.is_empty(),
            "(e) {} was never touched but is {m:?}",
            m.id
        );
    }
    // Parked machines never change.
    for p in parked.values() {
        let now = &by_id[&p.model.id];
        assert_eq!(
            durable_view(now),
            durable_view(&p.record),
            "parked machine {} changed across a restart",
            p.model.id
        );
    }
    let mut v = Verdict::default();
    // (b)/(c) Every worked-on machine against its history.
    for t in tasks.iter_mut() {
        for model in &mut t.pool {
            let now = &by_id[&model.id];
            let options = allowed(model);
            let Some(hit) = options.iter().find(|o| matches(o, now)) else {
                panic!(
                    "(b)/(c) {} after restart is\n  {now:?}\nbut its acknowledged history \
                     {:?} (last ack {:?}, indefinite {:?}) allows only\n  {options:#?}",
                    model.id, model.base, model.last_ack, model.indefinite
                );
            };
            if hit.interrupted.is_some() {
                v.failed_by_restart += 1;
            }
            if hit.applied {
                v.applied_indefinite += 1;
                let ind = model.indefinite.clone().expect("applied indefinite call");
                model.cycle += 1;
                if hit.interrupted.is_none() {
                    // (d) Learn its op id with an idempotent retry: never seen before, and
                    // above everything acknowledged before it was sent.
                    let ack = send(c, ind.kind, &model.id, ind.binding.as_ref(), None)
                        .await
                        .unwrap_or_else(|e| {
                            panic!(
                                "retry of the applied indefinite {:?} on {}: {e:?}",
                                ind.kind, model.id
                            )
                        });
                    shared.mint(
                        &ack.operation_id,
                        ind.op_floor,
                        (model.id.clone(), ind.kind, model.cycle),
                    );
                    model.last_ack = Some(LastAck {
                        kind: ind.kind,
                        op: ack.operation_id,
                        binding: if ind.kind == Kind::Configure {
                            ind.binding.clone()
                        } else {
                            None
                        },
                        lifetime,
                    });
                }
            }
            model.base = Base::Settled {
                state: state(now),
                binding: binding_of(now),
            };
            model.indefinite = None;
            model.domain_here = false;
        }
    }
    // (a) Every acknowledged fence mark survived: the exact last answered token is stale.
    let all_models = tasks
        .iter()
        .flat_map(|t| t.pool.iter())
        .chain(parked.values().map(|p| &p.model));
    for model in all_models {
        if let Some((e, s)) = model.mark {
            let replay = create(c, &model.id, tok(&model.shard, e, s)).await;
            assert_eq!(
                code(&replay),
                Code::FailedPrecondition,
                "(a) the mark ({}, {e}, {s}) on {} was lost across the restart: {replay:?}",
                model.shard,
                model.id
            );
        }
    }
    // Revision: every acknowledged accept and every recovered machine bumped it durably.
    let head = decimal(&listed.revision);
    let floor =
        prev_head + fresh_acked as i64 + v.applied_indefinite as i64 + v.failed_by_restart as i64;
    assert!(
        head >= floor,
        "the revision went back: head {head} after restart, but the previous head {prev_head} \
         plus {fresh_acked} acknowledged accepts, {} applied indefinite calls and {} recovered \
         machines needs at least {floor}",
        v.applied_indefinite,
        v.failed_by_restart
    );
    v.head = head;
    // Park FAILED machines (terminal) and Configured ones (the fake lost their domain).
    for t in tasks.iter_mut() {
        let (keep, park): (Vec<Model>, Vec<Model>) = std::mem::take(&mut t.pool)
            .into_iter()
            .partition(|m| !matches!(state(&by_id[&m.id]), S::Failed | S::Configured));
        t.pool = keep;
        for model in park {
            v.parked_now += 1;
            let record = by_id[&model.id].clone();
            parked.insert(model.id.clone(), Parked { model, record });
        }
    }
    v
}

/// The main durability property: at least 20 rounds of concurrent fenced and unfenced
/// traffic, each cut off by SIGKILL at a random point, then verified against a model built
/// only from acknowledged responses (see the module docs and the checks (a)–(f) in
/// `verify_restart`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_under_concurrent_load_loses_nothing_acknowledged() {
    let started = Instant::now();
    let mut rng = seeded_rng("sigkill_under_concurrent_load", 0x00D0_0AB1_E5EE_D001);
    let dir = tempfile::tempdir().expect("temp dir");
    let args = lane_args(&dir.path().join("load-state.redb"), LOAD_SEED_COUNT, &[]);
    let mut server = boot(&args);
    let mut c = server.client().await;
    let first = list_all(&mut c).await;
    assert_eq!(first.machines.len(), LOAD_SEED_COUNT);
    let mut head = decimal(&first.revision);
    let mut free: Vec<String> = first
        .machines
        .iter()
        .filter(|m| state(m) == S::Speculative && !m.labels.contains_key(FAULT_LABEL))
        .map(|m| m.id.clone())
        .collect();
    free.sort();
    free.reverse();
    let mut touched: BTreeSet<String> = BTreeSet::new();
    let mut parked: BTreeMap<String, Parked> = BTreeMap::new();
    let shared = Arc::new(Shared {
        killed: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        max_op: AtomicU64::new(0),
        ops: Mutex::new(HashMap::new()),
    });
    let mut tasks: Vec<Task> = (0..LOAD_TASKS)
        .map(|index| Task {
            index,
            shard: format!("dur-load-t{index}"),
            seq: 0,
            lifetime: 0,
            rng: Xoshiro256PlusPlus::seed_from_u64(rng.next_u64()),
            pool: Vec::new(),
            stats: Stats::default(),
            clusters: 0,
        })
        .collect();
    let mut total = Stats::default();
    let (mut total_failed, mut total_applied) = (0, 0);

    for round in 0..LOAD_ROUNDS {
        let round_started = Instant::now();
        // Top the pools up with machines nobody has touched.
        for t in &mut tasks {
            while t.pool.len() < POOL {
                let id = free
                    .pop()
                    .expect("LOAD_SEED_COUNT too small for this many rounds");
                touched.insert(id.clone());
                t.pool.push(Model {
                    id,
                    shard: t.shard.clone(),
                    base: Base::Settled {
                        state: S::Speculative,
                        binding: None,
                    },
                    last_ack: None,
                    cycle: 0,
                    indefinite: None,
                    mark: None,
                    domain_here: false,
                });
            }
            t.lifetime = round;
            t.stats = Stats::default();
        }
        shared.killed.store(false, Ordering::SeqCst);
        shared.stop.store(false, Ordering::SeqCst);
        let mut handles = Vec::new();
        for t in std::mem::take(&mut tasks) {
            let client = server.client().await;
            handles.push(tokio::spawn(run_task(t, client, Arc::clone(&shared))));
        }
        let run_for = Duration::from_millis(50 + below(&mut rng, 351));
        tokio::time::sleep(run_for).await;
        // Every fourth round lets the calls in flight finish first (transitions still run).
        let quiesce = round % 4 == 3;
        if quiesce {
            shared.stop.store(true, Ordering::SeqCst);
            for h in handles.drain(..) {
                tasks.push(h.await.expect("load task panicked"));
            }
        }
        shared.killed.store(true, Ordering::SeqCst);
        drop(c);
        sigkill(&mut server);
        for h in handles {
            tasks.push(h.await.expect("load task panicked"));
        }
        tasks.sort_by_key(|t| t.index);
        let mut stats = Stats::default();
        for t in &tasks {
            stats.add(t.stats);
        }

        server = boot(&args);
        c = server.client().await;
        let v = verify_restart(
            &mut c,
            &mut tasks,
            &mut parked,
            &touched,
            &shared,
            head,
            stats.fresh,
            round + 1,
        )
        .await;
        head = v.head;
        total.add(stats);
        total_failed += v.failed_by_restart;
        total_applied += v.applied_indefinite;
        println!(
            "round {round:2}: kill after {:3} ms{}: acked {:3} (fresh {:3}, retries {:2}, \
             across restart {:2}), rejected probes {:2}, indefinite {} (applied {}), \
             failed-by-restart {}, parked {} (total {}), head {head}, {} ms",
            run_for.as_millis(),
            if quiesce { " (calls drained)" } else { "" },
            stats.fresh + stats.retries,
            stats.fresh,
            stats.retries,
            stats.cross_restart_retries,
            stats.probes,
            stats.indefinite,
            v.applied_indefinite,
            v.failed_by_restart,
            v.parked_now,
            parked.len(),
            round_started.elapsed().as_millis()
        );
    }
    println!(
        "total: {} fresh, {} retries ({} across a restart), {} probes, {} indefinite \
         ({total_applied} applied), {total_failed} failed by restart, {} op ids, {:.1} s",
        total.fresh,
        total.retries,
        total.cross_restart_retries,
        total.probes,
        total.indefinite,
        shared.ops.lock().unwrap().len(),
        started.elapsed().as_secs_f64()
    );
    // Non-vacuity (real traffic, not a throughput: the kills come after a wall-clock delay).
    assert!(
        total.fresh >= 5 * LOAD_ROUNDS as u64,
        "too little traffic: {total:?}"
    );
    assert!(
        total.retries > 0 && total.cross_restart_retries > 0,
        "no retries: {total:?}"
    );
    assert!(total.indefinite > 0, "no call was ever cut off by a kill");
    assert!(total_failed > 0, "no transition was ever cut off by a kill");
}
