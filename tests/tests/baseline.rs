//! The upstream baseline (`intUnderflow/bigfleet`, `test/conformance/`, docs/conformance.md §2):
//! the 16 `conformance_test.go`, 6 `fencing_test.go` and 3 `metadata_test.go` functions,
//! one test each, named after the upstream function.
//!
//! Each test runs under the upstream per-test context (5, 10, 30 or 60 s) and waits with the
//! upstream `mustReachState` (Get every 100 ms; a Get error fails at once). Upstream skips
//! when the pool is empty; every launch here seeds 64 Speculative slots, so an empty pool
//! fails instead. Where upstream accepts either outcome, the core profile (which implements
//! Delete and revisions) must take the success path; the bare-metal profile re-runs
//! FullLifecycle and DeleteUnknownMachine and must answer UNIMPLEMENTED for Delete.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use tonic::Code;

use crate::harness::*;

const FIVE: Duration = Duration::from_secs(5);
const TEN: Duration = Duration::from_secs(10);
const THIRTY: Duration = Duration::from_secs(30);
/// The blob upstream's lifecycle walks send.
const BLOB: &[u8] = b"# conformance bootstrap\n";

/// Runs `body` under the upstream per-test context of `secs` seconds.
async fn within(secs: u64, body: impl Future<Output = ()>) {
    let expired = tokio::time::timeout(Duration::from_secs(secs), body)
        .await
        .is_err();
    assert!(!expired, "the upstream {secs}s test context expired");
}

/// Upstream `pickSpeculative`: List SPECULATIVE with `max_results = n`.
async fn pick_upstream(c: &mut Client, n: usize) -> Vec<String> {
    let max = i32::try_from(n).unwrap();
    let ids: Vec<String> = list(c, &[S::Speculative], max, b"")
        .await
        .machines
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert!(
        ids.len() >= n,
        "the seeded pool must offer {n} Speculative machines: {ids:?}"
    );
    ids
}

/// Upstream `mustReachState`: Get every 100 ms; any Get error fails immediately.
async fn must_reach(c: &mut Client, id: &str, want: S, timeout: Duration) -> pb::Machine {
    let start = Instant::now();
    loop {
        let m = get(c, id)
            .await
            .unwrap_or_else(|e| panic!("Get({id}) waiting for {want:?}: {e}"));
        if state(&m) == want {
            return m;
        }
        if start.elapsed() > timeout {
            let last = get(c, id).await;
            panic!("{id} did not reach {want:?} within {timeout:?}; final Get {last:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Pick, Create, reach IDLE (10 s).
async fn walk_idle(c: &mut Client) -> String {
    let id = pick_upstream(c, 1).await.remove(0);
    create(c, &id, None).await.expect("Create must succeed");
    must_reach(c, &id, S::Idle, TEN).await;
    id
}

/// Walk to IDLE, Configure(cluster, metadata, blob), reach CONFIGURED (10 s).
async fn walk_configured(
    c: &mut Client,
    cluster: &str,
    metadata: HashMap<String, String>,
    blob: &[u8],
) -> String {
    let id = walk_idle(c).await;
    configure_map(c, &id, cluster, metadata, blob.to_vec(), None)
        .await
        .expect("Configure must succeed");
    must_reach(c, &id, S::Configured, TEN).await;
    id
}

/// FullLifecycle up to (not including) the Delete; returns the Idle machine.
async fn lifecycle_until_delete(c: &mut Client) -> String {
    let id = pick_upstream(c, 1).await.remove(0);
    let ack = create(c, &id, None).await.expect("Create must succeed");
    assert!(
        !ack.operation_id.is_empty(),
        "Create ack without operation_id"
    );
    must_reach(c, &id, S::Idle, TEN).await;
    let ack = configure_map(
        c,
        &id,
        "conformance-cluster",
        HashMap::new(),
        BLOB.to_vec(),
        None,
    )
    .await
    .expect("Configure must succeed");
    assert!(
        !ack.operation_id.is_empty(),
        "Configure ack without operation_id"
    );
    must_reach(c, &id, S::Configured, TEN).await;
    drain(c, &id, 5, None).await.expect("Drain must succeed");
    must_reach(c, &id, S::Idle, THIRTY).await;
    id
}

/// TestConformance_FullLifecycle (core): Create → IDLE, Configure → CONFIGURED, Drain(5) →
/// IDLE, and, Delete being implemented, Delete succeeds and the slot is SPECULATIVE again.
#[tokio::test]
async fn upstream_full_lifecycle() {
    let server = core();
    within(30, async {
        let mut c = server.client().await;
        let id = lifecycle_until_delete(&mut c).await;
        delete(&mut c, &id, None)
            .await
            .expect("core implements Delete: it must succeed");
        must_reach(&mut c, &id, S::Speculative, TEN).await;
    })
    .await;
}

/// TestConformance_FullLifecycle (bare-metal): the same walk, and Delete answers
/// UNIMPLEMENTED (the upstream early-pass branch) leaving the machine IDLE.
#[tokio::test]
async fn upstream_full_lifecycle_bare_metal() {
    let server = bare_metal();
    within(30, async {
        let mut c = server.client().await;
        let id = lifecycle_until_delete(&mut c).await;
        let result = delete(&mut c, &id, None).await;
        assert_eq!(
            code(&result),
            Code::Unimplemented,
            "bare-metal Delete: {result:?}"
        );
        must_reach(&mut c, &id, S::Idle, TEN).await;
    })
    .await;
}

/// TestConformance_CreateIdempotent: two back-to-back Creates both succeed with one id.
#[tokio::test]
async fn upstream_create_idempotent() {
    let server = core();
    within(30, async {
        let mut c = server.client().await;
        let id = pick_upstream(&mut c, 1).await.remove(0);
        let first = create(&mut c, &id, None).await.expect("first Create");
        let second = create(&mut c, &id, None).await.expect("second Create");
        assert_eq!(first.operation_id, second.operation_id);
    })
    .await;
}

/// TestConformance_ConfigureIdempotent: after IDLE, two identical back-to-back Configures
/// both succeed with one operation id.
#[tokio::test]
async fn upstream_configure_idempotent() {
    let server = core();
    within(30, async {
        let mut c = server.client().await;
        let id = walk_idle(&mut c).await;
        let blob = b"# conformance idempotency\n".to_vec();
        let first = configure_map(
            &mut c,
            &id,
            "conformance-idem",
            HashMap::new(),
            blob.clone(),
            None,
        )
        .await
        .expect("first Configure");
        let second = configure_map(&mut c, &id, "conformance-idem", HashMap::new(), blob, None)
            .await
            .expect("second Configure");
        assert_eq!(first.operation_id, second.operation_id);
    })
    .await;
}

/// TestConformance_DrainIdempotent: from CONFIGURED, two identical Drains (grace 30) both
/// succeed with one operation id.
#[tokio::test]
async fn upstream_drain_idempotent() {
    let server = core();
    within(30, async {
        let mut c = server.client().await;
        let id = walk_configured(&mut c, "conformance-idem-drain", HashMap::new(), BLOB).await;
        let first = drain(&mut c, &id, 30, None).await.expect("first Drain");
        let second = drain(&mut c, &id, 30, None).await.expect("second Drain");
        assert_eq!(first.operation_id, second.operation_id);
    })
    .await;
}

/// TestConformance_DeleteIdempotent (core: no skip): from IDLE, Delete succeeds and an
/// identical second Delete succeeds with the same operation id.
#[tokio::test]
async fn upstream_delete_idempotent() {
    let server = core();
    within(30, async {
        let mut c = server.client().await;
        let id = walk_idle(&mut c).await;
        let first = delete(&mut c, &id, None)
            .await
            .expect("core implements Delete");
        let second = delete(&mut c, &id, None).await.expect("second Delete");
        assert_eq!(first.operation_id, second.operation_id);
    })
    .await;
}

/// TestConformance_GetUnknownMachine: Get of an unknown id is NOT_FOUND.
#[tokio::test]
async fn upstream_get_unknown_machine() {
    let server = core();
    within(5, async {
        let mut c = server.client().await;
        let result = get(&mut c, "definitely-not-a-real-machine-id").await;
        assert_eq!(code(&result), Code::NotFound, "{result:?}");
    })
    .await;
}

/// TestConformance_DeleteUnknownMachine (core): Delete("nonexistent") is NOT_FOUND.
#[tokio::test]
async fn upstream_delete_unknown_machine() {
    let server = core();
    within(5, async {
        let mut c = server.client().await;
        let result = delete(&mut c, "nonexistent", None).await;
        assert_eq!(code(&result), Code::NotFound, "{result:?}");
    })
    .await;
}

/// TestConformance_DeleteUnknownMachine (bare-metal): Delete("nonexistent") is
/// UNIMPLEMENTED, the capability check coming before the lookup.
#[tokio::test]
async fn upstream_delete_unknown_machine_bare_metal() {
    let server = bare_metal();
    within(5, async {
        let mut c = server.client().await;
        let result = delete(&mut c, "nonexistent", None).await;
        assert_eq!(code(&result), Code::Unimplemented, "{result:?}");
    })
    .await;
}

/// A pool with one IDLE and one CONFIGURED machine besides the Speculative rest, as the
/// shared upstream provider would have; returns (idle, configured).
async fn mixed_pool(c: &mut Client) -> (String, String) {
    let idle = walk_idle(c).await;
    let configured = walk_configured(c, "conformance-cluster", HashMap::new(), BLOB).await;
    (idle, configured)
}

/// TestConformance_ListFiltersByState: List states=[IDLE] returns only IDLE machines (the
/// pool is prepared with IDLE and CONFIGURED machines, so the filter has work to do).
#[tokio::test]
async fn upstream_list_filters_by_state() {
    let server = core();
    let mut c = server.client().await;
    let (idle, _) = mixed_pool(&mut c).await;
    within(5, async {
        let listed = list(&mut c, &[S::Idle], 0, b"").await.machines;
        for m in &listed {
            assert_eq!(state(m), S::Idle, "List([IDLE]) returned {m:?}");
        }
        assert!(
            listed.iter().any(|m| m.id == idle),
            "the IDLE machine {idle} is missing"
        );
    })
    .await;
}

/// TestConformance_ListMaxResults: List max_results=1 returns at most one machine.
#[tokio::test]
async fn upstream_list_max_results() {
    let server = core();
    within(5, async {
        let mut c = server.client().await;
        let listed = list(&mut c, &[], 1, b"").await.machines;
        assert!(
            listed.len() <= 1,
            "max_results=1 returned {} machines",
            listed.len()
        );
    })
    .await;
}

/// TestConformance_LabelShape: every listed machine has an instance_type and a specified
/// state.
#[tokio::test]
async fn upstream_label_shape() {
    let server = core();
    let mut c = server.client().await;
    mixed_pool(&mut c).await;
    within(5, async {
        let all = list_all(&mut c).await.machines;
        assert!(!all.is_empty(), "the seeded provider lists no machines");
        for m in &all {
            assert!(!m.instance_type.is_empty(), "empty instance_type: {m:?}");
            assert_ne!(state(m), S::Unspecified, "unspecified state: {m:?}");
        }
    })
    .await;
}

/// TestConformance_CostFieldBounds: price_per_hour is a number ≥ 0 and
/// interruption_probability a number in [0, 1], for every listed machine.
#[tokio::test]
async fn upstream_cost_field_bounds() {
    let server = core();
    let mut c = server.client().await;
    mixed_pool(&mut c).await;
    within(5, async {
        let all = list_all(&mut c).await.machines;
        assert!(!all.is_empty(), "the seeded provider lists no machines");
        for m in &all {
            let (price, p) = (m.price_per_hour, m.interruption_probability);
            assert!(
                !price.is_nan() && price >= 0.0,
                "price_per_hour {price}: {}",
                m.id
            );
            assert!(
                !p.is_nan() && (0.0..=1.0).contains(&p),
                "interruption {p}: {}",
                m.id
            );
        }
    })
    .await;
}

/// TestConformance_ListRevisionAdvances: the List revision before and after a Create that
/// reached IDLE differ (this provider implements revisions, so r0 must be non-empty).
#[tokio::test]
async fn upstream_list_revision_advances() {
    let server = core();
    within(30, async {
        let mut c = server.client().await;
        let id = pick_upstream(&mut c, 1).await.remove(0);
        let r0 = list_all(&mut c).await.revision;
        create(&mut c, &id, None).await.expect("Create");
        must_reach(&mut c, &id, S::Idle, FIVE).await;
        let r1 = list_all(&mut c).await.revision;
        assert!(
            !r0.is_empty(),
            "this provider implements revisions: r0 must be non-empty"
        );
        assert_ne!(r0, r1, "the revision did not advance across Create");
    })
    .await;
}

/// TestConformance_DrainOnSpeculative: Drain(5) on a SPECULATIVE machine fails, and not
/// with FAILED_PRECONDITION.
#[tokio::test]
async fn upstream_drain_on_speculative() {
    let server = core();
    within(5, async {
        let mut c = server.client().await;
        let id = pick_upstream(&mut c, 1).await.remove(0);
        let result = drain(&mut c, &id, 5, None).await;
        let got = code(&result);
        assert!(
            got != Code::Ok && got != Code::FailedPrecondition,
            "{result:?}"
        );
    })
    .await;
}

/// TestConformance_TransitionalStateObservability: after Create, 5 ms Gets for up to 1 s
/// (no Get error allowed) see SPECULATIVE, CREATING or IDLE, and IDLE arrives within 10 s.
#[tokio::test]
async fn upstream_transitional_state_observability() {
    let server = core();
    within(10, async {
        let mut c = server.client().await;
        let id = pick_upstream(&mut c, 1).await.remove(0);
        create(&mut c, &id, None).await.expect("Create");
        let start = Instant::now();
        let mut seen = Vec::new();
        while start.elapsed() < Duration::from_secs(1) {
            let m = get(&mut c, &id)
                .await
                .unwrap_or_else(|e| panic!("Get failed: {e}"));
            seen.push(state(&m));
            if state(&m) == S::Idle {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        must_reach(&mut c, &id, S::Idle, TEN).await;
        let expected = [S::Speculative, S::Creating, S::Idle];
        assert!(
            seen.iter().any(|s| expected.contains(s)),
            "states seen: {seen:?}"
        );
    })
    .await;
}

/// TestConformance_DrainGraceTimeout: Drain(0) on CONFIGURED is acknowledged; within 10 s
/// the machine reaches IDLE (or FAILED with a last_error) and never shows CONFIGURED again.
#[tokio::test]
async fn upstream_drain_grace_timeout() {
    let server = core();
    within(30, async {
        let mut c = server.client().await;
        let id = walk_configured(&mut c, "conformance-grace", HashMap::new(), BLOB).await;
        drain(&mut c, &id, 0, None)
            .await
            .expect("Drain(0) must be acknowledged");
        let start = Instant::now();
        loop {
            let m = get(&mut c, &id).await.expect("Get");
            match state(&m) {
                S::Idle => break,
                S::Failed => {
                    assert!(!m.last_error.is_empty(), "FAILED without last_error: {m:?}");
                    break;
                }
                S::Configured => panic!("silent revert to CONFIGURED after the Drain ack: {m:?}"),
                _ => {}
            }
            assert!(start.elapsed() < TEN, "stuck after Drain(0): {m:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// TestConformance_DeleteOnConfigured (core): Delete on CONFIGURED fails, not with
/// UNIMPLEMENTED (Delete exists) nor FAILED_PRECONDITION, and the machine stays CONFIGURED.
#[tokio::test]
async fn upstream_delete_on_configured() {
    let server = core();
    within(30, async {
        let mut c = server.client().await;
        let cluster = "conformance-delete-configured";
        let id = walk_configured(&mut c, cluster, HashMap::new(), BLOB).await;
        let result = delete(&mut c, &id, None).await;
        let got = code(&result);
        assert_ne!(got, Code::Ok, "Delete on CONFIGURED must fail");
        assert_ne!(got, Code::Unimplemented, "core implements Delete");
        assert_ne!(got, Code::FailedPrecondition, "{result:?}");
        let m = get(&mut c, &id).await.expect("Get");
        assert_eq!(state(&m), S::Configured, "partial transition: {m:?}");
    })
    .await;
}

// ---- fencing_test.go ---------------------------------------------------------------------

/// Upstream shard ids: `conformance-fence-<prefix>-<unix-nanos>`.
fn fence_shard(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("conformance-fence-{prefix}-{nanos}")
}

/// A fenced Create probe; returns its code.
async fn probe(c: &mut Client, id: &str, shard: &str, epoch: i64, seq: i64) -> Code {
    code(&create(c, id, tok(shard, epoch, seq)).await)
}

/// Runs a fencing test: one machine, one fresh shard, `steps` of (epoch, seq, expected).
async fn fence_steps(prefix: &str, steps: &[(i64, i64, Code)]) {
    let server = core();
    within(30, async {
        let mut c = server.client().await;
        let id = pick_upstream(&mut c, 1).await.remove(0);
        let shard = fence_shard(prefix);
        for &(epoch, seq, want) in steps {
            let got = probe(&mut c, &id, &shard, epoch, seq).await;
            assert_eq!(got, want, "Create with ({epoch},{seq}) on {id}");
        }
    })
    .await;
}

/// TestConformance_FencingUnknownShardAccepted: first contact (1,1) is accepted; its
/// replay is FAILED_PRECONDITION.
#[tokio::test]
async fn upstream_fencing_unknown_shard_accepted() {
    fence_steps(
        "unknown",
        &[(1, 1, Code::Ok), (1, 1, Code::FailedPrecondition)],
    )
    .await;
}

/// TestConformance_FencingStaleEpochRejected: after (2,1), (1,99) is FAILED_PRECONDITION.
#[tokio::test]
async fn upstream_fencing_stale_epoch_rejected() {
    fence_steps(
        "epoch",
        &[(2, 1, Code::Ok), (1, 99, Code::FailedPrecondition)],
    )
    .await;
}

/// TestConformance_FencingStaleSequenceRejected: after (1,5), both (1,5) and (1,4) are
/// FAILED_PRECONDITION.
#[tokio::test]
async fn upstream_fencing_stale_sequence_rejected() {
    let fp = Code::FailedPrecondition;
    fence_steps("seq", &[(1, 5, Code::Ok), (1, 5, fp), (1, 4, fp)]).await;
}

/// TestConformance_FencingPerMachineIsolation: marks are per (shard, machine): B accepts a
/// lower sequence than A's; then replays on both and a lower epoch on B are rejected.
#[tokio::test]
async fn upstream_fencing_per_machine_isolation() {
    let server = core();
    within(30, async {
        let mut c = server.client().await;
        let ids = pick_upstream(&mut c, 2).await;
        let (a, b) = (&ids[0], &ids[1]);
        assert_ne!(a, b, "List(max 2) returned one machine twice");
        let shard = fence_shard("isolation");
        let fp = Code::FailedPrecondition;
        assert_eq!(probe(&mut c, a, &shard, 1, 30).await, Code::Ok, "A (1,30)");
        assert_eq!(probe(&mut c, b, &shard, 1, 7).await, Code::Ok, "B (1,7)");
        assert_eq!(probe(&mut c, b, &shard, 1, 7).await, fp, "B (1,7) replay");
        assert_eq!(probe(&mut c, a, &shard, 1, 30).await, fp, "A (1,30) replay");
        assert_eq!(probe(&mut c, b, &shard, 0, 999).await, fp, "B (0,999)");
    })
    .await;
}

/// TestConformance_FencingNewEpochResetsSequence: after (1,1000), (2,1) is accepted.
#[tokio::test]
async fn upstream_fencing_new_epoch_resets_sequence() {
    fence_steps("newepoch", &[(1, 1000, Code::Ok), (2, 1, Code::Ok)]).await;
}

/// TestConformance_FencingReadsUnaffected: after (9,9) and a rejected (1,1), Get on the
/// machine and an unfiltered List still succeed.
#[tokio::test]
async fn upstream_fencing_reads_unaffected() {
    let server = core();
    within(30, async {
        let mut c = server.client().await;
        let id = pick_upstream(&mut c, 1).await.remove(0);
        let shard = fence_shard("reads");
        assert_eq!(probe(&mut c, &id, &shard, 9, 9).await, Code::Ok, "(9,9)");
        assert_eq!(
            probe(&mut c, &id, &shard, 1, 1).await,
            Code::FailedPrecondition,
            "(1,1)"
        );
        get(&mut c, &id).await.expect("Get is never fenced");
        let all = c.list(pb::ListFilter::default()).await;
        assert!(all.is_ok(), "List is never fenced: {all:?}");
    })
    .await;
}

// ---- metadata_test.go --------------------------------------------------------------------

/// The metadata walk: Create → IDLE, Configure(cluster, metadata, metadata blob) →
/// CONFIGURED, 10 s each.
async fn metadata_walk(c: &mut Client, cluster: &str, metadata: &[(&str, &str)]) -> String {
    walk_configured(c, cluster, md(metadata), b"# conformance metadata\n").await
}

/// TestConformance_MetadataEchoedOnGetAndList: cluster and the exact metadata map (NUL byte
/// included) are echoed on Get and on List([CONFIGURED]).
#[tokio::test]
async fn upstream_metadata_echoed_on_get_and_list() {
    let server = core();
    within(30, async {
        let mut c = server.client().await;
        let pairs = [
            ("bigfleet.lucy.sh/assigned-priority", "900000"),
            (
                "bigfleet.lucy.sh/assigned-group",
                "topology.bigfleet/rack\0gang-7",
            ),
            ("x-conformance/opaque", "echo-me"),
        ];
        let id = metadata_walk(&mut c, "conformance-md", &pairs).await;
        let m = get(&mut c, &id).await.expect("Get");
        assert_eq!(m.cluster, "conformance-md");
        assert_eq!(m.shard_metadata, md(&pairs));
        let listed = list(&mut c, &[S::Configured], 0, b"").await.machines;
        let entry = listed
            .iter()
            .find(|m| m.id == id)
            .expect("List([CONFIGURED]) lacks it");
        assert_eq!(entry.cluster, "conformance-md");
        assert_eq!(entry.shard_metadata, md(&pairs));
    })
    .await;
}

/// TestConformance_MetadataAndBindingClearOnDrain: after Drain(5) reaches IDLE (30 s), the
/// cluster is empty and the metadata map is empty.
#[tokio::test]
async fn upstream_metadata_and_binding_clear_on_drain() {
    let server = core();
    within(60, async {
        let mut c = server.client().await;
        let pairs = [("bigfleet.lucy.sh/assigned-priority", "1000000")];
        let id = metadata_walk(&mut c, "conformance-md-drain", &pairs).await;
        drain(&mut c, &id, 5, None).await.expect("Drain");
        must_reach(&mut c, &id, S::Idle, THIRTY).await;
        let m = get(&mut c, &id).await.expect("Get");
        assert_eq!(m.cluster, "", "cluster survived the Drain");
        assert!(
            m.shard_metadata.is_empty(),
            "metadata survived: {:?}",
            m.shard_metadata
        );
    })
    .await;
}

/// TestConformance_MetadataUnknownKeysPreservedVerbatim: unicode, spaces, TAB and an empty
/// value come back byte-for-byte; the empty-valued key is present.
#[tokio::test]
async fn upstream_metadata_unknown_keys_preserved_verbatim() {
    let server = core();
    within(30, async {
        let mut c = server.client().await;
        let pairs = [
            (
                "x-conformance/definitely-unknown",
                "παντα ρει  \t|0xDEADBEEF",
            ),
            ("x-conformance/empty-value", ""),
        ];
        let id = metadata_walk(&mut c, "conformance-md-unknown", &pairs).await;
        let m = get(&mut c, &id).await.expect("Get");
        assert_eq!(m.shard_metadata, md(&pairs));
        assert!(m.shard_metadata.contains_key("x-conformance/empty-value"));
    })
    .await;
}

crate::harness::backend::on_test_driver!(
    upstream_full_lifecycle,
    upstream_full_lifecycle_bare_metal,
    upstream_create_idempotent,
    upstream_configure_idempotent,
    upstream_drain_idempotent,
    upstream_delete_idempotent,
    upstream_get_unknown_machine,
    upstream_delete_unknown_machine,
    upstream_delete_unknown_machine_bare_metal,
    upstream_list_filters_by_state,
    upstream_list_max_results,
    upstream_label_shape,
    upstream_cost_field_bounds,
    upstream_list_revision_advances,
    upstream_drain_on_speculative,
    upstream_transitional_state_observability,
    upstream_drain_grace_timeout,
    upstream_delete_on_configured,
    upstream_fencing_unknown_shard_accepted,
    upstream_fencing_stale_epoch_rejected,
    upstream_fencing_stale_sequence_rejected,
    upstream_fencing_per_machine_isolation,
    upstream_fencing_new_epoch_resets_sequence,
    upstream_fencing_reads_unaffected,
    upstream_metadata_echoed_on_get_and_list,
    upstream_metadata_and_binding_clear_on_drain,
    upstream_metadata_unknown_keys_preserved_verbatim,
);

crate::harness::backend::on_real_libvirtd!(
    upstream_full_lifecycle,
    upstream_create_idempotent,
    upstream_configure_idempotent,
    upstream_drain_idempotent,
    upstream_delete_idempotent,
    upstream_list_max_results,
    upstream_transitional_state_observability,
    upstream_delete_on_configured,
    upstream_fencing_stale_epoch_rejected,
    upstream_metadata_and_binding_clear_on_drain,
);
