//! Part 4: SIGKILL under concurrent load: the model of what the acknowledged history allows, and
//! the traffic tasks that build it. The restart check and the test are in `verify`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use rand_xoshiro::Xoshiro256PlusPlus;
use tonic::Code;

use super::*;
use crate::harness::*;

mod verify;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Create,
    Configure,
    Drain,
    Delete,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Create => "create",
            Kind::Configure => "configure",
            Kind::Drain => "drain",
            Kind::Delete => "delete",
        }
    }
    fn transitional(self) -> S {
        match self {
            Kind::Create => S::Creating,
            Kind::Configure => S::Configuring,
            Kind::Drain => S::Draining,
            Kind::Delete => S::Deleting,
        }
    }
    fn target(self) -> S {
        match self {
            Kind::Create | Kind::Drain => S::Idle,
            Kind::Configure => S::Configured,
            Kind::Delete => S::Speculative,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Binding {
    cluster: String,
    md: HashMap<String, String>,
}

/// What the acknowledged history says about a machine.
#[derive(Clone, Debug)]
enum Base {
    /// Known stable and durable (verified after a restart, or implied by a later ack).
    Settled { state: S, binding: Option<Binding> },
    /// Accepted (the ack was received); its completion is not known to be durable yet.
    /// `binding` is the binding the record had at acceptance.
    Pending {
        kind: Kind,
        binding: Option<Binding>,
    },
}

#[derive(Clone, Debug)]
struct LastAck {
    kind: Kind,
    op: String,
    /// For Configure: the binding that was accepted (retries resend it).
    binding: Option<Binding>,
    lifetime: usize,
}

/// A call whose outcome the kill made unknown.
#[derive(Clone, Debug)]
struct Indefinite {
    kind: Kind,
    /// Sent as a fresh transition from its source state (so it may have been accepted).
    fresh: bool,
    /// The binding the record would carry once accepted (Configure: the one sent; Drain:
    /// the current one).
    binding: Option<Binding>,
    /// The highest op number acknowledged before the call was sent.
    op_floor: u64,
}

#[derive(Clone, Debug)]
struct Model {
    id: String,
    shard: String,
    base: Base,
    last_ack: Option<LastAck>,
    cycle: u32,
    indefinite: Option<Indefinite>,
    /// The newest fenced token that got a definite answer (OK or a rejection other than
    /// FAILED_PRECONDITION): the mark for (shard, id) is at least this.
    mark: Option<(i64, i64)>,
    /// Whether the fake holds this machine's domain in the current process lifetime.
    domain_here: bool,
}

impl Model {
    fn bound(&self) -> Option<Binding> {
        match &self.base {
            Base::Settled { binding, .. } | Base::Pending { binding, .. } => binding.clone(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Stats {
    fresh: u64,
    retries: u64,
    cross_restart_retries: u64,
    probes: u64,
    indefinite: u64,
}

impl Stats {
    fn add(&mut self, o: Stats) {
        self.fresh += o.fresh;
        self.retries += o.retries;
        self.cross_restart_retries += o.cross_restart_retries;
        self.probes += o.probes;
        self.indefinite += o.indefinite;
    }
}

struct Task {
    index: usize,
    shard: String,
    seq: i64,
    lifetime: usize,
    rng: Xoshiro256PlusPlus,
    pool: Vec<Model>,
    stats: Stats,
    clusters: u64,
}

struct Shared {
    /// Set just before SIGKILL: errors after this are indefinite, and no new call starts.
    killed: AtomicBool,
    /// Set to let tasks finish their current call and stop (partial quiescence).
    stop: AtomicBool,
    /// Highest op number ever acknowledged.
    max_op: AtomicU64,
    /// Every op id ever learned → (machine, kind, cycle).
    ops: Mutex<HashMap<String, (String, Kind, u32)>>,
}

impl Shared {
    /// Records a freshly minted op id; it must be new and above `floor`.
    fn mint(&self, op: &str, floor: u64, identity: (String, Kind, u32)) {
        let n = op_number(op);
        assert!(
            n > floor,
            "(d) op id {op} for {identity:?} is not above {floor}, the highest op number \
             acknowledged before it was requested: the op-id counter went back"
        );
        let mut ops = self.ops.lock().unwrap();
        if let Some(previous) = ops.get(op) {
            panic!("(d) op id {op} reused: first {previous:?}, now {identity:?}");
        }
        ops.insert(op.to_owned(), identity);
        drop(ops);
        self.max_op.fetch_max(n, Ordering::SeqCst);
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Action {
    Fresh,
    Retry,
    Probe,
}

fn random_binding(rng: &mut Xoshiro256PlusPlus, task: usize, n: u64) -> Binding {
    const VALUES: [&str; 6] = ["v", "", "élan", "a\u{0}b", "✓ ok", "line\nbreak"];
    let entries = below(rng, 4);
    let md = (0..entries)
        .map(|i| {
            let value = VALUES[below(rng, VALUES.len() as u64) as usize];
            (
                format!("dur/t{task}/k{i}"),
                format!("{value}{}", below(rng, 1000)),
            )
        })
        .collect();
    Binding {
        cluster: format!("load-t{task}-{n}"),
        md,
    }
}

async fn send(
    c: &mut Client,
    kind: Kind,
    id: &str,
    binding: Option<&Binding>,
    token: Token,
) -> Result<pb::TransitionAck, tonic::Status> {
    match kind {
        Kind::Create => create(c, id, token).await,
        Kind::Configure => {
            let b = binding.expect("a Configure carries a binding");
            configure_map(c, id, &b.cluster, b.md.clone(), b"# load\n".to_vec(), token).await
        }
        Kind::Drain => drain(c, id, 5, token).await,
        Kind::Delete => delete(c, id, token).await,
    }
}

fn binding_of(m: &pb::Machine) -> Option<Binding> {
    (!m.cluster.is_empty() || !m.shard_metadata.is_empty()).then(|| Binding {
        cluster: m.cluster.clone(),
        md: m.shard_metadata.clone(),
    })
}

/// During load (no restart in between) Get must agree with the acknowledged history.
fn check_live(model: &Model, m: &pb::Machine) {
    let s = state(m);
    let ok = match &model.base {
        Base::Settled { state, .. } => s == *state,
        Base::Pending { kind, .. } => s == kind.transitional() || s == kind.target(),
    };
    assert!(
        ok,
        "during load {} is {s:?}, but the acknowledged history says {:?}",
        model.id, model.base
    );
}

/// One task's traffic until the kill (or the stop flag).
async fn run_task(mut t: Task, mut c: Client, shared: Arc<Shared>) -> Task {
    let epoch = i64::try_from(t.lifetime).expect("small") + 1;
    while !shared.stop.load(Ordering::SeqCst) && !shared.killed.load(Ordering::SeqCst) {
        let i = below(&mut t.rng, t.pool.len() as u64) as usize;
        let roll = below(&mut t.rng, 100);
        let action = if roll < 15 && t.pool[i].last_ack.is_some() {
            Action::Retry
        } else if roll < 22 {
            Action::Probe
        } else {
            Action::Fresh
        };
        let (kind, binding) = if action == Action::Retry {
            let la = t.pool[i].last_ack.clone().expect("retry of an acked call");
            let mut binding = la.binding.clone();
            if la.kind == Kind::Configure && below(&mut t.rng, 2) == 0 {
                // Same intent, different request contents: they must be ignored.
                t.clusters += 1;
                binding = Some(random_binding(&mut t.rng, t.index, t.clusters));
            }
            (la.kind, binding)
        } else {
            let Ok(current) = get(&mut c, &t.pool[i].id).await else {
                break;
            };
            check_live(&t.pool[i], &current);
            let s = state(&current);
            assert_ne!(
                s,
                S::Failed,
                "{} FAILED during load: {current:?}",
                t.pool[i].id
            );
            let domain = t.pool[i].domain_here;
            let pick = below(&mut t.rng, 10);
            let kind = match (action, s) {
                (Action::Fresh, S::Speculative) => Some(Kind::Create),
                // The fake lost the domain of a machine restored Idle: only Delete works.
                (Action::Fresh, S::Idle) if domain && pick < 7 => Some(Kind::Configure),
                (Action::Fresh, S::Idle) => Some(Kind::Delete),
                (Action::Fresh, S::Configured) if domain => Some(Kind::Drain),
                // Always out of position (no record makes them idempotent).
                (Action::Probe, S::Speculative) if pick < 5 => Some(Kind::Configure),
                (Action::Probe, S::Speculative) => Some(Kind::Drain),
                (Action::Probe, S::Configured) if pick < 5 => Some(Kind::Create),
                (Action::Probe, S::Configured) => Some(Kind::Delete),
                _ => None,
            };
            let Some(kind) = kind else {
                tokio::time::sleep(Duration::from_millis(2)).await;
                continue;
            };
            let binding = match kind {
                Kind::Configure => {
                    t.clusters += 1;
                    Some(random_binding(&mut t.rng, t.index, t.clusters))
                }
                Kind::Drain => t.pool[i].bound(),
                _ => None,
            };
            (kind, binding)
        };
        let fenced = below(&mut t.rng, 100) < 60;
        let token: Token = fenced.then(|| {
            t.seq += 1;
            (t.shard.clone(), epoch, t.seq)
        });
        if shared.killed.load(Ordering::SeqCst) {
            break;
        }
        let floor = shared.max_op.load(Ordering::SeqCst);
        let id = t.pool[i].id.clone();
        let result = send(&mut c, kind, &id, binding.as_ref(), token.clone()).await;
        let killed = shared.killed.load(Ordering::SeqCst);
        let m = &mut t.pool[i];
        match result {
            Ok(ack) => {
                if let Some((_, e, s)) = &token {
                    m.mark = Some((*e, *s));
                }
                let snap = ack.machine.clone().unwrap_or_default();
                match action {
                    Action::Fresh => {
                        m.cycle += 1;
                        shared.mint(&ack.operation_id, floor, (id.clone(), kind, m.cycle));
                        assert_eq!(
                            state(&snap),
                            kind.transitional(),
                            "a fresh {kind:?} ack on {id} is not transitional: {ack:?}"
                        );
                        let at_accept = match kind {
                            Kind::Configure | Kind::Drain => binding.clone(),
                            _ => None,
                        };
                        if kind == Kind::Configure {
                            assert_eq!(binding_of(&snap), at_accept, "Configure ack binding");
                        }
                        m.base = Base::Pending {
                            kind,
                            binding: at_accept,
                        };
                        m.last_ack = Some(LastAck {
                            kind,
                            op: ack.operation_id.clone(),
                            binding: if kind == Kind::Configure {
                                binding
                            } else {
                                None
                            },
                            lifetime: t.lifetime,
                        });
                        m.domain_here =
                            kind == Kind::Create || (m.domain_here && kind != Kind::Delete);
                        t.stats.fresh += 1;
                    }
                    Action::Retry => {
                        let la = m.last_ack.clone().expect("retry of an acked call");
                        assert_eq!(
                            ack.operation_id, la.op,
                            "(d) an idempotent {kind:?} retry on {id} returned a different op id \
                             (recorded in lifetime {}, now lifetime {})",
                            la.lifetime, t.lifetime
                        );
                        if kind == Kind::Configure {
                            assert_eq!(
                                binding_of(&snap),
                                la.binding,
                                "a Configure retry with other contents changed the binding"
                            );
                        }
                        if fenced && state(&snap) == kind.target() {
                            // The retry's mark was made durable after the completion it saw.
                            m.base = Base::Settled {
                                state: kind.target(),
                                binding: if kind == Kind::Configure {
                                    la.binding
                                } else {
                                    None
                                },
                            };
                        }
                        if la.lifetime < t.lifetime {
                            t.stats.cross_restart_retries += 1;
                        }
                        t.stats.retries += 1;
                    }
                    Action::Probe => {
                        panic!("out-of-position {kind:?} on {id} was accepted: {ack:?}")
                    }
                }
                shared
                    .max_op
                    .fetch_max(op_number(&ack.operation_id), Ordering::SeqCst);
            }
            Err(_) if killed => {
                // Sent before the kill, answered (or broken) after it: unknown outcome.
                m.indefinite = Some(Indefinite {
                    kind,
                    fresh: action == Action::Fresh,
                    binding: match kind {
                        Kind::Configure | Kind::Drain => binding,
                        _ => None,
                    },
                    op_floor: floor,
                });
                t.stats.indefinite += 1;
                break;
            }
            Err(status) => {
                assert_ne!(
                    status.code(),
                    Code::FailedPrecondition,
                    "a strictly newer token {token:?} was fenced on {id}: {status:?}"
                );
                assert!(
                    action == Action::Probe && status.code() == OUT_OF_POSITION,
                    "{action:?} {kind:?} on {id} failed before any kill: {status:?}"
                );
                if let Some((_, e, s)) = &token {
                    m.mark = Some((*e, *s));
                }
                t.stats.probes += 1;
            }
        }
    }
    t
}
