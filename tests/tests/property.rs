//! docs/conformance.md §3.11 — property / fuzz (B1201–B1205): seeded random token streams against
//! running-max oracles, random UTF-8 metadata round-trips, random lifecycle walks against
//! the four-edge model, and the request-shape code discipline. Every random stream comes
//! from `Xoshiro256PlusPlus` with a fixed seed that is printed (override:
//! `BIGFLEET_TEST_SEED`).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use tonic::Code;

use crate::harness::*;

const FP: Code = Code::FailedPrecondition;

/// A seeded RNG: `BIGFLEET_TEST_SEED` if set, else `default`; the seed is printed.
fn rng(test: &str, default: u64) -> Xoshiro256PlusPlus {
    let seed = std::env::var("BIGFLEET_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    println!("{test}: seed {seed} (override with BIGFLEET_TEST_SEED)");
    Xoshiro256PlusPlus::seed_from_u64(seed)
}

/// Uniform integer in `lo..=hi`.
fn uniform(rng: &mut Xoshiro256PlusPlus, lo: i64, hi: i64) -> i64 {
    let span = u64::try_from(hi - lo + 1).expect("non-empty range");
    lo + i64::try_from(rng.next_u64() % span).expect("small span")
}

/// A uniform index below `n`.
fn index(rng: &mut Xoshiro256PlusPlus, n: usize) -> usize {
    usize::try_from(rng.next_u64() % u64::try_from(n).unwrap()).unwrap()
}

/// A uniform non-negative int63.
fn int63(rng: &mut Xoshiro256PlusPlus) -> i64 {
    i64::try_from(rng.next_u64() >> 1).unwrap()
}

/// The B1201/B1204 clamp: a token with epoch ≤ 0 and seq ≤ 0 gets seq 1.
fn clamp((e, s): (i64, i64)) -> (i64, i64) {
    if e <= 0 && s <= 0 { (e, 1) } else { (e, s) }
}

/// A non-fencing rejection: an error whose code is not FAILED_PRECONDITION.
fn non_fencing_rejection<T>(result: &Result<T, tonic::Status>) -> bool {
    result.is_err() && code(result) != FP
}

/// The capability probe's Delete half (docs/conformance.md §1.2): walk a machine to Idle and Delete
/// it; Delete exists unless the answer is UNIMPLEMENTED. On success the machine returns to the
/// pool.
async fn probe_delete(server: &Server, c: &mut Client) -> bool {
    let id = walk_to_idle(server, c).await;
    let result = delete(c, &id, None).await;
    if result.is_ok() {
        reach(c, &id, S::Speculative, SETTLE).await;
    }
    code(&result) != Code::Unimplemented
}

/// B1201: on one (shard, machine), 240 fenced Creates with tokens from six random branches
/// (negative sequences included) are accepted exactly when strictly newer than the oracle's
/// mark, FAILED_PRECONDITION otherwise — at every step.
#[tokio::test]
async fn b1201_token_stream_matches_oracle() {
    let server = core();
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let shard = unique_shard("b1201");
    let mut rng = rng("b1201", 1201);
    let mut mark: Option<(i64, i64)> = None;
    let (mut accepted, mut fenced, mut negative) = (0, 0, 0);
    for step in 0..240 {
        let token = match mark {
            None => (uniform(&mut rng, 1, 3), uniform(&mut rng, 1, 3)),
            Some((me, ms)) => match uniform(&mut rng, 1, 6) {
                1 => (me, ms),
                2 => (me, ms + uniform(&mut rng, -2, 2)),
                3 => (me + uniform(&mut rng, -1, 1), ms + uniform(&mut rng, -2, 2)),
                4 => (me + 1, uniform(&mut rng, 0, 2)),
                5 => (me, ms + uniform(&mut rng, 1, 3)),
                _ => (uniform(&mut rng, 1, 6), uniform(&mut rng, 0, 7)),
            },
        };
        let (e, s) = clamp(token);
        let newer = mark.is_none_or(|m| (e, s) > m);
        let want = if newer { Code::Ok } else { FP };
        let result = create(&mut c, &id, tok(&shard, e, s)).await;
        assert_eq!(
            code(&result),
            want,
            "step {step}: token ({e},{s}) against mark {mark:?}: {result:?}"
        );
        if newer {
            mark = Some((e, s));
            accepted += 1;
        } else {
            fenced += 1;
        }
        negative += usize::from(s < 0);
    }
    println!("b1201: {accepted} accepted, {fenced} fenced, {negative} negative sequences");
    assert!(
        accepted > 1 && fenced > 0,
        "degenerate stream: {accepted} accepted, {fenced} fenced"
    );
}

/// One random code point from the B1202 mix.
fn code_point(rng: &mut Xoshiro256PlusPlus) -> char {
    let (lo, hi) = match uniform(rng, 0, 99) {
        0..40 => (0x20, 0x7E),
        40..50 => (0x00, 0x1F),
        50..70 => (0xA0, 0x39F),
        70..90 => (0x4E00, 0x4EFF),
        _ => (0x1F300, 0x1F4FF),
    };
    char::from_u32(u32::try_from(uniform(rng, lo, hi)).unwrap()).expect("valid scalar value")
}

/// A random string of 0–23 code points.
fn random_text(rng: &mut Xoshiro256PlusPlus) -> String {
    (0..uniform(rng, 0, 23)).map(|_| code_point(rng)).collect()
}

/// B1202: 20 random valid-UTF-8 metadata maps (0–11 entries; NUL, C0 controls, Greek,
/// CJK and emoji) round-trip exactly through Configure → Get and List(CONFIGURED), and each
/// Drain clears metadata and cluster.
#[tokio::test]
async fn b1202_random_utf8_metadata_round_trips() {
    let server = core();
    let mut c = server.client().await;
    let mut rng = rng("b1202", 1202);
    let id = walk_to_idle(&server, &mut c).await;
    let prefixes = [
        "bigfleet.lucy.sh/",
        "topology.bigfleet/",
        "x-shard/",
        "节点/",
    ];
    for case in 0..20 {
        let entries = uniform(&mut rng, 0, 11);
        let mut want: HashMap<String, String> = HashMap::new();
        for i in 0..entries {
            let key = format!(
                "{}{}-{i}",
                prefixes[index(&mut rng, prefixes.len())],
                random_text(&mut rng)
            );
            want.insert(key, random_text(&mut rng));
        }
        let cluster = format!("conf-b1202-{case}");
        configure_map(
            &mut c,
            &id,
            &cluster,
            want.clone(),
            b"# conformance\n".to_vec(),
            None,
        )
        .await
        .unwrap_or_else(|e| panic!("case {case}: Configure {want:?} rejected: {e:?}"));
        let got = reach(&mut c, &id, S::Configured, SETTLE).await;
        assert_eq!(
            got.shard_metadata, want,
            "case {case}: Get metadata differs"
        );
        assert_eq!(got.cluster, cluster, "case {case}: Get cluster differs");
        let listed = list(&mut c, &[S::Configured], 0, b"").await.machines;
        let entry = listed
            .iter()
            .find(|m| m.id == id)
            .unwrap_or_else(|| panic!("case {case}: {id} not in List(CONFIGURED)"));
        assert_eq!(
            entry.shard_metadata, want,
            "case {case}: List metadata differs"
        );
        drain(&mut c, &id, 0, None)
            .await
            .unwrap_or_else(|e| panic!("case {case}: Drain rejected: {e:?}"));
        let idle = reach(&mut c, &id, S::Idle, SETTLE).await;
        assert!(
            idle.shard_metadata.is_empty() && idle.cluster.is_empty(),
            "case {case}: binding not cleared: {idle:?}"
        );
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Create,
    Configure,
    Drain,
    Delete,
}

/// B1203: 5 walks of 9 random steps (Create, Configure, Drain, Delete) follow the
/// four-edge model: legal edges succeed and reach their target; at-target calls succeed or
/// are non-fencing rejections and move nothing; every other call is a non-fencing
/// rejection and moves nothing.
#[tokio::test]
async fn b1203_random_lifecycle_follows_four_edge_model() {
    let server = core();
    let mut c = server.client().await;
    let has_delete = probe_delete(&server, &mut c).await;
    assert!(has_delete, "the core profile offers Delete");
    let mut rng = rng("b1203", 1203);
    let window = Duration::from_millis(80);
    let (mut legal_n, mut at_target_n, mut other_n) = (0, 0, 0);
    for walk in 0..5 {
        let id = pick(&server, &mut c).await;
        let mut at = S::Speculative;
        for step in 0..9 {
            let op = [Op::Create, Op::Configure, Op::Drain, Op::Delete][index(&mut rng, 4)];
            let ctx = format!("walk {walk} step {step}: {op:?} on {id} in {at:?}");
            let result = match op {
                Op::Create => create(&mut c, &id, None).await,
                Op::Configure => configure(&mut c, &id, "conf-b1203", &[("k", "v")], None).await,
                Op::Drain => drain(&mut c, &id, 0, None).await,
                Op::Delete => delete(&mut c, &id, None).await,
            };
            if matches!(op, Op::Delete) && !has_delete {
                assert_eq!(code(&result), Code::Unimplemented, "{ctx}: {result:?}");
                continue;
            }
            let legal = match (op, at) {
                (Op::Create, S::Speculative) | (Op::Drain, S::Configured) => Some(S::Idle),
                (Op::Configure, S::Idle) => Some(S::Configured),
                (Op::Delete, S::Idle) => Some(S::Speculative),
                _ => None,
            };
            let at_target = matches!(
                (op, at),
                (Op::Create | Op::Drain, S::Idle)
                    | (Op::Configure, S::Configured)
                    | (Op::Delete, S::Speculative)
            );
            if let Some(target) = legal {
                assert!(
                    result.is_ok(),
                    "{ctx}: a legal edge must succeed: {result:?}"
                );
                reach(&mut c, &id, target, SETTLE).await;
                at = target;
                legal_n += 1;
            } else if at_target {
                assert!(
                    result.is_ok() || non_fencing_rejection(&result),
                    "{ctx}: {result:?}"
                );
                stays_in(&mut c, &id, at, window).await;
                at_target_n += 1;
            } else {
                assert!(
                    non_fencing_rejection(&result),
                    "{ctx}: must be a non-fencing rejection, got {result:?}"
                );
                stays_in(&mut c, &id, at, window).await;
                let now = get(&mut c, &id).await.expect("Get");
                assert_eq!(state(&now), at, "{ctx}: state changed: {now:?}");
                other_n += 1;
            }
        }
    }
    println!(
        "b1203: {legal_n} legal edges, {at_target_n} at-target calls, {other_n} out-of-position calls"
    );
}

/// B1204: with 3 shards interleaved over 4 shared machines for 200 random fenced Creates,
/// each (shard, machine) follows its own running-max oracle (FAILED_PRECONDITION only from
/// fencing), and afterwards a brand-new shard's (1,1) is accepted.
#[tokio::test]
async fn b1204_interleaved_shards_follow_per_pair_oracles() {
    let server = core();
    let mut c = server.client().await;
    let machines = pick_n(&server, &mut c, 4).await;
    let shards: Vec<String> = (0..3).map(|_| unique_shard("b1204")).collect();
    let mut rng = rng("b1204", 1204);
    let mut marks: HashMap<(usize, usize), (i64, i64)> = HashMap::new();
    for step in 0..200 {
        let (si, mi) = (index(&mut rng, 3), index(&mut rng, 4));
        let mark = marks.get(&(si, mi)).copied();
        let token = match mark {
            None => (uniform(&mut rng, 1, 2), uniform(&mut rng, 1, 2)),
            Some((me, ms)) => match uniform(&mut rng, 1, 4) {
                1 => (me, ms),
                2 => (me, ms + uniform(&mut rng, -1, 1)),
                3 => (me + 1, uniform(&mut rng, 0, 1)),
                _ => (me + uniform(&mut rng, -1, 1), ms + uniform(&mut rng, -1, 1)),
            },
        };
        let (e, s) = clamp(token);
        let newer = mark.is_none_or(|m| (e, s) > m);
        let want = if newer { Code::Ok } else { FP };
        let result = create(&mut c, &machines[mi], tok(&shards[si], e, s)).await;
        assert_eq!(
            code(&result),
            want,
            "step {step}: shard {si} machine {mi} token ({e},{s}) against mark {mark:?}: {result:?}"
        );
        if newer {
            marks.insert((si, mi), (e, s));
        }
    }
    let fresh = unique_shard("b1204-new");
    let result = create(&mut c, &machines[0], tok(&fresh, 1, 1)).await;
    assert_eq!(
        code(&result),
        Code::Ok,
        "a brand-new shard's (1,1) must be accepted: {result:?}"
    );
}

/// B1205: malformed or oversized requests get the expected codes and never
/// FAILED_PRECONDITION: empty ids → INVALID_ARGUMENT; unknown ids (also with a fresh fenced
/// token) → NOT_FOUND; negative grace, 400–799 metadata keys, a 64–128 KiB blob and a
/// fenced Create with (1, random int63) → anything but FAILED_PRECONDITION.
#[tokio::test]
async fn b1205_request_shape_code_discipline() {
    let server = core();
    let mut c = server.client().await;
    let has_delete = probe_delete(&server, &mut c).await;
    assert!(has_delete, "the core profile offers Delete");
    let mut rng = rng("b1205", 1205);
    let missing = |got: Code| got == Code::NotFound || (!has_delete && got == Code::Unimplemented);

    for rep in 0..4 {
        let results = [
            ("Create(\"\")", code(&create(&mut c, "", None).await)),
            (
                "Configure(\"\", x)",
                code(&configure(&mut c, "", "x", &[], None).await),
            ),
            ("Drain(\"\", 5)", code(&drain(&mut c, "", 5, None).await)),
            ("Get(\"\")", code(&get(&mut c, "").await)),
        ];
        for (what, got) in results {
            assert_eq!(got, Code::InvalidArgument, "rep {rep}: {what}");
        }
    }

    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let ghost = format!("conformance-ghost-{nanos}-{}", rng.next_u32());
    for rep in 0..4 {
        let results = [
            ("Get", code(&get(&mut c, &ghost).await)),
            ("Create", code(&create(&mut c, &ghost, None).await)),
            (
                "Configure(x)",
                code(&configure(&mut c, &ghost, "x", &[], None).await),
            ),
            ("Drain(1)", code(&drain(&mut c, &ghost, 1, None).await)),
        ];
        for (what, got) in results {
            assert!(
                missing(got),
                "rep {rep}: {what} on ghost {ghost}: expected NOT_FOUND, got {got:?}"
            );
        }
    }
    for rep in 0..4 {
        let shard = unique_shard("b1205-ghost");
        let (e, s) = (int63(&mut rng), int63(&mut rng));
        let got = code(&create(&mut c, &ghost, tok(&shard, e, s)).await);
        assert!(
            missing(got),
            "rep {rep}: fenced ({e},{s}) Create on ghost: expected NOT_FOUND, got {got:?}"
        );
    }

    let configured = walk_to_configured(&server, &mut c, "conf-b1205-neg", &[]).await;
    let grace = -uniform(&mut rng, 1, 1 << 40);
    let result = drain(&mut c, &configured, grace, None).await;
    assert_ne!(code(&result), FP, "Drain with grace {grace}: {result:?}");

    let idle = walk_to_idle(&server, &mut c).await;
    let keys = uniform(&mut rng, 400, 799);
    let bulk: HashMap<String, String> = (0..keys)
        .map(|i| {
            (
                format!("x-bulk/key-{i:05}-{:x}", rng.next_u32()),
                format!("v-{i}"),
            )
        })
        .collect();
    let result = configure_map(
        &mut c,
        &idle,
        "conf-b1205-bigmd",
        bulk,
        b"# conformance\n".to_vec(),
        None,
    )
    .await;
    assert_ne!(code(&result), FP, "Configure with {keys} keys: {result:?}");

    let idle = walk_to_idle(&server, &mut c).await;
    let size = usize::try_from(uniform(&mut rng, 64 * 1024, 128 * 1024)).unwrap();
    let mut blob = vec![0u8; size];
    for chunk in blob.chunks_mut(8) {
        let bytes = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    let result = configure_map(
        &mut c,
        &idle,
        "conf-b1205-bigblob",
        HashMap::new(),
        blob,
        None,
    )
    .await;
    assert_ne!(
        code(&result),
        FP,
        "Configure with a {size}-byte blob: {result:?}"
    );

    let id = pick(&server, &mut c).await;
    let shard = unique_shard("b1205");
    let seq = int63(&mut rng);
    let result = create(&mut c, &id, tok(&shard, 1, seq)).await;
    assert_ne!(
        code(&result),
        FP,
        "fenced Create (1,{seq}) on a fresh shard: {result:?}"
    );
}

crate::harness::backend::on_test_driver!(
    b1201_token_stream_matches_oracle,
    b1202_random_utf8_metadata_round_trips,
    b1203_random_lifecycle_follows_four_edge_model,
    b1204_interleaved_shards_follow_per_pair_oracles,
    b1205_request_shape_code_discipline,
);
