//! Unit tests of the provider's promise that an accepted operation ends by its deadline,
//! whatever its caller or its worker does: a call dropped while its decision is being
//! committed still runs its transition, a transition whose worker never runs is failed by the
//! deadline sweep, and a failed commit nobody waits for any more is taken back before the next
//! decision is taken on top of it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bigfleet_libvirt_domain::{
    FenceToken, Kind, ListQuery, Machine, MachineState, MutateRequest, Mutation, Policy, Timeouts,
};
use futures::FutureExt;

use crate::testkit::doubles::{TestDisk, TestHost, TestSpawner, TokioClock};
use crate::{BootstrapBlob, Provider, ProviderConfig};

type Subject = Provider<TestHost, TestDisk, TokioClock, TestSpawner>;

const TIMEOUT: Duration = Duration::from_secs(2);

async fn start(host: TestHost, disk: TestDisk, spawner: TestSpawner) -> Subject {
    let config = ProviderConfig {
        policy: Policy {
            timeouts: Timeouts::uniform(TIMEOUT),
            ..Policy::default()
        },
        ..ProviderConfig::default()
    };
    let clock = TokioClock::starting_now();
    Provider::start(config, host, disk, clock, spawner, Vec::new())
        .await
        .expect("start")
}

fn mutation(sequence: i64, request: MutateRequest) -> Mutation {
    Mutation {
        machine_id: "m-1".to_owned(),
        token: FenceToken {
            shard_id: "s".to_owned(),
            epoch: 1,
            sequence,
        },
        request,
    }
}

fn configure() -> MutateRequest {
    MutateRequest::Configure {
        cluster: "c-1".to_owned(),
        shard_metadata: Default::default(),
    }
}

/// Lets `d` pass on the provider's (paused, auto-advancing) clock.
async fn wait(provider: &Subject, d: Duration) {
    provider.sleep_until(provider.now().saturating_add(d)).await;
}

async fn machine(provider: &Subject) -> Arc<Machine> {
    provider.get("m-1").await.expect("get").expect("m-1 exists")
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_its_decision_is_committed_still_runs_its_transition() {
    let host = TestHost::default();
    let disk = TestDisk::slow();
    let provider = start(host.clone(), disk.clone(), TestSpawner::default()).await;
    let steps = [
        (MutateRequest::Create, MachineState::Idle),
        (configure(), MachineState::Configured),
        (
            MutateRequest::Drain {
                grace_period_seconds: 0,
            },
            MachineState::Idle,
        ),
        (MutateRequest::Delete, MachineState::Speculative),
    ];
    for (step, (request, target)) in (1..).zip(steps) {
        let sequence = step * 2;
        disk.set_open(false);
        // The call is decided on its first poll, then waits for the commit: the caller
        // gives up there (its future is dropped), as a client deadline does.
        let call = provider.mutate(
            mutation(sequence, request.clone()),
            BootstrapBlob::default(),
        );
        assert!(
            call.now_or_never().is_none(),
            "the commit is still under way"
        );
        disk.set_open(true);
        wait(&provider, Duration::from_millis(100)).await;
        let ended = machine(&provider).await;
        assert_eq!(
            ended.state, target,
            "step {step}: the dropped call's transition ran ({:?})",
            ended.last_error
        );
        // A retry (a fresh token) is answered from the record: the dropped call's operation
        // was accepted and is on record.
        let replay = provider
            .mutate(mutation(sequence + 1, request), BootstrapBlob::default())
            .await
            .expect("the retry is answered");
        assert!(
            replay.dispatch.is_none(),
            "step {step}: a retry starts nothing"
        );
        assert_eq!(replay.operation_id.as_str(), format!("op-{step}"));
    }
    assert_eq!(
        host.calls(),
        [Kind::Create, Kind::Configure, Kind::Drain, Kind::Delete]
    );
}

#[tokio::test(start_paused = true)]
async fn a_transition_whose_worker_never_runs_fails_at_its_deadline() {
    let host = TestHost::default();
    let spawner = TestSpawner::losing_transitions();
    let provider = start(host.clone(), TestDisk::slow(), spawner).await;
    let ack = provider
        .mutate(mutation(1, MutateRequest::Create), BootstrapBlob::default())
        .await
        .expect("accepted");
    assert_eq!(ack.machine.state, MachineState::Creating);
    wait(&provider, TIMEOUT / 2).await;
    assert_eq!(
        machine(&provider).await.state,
        MachineState::Creating,
        "nothing fails before its deadline"
    );
    wait(
        &provider,
        TIMEOUT / 2 + crate::provider::SWEEP_GRACE + Duration::from_millis(10),
    )
    .await;
    let failed = machine(&provider).await;
    assert_eq!(failed.state, MachineState::Failed);
    assert_eq!(
        failed.last_error,
        "create transition timed out after 2s: context deadline exceeded"
    );
    assert_eq!(
        host.calls(),
        [Kind::Delete],
        "no worker reached the host; only the compensating delete of a failed Create did"
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_starts_after_its_deadline_does_not_touch_the_host() {
    let host = TestHost::default();
    let disk = TestDisk::slow();
    let provider = start(host.clone(), disk.clone(), TestSpawner::default()).await;
    disk.set_open(false);
    let call = provider.mutate(mutation(1, MutateRequest::Create), BootstrapBlob::default());
    assert!(call.now_or_never().is_none());
    // The commit takes longer than the transition's deadline and its grace.
    wait(&provider, TIMEOUT + crate::provider::SWEEP_GRACE * 2).await;
    disk.set_open(true);
    wait(&provider, Duration::from_millis(100)).await;
    let failed = machine(&provider).await;
    assert_eq!(
        failed.state,
        MachineState::Failed,
        "{:?}",
        failed.last_error
    );
    assert!(
        failed.last_error.contains("timed out after 2s"),
        "{:?}",
        failed.last_error
    );
    assert_eq!(
        host.calls(),
        [Kind::Delete],
        "only the compensating delete reached the host"
    );
}

/// The commit of a call whose caller gave up fails, and nobody settles it (the caller would
/// have). The next decision (here a reconcile that finds a new machine) must take that failed
/// decision back before it is taken; taken back beneath it instead, the later rewind of the
/// reconcile would bring the failed decision's revision back, and reads would answer state
/// that is not durable.
#[tokio::test(start_paused = true)]
async fn a_failed_commit_whose_caller_is_gone_is_taken_back_before_the_next_decision() {
    let host = TestHost::default();
    let disk = TestDisk::slow();
    let provider = start(host.clone(), disk.clone(), TestSpawner::default()).await;
    disk.set_open(false);
    let call = provider.mutate(mutation(1, MutateRequest::Create), BootstrapBlob::default());
    assert!(
        call.now_or_never().is_none(),
        "the commit is still under way"
    );
    disk.set_failing(true);
    disk.set_open(true);
    wait(&provider, Duration::from_millis(10)).await;
    host.add_slot("m-2");
    assert!(
        provider.reconcile().await.is_err(),
        "the disk still fails the reconcile's commit"
    );
    disk.set_failing(false);
    let page = provider.list(&ListQuery::default()).await.expect("list");
    assert_eq!(
        page.revision,
        disk.durable().revision,
        "a List answers only durable state"
    );
    assert_eq!(
        machine(&provider).await.state,
        MachineState::Speculative,
        "the Create whose commit failed was taken back"
    );
    assert_eq!(page.machines.len(), 1, "m-2 was never made durable");
}

/// Records, for every event logged, its message and the names of the spans it was logged in
/// (innermost first).
#[derive(Clone, Default)]
struct Scopes(Arc<Mutex<Vec<Seen>>>);

/// An event's message and the names of the spans it was logged in.
type Seen = (String, Vec<String>);

impl<S> tracing_subscriber::Layer<S> for Scopes
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        let spans = ctx
            .event_scope(event)
            .map(|scope| scope.map(|span| span.name().to_owned()).collect())
            .unwrap_or_default();
        self.0.lock().unwrap().push((message.0, spans));
    }
}

/// A transition the sweep fails is failed inside its own transition span, a child of the
/// call's span, so the caller's trace shows why its operation ended (the sweep used to open a
/// new span under its own task's).
///
/// Run in a process of its own: tracing caches each callsite's interest process-wide, and a
/// test thread without a subscriber that reaches a callsite while this test installs its
/// thread's subscriber can leave a span disabled here.
#[test]
fn the_sweep_fails_a_transition_inside_the_calls_trace() {
    let name = "provider::cancel_tests::sweep_span_in_a_process_of_its_own";
    let output = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--ignored", "--exact", name, "--test-threads=1"])
        .output()
        .expect("the test binary runs");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{printed}");
    assert!(
        printed.contains("1 passed"),
        "the inner test ran: {printed}"
    );
}

#[tokio::test(start_paused = true)]
#[ignore = "run by the_sweep_fails_a_transition_inside_the_calls_trace in a process of its own"]
async fn sweep_span_in_a_process_of_its_own() {
    use tracing::Instrument;
    use tracing_subscriber::layer::SubscriberExt;
    let scopes = Scopes::default();
    let subscriber = tracing_subscriber::registry().with(scopes.clone());
    let _default = tracing::subscriber::set_default(subscriber);
    let spawner = TestSpawner::losing_transitions();
    let provider = start(TestHost::default(), TestDisk::slow(), spawner).await;
    provider
        .mutate(mutation(1, MutateRequest::Create), BootstrapBlob::default())
        .instrument(tracing::info_span!("rpc"))
        .await
        .expect("accepted");
    wait(&provider, TIMEOUT + crate::provider::SWEEP_GRACE * 2).await;
    assert_eq!(machine(&provider).await.state, MachineState::Failed);
    let seen = scopes.0.lock().unwrap().clone();
    let (_, spans) = seen
        .iter()
        .find(|(message, _)| message.contains("by its deadline: failing it"))
        .expect("the sweep said it failed the transition");
    assert_eq!(spans, &["transition", "rpc"], "{seen:?}");
}
