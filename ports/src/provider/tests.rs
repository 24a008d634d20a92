//! Unit tests of per-commit store failures: a commit that fails is taken back (the call is
//! not acknowledged and reads serve the last durable state), the next commit is attempted
//! afresh, and a transition's completion that could not be committed is committed once the
//! store takes commits again.

use bigfleet_libvirt_domain::{
    FenceKey, FenceToken, Kind, MachineId, MachineState, MutateRequest, Mutation,
};

use crate::testkit::doubles::{StoppedClock, TestDisk, TestHost, TestSpawner};
use crate::{BootstrapBlob, Provider, ProviderConfig, ProviderError};

/// The host of these tests: slots m-1 and m-2, each Create waiting until the test lets it
/// through.
fn gated_host() -> TestHost {
    TestHost::default().with_slot("m-2").gated()
}

type Subject = Provider<TestHost, TestDisk, StoppedClock, TestSpawner>;

async fn start(host: TestHost, disk: TestDisk) -> Subject {
    let config = ProviderConfig::default();
    let clock = StoppedClock::short_waits_only();
    Provider::start(
        config,
        host,
        disk,
        clock,
        TestSpawner::default(),
        Vec::new(),
    )
    .await
    .expect("start")
}

fn create(id: &str, sequence: i64) -> Mutation {
    Mutation {
        machine_id: id.to_owned(),
        token: FenceToken {
            shard_id: "s".to_owned(),
            epoch: 1,
            sequence,
        },
        request: MutateRequest::Create,
    }
}

async fn state(provider: &Subject, id: &str) -> MachineState {
    provider.get(id).await.expect("get").expect("exists").state
}

async fn run_tasks() {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_failed_commit_is_taken_back_and_the_next_one_is_attempted_afresh() {
    let disk = TestDisk::default();
    let provider = start(gated_host(), disk.clone()).await;
    disk.set_full(true);
    let refused = provider
        .mutate(create("m-1", 1), BootstrapBlob::default())
        .await;
    assert!(
        matches!(refused, Err(ProviderError::Store(_))),
        "{refused:?}"
    );
    // Reads answer, from the durable state: nothing of the refused call is served.
    assert_eq!(state(&provider, "m-1").await, MachineState::Speculative);
    let status = provider.store_status();
    assert!(status.failing.is_some_and(|e| e.contains("No space")));
    assert_eq!(status.failures, 1);
    // A second call on the full disk is attempted (not refused for good) and fails too.
    let attempts = disk.attempts();
    let refused = provider
        .mutate(create("m-2", 1), BootstrapBlob::default())
        .await;
    assert!(refused.is_err());
    assert_eq!(
        disk.attempts(),
        attempts + 1,
        "the next commit really tried"
    );
    assert_eq!(provider.store_status().failures, 2);
    // Room again: the same token passes (its mark was never advanced) and is acknowledged.
    disk.set_full(false);
    let ack = provider
        .mutate(create("m-1", 1), BootstrapBlob::default())
        .await
        .expect("accepted once the disk has room");
    assert_eq!(provider.store_status().failing, None);
    let durable = disk.durable();
    let key = FenceKey {
        shard_id: "s".to_owned(),
        machine_id: "m-1".to_owned(),
    };
    assert_eq!(
        durable.fences.len(),
        1,
        "only the acknowledged mark is durable"
    );
    assert_eq!(durable.fences[0].0, key);
    let id = MachineId::new("m-1").unwrap();
    assert_eq!(
        durable.operations,
        vec![(id, Kind::Create, ack.operation_id)],
        "only the acknowledged operation id is durable"
    );
    assert!(
        durable
            .machines
            .iter()
            .all(|m| m.id.as_str() == "m-1" || m.state == MachineState::Speculative)
    );
}

#[tokio::test]
async fn a_completion_that_could_not_be_committed_is_committed_once_there_is_room() {
    let disk = TestDisk::default();
    let host = gated_host();
    let provider = start(host.clone(), disk.clone()).await;
    provider
        .mutate(create("m-1", 1), BootstrapBlob::default())
        .await
        .expect("accepted");
    disk.set_full(true);
    host.release_create();
    run_tasks().await;
    // The Create finished, but its completion is not durable: reads show the durable state.
    assert_eq!(state(&provider, "m-1").await, MachineState::Creating);
    assert!(provider.store_status().failing.is_some());
    disk.set_full(false);
    run_tasks().await;
    assert_eq!(state(&provider, "m-1").await, MachineState::Idle);
    let durable = disk.durable();
    let m1 = durable.machines.iter().find(|m| m.id.as_str() == "m-1");
    assert_eq!(m1.map(|m| m.state), Some(MachineState::Idle));
    assert_eq!(provider.store_status().failing, None);
}
