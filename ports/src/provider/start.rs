//! Starting the provider: loading durable state, seeding an empty store from the
//! hypervisor on first boot (under the seed timeout) or failing the transitions a restart
//! interrupted, persisting what start-up decided, then the deadline sweep and the start-up
//! half of the compensation.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use bigfleet_libvirt_domain::{Core, ListRotation};
use futures::FutureExt;
use futures::channel::mpsc;
use tracing::{Instrument, info, info_span};

use super::deadlines::sweep_deadlines;
use super::rewind::settled;
use super::{Guarded, Inner, Observer, Provider, ProviderConfig, StartError};
use crate::clock::Clock;
use crate::hypervisor::Hypervisor;
use crate::spawn::Spawner;
use crate::store::StateStore;

impl<H: Hypervisor, S: StateStore, C: Clock, E: Spawner> Provider<H, S, C, E> {
    /// Loads durable state (seeding from the hypervisor on first boot, failing interrupted
    /// transitions after a restart) and returns a provider ready to serve, which tells
    /// `observers` about every transition it finishes.
    ///
    /// # Errors
    /// When the store cannot be read or committed, or first-boot seeding fails.
    pub async fn start(
        config: ProviderConfig,
        hypervisor: H,
        store: S,
        clock: C,
        spawner: E,
        observers: Vec<Observer>,
    ) -> Result<Self, StartError> {
        let snapshot = store.load().await?;
        let (core, changes) = if snapshot.is_fresh() {
            let deadline = clock.now().saturating_add(config.seed_timeout);
            let described = futures::select_biased! {
                described = hypervisor.describe().fuse() => described.map_err(StartError::Describe)?,
                () = clock.sleep_until(deadline).fuse() =>
                    return Err(StartError::DescribeTimedOut(config.seed_timeout)),
            };
            let (core, changes) = Core::seed(config.policy, described)?;
            info!(
                machines = core.len(),
                "seeded an empty store from the hypervisor"
            );
            (core, Some(changes))
        } else {
            let (core, changes) = Core::restore(config.policy, snapshot)?;
            let failed = changes.as_ref().map_or(0, |c| c.machines.len());
            info!(
                machines = core.len(),
                interrupted = failed,
                "restored durable state"
            );
            (core, changes)
        };
        if let Some(changes) = changes {
            store.commit(changes).await.map_err(StartError::Persist)?;
        }
        let guarded = Guarded::durable(core);
        let (sweep_wake, woken) = mpsc::channel(1);
        let inner = Inner {
            core: Mutex::new(guarded),
            store_status: Mutex::default(),
            hypervisor: Arc::new(hypervisor),
            store,
            clock,
            spawner,
            observers,
            sweep_wake,
        };
        let provider = Self {
            inner: Arc::new(inner),
        };
        let sweep = sweep_deadlines(Arc::downgrade(&provider.inner), woken);
        // Injected bug (simulator bug hunt only, with the one in `mutate`): no sweep, so
        // nothing but a restart ends a transition whose worker never started.
        if !cfg!(feature = "bug-transition-after-commit") {
            provider.inner.spawner.spawn(
                "deadline-sweep",
                sweep.instrument(info_span!("deadline_sweep")),
            );
        }
        provider.compensate_failed();
        Ok(provider)
    }
}

impl Guarded {
    /// A core whose whole state is durable: nothing pending, nothing to wait for.
    fn durable(core: Core) -> Self {
        Self {
            core,
            last_commit: settled(),
            next_seq: 0,
            machine_commits: BTreeMap::new(),
            revision_commit: None,
            rotation: ListRotation::default(),
            pending: VecDeque::new(),
            deadlines: BTreeMap::new(),
        }
    }
}
