//! Unit tests of the Create compensation: a Create whose effect is unknown is followed by a
//! delete of its domain, one that provably changed nothing is not, and a restart
//! compensates interrupted Creates. Time is a clock whose timers fire at once, so backoff
//! and deadlines cost nothing.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};

use bigfleet_libvirt_domain::{
    Core, FenceToken, HostRef, Machine, MachineId, MachineState, MutateRequest, Mutation, Timestamp,
};

use crate::testkit::doubles::{StoppedClock, TestDisk, TestSpawner};
use crate::testkit::speculative;
use crate::{
    BootstrapBlob, ConfigureRequest, CreateRequest, Created, DeleteRequest, DrainRequest,
    Hypervisor, HypervisorError, Provider, ProviderConfig,
};

/// A host that records domains by machine id; `create` answers as `create_answer` says.
#[derive(Clone, Default)]
struct Host {
    domains: Arc<Mutex<BTreeSet<MachineId>>>,
    deletes: Arc<Mutex<u32>>,
    create_answer: Option<HypervisorError>,
}

impl Host {
    fn failing_create(error: HypervisorError) -> Self {
        Self {
            create_answer: Some(error),
            ..Self::default()
        }
    }

    fn domain_count(&self) -> usize {
        self.domains.lock().unwrap().len()
    }

    fn delete_count(&self) -> u32 {
        *self.deletes.lock().unwrap()
    }
}

impl Hypervisor for Host {
    fn describe(&self) -> impl Future<Output = Result<Vec<Machine>, HypervisorError>> + Send {
        std::future::ready(Ok(vec![speculative("m-1")]))
    }

    async fn create(&self, request: CreateRequest) -> Result<Created, HypervisorError> {
        let error = self.create_answer.clone();
        // An indefinite error models a lost reply: the domain exists all the same.
        if error
            .as_ref()
            .is_none_or(|e| e.side_effects != crate::SideEffects::None)
        {
            self.domains
                .lock()
                .unwrap()
                .insert(request.machine.id.clone());
        }
        match error {
            Some(error) => Err(error),
            None => Ok(Created {
                host: HostRef {
                    provider: "test".to_owned(),
                    reference: format!("zone-a/{}", request.machine.id),
                },
                resources: None,
                allocatable: None,
            }),
        }
    }

    async fn configure(&self, _: ConfigureRequest) -> Result<(), HypervisorError> {
        Ok(())
    }

    async fn drain(&self, _: DrainRequest) -> Result<(), HypervisorError> {
        Ok(())
    }

    async fn delete(&self, request: DeleteRequest) -> Result<(), HypervisorError> {
        *self.deletes.lock().unwrap() += 1;
        self.domains.lock().unwrap().remove(&request.machine.id);
        Ok(())
    }
}

async fn start(host: Host, store: TestDisk) -> Provider<Host, TestDisk, StoppedClock, TestSpawner> {
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

async fn create(provider: &Provider<Host, TestDisk, StoppedClock, TestSpawner>) {
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

fn state(provider: &Provider<Host, TestDisk, StoppedClock, TestSpawner>) -> MachineState {
    provider.peek(&Default::default()).machines[0].state
}

#[tokio::test]
async fn a_create_whose_reply_was_lost_is_followed_by_a_delete_of_its_domain() {
    let host = Host::failing_create(HypervisorError::indefinite("reply lost"));
    let provider = start(host.clone(), TestDisk::default()).await;
    create(&provider).await;
    settle().await;
    assert_eq!(state(&provider), MachineState::Failed);
    assert_eq!(host.delete_count(), 1, "one compensating delete");
    assert_eq!(host.domain_count(), 0, "no domain left behind");
}

#[tokio::test]
async fn a_create_that_changed_nothing_is_not_compensated() {
    let host = Host::failing_create(HypervisorError::permanent("no such image"));
    let provider = start(host.clone(), TestDisk::default()).await;
    create(&provider).await;
    settle().await;
    assert_eq!(state(&provider), MachineState::Failed);
    assert_eq!(host.delete_count(), 0);
}

#[tokio::test]
async fn a_successful_create_is_not_compensated() {
    let host = Host::default();
    let provider = start(host.clone(), TestDisk::default()).await;
    create(&provider).await;
    settle().await;
    assert_eq!(state(&provider), MachineState::Idle);
    assert_eq!((host.delete_count(), host.domain_count()), (0, 1));
}

#[tokio::test]
async fn a_restart_compensates_a_create_it_interrupted() {
    // The first process accepted the Create, the host made the domain, then the process
    // died before the completion was persisted.
    let (host, store) = (Host::default(), TestDisk::default());
    drop(start(host.clone(), store.clone()).await); // first boot seeds m-1
    let snapshot = store.durable();
    let (mut core, _) = Core::restore(ProviderConfig::default().policy, snapshot).expect("restore");
    let mutation = Mutation {
        machine_id: "m-1".to_owned(),
        token: FenceToken::default(),
        request: MutateRequest::Create,
    };
    let changes = core
        .mutate(mutation, Timestamp(1))
        .changes
        .expect("accepted");
    store.apply(&changes);
    host.domains
        .lock()
        .unwrap()
        .insert(MachineId::new("m-1").unwrap());

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
