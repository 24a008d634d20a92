//! `SimHypervisor`: N simulated libvirt hosts (one zone each) behind the Hypervisor port,
//! with the seeded per-call faults of the run's [`HostFaults`].
//!
//! Host state (`crate::hosts`) lives in the world, outside the provider process: a request,
//! once sent, is executed by a task on the host's own madsim node, so killing the provider
//! (or dropping the call at its deadline) does not undo or cancel it. Operations on one
//! domain execute in arrival order (libvirt serialises jobs on a domain), which is why a
//! compensating delete sent after a hung Create still runs after it.
//!
//! Faults per call: an error before dispatch (nothing happened); a latency spike (possibly
//! past the deadline); a hang (the host acts late and never answers); a lost reply (the
//! host acted, the caller gets an indefinite error); a partial Create (domain defined, not
//! started: `SideEffects::Applied`); a host unreachable for a while (calls are refused, and
//! replies in flight are lost after a keepalive timeout). And a whole-host stall (a frozen
//! libvirtd): for 25–40 s the host takes every call and neither acts on it nor answers, the
//! calls it had in hand included (describe's scan of it too); when it resumes it acts on
//! everything it held, in order, and answers. Each call is recorded when sent and when it
//! ends (`Event::HostCall`, `Event::HostCallEnd`; the `hosts-keep-serving` checker judges
//! them).
//!
//! Each provider process's `SimHypervisor` keeps `--host-connections` connections to every
//! host, and every call it makes passes through the product's per-host [`Lanes`] first, then
//! takes a connection by the product's [`Spread`] (the least busy), on the lane the libvirt
//! adapter uses for the same call: Create and Configure on `create`, Drain and Delete (the
//! compensation and orphan collection included) on `teardown`, describe on `read`, the
//! guest-agent readiness check on `agent`. The permit travels with the request into the
//! host's task and is dropped only when the host has finished it and the reply (or the
//! connection's loss) reached the caller, as the adapter's blocking thread holds it until
//! the libvirt call returns; a caller that gives up, a dropped future or a lost reply frees
//! nothing early. A hang holds its slot until the host finally acts (late), then frees it
//! without answering.
//!
//! Each host models libvirtd's `max_client_requests` (drawn per host, `FaultPlan::libvirtd`):
//! it counts the requests of each connection not yet finished, appends the count (and the
//! process's count over all its connections) to the history as each one arrives
//! (`Event::HostLoad`; the `host-budget` checker judges it), and executes at most that many
//! of one connection at once: a request over the limit waits in the daemon until one of
//! its connection finishes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bigfleet_libvirt_config::naming::domain_name;
use bigfleet_libvirt_domain::{HostRef, Machine, MachineId, MachineState};
use bigfleet_libvirt_ports::claims::{Claims, Placed};
use bigfleet_libvirt_ports::lanes::{Lane, Lanes, NoObserver, Permit};
use bigfleet_libvirt_ports::spread::{Link, Spread};
use bigfleet_libvirt_ports::steps;
use bigfleet_libvirt_ports::{
    ConfigureRequest, CreateRequest, Created, DeleteRequest, DrainRequest, Hypervisor,
    HypervisorError, ReadinessRequest, SideEffects,
};
use futures::FutureExt;
use futures::channel::oneshot;
use futures::future::BoxFuture;

use super::books;
use super::on_host::OnHost;
use crate::faults::HostFaults;
use crate::history::{CallEnd, Event};
use crate::hosts::{Domain, Hosts, create_volumes, volume_owner, zone_index};
use crate::rng::SimRng;
use crate::time::elapsed;
use crate::world::World;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    Error,
    Spike,
    Hang,
    LostReply,
    Partial,
    /// One step of the Create, drawn when it executes, fails.
    Step,
}

#[derive(Clone, Debug)]
enum Op {
    Create,
    Configure(String),
    Ready,
    Drain,
    Delete,
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Configure(_) => "configure",
            Self::Ready => "ready",
            Self::Drain => "drain",
            Self::Delete => "delete",
        }
    }

    /// The lane the libvirt adapter uses for the same call.
    fn lane(&self) -> Lane {
        match self {
            Self::Create | Self::Configure(_) => Lane::Create,
            Self::Ready => Lane::Agent,
            Self::Drain | Self::Delete => Lane::Teardown,
        }
    }
}

type HostResult = Result<Option<HostRef>, HypervisorError>;

/// One call as the host will execute it.
struct Job {
    host: usize,
    op: Op,
    machine: Machine,
    fault: Fault,
    arrive_at: Duration,
    execute_at: Duration,
    /// A stall pushed `execute_at` to its end.
    held: bool,
    reply_delay: Duration,
    keepalive: Duration,
}

/// Connection numbers per provider process: connection `i` of process `p` is
/// `p × CONNECTIONS_PER_PROCESS + i`.
pub const CONNECTIONS_PER_PROCESS: u64 = 100;

/// The provider's view of the hosts: its connections to each, behind its lanes.
#[derive(Clone)]
pub struct SimHypervisor {
    world: Arc<World>,
    /// This process's number; its connections are numbered from it.
    process: u64,
    lanes: Arc<Vec<Arc<Lanes>>>,
    spreads: Arc<Vec<Arc<Spread>>>,
    /// Its books of what machines hold alone on each host (`fakes::books`).
    books: Arc<Mutex<Vec<Claims>>>,
}

fn draw_fault(rng: &mut SimRng, faults: &HostFaults, op: &Op) -> Fault {
    let candidates = [
        (faults.error, Fault::Error),
        (faults.spike, Fault::Spike),
        (faults.hang, Fault::Hang),
        (faults.lost_reply, Fault::LostReply),
        (faults.partial_create, Fault::Partial),
        (faults.step_failure, Fault::Step),
    ];
    for (rate, fault) in candidates {
        let create_only = matches!(fault, Fault::Partial | Fault::Step);
        if create_only && !matches!(op, Op::Create) {
            continue;
        }
        if rng.chance(rate) {
            return fault;
        }
    }
    Fault::None
}

impl SimHypervisor {
    /// A new connection to the hosts of `world`, with the run's budget on each.
    #[must_use]
    pub fn new(world: Arc<World>) -> Self {
        let process = {
            let mut hosts = world.hosts();
            hosts.connections += 1;
            hosts.connections
        };
        let budget = world.plan.libvirtd.budget;
        let lanes = (0..world.plan.hosts)
            .map(|host| Lanes::new(&format!("zone-{host}"), budget, Arc::new(NoObserver)))
            .collect();
        let spreads = (0..world.plan.hosts)
            .map(|_| Spread::new(world.plan.libvirtd.connections))
            .collect();
        let books = vec![Claims::default(); world.plan.hosts];
        Self {
            world,
            process,
            lanes: Arc::new(lanes),
            spreads: Arc::new(spreads),
            books: Arc::new(Mutex::new(books)),
        }
    }

    /// The number of this process's connection `link` (see [`CONNECTIONS_PER_PROCESS`]).
    fn connection(&self, link: &Link) -> u64 {
        self.process * CONNECTIONS_PER_PROCESS + u64::try_from(link.index()).expect("small")
    }

    /// This process's requests on `host` not yet finished, all its connections together.
    fn process_load(&self, hosts: &crate::hosts::Hosts, host: usize) -> usize {
        let first = self.process * CONNECTIONS_PER_PROCESS;
        (hosts
            .load
            .range((host, first)..(host, first + CONNECTIONS_PER_PROCESS)))
        .map(|(_, load)| load.in_flight)
        .sum()
    }

    fn host_ref(&self, zone: usize, domain: &Domain) -> HostRef {
        HostRef {
            provider: self.world.provider_label.clone(),
            reference: format!("zone-{zone}/{}", domain.name),
        }
    }

    /// Sends `op` for `machine` to its host once its lane has a slot; the result is the
    /// reply.
    async fn dispatch(&self, op: Op, machine: &Machine) -> HostResult {
        let host = zone_index(&machine.zone);
        let calm = self.world.calm();
        let unreachable = !calm && self.world.host_unreachable(host, elapsed());
        let fault = if calm || unreachable {
            Fault::None
        } else {
            draw_fault(&mut self.world.hosts().rng, &self.world.plan.host, &op)
        };
        let mut call = HostCall::sent(&self.world, host, unreachable || fault != Fault::None);
        if unreachable || fault == Fault::Error {
            let refused = self.refuse(host, &op, &machine.id, unreachable).await;
            call.end = CallEnd::Answered;
            return refused;
        }
        let permit = self.lanes[host].acquire(op.lane()).await;
        // A wait for the slot may span the start of an outage.
        let now = elapsed();
        if !self.world.calm() && self.world.host_unreachable(host, now) {
            drop(permit);
            let refused = self.refuse(host, &op, &machine.id, true).await;
            call.end = CallEnd::Answered;
            return refused;
        }
        let link = self.spreads[host].lease();
        let job = self.schedule(host, op, machine, fault, now);
        call.held = job.held;
        // From here the host has it: it ends when the host is done with it.
        call.end = CallEnd::Unanswered;
        let (answer, reply) = oneshot::channel();
        drop(self.world.host_node(host).spawn(self.clone().serve(
            job,
            answer,
            (permit, link),
            call,
        )));
        match reply.await {
            Ok(result) => result,
            // No answer is coming: hang until the caller's deadline drops this future.
            Err(oneshot::Canceled) => std::future::pending().await,
        }
    }

    /// A call that never reaches the host: refused after a short while, nothing happened.
    fn refuse(
        &self,
        host: usize,
        op: &Op,
        id: &MachineId,
        unreachable: bool,
    ) -> BoxFuture<'static, HostResult> {
        let wait = self
            .world
            .hosts()
            .rng
            .duration(Duration::from_millis(1), Duration::from_secs(2));
        let why = if unreachable {
            "host unreachable"
        } else {
            "injected error before dispatch"
        };
        let message = format!("zone-{host}: {} {id}: {why}", op.name());
        self.world.trace(format!("host {message}"));
        let error = HypervisorError {
            message,
            side_effects: SideEffects::None,
        };
        madsim::time::sleep(wait).map(move |()| Err(error)).boxed()
    }

    /// Decides when the host executes the call (after the domain's earlier operations) and
    /// how its reply travels.
    fn schedule(&self, host: usize, op: Op, machine: &Machine, fault: Fault, now: Duration) -> Job {
        let timeout = self.world.plan.transition_timeout;
        let service_range = self.world.plan.host.service;
        let mut hosts = self.world.hosts();
        let rng = &mut hosts.rng;
        let service = match fault {
            Fault::Spike => rng.duration(Duration::from_secs(1), timeout * 2),
            Fault::Hang => rng.duration(timeout, timeout * 2),
            _ => rng.duration(service_range.0, service_range.1),
        };
        let send = rng.duration(Duration::from_micros(100), Duration::from_millis(2));
        let reply_delay = rng.duration(Duration::from_micros(100), Duration::from_millis(2));
        let keepalive = rng.duration(Duration::from_secs(2), Duration::from_secs(5));
        let queued = hosts
            .busy_until
            .get(&machine.id)
            .copied()
            .unwrap_or_default();
        let arrive_at = now + send;
        let planned = arrive_at.max(queued) + service;
        drop(hosts);
        // A stalled host does nothing until it resumes.
        let execute_at = self.world.after_stall(host, planned);
        let held = execute_at != planned;
        if held {
            self.world.trace(format!(
                "host zone-{host}: {} {} held by a stall until {:.3}s",
                op.name(),
                machine.id,
                execute_at.as_secs_f64()
            ));
        }
        let mut hosts = self.world.hosts();
        hosts.busy_until.insert(machine.id.clone(), execute_at);
        Job {
            host,
            op,
            machine: machine.clone(),
            fault,
            arrive_at,
            execute_at,
            held,
            reply_delay,
            keepalive,
        }
    }

    /// The host side of one call: arrive, wait for one of the daemon's workers, execute at
    /// the scheduled time (or as soon as a worker is free after it), then answer (or not);
    /// a stall holds the execution and the answer until the host resumes. The permit, the
    /// call's slot in the provider's lanes, and the link, its connection, are dropped when
    /// this ends, and `call` records the end.
    async fn serve(
        self,
        job: Job,
        answer: oneshot::Sender<HostResult>,
        (_permit, link): (Permit, Link),
        mut call: HostCall,
    ) {
        let Job {
            host,
            op,
            machine,
            fault,
            ..
        } = &job;
        madsim::time::sleep(job.arrive_at.saturating_sub(elapsed())).await;
        self.arrive(*host, &link).await;
        madsim::time::sleep(job.execute_at.saturating_sub(elapsed())).await;
        // A worker freed during a stall (a request that waited in the daemon) waits it out.
        call.held |= self.hold(*host).await;
        let result = self.execute(*host, op, machine, *fault);
        self.finish(*host, &link);
        if *fault == Fault::Hang {
            return; // The host never answers; the caller's deadline ends the call.
        }
        let what = format!("zone-{host}: {} {}", op.name(), machine.id);
        let lost = !self.world.calm() && self.world.host_unreachable(*host, elapsed());
        let result = if lost {
            self.world
                .trace(format!("host {what}: reply lost, the host is unreachable"));
            madsim::time::sleep(job.keepalive).await;
            Err(HypervisorError::indefinite(format!(
                "{what}: connection to the host lost"
            )))
        } else {
            madsim::time::sleep(job.reply_delay).await;
            match (fault, result) {
                (Fault::LostReply, Ok(_)) => Err(HypervisorError::indefinite(format!(
                    "{what}: reply lost after the host acted"
                ))),
                (_, result) => result,
            }
        };
        // A stall that starts with the reply on its way holds it too.
        call.held |= self.hold(*host).await;
        call.end = CallEnd::Answered;
        let _ = answer.send(result);
    }

    /// Waits until `host` resumes if a stall of it covers now; whether it had to.
    async fn hold(&self, host: usize) -> bool {
        let now = elapsed();
        let resume = self.world.after_stall(host, now);
        if resume == now {
            return false;
        }
        madsim::time::sleep(resume - now).await;
        true
    }

    /// A request on connection `link` arrives at `host`: counted, recorded, and once one of
    /// the daemon's `max_client_requests` workers for the connection is free, executing.
    async fn arrive(&self, host: usize, link: &Link) {
        let limit = self.world.plan.libvirtd.max_client_requests[host];
        let connection = self.connection(link);
        let (in_flight, host_in_flight, worker) = {
            let mut hosts = self.world.hosts();
            let load = hosts.load.entry((host, connection)).or_default();
            load.in_flight += 1;
            let in_flight = load.in_flight;
            let worker = if load.executing < limit {
                load.executing += 1;
                None
            } else {
                let (free, freed) = oneshot::channel();
                load.waiting.push_back(free);
                Some(freed)
            };
            (in_flight, self.process_load(&hosts, host), worker)
        };
        self.world.record(Event::HostLoad {
            host,
            connection,
            in_flight,
            host_in_flight,
        });
        if let Some(freed) = worker {
            self.world.trace(format!(
                "host zone-{host}: connection {connection} over max_client_requests={limit}, \
                 the request waits in the daemon"
            ));
            // The finishing request hands its worker over; host tasks are never killed.
            let _ = freed.await;
        }
    }

    /// A request on connection `link` finished on `host`: its worker goes to the next
    /// waiting request of that connection, if any.
    fn finish(&self, host: usize, link: &Link) {
        let mut hosts = self.world.hosts();
        let load = hosts.load.entry((host, self.connection(link))).or_default();
        load.in_flight -= 1;
        load.executing -= 1;
        while let Some(next) = load.waiting.pop_front() {
            if next.send(()).is_ok() {
                load.executing += 1;
                break;
            }
        }
    }

    /// Describe's scan of `host`, a request that arrives and finishes at once (it reads
    /// what the world holds and never waits for a daemon worker): counted and recorded.
    fn scan(&self, host: usize, link: &Link) {
        let connection = self.connection(link);
        let (in_flight, host_in_flight) = {
            let mut hosts = self.world.hosts();
            let load = hosts.load.entry((host, connection)).or_default();
            let in_flight = load.in_flight + 1;
            (in_flight, self.process_load(&hosts, host) + 1)
        };
        self.world.record(Event::HostLoad {
            host,
            connection,
            in_flight,
            host_in_flight,
        });
    }

    /// Applies `op` on `host` now.
    fn execute(&self, host: usize, op: &Op, machine: &Machine, fault: Fault) -> HostResult {
        let id = &machine.id;
        let result = {
            let mut hosts = self.world.hosts();
            match op {
                Op::Create => self.create_on(&mut hosts, host, id, fault),
                Op::Configure(cluster) => {
                    with_running(&mut hosts.domains[host], host, op, id, |d| {
                        d.cluster.clone_from(cluster);
                        d.blob = true;
                    })
                }
                Op::Ready => with_running(&mut hosts.domains[host], host, op, id, |_| {}),
                Op::Drain => with_running(&mut hosts.domains[host], host, op, id, |d| {
                    d.cluster.clear();
                    d.blob = false;
                }),
                Op::Delete => {
                    // As the adapter: the domain goes, then every volume of its name, even
                    // when the domain was already gone; its claim leaves the books.
                    hosts.domains[host].remove(id);
                    let name = domain_name(&self.world.provider_label, id.as_str());
                    self.books()[host].forget(&name);
                    hosts.volumes[host].retain(|v| volume_owner(v) != name);
                    Ok(None)
                }
            }
        };
        let shown = match &result {
            Ok(_) => "ok".to_owned(),
            Err(e) => format!("error: {}", e.message),
        };
        self.world.trace(format!(
            "host zone-{host} {} {id} fault={fault:?} -> {shown}",
            op.name()
        ));
        self.world.stats().host_operations += 1;
        let domains = {
            let hosts = self.world.hosts();
            hosts.domains.iter().filter(|d| d.contains_key(id)).count()
        };
        self.world.record(Event::HostEffect {
            machine: id.clone(),
            domains,
        });
        if matches!(op, Op::Create | Op::Delete) {
            let holdings = books::holdings(&self.world.hosts().domains[host]);
            let in_flight = self.books()[host].in_flight().map(str::to_owned).collect();
            self.world.record(Event::Books {
                host,
                holdings,
                in_flight,
            });
        }
        result
    }

    /// This process's books of each host.
    fn books(&self) -> MutexGuard<'_, Vec<Claims>> {
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl SimHypervisor {
    /// A Create on `host`, as the libvirt adapter does it: an existing domain of the machine
    /// is adopted and started; otherwise the product's step runner makes the volumes, fills
    /// the seed, defines and starts the domain, and on a failing step (`Fault::Step`, at a
    /// drawn step) rolls back what it made and answers `SideEffects::None`, as the adapter
    /// does after a complete rollback. `Fault::Partial` stops after the define, with no
    /// rollback (as a process that died there would leave it).
    fn create_on(
        &self,
        hosts: &mut Hosts,
        host: usize,
        id: &MachineId,
        fault: Fault,
    ) -> HostResult {
        if let Some(domain) = hosts.domains[host].get_mut(id) {
            domain.running = true;
            return Ok(Some(self.host_ref(host, domain)));
        }
        let name = domain_name(&self.world.provider_label, id.as_str());
        let volumes = create_volumes(&name, self.world.plan.host.data_disks);
        let seed = volumes.last().cloned().into_iter().collect::<Vec<_>>();
        let mut plan = steps::create_steps(&volumes, &seed);
        if fault == Fault::Partial {
            plan.pop();
        }
        let fail_at = (fault == Fault::Step).then(|| hosts.rng.index(plan.len()));
        let mut books = self.books();
        let books = &mut books[host];
        // As the adapter's `read_books`, and for a dead process's Create (`fakes::books`).
        let late = self.process != hosts.connections;
        if !books.scanned() || late {
            books::scan(books, &hosts.domains[host]);
        }
        let mut on_host = OnHost {
            hosts,
            host,
            id,
            name: &name,
            books,
            placed: Placed::default(),
            late,
            fail_at,
            calls: 0,
        };
        let ran = steps::run(&mut on_host, &plan);
        if ran.is_ok() {
            on_host.books.commit(&name);
        }
        if let Err(failed) = ran {
            // As the adapter answers: a step the host refused, rolled back completely on a
            // live connection, did nothing.
            let side_effects = if failed.leftovers.is_empty() {
                SideEffects::None
            } else {
                SideEffects::Applied
            };
            return Err(HypervisorError {
                message: format!(
                    "zone-{host}: create {id}: step {} failed: {}",
                    failed.step, failed.error
                ),
                side_effects,
            });
        }
        if fault == Fault::Partial {
            return Err(HypervisorError {
                message: format!("zone-{host}: create {id}: domain defined but failed to start"),
                side_effects: SideEffects::Applied,
            });
        }
        let domain = &hosts.domains[host][id];
        Ok(Some(self.host_ref(host, domain)))
    }
}

fn with_running(
    domains: &mut BTreeMap<MachineId, Domain>,
    host: usize,
    op: &Op,
    id: &MachineId,
    edit: impl FnOnce(&mut Domain),
) -> HostResult {
    match domains.get_mut(id).filter(|d| d.running) {
        Some(domain) => {
            edit(domain);
            Ok(None)
        }
        None => Err(HypervisorError::permanent(format!(
            "zone-{host}: {} {id}: no running domain",
            op.name()
        ))),
    }
}

/// One call to a host as the history tells it: recorded when sent (`Event::HostCall`) and
/// when it ends (`Event::HostCallEnd`, on drop: the host finished it, or its caller dropped
/// it before it reached the host).
struct HostCall {
    world: Arc<World>,
    id: u64,
    /// How it ends if dropped now.
    end: CallEnd,
    /// A stall held it.
    held: bool,
}

impl HostCall {
    fn sent(world: &Arc<World>, host: usize, faulted: bool) -> Self {
        let id = {
            let mut hosts = world.hosts();
            hosts.calls += 1;
            hosts.calls
        };
        world.record(Event::HostCall {
            call: id,
            host,
            faulted,
        });
        Self {
            world: Arc::clone(world),
            id,
            end: CallEnd::Dropped,
            held: false,
        }
    }
}

impl Drop for HostCall {
    fn drop(&mut self) {
        if self.held {
            self.world.stats().stall_held += 1;
        }
        self.world.record(Event::HostCallEnd {
            call: self.id,
            how: self.end,
        });
    }
}

fn done(result: HostResult) -> Result<(), HypervisorError> {
    result.map(|_| ())
}

impl Hypervisor for SimHypervisor {
    async fn describe(&self) -> Result<Vec<Machine>, HypervisorError> {
        let world = &self.world;
        let down_at = |now: Duration| {
            (0..world.plan.hosts).find(|h| !world.calm() && world.host_unreachable(*h, now))
        };
        if down_at(elapsed()).is_none() {
            for host in 0..world.plan.hosts {
                let _permit = self.lanes[host].acquire(Lane::Read).await;
                let link = self.spreads[host].lease();
                // A stalled host answers the scan when it resumes.
                self.hold(host).await;
                self.scan(host, &link);
            }
        }
        match down_at(elapsed()) {
            Some(host) => Err(HypervisorError::permanent(format!(
                "zone-{host}: describe: host unreachable"
            ))),
            None => {
                let hosts = world.hosts();
                for (books, domains) in self.books().iter_mut().zip(&hosts.domains) {
                    books::scan(books, domains);
                }
                Ok(world
                    .inventory
                    .iter()
                    .map(|slot| {
                        let mut machine = slot.clone();
                        let drift = hosts.price_drift.get(&slot.id).copied().unwrap_or(0);
                        machine.price_per_hour += f64::from(drift) * 0.125;
                        let host = zone_index(&slot.zone);
                        if let Some(domain) = hosts.domains[host].get(&slot.id) {
                            if domain.running {
                                machine.state = MachineState::Idle;
                                machine.host = Some(self.host_ref(host, domain));
                            }
                        }
                        machine
                    })
                    .collect())
            }
        }
    }

    async fn create(&self, request: CreateRequest) -> Result<Created, HypervisorError> {
        let host = self.dispatch(Op::Create, &request.machine).await?;
        Ok(Created {
            host: host.expect("create returns the host"),
            resources: None,
            allocatable: None,
        })
    }

    async fn configure(&self, request: ConfigureRequest) -> Result<(), HypervisorError> {
        done(
            self.dispatch(Op::Configure(request.cluster_id), &request.machine)
                .await,
        )
    }

    async fn confirm_node_ready(&self, request: ReadinessRequest) -> Result<(), HypervisorError> {
        done(self.dispatch(Op::Ready, &request.machine).await)
    }

    fn readiness_gate(&self) -> bool {
        true
    }

    async fn drain(&self, request: DrainRequest) -> Result<(), HypervisorError> {
        done(self.dispatch(Op::Drain, &request.machine).await)
    }

    async fn delete(&self, request: DeleteRequest) -> Result<(), HypervisorError> {
        done(self.dispatch(Op::Delete, &request.machine).await)
    }
}
