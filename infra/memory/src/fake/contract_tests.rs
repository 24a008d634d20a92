//! The fake hypervisor (bare, and inside the instrumentation decorator the binary wraps
//! every hypervisor in) against the shared `Hypervisor` contract suites, and a deliberately
//! broken wrapper the suite must reject (so the suite is known to have teeth).

use std::time::Duration;

use bigfleet_libvirt_domain::Machine;
use bigfleet_libvirt_ports::testkit::{
    HypervisorCaps, Residue, failed_create_contract, hypervisor_contract, speculative,
};
use bigfleet_libvirt_ports::{
    ConfigureRequest, CreateRequest, Created, DeleteRequest, DrainRequest, Hypervisor,
    HypervisorError,
};
use futures::FutureExt;

use super::{CREATE_FAULT_LABEL, FakeConfig, FakeHypervisor};
use bigfleet_libvirt_observe::instrumented::ApiMetrics;
use bigfleet_libvirt_observe::instrumented::InstrumentedHypervisor;
use bigfleet_libvirt_system::SystemClock;

/// Four open slots, the last one labelled to fail Create (fault hooks are on).
fn fake() -> FakeHypervisor<SystemClock> {
    let mut slots: Vec<Machine> = (0..4).map(|i| speculative(&format!("m-{i}"))).collect();
    slots[3]
        .labels
        .insert(CREATE_FAULT_LABEL.to_owned(), "error".to_owned());
    let config = FakeConfig {
        provider: "contract".to_owned(),
        slots,
        delay_min: Duration::from_millis(1),
        delay_max: Duration::from_millis(3),
        seed: 7,
        fault_hooks: true,
        slow_ok_delay: Duration::from_secs(60),
    };
    FakeHypervisor::new(config, SystemClock)
}

/// The fake's substrate: the domain it holds for a machine, if any.
fn residue(fake: &FakeHypervisor<SystemClock>) -> Residue {
    let fake = fake.clone();
    Box::new(move |machine| {
        let held = fake.domain_of(&machine.id).into_iter().collect();
        std::future::ready(held).boxed()
    })
}

const CAPS: HypervisorCaps = HypervisorCaps { bootstrap: true };

#[tokio::test]
async fn the_fake_passes_the_hypervisor_contract() {
    let fake = fake();
    hypervisor_contract(&fake, CAPS, &residue(&fake)).await;
}

#[tokio::test]
async fn the_instrumented_fake_passes_the_hypervisor_contract() {
    // As the binary wires it: the metrics and spans decorator must keep the contract.
    let fake = fake();
    let wrapped = InstrumentedHypervisor::new(fake.clone(), ApiMetrics::unexposed());
    hypervisor_contract(&wrapped, CAPS, &residue(&fake)).await;
}

#[tokio::test]
async fn a_failed_fake_create_leaves_nothing_behind() {
    let fake = fake();
    let slots = fake.describe().await.unwrap();
    let error = failed_create_contract(&fake, &residue(&fake), &slots[3]).await;
    assert!(error.message.contains("fault hook"), "{}", error.message);
}

/// The fake with one bug: a Delete without a host ref (the compensating Delete of a failed
/// Create) fails instead of succeeding.
struct HostlessDeleteFails(FakeHypervisor<SystemClock>);

impl Hypervisor for HostlessDeleteFails {
    fn describe(
        &self,
    ) -> impl std::future::Future<Output = Result<Vec<Machine>, HypervisorError>> + Send {
        self.0.describe()
    }

    async fn create(&self, request: CreateRequest) -> Result<Created, HypervisorError> {
        self.0.create(request).await
    }

    async fn configure(&self, request: ConfigureRequest) -> Result<(), HypervisorError> {
        self.0.configure(request).await
    }

    async fn drain(&self, request: DrainRequest) -> Result<(), HypervisorError> {
        self.0.drain(request).await
    }

    async fn delete(&self, request: DeleteRequest) -> Result<(), HypervisorError> {
        if request.machine.host.is_none() {
            return Err(HypervisorError::permanent("no host ref, no domain"));
        }
        self.0.delete(request).await
    }
}

#[tokio::test]
#[should_panic(expected = "delete of a machine that was never created")]
async fn the_contract_rejects_a_hypervisor_whose_hostless_delete_fails() {
    let fake = fake();
    let probe = residue(&fake);
    hypervisor_contract(&HostlessDeleteFails(fake), CAPS, &probe).await;
}

/// The fake with another bug: a Create of a slot labelled to fail makes the domain first,
/// then reports the failure without rolling back.
struct LeakyFailedCreate(FakeHypervisor<SystemClock>);

impl Hypervisor for LeakyFailedCreate {
    fn describe(
        &self,
    ) -> impl std::future::Future<Output = Result<Vec<Machine>, HypervisorError>> + Send {
        self.0.describe()
    }

    async fn create(&self, request: CreateRequest) -> Result<Created, HypervisorError> {
        let mut machine = Machine::clone(&request.machine);
        if machine.labels.remove(CREATE_FAULT_LABEL).is_none() {
            return self.0.create(request).await;
        }
        let unlabelled = CreateRequest {
            machine: std::sync::Arc::new(machine),
            ..request
        };
        self.0.create(unlabelled).await?;
        Err(HypervisorError::permanent("failed after making the domain"))
    }

    async fn configure(&self, request: ConfigureRequest) -> Result<(), HypervisorError> {
        self.0.configure(request).await
    }

    async fn drain(&self, request: DrainRequest) -> Result<(), HypervisorError> {
        self.0.drain(request).await
    }

    async fn delete(&self, request: DeleteRequest) -> Result<(), HypervisorError> {
        self.0.delete(request).await
    }
}

#[tokio::test]
#[should_panic(expected = "a failed create must leave nothing behind")]
async fn the_failed_create_contract_rejects_a_create_that_fails_without_rolling_back() {
    let fake = fake();
    let slots = fake.describe().await.unwrap();
    let probe = residue(&fake);
    failed_create_contract(&LeakyFailedCreate(fake), &probe, &slots[3]).await;
}
