//! docs/conformance.md §3.3 — fencing (B301–B303, B305–B312): the per-(shard, machine) high-water
//! mark, its strict lexicographic order, its place before not-found and idempotency, the
//! all-zero bypass, and a seeded random token stream against a running-max oracle.

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use tonic::Code;

use crate::harness::*;

const FP: Code = Code::FailedPrecondition;

/// The four mutating RPCs, for the generic fenced dispatcher.
#[derive(Clone, Copy, Debug)]
enum Rpc {
    Create,
    Configure,
    Drain,
    Delete,
}

/// The suite's "FencedCall": Create → id + token; Configure → cluster `conf-cluster`, the
/// harness blob, no metadata; Drain → grace 0; Delete → id + token.
async fn fenced(
    c: &mut Client,
    rpc: Rpc,
    id: &str,
    token: Token,
) -> Result<pb::TransitionAck, tonic::Status> {
    match rpc {
        Rpc::Create => create(c, id, token).await,
        Rpc::Configure => configure(c, id, "conf-cluster", &[], token).await,
        Rpc::Drain => drain(c, id, 0, token).await,
        Rpc::Delete => delete(c, id, token).await,
    }
}

/// Asserts a fenced call's code, naming the step on failure.
fn expect(step: &str, result: &Result<pb::TransitionAck, tonic::Status>, want: Code) {
    assert_eq!(
        code(result),
        want,
        "{step}: expected {want:?}, got {result:?}"
    );
}

/// The seed for a random stream: `BIGFLEET_TEST_SEED` if set, else `default`; printed.
fn seed(test: &str, default: u64) -> u64 {
    let seed = std::env::var("BIGFLEET_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    println!("{test}: seed {seed} (override with BIGFLEET_TEST_SEED)");
    seed
}

/// Uniform integer in `lo..=hi`.
fn uniform(rng: &mut Xoshiro256PlusPlus, lo: i64, hi: i64) -> i64 {
    let span = u64::try_from(hi - lo + 1).expect("non-empty range");
    lo + i64::try_from(rng.next_u64() % span).expect("small span")
}

/// B301: the fence runs before the not-found check — a fresh token on an unknown id passes
/// the fence (recording a mark for that unknown id) and then gets NOT_FOUND, while an
/// older token on that same unknown id is FAILED_PRECONDITION on all four mutating RPCs.
#[tokio::test]
async fn b301_fence_runs_before_not_found() {
    let server = core();
    let mut c = server.client().await;
    let shard = unique_shard("b301");
    let ghost = "conformance-b301-ghost-machine";

    expect(
        "Create(ghost, 5,5)",
        &create(&mut c, ghost, tok(&shard, 5, 5)).await,
        Code::NotFound,
    );
    for rpc in [Rpc::Create, Rpc::Configure, Rpc::Drain, Rpc::Delete] {
        let result = fenced(&mut c, rpc, ghost, tok(&shard, 1, 1)).await;
        // The core profile implements Delete: it is fenced like the other three.
        assert_eq!(
            code(&result),
            FP,
            "{rpc:?}(ghost, 1,1) after mark (5,5): expected FAILED_PRECONDITION, got {result:?}"
        );
    }
    expect(
        "Create(ghost, 9,9)",
        &create(&mut c, ghost, tok(&shard, 9, 9)).await,
        Code::NotFound,
    );
}

/// B302: marks are per (shard, machine): different shards on different machines never
/// interfere, and within one shard each machine keeps its own mark (a lower token on mB is
/// accepted although mA's mark in the same shard is higher).
#[tokio::test]
async fn b302_marks_are_per_shard_and_machine() {
    let server = core();
    let mut c = server.client().await;
    let m = pick_n(&server, &mut c, 3).await;
    b302_procedure(&mut c, [&m[0], &m[1], &m[2]]).await;
}

/// B302 exactly as BigFleet's certification runner drives it: each of mA, mB and mC is the
/// first machine of its own `List(SPECULATIVE, max_results=1)`, three calls in a row with
/// nothing in between and no de-duplication. This only passes when consecutive capped
/// Lists spread their picks.
#[tokio::test]
async fn b302_with_the_upstream_harness_picks() {
    let server = core();
    let mut c = server.client().await;
    let mut picks = Vec::new();
    for _ in 0..3 {
        picks.push(capped_pick(&mut c).await);
    }
    println!("three back-to-back List(SPECULATIVE, max_results=1) picks: {picks:?}");
    b302_procedure(&mut c, [&picks[0], &picks[1], &picks[2]]).await;
}

/// The B302 procedure on three machines, which must be distinct.
async fn b302_procedure(c: &mut Client, [ma, mb, mc]: [&String; 3]) {
    assert!(
        ma != mb && mb != mc && ma != mc,
        "picks must be distinct: {ma} {mb} {mc}"
    );
    let [a, b, cc, d] = ["b302a", "b302b", "b302c", "b302d"].map(unique_shard);

    // Cross-shard.
    expect("A mA (9,9)", &create(c, ma, tok(&a, 9, 9)).await, Code::Ok);
    expect("B mB (7,3)", &create(c, mb, tok(&b, 7, 3)).await, Code::Ok);
    expect("C mC (1,1)", &create(c, mc, tok(&cc, 1, 1)).await, Code::Ok);
    expect("A mA (1,1)", &create(c, ma, tok(&a, 1, 1)).await, FP);
    expect("B mB (7,3) again", &create(c, mb, tok(&b, 7, 3)).await, FP);
    expect("C mC (1,1) again", &create(c, mc, tok(&cc, 1, 1)).await, FP);
    expect("B mB (7,4)", &create(c, mb, tok(&b, 7, 4)).await, Code::Ok);

    // Cross-machine within shard D.
    expect(
        "D mA (5,30)",
        &create(c, ma, tok(&d, 5, 30)).await,
        Code::Ok,
    );
    expect("D mB (5,7)", &create(c, mb, tok(&d, 5, 7)).await, Code::Ok);
    expect("D mB (5,7) again", &create(c, mb, tok(&d, 5, 7)).await, FP);
    expect(
        "D mA (5,30) again",
        &create(c, ma, tok(&d, 5, 30)).await,
        FP,
    );
    expect("D mB (4,999)", &create(c, mb, tok(&d, 4, 999)).await, FP);
}

/// B303: on one (shard, machine), a token is accepted only when strictly greater than the
/// mark in (epoch, sequence) lexicographic order — the 16-row table after (2,5).
#[tokio::test]
async fn b303_strict_lexicographic_order() {
    let server = core();
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let shard = unique_shard("b303");
    expect(
        "first (2,5)",
        &create(&mut c, &id, tok(&shard, 2, 5)).await,
        Code::Ok,
    );
    let table: [(i64, i64, Code); 16] = [
        (2, 5, FP),
        (2, 4, FP),
        (1, 9, FP),
        (1, 99_999, FP),
        (2, 6, Code::Ok),
        (2, 6, FP),
        (2, 5, FP),
        (3, 0, Code::Ok),
        (3, 0, FP),
        (2, 999_999, FP),
        (3, 1, Code::Ok),
        (4, 0, Code::Ok),
        (4, 0, FP),
        (10, 7, Code::Ok),
        (10, 7, FP),
        (9, 999, FP),
    ];
    for (row, (epoch, seq, want)) in table.into_iter().enumerate() {
        let result = create(&mut c, &id, tok(&shard, epoch, seq)).await;
        expect(&format!("row {} ({epoch},{seq})", row + 1), &result, want);
    }
}

/// B305: fenced-out calls never block reads and change nothing: after four stale Creates,
/// Get and List (unfiltered and filtered to the resting state) still answer and the
/// machine is still at rest in the same state.
#[tokio::test]
async fn b305_reads_unaffected_and_fenced_calls_change_nothing() {
    let server = core();
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let shard = unique_shard("b305");
    expect(
        "Create (7,7)",
        &create(&mut c, &id, tok(&shard, 7, 7)).await,
        Code::Ok,
    );
    let resting = state(&reach(&mut c, &id, S::Idle, SETTLE).await);
    for i in 1..=4 {
        expect(
            &format!("Create (1,{i})"),
            &create(&mut c, &id, tok(&shard, 1, i)).await,
            FP,
        );
        let got = get(&mut c, &id).await.expect("Get works while fenced out");
        assert_eq!(
            state(&got),
            resting,
            "a fenced-out Create moved {id}: {got:?}"
        );
        assert!(
            !list_all(&mut c).await.machines.is_empty(),
            "unfiltered List empty"
        );
        let filtered = list(&mut c, &[resting], 0, b"").await.machines;
        assert!(!filtered.is_empty(), "List({resting:?}) empty");
        assert!(
            filtered.iter().any(|m| m.id == id),
            "List({resting:?}) lacks {id}"
        );
    }
    let last = get(&mut c, &id).await.expect("Get");
    assert_eq!(state(&last), resting, "{id} changed state: {last:?}");
}

/// B306: the fence runs before the idempotency short-circuit on Configure: a stale replay
/// of an accepted Configure is FAILED_PRECONDITION (not the cached op id), while a newer
/// replay returns the original op id and leaves the machine CONFIGURED.
#[tokio::test]
async fn b306_fence_before_idempotency_on_configure() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_idle(&server, &mut c).await;
    let shard = unique_shard("b306");
    let send = |c: &mut Client, e: i64, s: i64| {
        let mut c = c.clone();
        let (id, shard) = (id.clone(), shard.clone());
        async move {
            configure_map(
                &mut c,
                &id,
                "b306",
                md(&[("k", "v")]),
                b"# conf\n".to_vec(),
                tok(&shard, e, s),
            )
            .await
        }
    };
    let first = send(&mut c, 5, 5).await.expect("Configure (5,5) accepted");
    let op1 = first.operation_id;
    assert!(!op1.is_empty(), "empty operation_id");
    reach(&mut c, &id, S::Configured, SETTLE).await;
    expect("Configure (1,1)", &send(&mut c, 1, 1).await, FP);
    let again = send(&mut c, 5, 6).await.expect("Configure (5,6) accepted");
    assert_eq!(
        again.operation_id, op1,
        "the newer replay must return the original op id"
    );
    let now = get(&mut c, &id).await.expect("Get");
    assert_eq!(state(&now), S::Configured, "{now:?}");
}

/// B307: the fence runs before the idempotency short-circuit on Drain: a stale replay of an
/// accepted Drain is FAILED_PRECONDITION, a newer replay returns the original op id and the
/// machine stays IDLE.
#[tokio::test]
async fn b307_fence_before_idempotency_on_drain() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_configured(&server, &mut c, "b307", &[("k", "v")]).await;
    let shard = unique_shard("b307");
    let first = drain(&mut c, &id, 0, tok(&shard, 5, 5))
        .await
        .expect("Drain (5,5) accepted");
    let op1 = first.operation_id;
    assert!(!op1.is_empty(), "empty operation_id");
    reach(&mut c, &id, S::Idle, SETTLE).await;
    expect(
        "Drain (1,1)",
        &drain(&mut c, &id, 0, tok(&shard, 1, 1)).await,
        FP,
    );
    let again = drain(&mut c, &id, 0, tok(&shard, 5, 6))
        .await
        .expect("Drain (5,6) accepted");
    assert_eq!(
        again.operation_id, op1,
        "the newer replay must return the original op id"
    );
    let now = get(&mut c, &id).await.expect("Get");
    assert_eq!(state(&now), S::Idle, "{now:?}");
}

/// B308: the all-zero token (shard "", 0, 0) bypasses fencing: it is accepted, accepted
/// again on replay (no mark recorded), and accepted on a second machine.
#[tokio::test]
async fn b308_all_zero_token_bypasses_fencing() {
    let server = core();
    let mut c = server.client().await;
    let zero: Token = Some((String::new(), 0, 0));
    let id = pick(&server, &mut c).await;
    expect(
        "zero Create",
        &create(&mut c, &id, zero.clone()).await,
        Code::Ok,
    );
    reach(&mut c, &id, S::Idle, SETTLE).await;
    expect(
        "zero Create replay",
        &create(&mut c, &id, zero.clone()).await,
        Code::Ok,
    );
    let now = get(&mut c, &id).await.expect("Get");
    assert_eq!(state(&now), S::Idle, "{now:?}");
    let second = pick(&server, &mut c).await;
    expect(
        "zero Create on a second machine",
        &create(&mut c, &second, zero).await,
        Code::Ok,
    );
    reach(&mut c, &second, S::Idle, SETTLE).await;
}

/// B309: a session whose sequence advances on every call is accepted on Create, Configure
/// and Drain through two full Configure/Drain cycles, and its stale first token is then
/// refused.
#[tokio::test]
async fn b309_advancing_session_accepted_on_every_rpc() {
    let server = core();
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let shard = unique_shard("b309");
    let mut seq = 0;
    let mut next = || {
        seq += 1;
        tok(&shard, 1, seq)
    };
    expect(
        "Create (1,1)",
        &fenced(&mut c, Rpc::Create, &id, next()).await,
        Code::Ok,
    );
    reach(&mut c, &id, S::Idle, SETTLE).await;
    for round in 1..=2 {
        expect(
            &format!("round {round} Configure"),
            &fenced(&mut c, Rpc::Configure, &id, next()).await,
            Code::Ok,
        );
        reach(&mut c, &id, S::Configured, SETTLE).await;
        expect(
            &format!("round {round} Drain"),
            &fenced(&mut c, Rpc::Drain, &id, next()).await,
            Code::Ok,
        );
        reach(&mut c, &id, S::Idle, SETTLE).await;
    }
    assert_eq!(seq, 5, "the session used (1,1)..(1,5)");
    expect(
        "stale Configure (1,1)",
        &fenced(&mut c, Rpc::Configure, &id, tok(&shard, 1, 1)).await,
        FP,
    );
}

/// B310: after an epoch bump, tokens from the old epoch are refused (even ones equal to a
/// used sequence) and the new epoch with sequence 1 is accepted; Delete takes part in the
/// fenced session.
#[tokio::test]
async fn b310_new_epoch_refuses_old_tokens() {
    let server = core();
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let shard = unique_shard("b310");
    expect(
        "Create (1,1)",
        &create(&mut c, &id, tok(&shard, 1, 1)).await,
        Code::Ok,
    );
    reach(&mut c, &id, S::Idle, SETTLE).await;
    expect(
        "Delete (1,2)",
        &delete(&mut c, &id, tok(&shard, 1, 2)).await,
        Code::Ok,
    );
    reach(&mut c, &id, S::Speculative, SETTLE).await;
    expect(
        "Create (1,3)",
        &create(&mut c, &id, tok(&shard, 1, 3)).await,
        Code::Ok,
    );
    reach(&mut c, &id, S::Idle, SETTLE).await;
    expect(
        "Configure (1,1)",
        &fenced(&mut c, Rpc::Configure, &id, tok(&shard, 1, 1)).await,
        FP,
    );
    expect(
        "Configure (1,3)",
        &fenced(&mut c, Rpc::Configure, &id, tok(&shard, 1, 3)).await,
        FP,
    );
    expect(
        "Configure (2,1)",
        &fenced(&mut c, Rpc::Configure, &id, tok(&shard, 2, 1)).await,
        Code::Ok,
    );
    reach(&mut c, &id, S::Configured, SETTLE).await;
}

/// B311: a token that passes the fence advances the mark even when the operation is then
/// rejected as out of position (Drain on SPECULATIVE): (5,4) is then stale, (5,6) is not.
#[tokio::test]
async fn b311_passing_token_advances_mark_even_when_rejected() {
    let server = core();
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let shard = unique_shard("b311");
    let out_of_position = drain(&mut c, &id, 0, tok(&shard, 5, 5)).await;
    assert!(
        out_of_position.is_err() && code(&out_of_position) != FP,
        "Drain (5,5) on SPECULATIVE must be a non-fencing rejection, got {out_of_position:?}"
    );
    expect(
        "Create (5,4)",
        &create(&mut c, &id, tok(&shard, 5, 4)).await,
        FP,
    );
    expect(
        "Create (5,6)",
        &create(&mut c, &id, tok(&shard, 5, 6)).await,
        Code::Ok,
    );
    // The accepted Create actually moves the machine.
    reach(&mut c, &id, S::Idle, SETTLE).await;
}

/// B312: for a seeded random token stream (non-negative, 200 steps) on one (shard,
/// machine), every Create is accepted exactly when its token is strictly greater than the
/// running maximum, and otherwise FAILED_PRECONDITION.
#[tokio::test]
async fn b312_random_token_stream_matches_running_max() {
    let server = core();
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let shard = unique_shard("b312");
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed("b312", 312));
    let mut mark: Option<(i64, i64)> = None;
    let mut mismatches = Vec::new();
    let mut accepted = 0;
    for step in 0..200 {
        let (e, s) = match mark {
            None => (uniform(&mut rng, 0, 2), uniform(&mut rng, 0, 2)),
            Some((me, ms)) => (
                (me + uniform(&mut rng, -1, 2)).max(0),
                (ms + uniform(&mut rng, -3, 4)).max(0),
            ),
        };
        let newer = mark.is_none_or(|m| (e, s) > m);
        let want = if newer { Code::Ok } else { FP };
        let result = create(&mut c, &id, tok(&shard, e, s)).await;
        let got = code(&result);
        if got != want {
            mismatches.push(format!(
                "step {step}: token ({e},{s}) mark {mark:?}: want {want:?}, got {result:?}"
            ));
        }
        if newer {
            mark = Some((e, s));
            accepted += 1;
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} mismatches:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    assert!(accepted >= 1, "no token was ever accepted");
}

crate::harness::backend::on_test_driver!(
    b301_fence_runs_before_not_found,
    b302_marks_are_per_shard_and_machine,
    b302_with_the_upstream_harness_picks,
    b303_strict_lexicographic_order,
    b305_reads_unaffected_and_fenced_calls_change_nothing,
    b306_fence_before_idempotency_on_configure,
    b307_fence_before_idempotency_on_drain,
    b308_all_zero_token_bypasses_fencing,
    b309_advancing_session_accepted_on_every_rpc,
    b310_new_epoch_refuses_old_tokens,
    b311_passing_token_advances_mark_even_when_rejected,
    b312_random_token_stream_matches_running_max,
);

crate::harness::backend::on_real_libvirtd!(
    b302_with_the_upstream_harness_picks,
    b305_reads_unaffected_and_fenced_calls_change_nothing,
    b306_fence_before_idempotency_on_configure,
    b307_fence_before_idempotency_on_drain,
    b311_passing_token_advances_mark_even_when_rejected,
);
