//! [`assemble`], the adapter-level composition root shared by the binary, the simulator and
//! the benchmarks: the provider built from its settings and raw adapters, the hypervisor
//! instrumented, the transition observers attached and the restored machines handed back.
//! Nothing here parses flags, reads the environment or serves.

use std::sync::Arc;

use bigfleet_libvirt_domain::MachineState;
use bigfleet_libvirt_observe::instrumented::InstrumentedHypervisor;
use bigfleet_libvirt_ports::{
    Clock, Hypervisor, Observer, Provider, ProviderConfig, Spawner, StartError, StateStore,
    TransitionEvent,
};
use tracing::warn;

use crate::metrics::{KindLabels, Metrics, ProviderMetrics, TransitionLabels};

/// What [`assemble`] builds the provider from: the raw adapters (the hypervisor not yet
/// instrumented), the provider's settings, the metrics registry the series go to, and
/// whoever else is told about finished transitions.
pub struct Parts<H, S, C, E> {
    /// The provider's settings.
    pub config: ProviderConfig,
    /// The backend, as its adapter built it.
    pub hypervisor: H,
    /// The state store.
    pub store: S,
    /// The clock the provider runs on.
    pub clock: C,
    /// Where the provider's tasks run.
    pub spawner: E,
    /// Where the hypervisor calls and finished transitions are counted.
    pub metrics: Metrics,
    /// Told about every finished transition, after the metrics (a benchmark's timer, say).
    pub observers: Vec<Observer>,
}

/// The provider [`assemble`] returns: over the instrumented hypervisor.
pub type Assembled<H, S, C, E> = Provider<InstrumentedHypervisor<H>, S, C, E>;

/// The adapter-level composition root, which every builder of the provider calls (the
/// binary through [`run`](crate::run), the simulator and the benchmarks directly): wraps the
/// hypervisor in the [`InstrumentedHypervisor`] metrics decorator, starts the provider with
/// the transition metrics and `parts.observers` as its observers, and hands the machines it
/// started with back to the hypervisor ([`Hypervisor::restored`]: the fake re-creates their
/// domains, libvirt tracks them for drift and orphan checks).
///
/// # Errors
/// When durable state cannot be loaded or first-boot seeding fails.
pub async fn assemble<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    parts: Parts<H, S, C, E>,
) -> Result<Assembled<H, S, C, E>, StartError> {
    let Parts {
        config,
        hypervisor,
        store,
        clock,
        spawner,
        metrics,
        observers,
    } = parts;
    let hypervisor = InstrumentedHypervisor::new(hypervisor, metrics.api.clone());
    let metrics_timeline = metrics.timeline.clone();
    let counted: Observer = Arc::new(move |event: &TransitionEvent| {
        record_transition(&metrics.provider, event);
    });
    let timeline = crate::timeline::observer(clock.clone(), &metrics_timeline);
    let observers = [counted, timeline].into_iter().chain(observers).collect();
    let provider = Provider::start(config, hypervisor, store, clock, spawner, observers).await?;
    crate::timeline::track(&provider, &metrics_timeline);
    if !provider.readiness_gate() {
        warn!(
            "the hypervisor cannot observe node readiness: Configured is reported when bootstrap returns"
        );
    }
    provider.hand_off_restored();
    Ok(provider)
}

fn record_transition(metrics: &ProviderMetrics, event: &TransitionEvent) {
    let outcome = match &event.machine {
        Some(m) if m.state == MachineState::Failed => "failed",
        Some(_) => "success",
        None => "dropped",
    };
    let kind = event.kind.name().to_owned();
    let labels = TransitionLabels {
        kind: kind.clone(),
        outcome: outcome.to_owned(),
    };
    metrics.transitions.get_or_create(&labels).inc();
    if event.machine.is_some() {
        let seconds = event.elapsed.as_secs_f64();
        metrics
            .transition_duration
            .get_or_create(&KindLabels { kind })
            .observe(seconds);
    }
}
