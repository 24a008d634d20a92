//! Checks on every answer.
//!
//! Provider side (`on_answer`, before the reply leaves the provider node): the answer may
//! reflect only durable state. Every machine it shows must be one of that machine's durable
//! records, an acknowledged operation id must be durable, and a List revision may not be
//! ahead of the durable counter. This is what makes "no acknowledged mutation is lost
//! across restarts" hold by construction rather than by luck of the crash timing.
//!
//! Client side (`on_mutation`, `on_machine`, `on_list`, when a shard receives an answer):
//! stale tokens are never applied, fresh tokens are never fenced, records keep their
//! binding shape, a Configure's metadata comes back verbatim, and revisions never go back.

use bigfleet_libvirt_domain::{FenceMark, Kind, MachineId, StringMap, parse_cursor};
use bigfleet_libvirt_grpc::convert;
use bigfleet_libvirt_proto::v1alpha1 as pb;
use tonic::Code;

use super::{FenceScope, Invariant, binding_problem, from_wire, op_number};
use crate::fakes::store::Disk;
use crate::net::{Answer, Outcome, Reply, Rpc};
use crate::world::World;

fn target(rpc: &Rpc) -> Option<(&str, Kind)> {
    match rpc {
        Rpc::Create(r) => Some((&r.machine_id, Kind::Create)),
        Rpc::Configure(r) => Some((&r.machine_id, Kind::Configure)),
        Rpc::Drain(r) => Some((&r.machine_id, Kind::Drain)),
        Rpc::Delete(r) => Some((&r.machine_id, Kind::Delete)),
        Rpc::Get(_) | Rpc::List(_) => None,
    }
}

fn durable_problem(disk: &Disk, answered: &pb::Machine, what: &str) -> Option<String> {
    let id = MachineId::new(answered.id.clone()).ok()?;
    let durable = disk
        .history(&id)
        .iter()
        .rev()
        .any(|record| convert::machine(record) == *answered);
    let state = pb::MachineState::try_from(answered.state).map_or("?", |s| s.as_str_name());
    (!durable).then(|| format!("{what} shows machine {id} as {state}, which is not durable"))
}

/// Provider side: the answer about to leave reflects only durable state (and is not the
/// INTERNAL that the service's panic guard answers for a panicking handler).
pub fn on_answer(world: &World, rpc: &Rpc, reply: &Reply) {
    super::read_history(world);
    let answer = match reply {
        Ok(answer) => answer,
        Err(status) if status.code() == Code::Internal => {
            let detail = format!(
                "a handler panicked (INTERNAL: {}) on {rpc:?}",
                status.message()
            );
            world.violation(Invariant::Panic, detail);
            return;
        }
        Err(_) => return,
    };
    let problems: Vec<String> = {
        let disk = world.disk();
        match answer {
            Answer::Ack(ack) => {
                let mut problems: Vec<String> = ack
                    .machine
                    .iter()
                    .filter_map(|m| durable_problem(&disk, m, "an ack"))
                    .collect();
                if let Some((id, kind)) = target(rpc) {
                    let durable = MachineId::new(id)
                        .ok()
                        .and_then(|id| disk.operation(&id, kind).cloned());
                    let durable_n = durable.as_ref().and_then(|op| op_number(op.as_str()));
                    if durable_n < op_number(&ack.operation_id) {
                        problems.push(format!(
                            "ack of {kind} {id} names {} but the durable record is {durable:?}",
                            ack.operation_id
                        ));
                    }
                }
                problems
            }
            Answer::Machine(m) => durable_problem(&disk, m, "a Get").into_iter().collect(),
            Answer::List(list) => {
                let mut problems: Vec<String> = list
                    .machines
                    .iter()
                    .filter_map(|m| durable_problem(&disk, m, "a List"))
                    .collect();
                let revision = parse_cursor(&list.revision).unwrap_or(i64::MIN);
                if revision > disk.revision() {
                    problems.push(format!(
                        "a List answers revision {revision}, the durable revision is {}",
                        disk.revision()
                    ));
                }
                problems
            }
        }
    };
    for problem in problems {
        world.violation(Invariant::DurableBeforeAnswer, problem);
    }
}

/// What a shard knew when it sent a fenced call.
#[derive(Clone, Debug)]
pub struct Sent {
    /// (shard, machine).
    pub scope: FenceScope,
    /// The token's (epoch, sequence).
    pub token: FenceMark,
    /// The highest token of the scope that had a definite non-fenced answer by then.
    pub floor: Option<FenceMark>,
}

/// Records a fenced call about to be sent.
pub fn on_send(world: &World, scope: FenceScope, token: FenceMark) -> Sent {
    let mut ledger = world.ledger();
    ledger.sent.entry(scope.clone()).or_default().insert(token);
    let floor = ledger.acked_marks.get(&scope).copied();
    Sent {
        scope,
        token,
        floor,
    }
}

/// Whether fencing `token` can be right: a mark only ever holds a token some process sent
/// for the same (shard, machine), so another token at least as new must have been sent by
/// the time the rejection arrives. (A zombie's token may be overtaken by its successor's,
/// even if it was minted first: freshness is judged when the answer arrives.)
fn fencing_justified(world: &World, scope: &FenceScope, token: FenceMark) -> bool {
    world
        .ledger()
        .sent
        .get(scope)
        .is_some_and(|sent| sent.range(token..).any(|other| *other != token))
}

/// Client side: checks the answer to a fenced mutating call. `binding` is the (cluster,
/// metadata) a Configure sent.
pub fn on_mutation(
    world: &World,
    sent: &Sent,
    kind: Kind,
    outcome: &Outcome,
    binding: Option<(&str, &StringMap)>,
) {
    let Outcome::Answered(reply) = outcome else {
        return;
    };
    let (scope, token) = (&sent.scope, sent.token);
    let passed = match reply {
        Ok(_) => true,
        Err(status) => match status.code() {
            // The fence runs before not-found and the position check (docs/contract.md §2.3).
            Code::NotFound | Code::Aborted => true,
            Code::FailedPrecondition => {
                if !fencing_justified(world, scope, token) {
                    let detail = format!(
                        "{kind} by {} on {} with token {token:?} was fenced, but no newer \
                         token was ever sent for that machine: {}",
                        scope.0,
                        scope.1,
                        status.message()
                    );
                    world.violation(Invariant::FreshTokenFenced, detail);
                }
                false
            }
            _ => false,
        },
    };
    if !passed {
        return;
    }
    if let Some(floor) = sent.floor.filter(|f| token <= *f) {
        let answer = reply
            .as_ref()
            .map_or_else(|s| format!("{:?}", s.code()), |_| "OK".to_owned());
        let detail = format!(
            "{kind} by {} on {} with token {token:?} was answered {answer} although {floor:?} \
             had already been acknowledged",
            scope.0, scope.1
        );
        world.violation(Invariant::StaleTokenApplied, detail);
    }
    {
        let mut ledger = world.ledger();
        let mark = ledger.acked_marks.entry(scope.clone()).or_insert(token);
        *mark = (*mark).max(token);
    }
    if let Ok(Answer::Ack(ack)) = reply {
        if let Some(n) = op_number(&ack.operation_id) {
            let mut ledger = world.ledger();
            let acked = ledger.acked_ops.entry((scope.1.clone(), kind)).or_insert(n);
            *acked = (*acked).max(n);
        }
        if let Some(machine) = &ack.machine {
            on_machine(world, machine);
            check_verbatim(world, machine, binding);
        }
    }
}

/// A Configure ack that carries the cluster this shard sent must carry its metadata verbatim.
fn check_verbatim(world: &World, machine: &pb::Machine, binding: Option<(&str, &StringMap)>) {
    let Some((cluster, metadata)) = binding else {
        return;
    };
    if machine.cluster != cluster {
        return;
    }
    let echoed: StringMap = machine
        .shard_metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if echoed != *metadata {
        let detail = format!(
            "machine {} echoes shard_metadata {echoed:?} for cluster {cluster}, sent {metadata:?}",
            machine.id
        );
        world.violation(Invariant::Binding, detail);
    }
}

/// Client side: a machine as any answer shows it keeps its shape and binding rule.
pub fn on_machine(world: &World, machine: &pb::Machine) {
    match from_wire(machine) {
        Some(record) => {
            if let Some(problem) = binding_problem(&record) {
                world.violation(Invariant::Binding, format!("answered record: {problem}"));
            }
        }
        None => world.violation(
            Invariant::Binding,
            format!("answered record {:?} has no valid id or state", machine.id),
        ),
    }
}

/// Client side: a List answer. `floor` is the highest revision any client had been
/// answered when this List was sent; `cursor` the since_revision it carried.
pub fn on_list(world: &World, list: &pb::MachineList, floor: i64, cursor: Option<i64>) {
    let revision = parse_cursor(&list.revision).unwrap_or(i64::MIN);
    let lowest = floor.max(cursor.unwrap_or(i64::MIN));
    if revision < lowest {
        let detail = format!("a List answered revision {revision} after revision {lowest}");
        world.violation(Invariant::Revisions, detail);
    }
    for machine in &list.machines {
        on_machine(world, machine);
    }
    let mut ledger = world.ledger();
    ledger.max_revision = ledger.max_revision.max(revision);
}
