//! Unit tests of what reads wait for (issue 37): a Get waits for the newest decision on its
//! machine and no other, a List for the newest decision that moved its revision, and a
//! commit that fails leads both to answer from the last durable state. The disk holds every
//! commit until the test releases it, one at a time, like an fsync that takes as long as the
//! test wants.

use futures::FutureExt;

use bigfleet_libvirt_domain::{Ack, FenceToken, ListQuery, MachineState, MutateRequest, Mutation};

use crate::testkit::doubles::{StoppedClock, TestDisk, TestHost, TestSpawner};
use crate::{BootstrapBlob, Provider, ProviderConfig, ProviderError};

type Subject = Provider<TestHost, TestDisk, StoppedClock, TestSpawner>;

/// A provider over slots m-1, m-2 and m-3 (Creates wait for the test) on a held disk whose
/// first-boot commit was let through.
async fn start() -> (Subject, TestDisk) {
    let disk = TestDisk::held();
    disk.release();
    let host = TestHost::default()
        .with_slot("m-2")
        .with_slot("m-3")
        .gated();
    let provider = Provider::start(
        ProviderConfig::default(),
        host,
        disk.clone(),
        StoppedClock::short_waits_only(),
        TestSpawner::default(),
        Vec::new(),
    )
    .await
    .expect("start");
    assert_eq!(disk.held_count(), 1, "the first-boot commit");
    (provider, disk)
}

fn create(id: &str) -> Mutation {
    Mutation {
        machine_id: id.to_owned(),
        token: FenceToken {
            shard_id: "s".to_owned(),
            epoch: 1,
            sequence: 1,
        },
        request: MutateRequest::Create,
    }
}

/// Runs `work` as a task of its own, so the test can look at the provider while it waits.
// The tests' own task, as the Spawner double's: what is tested is that it waits.
#[allow(clippy::disallowed_methods)]
fn task<T: Send + 'static>(
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    tokio::spawn(work)
}

async fn run_tasks() {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
}

/// Sends a Create of `id` and lets it run until its commit is made (and held).
async fn create_held(
    provider: &Subject,
    id: &str,
) -> tokio::task::JoinHandle<Result<Ack, ProviderError>> {
    let provider = provider.clone();
    let mutation = create(id);
    let call = task(async move { provider.mutate(mutation, BootstrapBlob::default()).await });
    run_tasks().await;
    assert!(!call.is_finished(), "the Create waits for its held commit");
    call
}

fn state_now(provider: &Subject, id: &str) -> MachineState {
    let answer = provider
        .get(id)
        .now_or_never()
        .unwrap_or_else(|| panic!("a Get of {id} answers at once"))
        .expect("get")
        .expect("the machine exists");
    answer.state
}

#[tokio::test]
async fn a_get_of_an_untouched_machine_answers_while_another_machines_commit_is_pending() {
    let (provider, disk) = start().await;
    let call = create_held(&provider, "m-1").await;
    assert_eq!(disk.held_count(), 2, "the Create's commit is made");
    // m-2's newest decision (the seed) is durable: nothing to wait for.
    assert_eq!(state_now(&provider, "m-2"), MachineState::Speculative);
    // So is an id no decision ever wrote.
    let unknown = provider.get("m-9").now_or_never();
    assert!(
        matches!(unknown, Some(Ok(None))),
        "a Get of an unknown id answers at once: {unknown:?}"
    );
    assert!(
        !call.is_finished(),
        "the other machine's commit is still held"
    );
    disk.release();
    call.await.expect("join").expect("acknowledged");
}

#[tokio::test]
async fn a_get_of_a_machine_whose_decision_is_pending_waits_for_that_decision_only() {
    let (provider, disk) = start().await;
    let first = create_held(&provider, "m-1").await;
    let second = create_held(&provider, "m-2").await;
    let reader = provider.clone();
    let get = task(async move { reader.get("m-1").await });
    run_tasks().await;
    assert!(!get.is_finished(), "m-1's Create is not durable yet");
    // m-1's commit (the older one) completes; m-2's is still held: the Get of m-1 answers.
    disk.release();
    run_tasks().await;
    assert!(get.is_finished(), "m-1's decision is durable");
    let m1 = get.await.expect("join").expect("get").expect("exists");
    assert_eq!(m1.state, MachineState::Creating);
    first.await.expect("join").expect("acknowledged");
    assert!(!second.is_finished(), "m-2's commit is still held");
    assert_eq!(state_now(&provider, "m-1"), MachineState::Creating);
    // A Get of m-2 waits for m-2's.
    let reader = provider.clone();
    let get = task(async move { reader.get("m-2").await });
    run_tasks().await;
    assert!(!get.is_finished(), "m-2's Create is not durable yet");
    disk.release();
    let m2 = get.await.expect("join").expect("get").expect("exists");
    assert_eq!(m2.state, MachineState::Creating);
    second.await.expect("join").expect("acknowledged");
}

#[tokio::test]
async fn a_list_waits_for_the_decision_that_moved_its_revision_and_no_later_one() {
    let (provider, disk) = start().await;
    let before = provider.peek(&ListQuery::default()).revision;
    // A change set without records (the readiness probe's) moves no revision: a List does
    // not wait for it.
    let prober = provider.clone();
    let probe = task(async move { prober.probe_store().await });
    run_tasks().await;
    assert_eq!(disk.held_count(), 2, "the probe's commit is made");
    let page = provider
        .list(&ListQuery::default())
        .now_or_never()
        .expect("a List answers at once when no pending decision moved the revision")
        .expect("list");
    assert_eq!(page.revision, before);
    // A Create moves it; a probe behind it does not change what the List waits for.
    let call = create_held(&provider, "m-1").await;
    let prober = provider.clone();
    let second_probe = task(async move { prober.probe_store().await });
    run_tasks().await;
    let lister = provider.clone();
    let list = task(async move { lister.list(&ListQuery::default()).await });
    run_tasks().await;
    disk.release();
    run_tasks().await;
    assert!(!list.is_finished(), "the Create's commit is still held");
    probe
        .await
        .expect("join")
        .expect("the first probe is durable");
    disk.release();
    run_tasks().await;
    assert!(list.is_finished(), "the Create's commit is durable");
    assert!(
        !second_probe.is_finished(),
        "the second probe is still held"
    );
    let page = list.await.expect("join").expect("list");
    assert!(page.revision > before, "the Create moved the revision");
    let m1 = page.machines.iter().find(|m| m.id.as_str() == "m-1");
    assert_eq!(m1.map(|m| m.state), Some(MachineState::Creating));
    call.await.expect("join").expect("acknowledged");
    disk.release();
    second_probe.await.expect("join").expect("durable");
}

#[tokio::test]
async fn reads_waiting_for_a_commit_that_fails_answer_from_the_durable_state() {
    let (provider, disk) = start().await;
    let before = provider.peek(&ListQuery::default()).revision;
    let call = create_held(&provider, "m-1").await;
    let reader = provider.clone();
    let get = task(async move { reader.get("m-1").await });
    let lister = provider.clone();
    let list = task(async move { lister.list(&ListQuery::default()).await });
    run_tasks().await;
    assert!(!get.is_finished() && !list.is_finished());
    disk.set_failing(true);
    disk.release();
    let m1 = get.await.expect("join").expect("get").expect("exists");
    assert_eq!(m1.state, MachineState::Speculative, "the durable record");
    let page = list.await.expect("join").expect("list");
    assert_eq!(page.revision, before, "the durable revision");
    assert!(
        page.machines
            .iter()
            .all(|m| m.state == MachineState::Speculative)
    );
    let refused = call.await.expect("join");
    assert!(
        matches!(refused, Err(ProviderError::Store(_))),
        "{refused:?}"
    );
    // What the failed commit made reads wait for is gone with it: with another machine's
    // decision held, m-1 answers at once, from the durable state.
    disk.set_failing(false);
    let other = create_held(&provider, "m-2").await;
    assert_eq!(state_now(&provider, "m-1"), MachineState::Speculative);
    disk.release();
    other.await.expect("join").expect("acknowledged");
    assert_eq!(state_now(&provider, "m-2"), MachineState::Creating);
}
