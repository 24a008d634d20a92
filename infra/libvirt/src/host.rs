//! One libvirt host (zone): its connection, its health, and how blocking calls reach it.
//!
//! libvirt's API is blocking, so every call runs on tokio's blocking pool, behind the
//! host's lanes (`lanes`: the per-host budget, `--host-budget`, and who goes next), which
//! bound how many calls one host has in flight (docs/design.md §5.3). A
//! dropped future never cuts a call short: the closure runs to completion on its thread and
//! its slot is released when it really ends, so a deadline can never leave a half-made
//! domain behind a call that "returned". Each host is isolated: its own connection, its own
//! lanes and its own supervisor task, so a dead host fails its own calls fast (no waiting
//! for a slot or a dial) and never holds up another host.
//!
//! The supervisor dials, enables libvirt keepalive (driven by libvirt's default event loop
//! on one dedicated thread), probes liveness periodically, and after a loss reconnects with
//! jittered backoff. Health is `connecting`, `healthy` or `unreachable`, exported as the
//! one-hot gauge `bigfleet_libvirt_host_health{zone,state}`.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use bigfleet_libvirt_ports::{Clock, HypervisorError};
use futures::FutureExt;
use tokio::sync::{Notify, watch};
use tracing::{info, warn};
use virt::connect::Connect;

use super::backoff::Backoff;
use super::capacity::{Ledger, Node};
use super::error::{is_unsupported, maybe_done, nothing_done, text};
use super::golden::{self, GoldenImage};
use super::lane_metrics::LaneMetrics;
use super::lanes::{Budget, Lane, Lanes};
use super::volumes::BaseImage;
use crate::metrics::{HostLabels, LibvirtMetrics};

/// How hosts are connected to and watched.
#[derive(Clone, Debug)]
pub struct HostPolicy {
    /// libvirt keepalive interval in seconds (`virConnectSetKeepAlive`).
    pub keepalive_interval: i32,
    /// Unanswered keepalives before libvirt closes the connection.
    pub keepalive_count: u32,
    /// How often a healthy connection is probed.
    pub probe_interval: Duration,
    /// How long a probe may take before the host counts as unreachable.
    pub probe_timeout: Duration,
    /// First reconnect wait.
    pub backoff_min: Duration,
    /// Longest reconnect wait.
    pub backoff_max: Duration,
    /// How often the drift watch polls the state of our domains (zero = off).
    pub watch_interval: Duration,
}

impl Default for HostPolicy {
    fn default() -> Self {
        Self {
            keepalive_interval: 5,
            keepalive_count: 3,
            probe_interval: Duration::from_secs(15),
            probe_timeout: Duration::from_secs(30),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            watch_interval: Duration::from_secs(2),
        }
    }
}

/// A host's connection state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// A dial is in progress.
    Connecting,
    /// Connected and answering.
    Healthy,
    /// The last dial failed or the connection was lost; a reconnect is scheduled.
    Unreachable,
}

impl Health {
    /// The metric label value.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Health::Connecting => "connecting",
            Health::Healthy => "healthy",
            Health::Unreachable => "unreachable",
        }
    }
}

/// One open connection. Replaced wholesale on reconnect; calls in flight keep the old one
/// alive until they return.
pub(crate) struct Session {
    pub(crate) conn: Connect,
    pub(crate) generation: u64,
    /// libvirt's `test` driver: in memory, cannot upload volume contents.
    pub(crate) test_driver: bool,
    /// The base image facts, read once per connection.
    pub(crate) base: Mutex<Option<BaseImage>>,
}

struct Slot {
    session: Option<Arc<Session>>,
    generation: u64,
    last_error: String,
}

/// One libvirt host.
pub(crate) struct Host {
    pub(crate) zone: String,
    uri: String,
    policy: HostPolicy,
    lanes: Arc<Lanes>,
    slot: Mutex<Slot>,
    health: watch::Sender<Health>,
    wake: Arc<Notify>,
    metrics: LibvirtMetrics,
    pub(crate) ledger: Mutex<Ledger>,
    /// Domain names whose create or delete sequence is running on a blocking thread.
    busy: Mutex<BTreeSet<String>>,
    /// Signalled whenever a name leaves `busy`.
    freed: Condvar,
    /// `--image-source` and the pool it goes to, checked on every (re)connect.
    golden: Option<(Arc<GoldenImage>, String)>,
    /// A redial was asked for (SIGHUP): dial a fresh connection even while healthy.
    redial: AtomicBool,
}

/// Holds a domain name in [`Host::exclusive`] until dropped.
pub(crate) struct Exclusive<'a> {
    host: &'a Host,
    name: String,
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        let mut busy = self
            .host
            .busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        busy.remove(&self.name);
        self.host.freed.notify_all();
    }
}

impl Host {
    pub(crate) fn new(
        zone: &str,
        uri: &str,
        policy: HostPolicy,
        budget: Budget,
        lane_metrics: LaneMetrics,
        metrics: LibvirtMetrics,
        golden: Option<(Arc<GoldenImage>, String)>,
    ) -> Arc<Self> {
        let host = Self {
            zone: zone.to_owned(),
            uri: uri.to_owned(),
            lanes: Lanes::new(zone, budget, Arc::new(lane_metrics)),
            policy,
            slot: Mutex::new(Slot {
                session: None,
                generation: 0,
                last_error: "not connected yet".to_owned(),
            }),
            health: watch::Sender::new(Health::Connecting),
            wake: Arc::new(Notify::new()),
            metrics,
            ledger: Mutex::new(Ledger::default()),
            busy: Mutex::new(BTreeSet::new()),
            freed: Condvar::new(),
            golden,
            redial: AtomicBool::new(false),
        };
        host.publish(Health::Connecting);
        if host.golden.is_some() {
            host.publish_golden("pending");
        }
        Arc::new(host)
    }

    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Blocks (on a blocking thread only) until no other create or delete sequence for
    /// `name` runs on this host, then holds `name` until the guard drops. A caller whose
    /// future was dropped leaves its sequence running to the end; a retry for the same
    /// machine waits for it here instead of racing it, and then adopts what it made.
    pub(crate) fn exclusive(&self, name: &str) -> Exclusive<'_> {
        let mut busy = self
            .busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while busy.contains(name) {
            busy = self
                .freed
                .wait(busy)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        busy.insert(name.to_owned());
        Exclusive {
            host: self,
            name: name.to_owned(),
        }
    }

    pub(crate) fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current health.
    pub(crate) fn health(&self) -> Health {
        *self.health.borrow()
    }

    /// Waits until the host has left `connecting` (first dial done, either way).
    pub(crate) async fn settled(&self) {
        let mut rx = self.health.subscribe();
        let _ = rx.wait_for(|h| *h != Health::Connecting).await;
    }

    /// Waits until the host is healthy.
    pub(crate) async fn healthy(&self) {
        let mut rx = self.health.subscribe();
        let _ = rx.wait_for(|h| *h == Health::Healthy).await;
    }

    fn publish(&self, health: Health) {
        self.health.send_replace(health);
        for state in [Health::Connecting, Health::Healthy, Health::Unreachable] {
            let labels = HostLabels {
                zone: self.zone.clone(),
                state: state.name().to_owned(),
            };
            let value = i64::from(state == health);
            self.metrics.host_health.get_or_create(&labels).set(value);
        }
    }

    fn publish_golden(&self, current: &str) {
        for state in ["pending", "ready", "mismatch", "failed"] {
            let labels = HostLabels {
                zone: self.zone.clone(),
                state: state.to_owned(),
            };
            let value = i64::from(state == current);
            self.metrics.golden_image.get_or_create(&labels).set(value);
        }
    }

    /// The live session, or a fast failure naming the host's state.
    pub(crate) fn session(&self) -> Result<Arc<Session>, HypervisorError> {
        let slot = self.slot();
        slot.session.clone().ok_or_else(|| {
            nothing_done(format!(
                "libvirt host for zone {:?} is {} ({}); the provider reconnects with backoff, \
                 retry once it is healthy",
                self.zone,
                self.health().name(),
                slot.last_error
            ))
        })
    }

    /// Runs `f` on a blocking thread against the live connection, once `lane` has a slot
    /// of the host's budget.
    pub(crate) async fn call<T, F>(self: &Arc<Self>, lane: Lane, f: F) -> Result<T, HypervisorError>
    where
        T: Send + 'static,
        F: FnOnce(&Session) -> Result<T, HypervisorError> + Send + 'static,
    {
        self.session()?;
        let permit = self.lanes.acquire(lane).await;
        // The session current once the slot is ours: a wait may span a reconnect.
        let session = self.session()?;
        let host = Arc::clone(self);
        let joined = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let result = f(&session);
            if result.is_err() && !session.conn.is_alive().unwrap_or(false) {
                host.lost(session.generation, "the connection dropped during a call");
            }
            result
        })
        .await;
        joined.map_err(|e| maybe_done(format!("zone {:?}: libvirt worker: {e}", self.zone)))?
    }

    /// Marks the connection of `generation` lost (a newer one is left alone) and wakes the
    /// supervisor.
    pub(crate) fn lost(&self, generation: u64, reason: &str) {
        let old = {
            let mut slot = self.slot();
            if slot.generation != generation || slot.session.is_none() {
                return;
            }
            slot.last_error = reason.to_owned();
            slot.session.take()
        };
        warn!(zone = %self.zone, reason, "libvirt host unreachable; reconnecting");
        self.publish(Health::Unreachable);
        // Closing a remote connection may block: never on an async worker.
        drop(tokio::task::spawn_blocking(move || drop(old)));
        self.wake.notify_one();
    }

    /// Asks the supervisor to dial again now (credentials on disk may have changed).
    pub(crate) fn redial(&self) {
        self.redial.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// The host's lanes (tests count what is in flight).
    #[cfg(test)]
    pub(crate) fn lanes(&self) -> &Arc<Lanes> {
        &self.lanes
    }

    /// Test hook: behaves as if the transport had died under the current session.
    #[cfg(test)]
    pub(crate) fn sever(&self) {
        let generation = self.slot().generation;
        self.lost(generation, "severed by a test");
    }

    /// Dials once, makes sure the golden image is there (with `--image-source`) and installs
    /// the session. A host whose golden image is not in order gets no session: its slots
    /// stay out of the inventory, exactly as while it is unreachable, and the check runs
    /// again on the next dial.
    async fn open(&self) -> Result<(), String> {
        ensure_event_loop();
        let uri = self.uri.clone();
        let (interval, count) = (self.policy.keepalive_interval, self.policy.keepalive_count);
        let zone = self.zone.clone();
        let golden = self.golden.clone();
        let opened = tokio::task::spawn_blocking(move || {
            let (conn, test_driver, node) = dial(&uri, &zone, interval, count)?;
            let checked = golden
                .map(|(image, pool)| golden::ensure(&conn, test_driver, &zone, &pool, &image));
            Ok::<_, String>((conn, test_driver, node, checked))
        })
        .await
        .map_err(|e| format!("libvirt worker: {e}"))??;
        let (conn, test_driver, node, checked) = opened;
        match checked {
            None => {}
            Some(Ok(ensured)) => {
                info!(zone = %self.zone, outcome = ?ensured, "golden image ready");
                self.publish_golden("ready");
            }
            Some(Err(refusal)) => {
                warn!(zone = %self.zone, state = refusal.state(), reason = refusal.reason(),
                    "golden image not in order; this host's slots are withheld");
                self.publish_golden(refusal.state());
                drop(tokio::task::spawn_blocking(move || drop(conn)));
                return Err(format!(
                    "slots withheld: {} (checked again on the next reconnect)",
                    refusal.reason()
                ));
            }
        }
        self.ledger().set_node(node);
        let replaced = {
            let mut slot = self.slot();
            slot.generation += 1;
            let session = Arc::new(Session {
                conn,
                generation: slot.generation,
                test_driver,
                base: Mutex::new(None),
            });
            slot.last_error.clear();
            slot.session.replace(session)
        };
        // A redial replaces a live session: closing it may block, never on an async worker.
        drop(tokio::task::spawn_blocking(move || drop(replaced)));
        self.publish(Health::Healthy);
        Ok(())
    }

    fn dial_failed(&self, error: String) {
        warn!(zone = %self.zone, error = %error, "libvirt host unreachable");
        self.slot().last_error = error;
        self.publish(Health::Unreachable);
    }

    /// Probes a healthy connection; a failed or slow probe marks it lost.
    async fn probe<C: Clock>(self: &Arc<Self>, clock: &C) {
        let Ok(session) = self.session() else { return };
        let generation = session.generation;
        let check = tokio::task::spawn_blocking(move || {
            session.conn.is_alive().unwrap_or(false) && session.conn.lib_version().is_ok()
        });
        let deadline = clock.now().saturating_add(self.policy.probe_timeout);
        // Biased: an answer that arrives with the deadline still counts.
        let alive = futures::select_biased! {
            answer = check.fuse() => answer.unwrap_or(false),
            () = clock.sleep_until(deadline).fuse() => false,
        };
        if !alive {
            self.lost(generation, "liveness probe failed or timed out");
        }
    }
}

/// Opens the connection, enables keepalive and reads the node info.
fn dial(uri: &str, zone: &str, interval: i32, count: u32) -> Result<(Connect, bool, Node), String> {
    let conn =
        Connect::open(Some(uri)).map_err(|e| super::credentials::connect_failure(uri, &e))?;
    if let Err(e) = conn.set_keep_alive(interval, count) {
        if !is_unsupported(&e) {
            warn!(zone, error = %text(&e), "libvirt keepalive not enabled");
        }
    }
    let test_driver = conn
        .driver_type()
        .is_ok_and(|t| t.eq_ignore_ascii_case("test"));
    let info = conn
        .node_info()
        .map_err(|e| format!("read node info: {}", text(&e)))?;
    let node = Node {
        cpus: info.cpus,
        memory_kib: info.memory,
    };
    Ok((conn, test_driver, node))
}

/// Registers libvirt's default event loop once per process and runs it on a dedicated
/// thread: remote connections need it for keepalive and for noticing a dead peer.
pub(crate) fn ensure_event_loop() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        virt::error::clear_error_callback();
        if let Err(e) = virt::event::event_register_default_impl() {
            warn!(error = %text(&e), "libvirt event loop unavailable: keepalive is off");
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("libvirt-events".to_owned())
            .spawn(|| {
                while virt::event::event_run_default_impl().is_ok() {}
                warn!("libvirt event loop stopped: keepalive is off");
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start the libvirt event loop thread");
        }
    });
}

/// Keeps one host connected until the host is dropped: dials with backoff while it is
/// down, probes it while it is up.
pub(crate) async fn supervise<C: Clock>(host: Weak<Host>, clock: C, seed: u64) {
    let Some(wake) = host.upgrade().map(|h| Arc::clone(&h.wake)) else {
        return;
    };
    let mut backoff = {
        let Some(h) = host.upgrade() else { return };
        Backoff::new(h.policy.backoff_min, h.policy.backoff_max, seed)
    };
    loop {
        let Some(h) = host.upgrade() else { return };
        if h.redial.swap(false, Ordering::SeqCst) && h.session().is_ok() {
            match h.open().await {
                Ok(()) => info!(zone = %h.zone, "libvirt host redialled"),
                Err(error) => warn!(zone = %h.zone, error = %error,
                    "libvirt redial failed; keeping the current connection"),
            }
        }
        if h.session().is_ok() {
            backoff.reset();
            let deadline = clock.now().saturating_add(h.policy.probe_interval);
            drop(h);
            // Biased: a loss reported by a call is acted on before the periodic probe.
            futures::select_biased! {
                () = wake.notified().fuse() => {}
                () = clock.sleep_until(deadline).fuse() => {}
            }
            if let Some(h) = host.upgrade() {
                if !h.redial.load(Ordering::SeqCst) {
                    h.probe(&clock).await;
                }
            }
            continue;
        }
        h.publish(Health::Connecting);
        match h.open().await {
            Ok(()) => info!(zone = %h.zone, "libvirt host connected"),
            Err(error) => {
                h.dial_failed(error);
                let deadline = clock.now().saturating_add(backoff.next_wait());
                drop(h);
                // A redial request (SIGHUP) cuts the wait short: rotated credentials are
                // tried at once.
                futures::select_biased! {
                    () = wake.notified().fuse() => {}
                    () = clock.sleep_until(deadline).fuse() => {}
                }
                if let Some(h) = host.upgrade() {
                    h.redial.store(false, Ordering::SeqCst);
                }
            }
        }
    }
}
