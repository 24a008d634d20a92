//! The README's promise, tried as a new user would: the provider serves 32 Speculative
//! slots and a client drives Create → Configure → Drain → Delete, seeing each state.

use bigfleet_libvirt_proto::v1alpha1::MachineState as S;

use crate::harness::*;

#[tokio::test]
async fn default_launch_serves_32_slots_and_a_full_cycle() {
    let server = Server::start(&["--seed-count", "32"]);
    let mut c = server.client().await;
    let all = list_all(&mut c).await;
    assert_eq!(all.machines.len(), 32);
    assert!(all.machines.iter().all(|m| state(m) == S::Speculative));
    let id = pick(&server, &mut c).await;
    create(&mut c, &id, None).await.unwrap();
    let idle = reach(&mut c, &id, S::Idle, SETTLE).await;
    assert!(host_set(&idle));
    configure(&mut c, &id, "smoke", &[("k", "v")], None)
        .await
        .unwrap();
    let configured = reach(&mut c, &id, S::Configured, SETTLE).await;
    assert_eq!(configured.cluster, "smoke");
    drain(&mut c, &id, 5, None).await.unwrap();
    let idle = reach(&mut c, &id, S::Idle, SETTLE).await;
    assert!(idle.cluster.is_empty() && idle.shard_metadata.is_empty());
    delete(&mut c, &id, None).await.unwrap();
    let gone = reach(&mut c, &id, S::Speculative, SETTLE).await;
    assert!(!host_set(&gone));
    let listed = list(&mut c, &[S::Speculative], 0, b"").await;
    assert!(listed.machines.iter().any(|m| m.id == id));
}
