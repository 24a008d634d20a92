//! Transition matrix / errors (docs/conformance.md §3.2): B201–B215 against the core profile,
//! plus the empty-cluster_id check this provider documents.
//!
//! Where the suite tolerates several outcomes, the provider's documented choice is
//! asserted: an out-of-position call is ABORTED (so never FAILED_PRECONDITION, which means
//! a stale fence token and nothing else); an empty machine id or cluster id is
//! INVALID_ARGUMENT; negative grace and negative tokens are accepted; 512 × 1 KiB of
//! metadata and a 3 MiB blob are accepted (the receive limit is 16 MiB).

use std::collections::HashMap;
use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use tonic::Code;

use crate::harness::*;

/// The errors-area StaysIn / NeverReaches window.
const WINDOW: Duration = Duration::from_millis(250);
/// The reach deadline of B209, B210, B212, B213.
const SLOW: Duration = Duration::from_secs(20);

/// The call was refused as out of position: ABORTED (hence not FAILED_PRECONDITION).
fn assert_out_of_position<T: std::fmt::Debug>(result: &Result<T, tonic::Status>, what: &str) {
    assert_eq!(
        code(result),
        Code::Aborted,
        "{what} out of position: {result:?}"
    );
}

/// The machine is in `want` now and for the 250 ms window.
async fn assert_unchanged(c: &mut Client, id: &str, want: S) -> pb::Machine {
    let now = get(c, id).await.expect("Get");
    assert_eq!(state(&now), want, "state moved: {now:?}");
    stays_in(c, id, want, WINDOW).await;
    get(c, id).await.expect("Get")
}

/// A ghost id nobody seeded.
fn ghost(prefix: &str) -> String {
    unique_shard(prefix).replacen("conf-", "conformance-", 1)
}

/// B201: Create on a CONFIGURED machine is refused (ABORTED, not FAILED_PRECONDITION) and
/// changes nothing: still CONFIGURED for 250 ms with its cluster.
#[tokio::test]
async fn b201_create_on_configured_is_refused_without_change() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_configured(&server, &mut c, "conf-b201", &[("k", "v")]).await;
    let result = create(&mut c, &id, None).await;
    assert_out_of_position(&result, "Create on CONFIGURED");
    let m = assert_unchanged(&mut c, &id, S::Configured).await;
    assert_eq!(m.cluster, "conf-b201");
}

/// B202: Configure on a SPECULATIVE machine is refused (ABORTED) and changes nothing: still
/// SPECULATIVE for 250 ms, no cluster, no metadata.
#[tokio::test]
async fn b202_configure_on_speculative_is_refused_without_change() {
    let server = core();
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    assert_eq!(state(&get(&mut c, &id).await.expect("Get")), S::Speculative);
    let result = configure(&mut c, &id, "conf-b202", &[("k", "v")], None).await;
    assert_out_of_position(&result, "Configure on SPECULATIVE");
    let m = assert_unchanged(&mut c, &id, S::Speculative).await;
    assert_eq!(m.cluster, "");
    assert!(m.shard_metadata.is_empty(), "metadata attached: {m:?}");
}

/// B203: Drain on IDLE never answers FAILED_PRECONDITION and never moves the machine. With
/// no Drain history it is out of position (ABORTED); after a completed Drain it is the
/// idempotent no-op returning that Drain's operation id.
#[tokio::test]
async fn b203_drain_on_idle_never_moves_the_machine() {
    let server = core();
    let mut c = server.client().await;
    let fresh = walk_to_idle(&server, &mut c).await;
    let result = drain(&mut c, &fresh, 5, None).await;
    assert_out_of_position(&result, "Drain on a never-drained IDLE");
    assert_unchanged(&mut c, &fresh, S::Idle).await;

    let drained = walk_to_configured(&server, &mut c, "conf-b203", &[]).await;
    let first = drain(&mut c, &drained, 5, None).await.expect("Drain");
    reach(&mut c, &drained, S::Idle, SETTLE).await;
    let again = drain(&mut c, &drained, 5, None).await;
    let again = again.expect("Drain at target after a Drain is an idempotent no-op");
    assert_eq!(again.operation_id, first.operation_id);
    assert_unchanged(&mut c, &drained, S::Idle).await;
}

/// B204: Delete out of position never answers FAILED_PRECONDITION and leaves the state
/// unchanged: (a) on a never-deleted SPECULATIVE machine, (b) on a CONFIGURED one; both are
/// ABORTED here.
#[tokio::test]
async fn b204_delete_out_of_position_leaves_the_state() {
    let server = core();
    let mut c = server.client().await;
    let speculative = pick(&server, &mut c).await;
    assert_eq!(
        state(&get(&mut c, &speculative).await.expect("Get")),
        S::Speculative
    );
    let result = delete(&mut c, &speculative, None).await;
    assert_out_of_position(&result, "Delete on a never-created SPECULATIVE");
    assert_unchanged(&mut c, &speculative, S::Speculative).await;

    let configured = walk_to_configured(&server, &mut c, "conf-b204", &[]).await;
    assert_eq!(
        state(&get(&mut c, &configured).await.expect("Get")),
        S::Configured
    );
    let result = delete(&mut c, &configured, None).await;
    assert_out_of_position(&result, "Delete on CONFIGURED");
    assert_unchanged(&mut c, &configured, S::Configured).await;
}

/// B205: re-Configure at CONFIGURED and re-Create at IDLE succeed as no-ops: the
/// Configure ack's snapshot is CONFIGURED and neither machine re-enters a transition.
#[tokio::test]
async fn b205_at_target_replays_are_no_ops() {
    let server = core();
    let mut c = server.client().await;
    let metadata = [("a", "1"), ("b", "2")];
    let id = walk_to_configured(&server, &mut c, "conf-b205", &metadata).await;
    let ack = configure(&mut c, &id, "conf-b205", &metadata, None)
        .await
        .expect("re-Configure");
    let snapshot = ack.machine.expect("the ack carries the machine snapshot");
    assert_eq!(
        state(&snapshot),
        S::Configured,
        "ack snapshot: {snapshot:?}"
    );
    assert_eq!(state(&get(&mut c, &id).await.expect("Get")), S::Configured);
    never_reaches(&mut c, &id, S::Configuring, WINDOW).await;
    never_reaches(&mut c, &id, S::Draining, WINDOW).await;

    let idle = walk_to_idle(&server, &mut c).await;
    create(&mut c, &idle, None)
        .await
        .expect("re-Create at IDLE");
    assert_eq!(state(&get(&mut c, &idle).await.expect("Get")), S::Idle);
    never_reaches(&mut c, &idle, S::Creating, WINDOW).await;
}

/// B206: an at-target replay returns the original operation id, for Create and Configure;
/// the two ids are non-empty and distinct.
#[tokio::test]
async fn b206_at_target_replay_returns_the_original_operation_id() {
    let server = core();
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let created = create(&mut c, &id, None)
        .await
        .expect("Create")
        .operation_id;
    assert!(!created.is_empty(), "Create ack without operation_id");
    reach(&mut c, &id, S::Idle, SETTLE).await;
    let replay = create(&mut c, &id, None)
        .await
        .expect("Create replay")
        .operation_id;
    assert_eq!(replay, created);
    let metadata = [("k", "v")];
    let configured = configure(&mut c, &id, "conf-b206", &metadata, None)
        .await
        .expect("Configure");
    let configured = configured.operation_id;
    assert!(!configured.is_empty(), "Configure ack without operation_id");
    assert_ne!(configured, created);
    reach(&mut c, &id, S::Configured, SETTLE).await;
    let replay = configure(&mut c, &id, "conf-b206", &metadata, None)
        .await
        .expect("replay");
    assert_eq!(replay.operation_id, configured);
}

/// B207: Create, Configure and Drain on an unknown id are NOT_FOUND (never
/// FAILED_PRECONDITION) and do not create the machine.
#[tokio::test]
async fn b207_unknown_id_is_not_found_and_not_created() {
    let server = core();
    let mut c = server.client().await;
    let id = ghost("b207-ghost");
    let result = create(&mut c, &id, None).await;
    assert_eq!(code(&result), Code::NotFound, "Create: {result:?}");
    let result = configure(&mut c, &id, "x", &[("k", "v")], None).await;
    assert_eq!(code(&result), Code::NotFound, "Configure: {result:?}");
    let result = drain(&mut c, &id, 5, None).await;
    assert_eq!(code(&result), Code::NotFound, "Drain: {result:?}");
    let result = get(&mut c, &id).await;
    assert_eq!(
        code(&result),
        Code::NotFound,
        "Get after the calls: {result:?}"
    );
}

/// B208: an empty machine id is INVALID_ARGUMENT on Get, Create, Configure, Drain and (this
/// provider's choice, as the reference kit) Delete.
#[tokio::test]
async fn b208_empty_machine_id_is_invalid_argument() {
    let server = core();
    let mut c = server.client().await;
    let invalid = Code::InvalidArgument;
    assert_eq!(code(&get(&mut c, "").await), invalid, "Get(\"\")");
    assert_eq!(
        code(&create(&mut c, "", None).await),
        invalid,
        "Create(\"\")"
    );
    assert_eq!(
        code(&configure(&mut c, "", "x", &[], None).await),
        invalid,
        "Configure(\"\")"
    );
    assert_eq!(
        code(&drain(&mut c, "", 5, None).await),
        invalid,
        "Drain(\"\")"
    );
    assert_eq!(
        code(&delete(&mut c, "", None).await),
        invalid,
        "Delete(\"\")"
    );
}

/// B208 (provider extension): Configure with an empty cluster_id is INVALID_ARGUMENT, the
/// machine stays IDLE and unbound, and the fence mark does not advance: the same token is
/// accepted by the next Configure.
#[tokio::test]
async fn b208_empty_cluster_id_is_invalid_argument_without_fence_advance() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_idle(&server, &mut c).await;
    let shard = unique_shard("b208-cluster");
    let result = configure(&mut c, &id, "", &[("k", "v")], tok(&shard, 1, 1)).await;
    assert_eq!(
        code(&result),
        Code::InvalidArgument,
        "Configure(cluster \"\"): {result:?}"
    );
    let m = assert_unchanged(&mut c, &id, S::Idle).await;
    assert_eq!(m.cluster, "");
    assert!(m.shard_metadata.is_empty(), "metadata attached: {m:?}");
    let retry = configure(&mut c, &id, "conf-b208", &[("k", "v")], tok(&shard, 1, 1)).await;
    retry.expect("the refused call must not have advanced the fence mark");
    let m = reach(&mut c, &id, S::Configured, SETTLE).await;
    assert_eq!(m.cluster, "conf-b208");
}

/// B209: 512 metadata keys of 1 KiB each (~530 KiB) are accepted and echoed exactly.
#[tokio::test]
async fn b209_oversized_metadata_is_echoed_exactly() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_idle(&server, &mut c).await;
    let metadata: HashMap<String, String> = (0..512)
        .map(|i| (format!("b209-key-{i:03}"), "v".repeat(1024)))
        .collect();
    let blob = b"# conformance\n".to_vec();
    let result = configure_map(&mut c, &id, "conf-b209", metadata.clone(), blob, None).await;
    assert_eq!(code(&result), Code::Ok, "512 x 1 KiB metadata: {result:?}");
    reach(&mut c, &id, S::Configured, SLOW).await;
    let m = get(&mut c, &id).await.expect("Get");
    assert_eq!(m.shard_metadata.len(), 512);
    assert!(
        m.shard_metadata == metadata,
        "the metadata map was not echoed exactly"
    );
}

/// B210: Drain with grace −5 is accepted (never FAILED_PRECONDITION) and completes to IDLE
/// with the binding cleared.
#[tokio::test]
async fn b210_negative_grace_is_accepted() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_configured(&server, &mut c, "conf-b210", &[("k", "v")]).await;
    let result = drain(&mut c, &id, -5, None).await;
    assert_eq!(code(&result), Code::Ok, "Drain(grace -5): {result:?}");
    let m = reach(&mut c, &id, S::Idle, SLOW).await;
    assert_eq!(m.cluster, "", "cluster survived: {m:?}");
}

/// B211: a fenced Create whose token has a negative epoch and/or sequence (non-empty shard)
/// is accepted on first contact and the machine reaches IDLE.
#[tokio::test]
async fn b211_negative_tokens_are_accepted() {
    let server = core();
    let mut c = server.client().await;
    for (epoch, seq) in [(-1, 1), (1, -1), (-7, -3)] {
        let id = pick(&server, &mut c).await;
        let shard = unique_shard("b211");
        let result = create(&mut c, &id, tok(&shard, epoch, seq)).await;
        assert_eq!(
            code(&result),
            Code::Ok,
            "Create with ({epoch},{seq}): {result:?}"
        );
        reach(&mut c, &id, S::Idle, SETTLE).await;
    }
}

/// B212: an (i64::MAX, i64::MAX) token is accepted and becomes the mark without overflow:
/// an equal or lower token is then FAILED_PRECONDITION, even on an out-of-position Create.
#[tokio::test]
async fn b212_int64_max_token_becomes_the_mark() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_idle(&server, &mut c).await;
    let shard = unique_shard("b212");
    let max = i64::MAX;
    let result = configure(&mut c, &id, "conf-cluster", &[], tok(&shard, max, max)).await;
    assert_eq!(
        code(&result),
        Code::Ok,
        "Configure with (max,max): {result:?}"
    );
    reach(&mut c, &id, S::Configured, SLOW).await;
    let replay = create(&mut c, &id, tok(&shard, max, max)).await;
    assert_eq!(
        code(&replay),
        Code::FailedPrecondition,
        "Create (max,max): {replay:?}"
    );
    let lower = create(&mut c, &id, tok(&shard, max - 1, max)).await;
    assert_eq!(
        code(&lower),
        Code::FailedPrecondition,
        "Create (max-1,max): {lower:?}"
    );
    let m = get(&mut c, &id).await.expect("Get");
    assert!(!m.cluster.is_empty(), "cluster lost: {m:?}");
}

/// B213: a 3 MiB bootstrap blob is accepted and the machine reaches CONFIGURED with its
/// cluster.
#[tokio::test]
async fn b213_three_mib_blob_is_accepted() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_idle(&server, &mut c).await;
    let blob: Vec<u8> = (0..3 * 1024 * 1024)
        .map(|i: usize| b'a' + u8::try_from(i % 26).unwrap())
        .collect();
    let result = configure_map(&mut c, &id, "conf-b213", md(&[("k", "v")]), blob, None).await;
    assert_eq!(code(&result), Code::Ok, "3 MiB blob: {result:?}");
    let m = reach(&mut c, &id, S::Configured, SLOW).await;
    assert_eq!(m.cluster, "conf-b213");
}

/// B214: each new transition gets a new operation id (five distinct, non-empty ids over
/// Create, Configure, Drain, Configure, Drain); replaying the last Drain reuses the fifth.
#[tokio::test]
async fn b214_each_transition_gets_a_fresh_operation_id() {
    let server = core();
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let mut ids = Vec::new();
    ids.push(
        create(&mut c, &id, None)
            .await
            .expect("Create")
            .operation_id,
    );
    reach(&mut c, &id, S::Idle, SETTLE).await;
    for (cluster, value) in [("conf-b214", "1"), ("conf-b214-b", "2")] {
        let ack = configure(&mut c, &id, cluster, &[("k", value)], None)
            .await
            .expect("Configure");
        ids.push(ack.operation_id);
        reach(&mut c, &id, S::Configured, SETTLE).await;
        ids.push(
            drain(&mut c, &id, 5, None)
                .await
                .expect("Drain")
                .operation_id,
        );
        reach(&mut c, &id, S::Idle, SETTLE).await;
    }
    assert!(
        ids.iter().all(|op| !op.is_empty()),
        "empty operation id in {ids:?}"
    );
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 5, "operation ids are not distinct: {ids:?}");
    let replay = drain(&mut c, &id, 5, None).await.expect("Drain replay");
    assert_eq!(replay.operation_id, ids[4]);
}

/// B215: Get on an unknown id is NOT_FOUND; Delete on it is NOT_FOUND (Delete exists on
/// the core profile).
#[tokio::test]
async fn b215_unknown_id_get_and_delete_are_not_found() {
    let server = core();
    let mut c = server.client().await;
    let id = ghost("b215-ghost");
    let result = get(&mut c, &id).await;
    assert_eq!(code(&result), Code::NotFound, "Get: {result:?}");
    let result = delete(&mut c, &id, None).await;
    assert_eq!(code(&result), Code::NotFound, "Delete: {result:?}");
}

crate::harness::backend::on_test_driver!(
    b201_create_on_configured_is_refused_without_change,
    b202_configure_on_speculative_is_refused_without_change,
    b203_drain_on_idle_never_moves_the_machine,
    b204_delete_out_of_position_leaves_the_state,
    b205_at_target_replays_are_no_ops,
    b206_at_target_replay_returns_the_original_operation_id,
    b207_unknown_id_is_not_found_and_not_created,
    b208_empty_machine_id_is_invalid_argument,
    b208_empty_cluster_id_is_invalid_argument_without_fence_advance,
    b209_oversized_metadata_is_echoed_exactly,
    b210_negative_grace_is_accepted,
    b211_negative_tokens_are_accepted,
    b212_int64_max_token_becomes_the_mark,
    b213_three_mib_blob_is_accepted,
    b214_each_transition_gets_a_fresh_operation_id,
    b215_unknown_id_get_and_delete_are_not_found,
);

crate::harness::backend::on_real_libvirtd!(
    b201_create_on_configured_is_refused_without_change,
    b205_at_target_replays_are_no_ops,
    b206_at_target_replay_returns_the_original_operation_id,
    b214_each_transition_gets_a_fresh_operation_id,
);
