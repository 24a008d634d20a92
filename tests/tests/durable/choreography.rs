//! Part 1: The choreography (docs/conformance.md §5.1): B1001–B1007 in the lane's order, across
//! one SIGKILL and a restart on the same state file.

use std::collections::BTreeSet;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use tonic::Code;

use super::*;
use crate::harness::*;

/// The lane's Configure of C (docs/conformance.md §5.1), sent again verbatim for B1002.
async fn configure_c(c: &mut Client, id: &str) -> Result<pb::TransitionAck, tonic::Status> {
    configure_map(
        c,
        id,
        "durable-cluster",
        md(&DUR_MD),
        b"# durable\n".to_vec(),
        None,
    )
    .await
}

/// B1001–B1007 in the lane's order: fence F with (durA, 3, 7), configure C with
/// `durable-cluster` and {d/k: v, d/k2: v2}, snapshot the inventory, SIGKILL, restart on the
/// same state file (new port), then: the equal token is still fenced (B1001), the Configure
/// retry returns the pre-restart op id (B1002), C keeps its binding (B1003), the inventory is
/// identical (B1004), the cursor is non-empty and a new op id is fresh (B1005), nothing is
/// left transitional except what new traffic started (B1006, weak), and a brand-new shard's
/// first token is accepted (B1007).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn b1001_to_b1007_durability_lane() {
    let dir = tempfile::tempdir().expect("temp dir");
    let args = lane_args(&dir.path().join("durable-state.redb"), 64, &[]);
    let mut server = boot(&args);
    let mut c = server.client().await;

    // 3a: fence F.
    let f = pick(&server, &mut c).await;
    let create_f = create(&mut c, &f, tok("durA", 3, 7))
        .await
        .expect("fenced Create(F, durA, 3, 7)");
    reach(&mut c, &f, S::Idle, WALK).await;
    // 3b: configure C.
    let cm = pick(&server, &mut c).await;
    let create_c = create(&mut c, &cm, None).await.expect("Create(C)");
    reach(&mut c, &cm, S::Idle, WALK).await;
    let cfg = configure_c(&mut c, &cm).await.expect("Configure(C)");
    let cfg_op = cfg.operation_id.clone();
    assert!(!cfg_op.is_empty(), "Configure(C) ack has an empty op id");
    reach(&mut c, &cm, S::Configured, WALK).await;
    let pre_ops: BTreeSet<String> = [
        create_f.operation_id.clone(),
        create_c.operation_id.clone(),
        cfg_op.clone(),
    ]
    .into();
    assert_eq!(
        pre_ops.len(),
        3,
        "three accepted transitions, three op ids: {pre_ops:?}"
    );
    // 3c: inventory snapshot.
    let snapshot = inventory(&mut c).await;
    assert_eq!(snapshot.get(&f), Some(&S::Idle));
    assert_eq!(snapshot.get(&cm), Some(&S::Configured));

    // 4–5: SIGKILL, re-boot on the same file and a new port.
    let old_addr = server.addr;
    drop(c);
    sigkill(&mut server);
    let server = boot(&args);
    assert_ne!(
        server.addr, old_addr,
        "the restart must serve on a different port"
    );
    let mut c = server.client().await;

    // B1001: the equal (not newer) token is still stale.
    let replay = create(&mut c, &f, tok("durA", 3, 7)).await;
    assert_eq!(
        code(&replay),
        Code::FailedPrecondition,
        "B1001: the pre-restart mark (durA, 3, 7) on {f} was lost: {replay:?}"
    );
    // B1002: the identical Configure retry returns cfgOp.
    let again = configure_c(&mut c, &cm)
        .await
        .expect("B1002: the Configure retry must succeed");
    assert!(!again.operation_id.is_empty(), "B1002: empty op id");
    assert_eq!(
        again.operation_id, cfg_op,
        "B1002: the retry minted a new op id"
    );
    // B1003: C keeps its cluster and exact metadata.
    let got = get(&mut c, &cm).await.expect("B1003: Get(C)");
    assert_eq!(got.cluster, "durable-cluster", "B1003: cluster lost");
    assert_eq!(got.shard_metadata, md(&DUR_MD), "B1003: metadata changed");
    // B1004: identical id → state inventory.
    let after = inventory(&mut c).await;
    assert_eq!(after.len(), snapshot.len(), "B1004: inventory size changed");
    for (id, s) in &snapshot {
        assert_eq!(
            after.get(id),
            Some(s),
            "B1004: {id} missing or changed state"
        );
    }
    let extra: Vec<&String> = after
        .keys()
        .filter(|id| !snapshot.contains_key(*id))
        .collect();
    assert!(
        extra.is_empty(),
        "B1004: extra ids after restart: {extra:?}"
    );
    // B1005: a non-empty cursor, and a new op id that repeats no pre-restart id.
    let listed = list_all(&mut c).await;
    assert!(
        !listed.revision.is_empty(),
        "B1005: empty List revision after restart"
    );
    let mut used: BTreeSet<String> = [f.clone(), cm.clone()].into();
    let fresh = pick_excluding(&mut c, &used).await;
    let ack = create(&mut c, &fresh, None)
        .await
        .expect("B1005: Create on a fresh machine");
    assert!(!ack.operation_id.is_empty(), "B1005: empty op id");
    assert!(
        !pre_ops.contains(&ack.operation_id),
        "B1005: post-restart op id {} repeats a pre-restart id {pre_ops:?}",
        ack.operation_id
    );
    used.insert(fresh.clone());
    // B1006 (weak): nothing transitional, except the machine B1005 just started.
    let stuck: Vec<(String, S)> = list_all(&mut c)
        .await
        .machines
        .iter()
        .filter(|m| m.id != fresh && transitional(state(m)))
        .map(|m| (m.id.clone(), state(m)))
        .collect();
    assert!(
        stuck.is_empty(),
        "B1006 (weak): transitional after restart: {stuck:?}"
    );
    // B1007: the first token of a brand-new shard is accepted.
    let other = pick_excluding(&mut c, &used).await;
    let first = create(&mut c, &other, tok("durB", 1, 1)).await;
    assert_eq!(
        code(&first),
        Code::Ok,
        "B1007: first token (durB, 1, 1) refused after restart: {first:?}"
    );
}
