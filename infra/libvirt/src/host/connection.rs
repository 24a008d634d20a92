//! One libvirt host (zone): its connections, its health, and how blocking calls reach it.
//!
//! libvirt's API is blocking, so every call runs on tokio's blocking pool, behind the
//! host's lanes (`lanes`: the per-host budget, `--host-budget`, and who goes next), which
//! bound how many calls one host has in flight (docs/design.md §5.3). The host keeps
//! `--host-connections` connections, dialled and replaced together, and gives each call
//! the one with the fewest calls on it (`ports/src/spread.rs`), so no connection carries more than
//! ⌈budget ÷ connections⌉ calls: libvirtd's `max_client_requests` counts requests per
//! connection, and a call that uploads a volume has its data packets counted beside it. A
//! dropped future never cuts a call short: the closure runs to completion on its thread and
//! its slot is released when it really ends, so a deadline can never leave a half-made
//! domain behind a call that "returned". Each host is isolated: its own connection, its own
//! lanes and its own supervisor task, so a dead host fails its own calls fast (no waiting
//! for a slot or a dial) and never holds up another host.
//!
//! The supervisor dials, probes liveness periodically, and after a loss reconnects with
//! jittered backoff. Health is `connecting`, `healthy` or `unreachable`, exported as the
//! one-hot gauge `bigfleet_libvirt_host_health{zone,state}`.
//!
//! **Closing is ordered after every call.** A connection is closed only when the last
//! [`Session`] handle drops, and every call, probe and watch tick holds one for as long as it
//! runs, so the provider never closes a connection another thread is using: not on a lost
//! probe, not on a SIGHUP redial, not at shutdown. libvirt's client-side keepalive is turned
//! off on every connection, because it is the one close the provider cannot order: libvirt's
//! timer closes the connection from its event loop while other threads wait for replies on
//! it, and libvirt 9.0's client then crashed the whole process (SIGSEGV in its I/O loop) when
//! a host that had hung for longer than the keepalive window came back. The liveness probe
//! takes keepalive's place: a host that stops answering is `unreachable` within
//! `2 × probe_interval + probe_timeout` (a connection that answered a call since the last
//! probe is not asked; the silent ones are asked in turn, so a single connection that stops
//! answering is found too), its new calls fail at once, and the calls already on it
//! return (and then release the connection) once the host answers again or the transport
//! fails (docs/libvirt.md §2.3).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};

use bigfleet_libvirt_config::HostConnection;
use bigfleet_libvirt_ports::spread::{Link, Probe, Spread};
use bigfleet_libvirt_ports::{Clock, HypervisorError};
use futures::FutureExt;
use tokio::sync::{Notify, watch};
use tracing::{info, warn};

use crate::host::backoff::Backoff;
use crate::host::capacity::Ledger;
use crate::host::dial::{dial, ensure_event_loop};
use crate::host::error::{maybe_done, nothing_done};
use crate::host::gate::Checks;
use crate::host::lanes::{Budget, Lane, Lanes};
use crate::host::session::Session;
use crate::metrics::lanes::LaneMetrics;
use crate::metrics::{HostLabels, LibvirtMetrics};
use crate::options::HostPolicy;

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

/// How often a probe that found the budget saturated looks again for an answered call.
const SATURATED_PROBE_TICK: std::time::Duration = std::time::Duration::from_millis(250);

struct Slot {
    /// The live connections, all of one generation; empty while there are none.
    sessions: Vec<Arc<Session>>,
    /// The calls on each of them.
    spread: Arc<Spread>,
    generation: u64,
    last_error: String,
}

/// A call's hold on one connection: counted on it until dropped.
pub(crate) struct Lease {
    pub(crate) session: Arc<Session>,
    link: Link,
}

/// One libvirt host.
pub(crate) struct Host {
    pub(crate) zone: String,
    uri: String,
    policy: HostPolicy,
    /// Connections dialled per generation (`--host-connections`).
    connections: usize,
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
    /// The pools to start and `--image-source`'s gate, on every (re)connect.
    checks: Checks,
    /// A redial was asked for (SIGHUP): dial a fresh connection even while healthy.
    redial: AtomicBool,
    /// Calls the host answered with success, counted: while the budget is saturated, a
    /// call answered within the probe's timeout stands in for the probe.
    answered: AtomicU64,
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
        at: &HostConnection,
        policy: HostPolicy,
        budget: Budget,
        connections: usize,
        lane_metrics: LaneMetrics,
        metrics: LibvirtMetrics,
        checks: Checks,
    ) -> Arc<Self> {
        let host = Self {
            zone: at.zone.clone(),
            uri: at.uri.clone(),
            lanes: Lanes::new(&at.zone, budget, Arc::new(lane_metrics)),
            policy,
            connections: connections.max(1),
            slot: Mutex::new(Slot {
                sessions: Vec::new(),
                spread: Spread::new(1),
                generation: 0,
                last_error: "not connected yet".to_owned(),
            }),
            health: watch::Sender::new(Health::Connecting),
            wake: Arc::new(Notify::new()),
            metrics,
            ledger: Mutex::new(Ledger::default()),
            busy: Mutex::new(BTreeSet::new()),
            freed: Condvar::new(),
            checks,
            redial: AtomicBool::new(false),
            answered: AtomicU64::new(0),
        };
        host.publish(Health::Connecting);
        if host.checks.golden.is_some() {
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

    /// A live session (the first connection), or a fast failure naming the host's state.
    pub(crate) fn session(&self) -> Result<Arc<Session>, HypervisorError> {
        let slot = self.slot();
        slot.sessions
            .first()
            .cloned()
            .ok_or_else(|| self.down(&slot))
    }

    /// The live connection with the fewest calls on it ([`Spread`]), counted for as long
    /// as the lease is held, so every connection stays at or below ⌈calls in flight ÷
    /// connections⌉.
    pub(crate) fn lease(&self) -> Result<Lease, HypervisorError> {
        let slot = self.slot();
        if slot.sessions.is_empty() {
            return Err(self.down(&slot));
        }
        let link = slot.spread.lease();
        Ok(Lease {
            session: Arc::clone(&slot.sessions[link.index()]),
            link,
        })
    }

    /// The connections of the live generation (none while down), and the calls on each.
    #[cfg(test)]
    pub(crate) fn sessions(&self) -> (Vec<Arc<Session>>, Vec<usize>) {
        let slot = self.slot();
        (slot.sessions.clone(), slot.spread.loads())
    }

    fn down(&self, slot: &Slot) -> HypervisorError {
        nothing_done(format!(
            "libvirt host for zone {:?} is {} ({}); the provider reconnects with backoff, \
             retry once it is healthy",
            self.zone,
            self.health().name(),
            slot.last_error
        ))
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
        // A connection current once the slot is ours: a wait may span a reconnect.
        let lease = self.lease()?;
        let host = Arc::clone(self);
        let joined = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let session = &lease.session;
            let result = f(session);
            if result.is_ok() {
                lease.link.answered();
                host.answered.fetch_add(1, Ordering::SeqCst);
            } else if !session.conn.is_alive().unwrap_or(false) {
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
            if slot.generation != generation || slot.sessions.is_empty() {
                return;
            }
            slot.last_error = reason.to_owned();
            std::mem::take(&mut slot.sessions)
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

    /// Dials the host's connections, starts the provider's inactive rbd pools
    /// (`host::pools`), makes sure the golden image is there (with `--image-source`) and
    /// installs them. A host whose golden image is not in order gets
    /// no session: its slots stay out of the inventory, exactly as while it is unreachable,
    /// and the check runs again on the next dial. All connections or none: one that cannot
    /// be dialled fails the whole dial, and the others are closed.
    async fn open(&self) -> Result<(), String> {
        ensure_event_loop();
        let uri = self.uri.clone();
        let zone = self.zone.clone();
        let checks = self.checks.clone();
        let golden = checks.golden;
        let extra = self.connections - 1;
        let opened = tokio::task::spawn_blocking(move || {
            let (conn, test_driver, node) = dial(&uri, &zone)?;
            crate::host::pools::start_rbd_pools(&conn, &zone, &checks.pools);
            let checked = golden.map(|gate| gate.check(&conn, test_driver, &zone));
            let mut more = Vec::with_capacity(extra);
            for n in 0..extra {
                let (other, _, _) = dial(&uri, &zone)
                    .map_err(|e| format!("connection {} of {}: {e}", n + 2, extra + 1))?;
                more.push(other);
            }
            Ok::<_, String>((conn, more, test_driver, node, checked))
        })
        .await
        .map_err(|e| format!("libvirt worker: {e}"))??;
        let (conn, more, test_driver, node, checked) = opened;
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
                drop(tokio::task::spawn_blocking(move || drop((conn, more))));
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
            let generation = slot.generation;
            let sessions: Vec<Arc<Session>> = std::iter::once(conn)
                .chain(more)
                .map(|conn| {
                    Arc::new(Session {
                        conn,
                        generation,
                        test_driver,
                        base: Mutex::new(None),
                    })
                })
                .collect();
            slot.spread = Spread::new(sessions.len());
            slot.last_error.clear();
            std::mem::replace(&mut slot.sessions, sessions)
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

    /// Probes a healthy host; a failed or slow probe marks it lost.
    ///
    /// Each connection is judged on its own ([`Spread::probe`]): one that answered a call
    /// since the last probe is alive; of those that did not, one is asked for the library
    /// version, in turn, so an idle host's probes visit every connection (a connection
    /// that stops answering is found even while the others carry the traffic). The
    /// probe's call takes a slot of the budget like any other ([`Lanes::try_acquire`] on
    /// the read lane) and a connection below its share, so it never adds a request beyond
    /// what the connections were sized for (libvirtd stops reading a connection at its
    /// `max_client_requests`, "Client hit max requests limit"). While no slot is free it
    /// sends nothing and waits for one of the calls in flight to be answered instead,
    /// within the same timeout. Every connection must also still be open. A silent
    /// connection whose every share is taken by calls in flight is left to those calls.
    async fn probe<C: Clock>(self: &Arc<Self>, clock: &C) {
        let Ok(session) = self.session() else { return };
        let generation = session.generation;
        drop(session);
        let answered = self.answered.load(Ordering::SeqCst);
        let deadline = clock.now().saturating_add(self.policy.probe_timeout);
        let permit = loop {
            if let Some(permit) = self.lanes.try_acquire(Lane::Read) {
                break permit;
            }
            if self.answered.load(Ordering::SeqCst) != answered {
                return;
            }
            if clock.now() >= deadline {
                self.lost(generation, "no call answered within the liveness timeout");
                return;
            }
            let tick = clock
                .now()
                .saturating_add(SATURATED_PROBE_TICK)
                .min(deadline);
            clock.sleep_until(tick).await;
        };
        let (sessions, spread) = {
            let slot = self.slot();
            (slot.sessions.clone(), Arc::clone(&slot.spread))
        };
        if sessions.first().map(|s| s.generation) != Some(generation) {
            return;
        }
        let share = self.lanes.budget().host.div_ceil(sessions.len());
        let link = match spread.probe(share) {
            Probe::Ask(link) => link,
            Probe::Answered | Probe::Full => return,
        };
        let asked = Arc::clone(&sessions[link.index()]);
        let check = tokio::task::spawn_blocking(move || {
            let (_permit, _link) = (permit, link);
            sessions.iter().all(|s| s.conn.is_alive().unwrap_or(false))
                && asked.conn.lib_version().is_ok()
        });
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
