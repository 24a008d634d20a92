//! The bare-metal profile (`--capacity-type=bare_metal`): a fixed, free pool without Delete.
//! Every machine is BARE_METAL at price 0; Delete answers UNIMPLEMENTED for any id and any
//! token, before the fence (docs/contract.md §2.3, step 3), so it never advances a fence mark; the
//! Create → Configure → Drain cycle works as in the core profile.

use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::{CapacityType, MachineState as S};
use tonic::Code;

use crate::harness::*;

fn assert_bare_metal(m: &pb::Machine, when: &str) {
    assert_eq!(
        CapacityType::try_from(m.capacity_type),
        Ok(CapacityType::BareMetal),
        "{when}: {} has capacity_type {}",
        m.id,
        m.capacity_type
    );
    assert_eq!(
        m.price_per_hour, 0.0,
        "{when}: {} costs {}",
        m.id, m.price_per_hour
    );
}

/// Every machine, in the seeded inventory and after walking to Idle and Configured, is
/// BARE_METAL with price_per_hour exactly 0.
#[tokio::test]
async fn bare_metal_every_machine_is_bare_metal_and_free() {
    let server = bare_metal();
    let mut c = server.client().await;
    let all = list_all(&mut c).await;
    assert!(!all.machines.is_empty(), "empty bare-metal inventory");
    for m in &all.machines {
        assert_bare_metal(m, "seeded");
    }
    let idle = walk_to_idle(&server, &mut c).await;
    let configured = walk_to_configured(&server, &mut c, "bm-shape", &[("k", "v")]).await;
    for id in [&idle, &configured] {
        assert_bare_metal(&get(&mut c, id).await.expect("Get"), "walked");
    }
    for m in &list_all(&mut c).await.machines {
        assert_bare_metal(m, "after walks");
    }
}

/// Delete returns UNIMPLEMENTED for every id — Speculative, Idle, Configured and unknown —
/// with an empty token and with a fenced token, and changes nothing.
#[tokio::test]
async fn bare_metal_delete_is_unimplemented_for_any_id_and_token() {
    let server = bare_metal();
    let mut c = server.client().await;
    let speculative = pick(&server, &mut c).await;
    let idle = walk_to_idle(&server, &mut c).await;
    let configured = walk_to_configured(&server, &mut c, "bm-delete", &[("k", "v")]).await;
    let unknown = "certify/no-such-machine".to_owned();
    let cases = [
        (&speculative, Some(S::Speculative)),
        (&idle, Some(S::Idle)),
        (&configured, Some(S::Configured)),
        (&unknown, None),
    ];
    for (id, want) in cases {
        let shard = unique_shard("bm-delete");
        for token in [None, tok(&shard, 1, 1), tok(&shard, 1, 2)] {
            let result = delete(&mut c, id, token.clone()).await;
            assert_eq!(
                code(&result),
                Code::Unimplemented,
                "Delete({id}, {token:?}): {result:?}"
            );
        }
        match want {
            Some(s) => stays_in(&mut c, id, s, Duration::from_millis(100)).await,
            None => assert_eq!(code(&get(&mut c, id).await), Code::NotFound),
        }
    }
}

/// A fenced Delete never advances the fence mark: after Delete(token T) → UNIMPLEMENTED, a
/// Create and a Configure carrying the very same T are accepted (a mark at T would make them
/// FAILED_PRECONDITION), and on an unknown id a Create with T gets NOT_FOUND, not FP.
#[tokio::test]
async fn bare_metal_delete_never_advances_a_fence_mark() {
    let server = bare_metal();
    let mut c = server.client().await;

    let id = pick(&server, &mut c).await;
    let shard = unique_shard("bm-fence");
    let t = tok(&shard, 3, 7);
    assert_eq!(
        code(&delete(&mut c, &id, t.clone()).await),
        Code::Unimplemented
    );
    let created = create(&mut c, &id, t.clone()).await;
    assert!(
        created.is_ok(),
        "Create with the Delete's token was refused: {created:?}"
    );
    reach(&mut c, &id, S::Idle, SETTLE).await;

    let t2 = tok(&shard, 3, 8);
    assert_eq!(
        code(&delete(&mut c, &id, t2.clone()).await),
        Code::Unimplemented
    );
    let configured = configure(&mut c, &id, "bm-fence", &[("k", "v")], t2).await;
    assert!(
        configured.is_ok(),
        "Configure with the Delete's token was refused: {configured:?}"
    );
    reach(&mut c, &id, S::Configured, SETTLE).await;

    let unknown = "certify/no-such-machine";
    let other = unique_shard("bm-fence-unknown");
    let t3 = tok(&other, 1, 1);
    assert_eq!(
        code(&delete(&mut c, unknown, t3.clone()).await),
        Code::Unimplemented
    );
    let result = create(&mut c, unknown, t3).await;
    assert_eq!(
        code(&result),
        Code::NotFound,
        "unknown id after a fenced Delete: {result:?}"
    );
}

/// The Create → Configure → Drain cycle works on bare metal: IDLE with a host, CONFIGURED
/// with the binding, IDLE again with the binding cleared, and the slot can be bound again.
#[tokio::test]
async fn bare_metal_create_configure_drain_cycle_works() {
    let server = bare_metal();
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    create(&mut c, &id, None).await.expect("Create accepted");
    let m = reach(&mut c, &id, S::Idle, SETTLE).await;
    assert!(host_set(&m), "IDLE without a host");
    for round in 1..=2 {
        let cluster = format!("bm-cycle-{round}");
        configure(&mut c, &id, &cluster, &[("round", "x")], None)
            .await
            .expect("Configure");
        let m = reach(&mut c, &id, S::Configured, SETTLE).await;
        assert_eq!(m.cluster, cluster);
        assert_eq!(m.shard_metadata, md(&[("round", "x")]));
        assert!(host_set(&m));
        assert_bare_metal(&m, "CONFIGURED");
        drain(&mut c, &id, 0, None).await.expect("Drain accepted");
        let m = reach(&mut c, &id, S::Idle, SETTLE).await;
        assert!(host_set(&m), "IDLE after Drain without a host");
        assert!(
            m.cluster.is_empty() && m.shard_metadata.is_empty(),
            "binding left: {m:?}"
        );
        assert!(m.last_error.is_empty());
        assert_bare_metal(&m, "IDLE after Drain");
    }
}
