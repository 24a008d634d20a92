//! Scale & soak (docs/conformance.md §3.10 and §6, B1101–B1109) at the suite's manual size that
//! fits CI: each test boots its own provider with `--seed-count=4000` (scale-seed 4000) and soaks
//! for 3 s. The registry's latency budgets (B1106, B1107) are absolute wall-clock numbers: the
//! tests here drive the registry's calls and print the figures, and the provider benchmark
//! checks the budgets (docs/conformance.md §6).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::{CapacityType, MachineState as S};

use crate::harness::*;

/// The seeded inventory and the minimum a full List must return.
const SCALE_SEED: usize = 4000;
/// The soak duration for B1104/B1105 (and B1109's window, soak/4 clamped).
const SOAK: Duration = Duration::from_secs(3);
/// The scale lane's reach-state deadline.
const REACH: Duration = Duration::from_secs(30);

/// The core profile at scale size.
fn scale() -> Server {
    crate::harness::profiles::seeded(4000)
}

/// The ids of a response, asserting none repeats.
fn ids(list: &pb::MachineList, what: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for m in &list.machines {
        assert!(seen.insert(m.id.clone()), "{what}: {} listed twice", m.id);
    }
    seen
}

/// The extension capability probe (docs/conformance.md §1.2), returning (SinceRevision, Delete).
async fn probe(server: &Server, c: &mut Client) -> (bool, bool) {
    let r0 = list_all(c).await.revision;
    let id = walk_to_idle(server, c).await;
    let r1 = list_all(c).await.revision;
    let deleted = delete(c, &id, None).await;
    if deleted.is_ok() {
        reach(c, &id, S::Speculative, SETTLE).await;
    }
    (
        !r0.is_empty() && r1 != r0,
        code(&deleted) != tonic::Code::Unimplemented,
    )
}

/// WalkNToIdle: pick `n`, fire the Creates concurrently (any error fails), then reach IDLE
/// for each within 30 s. Returns the ids and the acks' operation ids.
async fn walk_n_to_idle(server: &Server, c: &mut Client, n: usize) -> (Vec<String>, Vec<String>) {
    let picked = pick_n(server, c, n).await;
    let creates = picked.iter().map(|id| {
        let mut c = c.clone();
        let id = id.clone();
        async move { (create(&mut c, &id, None).await, id) }
    });
    let mut ops = Vec::new();
    for (result, id) in futures::future::join_all(creates).await {
        let ack = result.unwrap_or_else(|e| panic!("concurrent Create of {id} failed: {e:?}"));
        ops.push(ack.operation_id);
    }
    for id in &picked {
        reach(c, id, S::Idle, REACH).await;
    }
    (picked, ops)
}

/// Nearest-rank p99: sort, take element ⌈0.99·n⌉ − 1.
fn p99(mut samples: Vec<Duration>) -> Duration {
    assert!(!samples.is_empty());
    samples.sort();
    let rank = (samples.len() * 99).div_ceil(100);
    samples[rank - 1]
}

fn transitional_or_failed(s: S) -> bool {
    matches!(
        s,
        S::Creating | S::Configuring | S::Draining | S::Deleting | S::Failed
    )
}

/// B1101: a full List returns at least scale-seed machines, and every record has an id, a
/// state, an instance_type, a zone and a capacity_type (even Speculative ones), a finite
/// non-negative price and an interruption probability in [0, 1] (> 0 for SPOT).
#[tokio::test]
async fn b1101_full_list_meets_the_seed_and_every_record_is_in_shape() {
    let server = scale();
    let mut c = server.client().await;
    let start = Instant::now();
    let all = list_all(&mut c).await;
    eprintln!(
        "b1101: full List of {} in {:?}",
        all.machines.len(),
        start.elapsed()
    );
    assert!(
        all.machines.len() >= SCALE_SEED,
        "only {} machines",
        all.machines.len()
    );
    ids(&all, "full List");
    for m in &all.machines {
        assert!(!m.id.is_empty(), "empty id");
        assert_ne!(state(m), S::Unspecified, "{} has no state", m.id);
        assert!(!m.instance_type.is_empty(), "{} has no instance_type", m.id);
        assert!(!m.zone.is_empty(), "{} has no zone", m.id);
        let ct = CapacityType::try_from(m.capacity_type).unwrap_or(CapacityType::Unspecified);
        assert_ne!(
            ct,
            CapacityType::Unspecified,
            "{} has no capacity_type",
            m.id
        );
        assert!(
            m.price_per_hour.is_finite() && m.price_per_hour >= 0.0,
            "{} price",
            m.id
        );
        let p = m.interruption_probability;
        assert!(
            !p.is_nan() && (0.0..=1.0).contains(&p),
            "{} interruption {p}",
            m.id
        );
        if ct == CapacityType::Spot {
            assert!(p > 0.0, "SPOT {} with interruption {p}", m.id);
        }
    }
}

/// B1102: after 20 machines are walked to Idle and then configured, a delta since the
/// revision taken between the two phases returns exactly those 20 ids.
#[tokio::test]
async fn b1102_delta_after_20_configures_is_exactly_those_20() {
    let server = scale();
    let mut c = server.client().await;
    let (since, _) = probe(&server, &mut c).await;
    assert!(since, "SinceRevision not detected by the probe");
    let (walked, _) = walk_n_to_idle(&server, &mut c, 20).await;
    let rev = list_all(&mut c).await.revision;
    for id in &walked {
        configure(&mut c, id, "scale-b1102", &[("k", "v")], None)
            .await
            .expect("Configure");
    }
    for id in &walked {
        reach(&mut c, id, S::Configured, REACH).await;
    }
    let delta = list(&mut c, &[], 0, &rev).await;
    let got = ids(&delta, "delta");
    let want: BTreeSet<String> = walked.into_iter().collect();
    assert_eq!(
        got,
        want,
        "delta: missing {:?}, extra {:?}",
        want.difference(&got).collect::<Vec<_>>(),
        got.difference(&want).collect::<Vec<_>>()
    );
}

/// B1103: paging 500 at a time is complete: no page over the cap, no duplicates, nothing
/// outside the full list, and either a continuation cursor covers the full list or (this
/// provider: the cursor is the head) the follow-up page is empty and completeness rests on
/// the full list.
#[tokio::test]
async fn b1103_paging_by_500_is_complete_without_duplicates() {
    let server = scale();
    let mut c = server.client().await;
    let (since, _) = probe(&server, &mut c).await;
    assert!(since, "SinceRevision not detected by the probe");
    let full = list_all(&mut c).await;
    let f = ids(&full, "F");
    assert!(f.len() >= SCALE_SEED, "only {} machines", f.len());

    let page0 = list(&mut c, &[], 500, b"").await;
    let p0 = ids(&page0, "page0");
    assert!(
        !p0.is_empty() && p0.len() <= 500,
        "page0 has {} machines",
        p0.len()
    );
    assert!(p0.is_subset(&f), "page0 has ids outside F");
    let n0 = page0.revision.clone();

    let page1 = list(&mut c, &[], 500, &n0).await;
    let p1 = ids(&page1, "page1");
    assert!(p1.len() <= 500, "page1 has {} machines", p1.len());
    assert!(p1.is_disjoint(&p0), "page1 repeats page0 ids");
    if p1.intersection(&f).count() > 0 {
        let mut seen: BTreeSet<String> = p0.union(&p1).cloned().collect();
        let mut cursor = page1.revision.clone();
        let cap = f.len() / 500 + 8;
        let mut pages = 2;
        loop {
            assert!(pages < cap, "paging did not finish within {cap} pages");
            let page = list(&mut c, &[], 500, &cursor).await;
            let got = ids(&page, "page");
            assert!(got.len() <= 500, "a page has {} machines", got.len());
            pages += 1;
            if got.is_empty() || page.revision == cursor {
                break;
            }
            assert!(got.is_disjoint(&seen), "a page repeats earlier ids");
            seen.extend(got);
            cursor = page.revision;
        }
        assert!(
            seen.is_superset(&f),
            "paging lost {} ids",
            f.difference(&seen).count()
        );
    } else {
        assert_eq!(
            n0, full.revision,
            "a head-echo cursor should equal the head revision"
        );
        assert!(
            p1.is_empty(),
            "a head-echo cursor yielded a non-empty page1"
        );
    }
}

/// B1104: a Configure/Drain churn soak over 8 machines (at least one full cycle, for 3 s)
/// never leaves cluster, metadata or last_error behind at Idle.
#[tokio::test]
async fn b1104_churn_soak_leaves_nothing_behind_at_idle() {
    let server = scale();
    let mut c = server.client().await;
    let (walked, _) = walk_n_to_idle(&server, &mut c, 8).await;
    let deadline = Instant::now() + SOAK;
    let mut cycles = 0;
    while Instant::now() < deadline {
        for id in &walked {
            configure(&mut c, id, "scale-b1104", &[("cycle", "x")], None)
                .await
                .expect("Configure");
        }
        for id in &walked {
            reach(&mut c, id, S::Configured, REACH).await;
        }
        for id in &walked {
            drain(&mut c, id, 0, None).await.expect("Drain");
        }
        for id in &walked {
            let m = reach(&mut c, id, S::Idle, REACH).await;
            assert_eq!(m.cluster, "", "cycle {cycles}: {id} kept its cluster");
            assert!(
                m.shard_metadata.is_empty(),
                "cycle {cycles}: {id} kept metadata"
            );
            assert_eq!(m.last_error, "", "cycle {cycles}: {id} has last_error");
        }
        cycles += 1;
    }
    eprintln!("b1104: {cycles} complete cycles in {SOAK:?}");
    assert!(cycles >= 1, "no complete cycle");
}

/// The machines the provider holds (every state but Speculative), counted from a full List.
async fn resident(c: &mut Client) -> usize {
    let all = list_all(c).await;
    all.machines
        .iter()
        .filter(|m| state(m) != S::Speculative)
        .count()
}

/// B1105: with Delete, a create/delete soak keeps created = deleted + resident throughout
/// (resident as the provider's full List reports it), and the fleet size at the end equals
/// the size at the start.
#[tokio::test]
async fn b1105_create_delete_soak_conserves_the_fleet() {
    let server = scale();
    let mut c = server.client().await;
    let (_, has_delete) = probe(&server, &mut c).await;
    assert!(has_delete, "the core profile supports Delete");
    let n0 = list_all(&mut c).await.machines.len();
    let r0 = resident(&mut c).await;
    let (mut created, mut deleted) = (0usize, 0usize);
    let deadline = Instant::now() + SOAK;
    loop {
        let id = walk_to_idle(&server, &mut c).await;
        created += 1;
        assert_eq!(
            resident(&mut c).await,
            r0 + created - deleted,
            "after creating {id}: the List's resident count"
        );
        delete(&mut c, &id, None).await.expect("Delete accepted");
        reach(&mut c, &id, S::Speculative, REACH).await;
        deleted += 1;
        assert_eq!(
            resident(&mut c).await,
            r0 + created - deleted,
            "after deleting {id}: the List's resident count"
        );
        if Instant::now() >= deadline {
            break;
        }
    }
    eprintln!("b1105: created {created}, deleted {deleted}, {r0} resident before the soak");
    assert_eq!(
        list_all(&mut c).await.machines.len(),
        n0,
        "fleet size changed"
    );
}

/// B1106's sample, sequentially: 120 Gets of one id, 120 full Lists, 60 Creates (the RPC
/// only). Every call answers, with the machine asked for, the whole seed, an operation id.
/// The p99 figures are printed beside the registry's budgets (Get and Create <= 250 ms, List
/// <= 2 s); the provider benchmark checks the budgets (docs/conformance.md §6), a test does not
/// assert wall-clock time.
#[tokio::test]
async fn b1106_latency_sample_answers_every_call_and_reports_p99() {
    let server = scale();
    let mut c = server.client().await;
    let all = list_all(&mut c).await;
    let first = all
        .machines
        .first()
        .expect("non-empty inventory")
        .id
        .clone();

    let mut gets = Vec::with_capacity(120);
    for _ in 0..120 {
        let t = Instant::now();
        let m = get(&mut c, &first).await.expect("Get");
        gets.push(t.elapsed());
        assert_eq!(m.id, first, "Get answered another machine");
    }
    let mut lists = Vec::with_capacity(120);
    for _ in 0..120 {
        let t = Instant::now();
        let l = list_all(&mut c).await;
        lists.push(t.elapsed());
        assert!(
            l.machines.len() >= SCALE_SEED,
            "a List of {}",
            l.machines.len()
        );
    }
    let picked = pick_n(&server, &mut c, 60).await;
    let mut creates = Vec::with_capacity(60);
    for id in &picked {
        let t = Instant::now();
        let ack = create(&mut c, id, None)
            .await
            .unwrap_or_else(|e| panic!("Create {id}: {e:?}"));
        creates.push(t.elapsed());
        assert!(!ack.operation_id.is_empty(), "Create {id}: no operation id");
    }
    let (g, l, cr) = (p99(gets), p99(lists), p99(creates));
    eprintln!(
        "b1106: p99 Get {g:?}, List {l:?}, Create {cr:?} (registry budgets 250 ms, 2 s, 250 ms; \
         checked by `cargo bench -p bigfleet-libvirt --bench provider`)"
    );
}

/// B1107's call: after a warm-up List, one full List returns at least scale-seed machines.
/// Its time is printed beside the registry's 3 s budget, which the provider benchmark checks.
#[tokio::test]
async fn b1107_one_full_list_after_a_warm_up_returns_the_seed_and_reports_its_time() {
    let server = scale();
    let mut c = server.client().await;
    list_all(&mut c).await;
    let t = Instant::now();
    let all = list_all(&mut c).await;
    let took = t.elapsed();
    eprintln!(
        "b1107: full List of {} in {took:?} (registry budget 3 s)",
        all.machines.len()
    );
    assert!(
        all.machines.len() >= SCALE_SEED,
        "only {} machines",
        all.machines.len()
    );
}

/// B1108: 16 parallel Creates all succeed with non-empty, distinct operation ids, and every
/// machine reaches IDLE.
#[tokio::test]
async fn b1108_parallel_creates_get_distinct_ops_and_reach_idle() {
    let server = scale();
    let mut c = server.client().await;
    let start = Instant::now();
    let (walked, ops) = walk_n_to_idle(&server, &mut c, 16).await;
    let took = start.elapsed();
    assert_eq!(ops.len(), 16);
    assert!(
        ops.iter().all(|op| !op.is_empty()),
        "an empty operation id: {ops:?}"
    );
    let distinct: BTreeSet<&String> = ops.iter().collect();
    assert_eq!(distinct.len(), 16, "operation ids repeat: {ops:?}");
    for id in &walked {
        assert_eq!(state(&get(&mut c, id).await.expect("Get")), S::Idle);
    }
    eprintln!(
        "b1108: 16 machines to IDLE in {took:?} ({:.1}/s)",
        16.0 / took.as_secs_f64()
    );
}

/// B1109: Idle machines with no client activity never drift: over a window of soak/4
/// (clamped to [0.5 s, 3 s]) Gets every 20 ms never show a transitional state or FAILED
/// (and, with no client activity at all, always show IDLE).
#[tokio::test]
async fn b1109_idle_machines_do_not_drift() {
    let server = scale();
    let mut c = server.client().await;
    let (walked, _) = walk_n_to_idle(&server, &mut c, 8).await;
    let window = (SOAK / 4).clamp(Duration::from_millis(500), Duration::from_secs(3));
    let start = Instant::now();
    // Every machine is read in every round, the first round at once; a failed Get fails.
    loop {
        for id in &walked {
            let m = get(&mut c, id)
                .await
                .unwrap_or_else(|e| panic!("Get {id} during the window: {e:?}"));
            assert!(!transitional_or_failed(state(&m)), "{id} drifted: {m:?}");
            assert_eq!(state(&m), S::Idle, "{id} left IDLE without a client call");
        }
        if start.elapsed() >= window {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

crate::harness::backend::on_test_driver!(
    b1101_full_list_meets_the_seed_and_every_record_is_in_shape,
    b1102_delta_after_20_configures_is_exactly_those_20,
    b1103_paging_by_500_is_complete_without_duplicates,
    b1104_churn_soak_leaves_nothing_behind_at_idle,
    b1105_create_delete_soak_conserves_the_fleet,
    b1106_latency_sample_answers_every_call_and_reports_p99,
    b1107_one_full_list_after_a_warm_up_returns_the_seed_and_reports_its_time,
    b1108_parallel_creates_get_distinct_ops_and_reach_idle,
    b1109_idle_machines_do_not_drift,
);
