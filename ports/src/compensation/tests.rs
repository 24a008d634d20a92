//! Unit tests of the compensation: a Create whose effect is unknown is followed by a
//! delete of its domain, one that provably changed nothing is not, and a restart
//! compensates interrupted Creates and Deletes; and the hypervisor is told of each record
//! that goes Failed (`Hypervisor::failed`), and of no other. Time is a clock whose timers fire at once, so backoff
//! and deadlines cost nothing.

use bigfleet_libvirt_domain::{Core, FenceToken, MachineState, MutateRequest, Mutation, Timestamp};

use crate::testkit::doubles::{StoppedClock, TestDisk, TestHost, TestSpawner};
use crate::{BootstrapBlob, HypervisorError, Provider, ProviderConfig};

type Subject = Provider<TestHost, TestDisk, StoppedClock, TestSpawner>;

async fn start(host: TestHost, store: TestDisk) -> Subject {
    Provider::start(
        ProviderConfig::default(),
        host,
        store,
        StoppedClock::instant(),
        TestSpawner::default(),
        Vec::new(),
    )
    .await
    .expect("start")
}

async fn create(provider: &Subject) {
    let mutation = Mutation {
        machine_id: "m-1".to_owned(),
        token: FenceToken {
            shard_id: "s".to_owned(),
            epoch: 1,
            sequence: 1,
        },
        request: MutateRequest::Create,
    };
    provider
        .mutate(mutation, BootstrapBlob::default())
        .await
        .expect("create accepted");
}

/// Lets the spawned transition and compensation tasks run to the end.
async fn settle() {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
}

/// Writes to `store` what a process that accepted `request` on m-1, and died before its
/// completion was persisted, leaves there.
fn accepted_on_disk(store: &TestDisk, request: MutateRequest) {
    let policy = ProviderConfig::default().policy;
    let (mut core, _) = Core::restore(policy, store.durable()).expect("restore");
    let mutation = Mutation {
        machine_id: "m-1".to_owned(),
        token: FenceToken::default(),
        request,
    };
    let changes = core.mutate(mutation, Timestamp(1)).changes;
    store.apply(&changes.expect("accepted"));
}

fn state(provider: &Subject) -> MachineState {
    provider.peek(&Default::default()).machines[0].state
}

#[tokio::test]
async fn a_create_whose_reply_was_lost_is_followed_by_a_delete_of_its_domain() {
    let host = TestHost::failing_create(HypervisorError::indefinite("reply lost"));
    let provider = start(host.clone(), TestDisk::default()).await;
    create(&provider).await;
    settle().await;
    assert_eq!(state(&provider), MachineState::Failed);
    assert_eq!(host.delete_count(), 1, "one compensating delete");
    assert_eq!(host.domain_count(), 0, "no domain left behind");
}

#[tokio::test]
async fn a_create_that_changed_nothing_is_not_compensated() {
    let host = TestHost::failing_create(HypervisorError::permanent("no such image"));
    let provider = start(host.clone(), TestDisk::default()).await;
    create(&provider).await;
    settle().await;
    assert_eq!(state(&provider), MachineState::Failed);
    assert_eq!(host.delete_count(), 0);
}

#[tokio::test]
async fn a_successful_create_is_not_compensated() {
    let host = TestHost::default();
    let provider = start(host.clone(), TestDisk::default()).await;
    create(&provider).await;
    settle().await;
    assert_eq!(state(&provider), MachineState::Idle);
    assert_eq!((host.delete_count(), host.domain_count()), (0, 1));
}

#[tokio::test]
async fn the_hypervisor_is_told_of_a_record_that_went_failed_and_of_no_other() {
    let host = TestHost::failing_create(HypervisorError::permanent("no such image"));
    let provider = start(host.clone(), TestDisk::default()).await;
    create(&provider).await;
    settle().await;
    assert_eq!(state(&provider), MachineState::Failed);
    let told: Vec<String> = host.told_failed().iter().map(ToString::to_string).collect();
    assert_eq!(told, ["m-1"]);

    let host = TestHost::default();
    let provider = start(host.clone(), TestDisk::default()).await;
    create(&provider).await;
    settle().await;
    assert_eq!(state(&provider), MachineState::Idle);
    assert!(host.told_failed().is_empty());
}

#[tokio::test]
async fn a_restart_compensates_a_create_it_interrupted() {
    // The first process accepted the Create, the host made the domain, then the process
    // died before the completion was persisted.
    let (host, store) = (TestHost::default(), TestDisk::default());
    drop(start(host.clone(), store.clone()).await); // first boot seeds m-1
    accepted_on_disk(&store, MutateRequest::Create);
    host.add_domain("m-1");

    let second = start(host.clone(), store).await;
    settle().await;
    assert_eq!(state(&second), MachineState::Failed);
    assert_eq!(
        host.delete_count(),
        1,
        "the restart issues the compensating delete"
    );
    assert_eq!(host.domain_count(), 0);
}

#[tokio::test]
async fn a_restart_finishes_a_delete_it_interrupted() {
    // The first process created m-1, and accepted its Delete; it died before the host had
    // removed the domain. The record comes back Failed with its host: nothing will ever
    // Delete it again, so the restart removes the domain.
    let (host, store) = (TestHost::default(), TestDisk::default());
    let first = start(host.clone(), store.clone()).await;
    create(&first).await;
    settle().await;
    assert_eq!(state(&first), MachineState::Idle);
    drop(first);
    accepted_on_disk(&store, MutateRequest::Delete);
    assert_eq!(host.domain_count(), 1);

    let second = start(host.clone(), store).await;
    settle().await;
    let failed = &second.peek(&Default::default()).machines[0];
    assert_eq!(failed.state, MachineState::Failed);
    assert!(
        failed.has_host(),
        "a failed Delete keeps its host on the record"
    );
    assert_eq!(
        host.domain_count(),
        0,
        "the restart removed what the Delete left"
    );
}
