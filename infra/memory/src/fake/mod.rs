//! The in-memory fake hypervisor: how a new user tries the provider in one command and how
//! the conformance suite runs without credentials.
//!
//! Every call completes after a small random delay drawn from a seeded PRNG on the `Clock`
//! port, so runs are reproducible. With fault hooks on (`--fake-fault-hooks`) the fake
//! honours the conformance selectors: slots labelled `conformance.fault/create=error` fail
//! Create, and the Configure cluster ids `fault-error`, `fault-timeout`, `fault-slow-ok`,
//! `fault-drain-error` and `fault-readiness-block` fail, hang, finish late, poison the next
//! Drain, or hold the readiness gate.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bigfleet_libvirt_domain::{HostRef, Machine, MachineId, MachineState};
use bigfleet_libvirt_ports::{
    Clock, ConfigureRequest, CreateRequest, Created, DeleteRequest, DomainRef, DrainRequest,
    Hypervisor, HypervisorError, ReadinessRequest,
};
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use bigfleet_libvirt_config::naming::domain_name;

/// The label that marks a slot whose Create fails when fault hooks are on.
pub const CREATE_FAULT_LABEL: &str = "conformance.fault/create";

/// How the fake behaves.
#[derive(Clone, Debug)]
pub struct FakeConfig {
    /// The provider label stamped on host refs.
    pub provider: String,
    /// The slots the fake offers (all Speculative).
    pub slots: Vec<Machine>,
    /// Shortest simulated call latency.
    pub delay_min: Duration,
    /// Longest simulated call latency.
    pub delay_max: Duration,
    /// Seed of the latency PRNG.
    pub seed: u64,
    /// Whether the conformance fault selectors are honoured.
    pub fault_hooks: bool,
    /// How long `fault-slow-ok` takes: past any transition deadline.
    pub slow_ok_delay: Duration,
}

#[derive(Clone, Debug)]
struct FakeDomain {
    name: String,
    zone: String,
    running: bool,
    cluster: String,
    drain_fault: bool,
}

#[derive(Debug)]
struct FakeState {
    rng: Xoshiro256PlusPlus,
    domains: BTreeMap<MachineId, FakeDomain>,
}

/// An in-memory hypervisor with seeded latency and optional fault hooks.
#[derive(Clone, Debug)]
pub struct FakeHypervisor<C> {
    clock: C,
    config: Arc<FakeConfig>,
    state: Arc<Mutex<FakeState>>,
}

impl<C: Clock> FakeHypervisor<C> {
    /// A fake with no domains yet.
    #[must_use]
    pub fn new(config: FakeConfig, clock: C) -> Self {
        let state = FakeState {
            rng: Xoshiro256PlusPlus::seed_from_u64(config.seed),
            domains: BTreeMap::new(),
        };
        Self {
            clock,
            config: Arc::new(config),
            state: Arc::new(Mutex::new(state)),
        }
    }

    /// How many domains exist (for tests).
    #[must_use]
    pub fn domain_count(&self) -> usize {
        self.state().domains.len()
    }

    /// The name of the domain the fake holds for `id`, running or not (for tests).
    #[must_use]
    pub fn domain_of(&self, id: &MachineId) -> Option<String> {
        self.state().domains.get(id).map(|d| d.name.clone())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sleeps a seeded random latency in [delay_min, delay_max].
    fn latency(&self) -> impl Future<Output = ()> + Send + 'static {
        let (min, max) = (self.config.delay_min, self.config.delay_max);
        let span = u64::try_from(max.saturating_sub(min).as_nanos()).unwrap_or(u64::MAX);
        let jitter = if span == 0 {
            0
        } else {
            self.state().rng.next_u64() % (span + 1)
        };
        let deadline = self
            .clock
            .now()
            .saturating_add(min + Duration::from_nanos(jitter));
        self.clock.sleep_until(deadline)
    }

    fn fault(&self, selector: &str, cluster: &str) -> bool {
        self.config.fault_hooks && cluster == selector
    }

    fn host(&self, domain: &FakeDomain) -> HostRef {
        DomainRef::new(domain.zone.as_str(), domain.name.as_str()).host_ref(&self.config.provider)
    }

    fn with_domain<T>(
        &self,
        machine: &Machine,
        verb: &str,
        f: impl FnOnce(&mut FakeDomain) -> Result<T, HypervisorError>,
    ) -> Result<T, HypervisorError> {
        let mut state = self.state();
        let Some(domain) = state.domains.get_mut(&machine.id) else {
            return Err(HypervisorError::permanent(format!(
                "fake: {verb} of machine {} found no domain",
                machine.id
            )));
        };
        f(domain)
    }
}

fn injected(what: &str) -> HypervisorError {
    HypervisorError::permanent(format!("injected error: {what} fault hook"))
}

impl<C: Clock> Hypervisor for FakeHypervisor<C> {
    fn describe(&self) -> impl Future<Output = Result<Vec<Machine>, HypervisorError>> + Send {
        let state = self.state();
        let described = self
            .config
            .slots
            .iter()
            .map(|slot| {
                let mut machine = slot.clone();
                if let Some(domain) = state.domains.get(&slot.id).filter(|d| d.running) {
                    machine.state = MachineState::Idle;
                    machine.host = Some(self.host(domain));
                }
                machine
            })
            .collect();
        std::future::ready(Ok(described))
    }

    async fn create(&self, request: CreateRequest) -> Result<Created, HypervisorError> {
        self.latency().await;
        let machine = &request.machine;
        let faulty = machine
            .labels
            .get(CREATE_FAULT_LABEL)
            .is_some_and(|v| v == "error");
        if self.config.fault_hooks && faulty {
            return Err(injected("create"));
        }
        let mut state = self.state();
        let domain = state
            .domains
            .entry(machine.id.clone())
            .or_insert_with(|| FakeDomain {
                name: domain_name(&self.config.provider, machine.id.as_str()),
                zone: machine.zone.clone(),
                running: true,
                cluster: String::new(),
                drain_fault: false,
            });
        domain.running = true;
        let host = self.host(domain);
        Ok(Created {
            host,
            resources: None,
            allocatable: None,
        })
    }

    async fn configure(&self, request: ConfigureRequest) -> Result<(), HypervisorError> {
        self.latency().await;
        let cluster = request.cluster_id.as_str();
        if self.fault("fault-error", cluster) {
            return Err(injected("configure"));
        }
        if self.fault("fault-timeout", cluster) {
            // Hang until the provider's deadline drops this future.
            std::future::pending::<()>().await;
        }
        if self.fault("fault-slow-ok", cluster) {
            let done = self.clock.now().saturating_add(self.config.slow_ok_delay);
            self.clock.sleep_until(done).await;
        }
        let drain_fault = self.fault("fault-drain-error", cluster);
        self.with_domain(&request.machine, "configure", |domain| {
            domain.cluster = request.cluster_id.clone();
            domain.drain_fault = drain_fault;
            Ok(())
        })
    }

    async fn confirm_node_ready(&self, request: ReadinessRequest) -> Result<(), HypervisorError> {
        if self.fault("fault-readiness-block", &request.cluster_id) {
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    fn readiness_gate(&self) -> bool {
        // The fake's nodes are "Ready" as soon as bootstrap returns; only the fault hook
        // holds the gate.
        true
    }

    async fn drain(&self, request: DrainRequest) -> Result<(), HypervisorError> {
        self.latency().await;
        self.with_domain(&request.machine, "drain", |domain| {
            if domain.drain_fault {
                return Err(injected("drain"));
            }
            domain.cluster.clear();
            Ok(())
        })
    }

    async fn delete(&self, request: DeleteRequest) -> Result<(), HypervisorError> {
        self.latency().await;
        self.state().domains.remove(&request.machine.id);
        Ok(())
    }

    /// The restore hand-off: re-creates the domains of machines restored from durable state, so a restart of the
    /// fake (which keeps no state of its own) can still configure, drain and delete them.
    /// Machines without a host have no domain.
    fn restored(&self, machines: &[Arc<Machine>]) {
        let mut state = self.state();
        for machine in machines {
            let Some(host) = machine.host.as_ref().filter(|h| h.is_set()) else {
                continue;
            };
            // A reference of another form (no zone) names the domain alone.
            let DomainRef { zone, name } = host
                .reference
                .parse()
                .unwrap_or_else(|_| DomainRef::new("", host.reference.as_str()));
            state
                .domains
                .entry(machine.id.clone())
                .or_insert_with(|| FakeDomain {
                    name,
                    zone,
                    running: true,
                    cluster: machine.cluster.clone(),
                    drain_fault: false,
                });
        }
    }
}

#[cfg(test)]
mod contract_tests;
