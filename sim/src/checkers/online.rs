//! Checks on every answer, read from the history.
//!
//! Provider side (`on_answer`, for each answer as it left the provider node, recorded by
//! the server): the answer may reflect only durable state, judged against the disk as it
//! was when the answer left. Every machine it shows must be one of that machine's durable
//! records, an acknowledged operation id must be durable, and a List revision may not be
//! ahead of the durable counter. This is what makes "no acknowledged mutation is lost
//! across restarts" hold by construction rather than by luck of the crash timing.
//!
//! Client side (`on_mutation`, `on_machine`, `on_list`, for each answer a shard received,
//! recorded by the shard with what it had sent):
//! stale tokens are never applied, fresh tokens are never fenced, records keep their
//! binding shape, a Configure's metadata comes back verbatim, and revisions never go back.

use bigfleet_libvirt_domain::{FenceMark, Kind, MachineId, StringMap, parse_cursor};
use bigfleet_libvirt_grpc::convert;
use bigfleet_libvirt_proto::v1alpha1 as pb;
use tonic::Code;

use std::time::Duration;

use super::{Checkers, DiskSeen, FenceScope, binding_problem, from_wire, op_number};
use crate::rpc::{Answer, Reply, Rpc};
use crate::verdict::Invariant;

fn target(rpc: &Rpc) -> Option<(&str, Kind)> {
    match rpc {
        Rpc::Create(r) => Some((&r.machine_id, Kind::Create)),
        Rpc::Configure(r) => Some((&r.machine_id, Kind::Configure)),
        Rpc::Drain(r) => Some((&r.machine_id, Kind::Drain)),
        Rpc::Delete(r) => Some((&r.machine_id, Kind::Delete)),
        Rpc::Get(_) | Rpc::List(_) => None,
    }
}

fn durable_problem(disk: &DiskSeen, answered: &pb::Machine, what: &str) -> Option<String> {
    let id = MachineId::new(answered.id.clone()).ok()?;
    let durable = disk
        .records(&id)
        .iter()
        .rev()
        .any(|record| convert::machine(record) == *answered);
    let state = pb::MachineState::try_from(answered.state).map_or("?", |s| s.as_str_name());
    (!durable).then(|| format!("{what} shows machine {id} as {state}, which is not durable"))
}

/// Provider side: the answer that left at `at` reflects only durable state (and is not the
/// INTERNAL that the service's panic guard answers for a panicking handler).
pub fn on_answer(checkers: &Checkers, at: Duration, rpc: &Rpc, reply: &Reply) {
    let answer = match reply {
        Ok(answer) => answer,
        Err(status) if status.code() == Code::Internal => {
            let detail = format!(
                "a handler panicked (INTERNAL: {}) on {rpc:?}",
                status.message()
            );
            checkers.violation_at(Invariant::Panic, at, detail);
            return;
        }
        Err(_) => return,
    };
    let problems: Vec<String> = {
        let seen = checkers.disk();
        let disk = &*seen;
        match answer {
            Answer::Ack(ack) => {
                let mut problems: Vec<String> = ack
                    .machine
                    .iter()
                    .filter_map(|m| durable_problem(disk, m, "an ack"))
                    .collect();
                if let Some((id, kind)) = target(rpc) {
                    let durable = MachineId::new(id)
                        .ok()
                        .and_then(|id| disk.disk.operation(&id, kind).cloned());
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
            Answer::Machine(m) => durable_problem(disk, m, "a Get").into_iter().collect(),
            Answer::List(list) => {
                let mut problems: Vec<String> = list
                    .machines
                    .iter()
                    .filter_map(|m| durable_problem(disk, m, "a List"))
                    .collect();
                let revision = parse_cursor(&list.revision).unwrap_or(i64::MIN);
                if revision > disk.disk.revision() {
                    problems.push(format!(
                        "a List answers revision {revision}, the durable revision is {}",
                        disk.disk.revision()
                    ));
                }
                problems
            }
        }
    };
    for problem in problems {
        checkers.violation_at(Invariant::DurableBeforeAnswer, at, problem);
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

/// Follows a fenced call about to be sent (event `number`).
pub fn on_send(checkers: &Checkers, number: u64, scope: FenceScope, token: FenceMark) {
    let mut ledger = checkers.ledger();
    ledger.sent.entry(scope.clone()).or_default().insert(token);
    let floor = ledger.acked_marks.get(&scope).copied();
    let sent = Sent {
        scope,
        token,
        floor,
    };
    ledger.sends.insert(number, sent);
}

/// Whether fencing `token` can be right: a mark only ever holds a token some process sent
/// for the same (shard, machine), so another token at least as new must have been sent by
/// the time the rejection arrives. (A zombie's token may be overtaken by its successor's,
/// even if it was minted first: freshness is judged when the answer arrives.)
fn fencing_justified(checkers: &Checkers, scope: &FenceScope, token: FenceMark) -> bool {
    checkers
        .ledger()
        .sent
        .get(scope)
        .is_some_and(|sent| sent.range(token..).any(|other| *other != token))
}

/// Client side: checks what a shard learned at `at` of the fenced mutating call it sent as
/// event `sent`: `reply`, if the provider's answer arrived. `binding` is the (cluster,
/// metadata) a Configure sent.
pub fn on_mutation(
    checkers: &Checkers,
    at: Duration,
    sent: u64,
    kind: Kind,
    reply: Option<&Reply>,
    binding: Option<&(String, StringMap)>,
) {
    let Some(sent) = checkers.ledger().sends.remove(&sent) else {
        return;
    };
    let Some(reply) = reply else {
        return;
    };
    let (scope, token) = (&sent.scope, sent.token);
    let passed = match reply {
        Ok(_) => true,
        Err(status) => match status.code() {
            // The fence runs before not-found and the position check (docs/contract.md §2.3).
            Code::NotFound | Code::Aborted => true,
            Code::FailedPrecondition => {
                if !fencing_justified(checkers, scope, token) {
                    let detail = format!(
                        "{kind} by {} on {} with token {token:?} was fenced, but no newer \
                         token was ever sent for that machine: {}",
                        scope.0,
                        scope.1,
                        status.message()
                    );
                    checkers.violation_at(Invariant::FreshTokenFenced, at, detail);
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
        checkers.violation_at(Invariant::StaleTokenApplied, at, detail);
    }
    {
        let mut ledger = checkers.ledger();
        let mark = ledger.acked_marks.entry(scope.clone()).or_insert(token);
        *mark = (*mark).max(token);
    }
    if let Ok(Answer::Ack(ack)) = reply {
        if let Some(n) = op_number(&ack.operation_id) {
            let mut ledger = checkers.ledger();
            let acked = ledger.acked_ops.entry((scope.1.clone(), kind)).or_insert(n);
            *acked = (*acked).max(n);
        }
        if let Some(machine) = &ack.machine {
            on_machine(checkers, at, machine);
            check_verbatim(checkers, at, machine, binding);
        }
    }
}

/// A Configure ack that carries the cluster this shard sent must carry its metadata verbatim.
fn check_verbatim(
    checkers: &Checkers,
    at: Duration,
    machine: &pb::Machine,
    binding: Option<&(String, StringMap)>,
) {
    let Some((cluster, metadata)) = binding else {
        return;
    };
    if machine.cluster != *cluster {
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
        checkers.violation_at(Invariant::Binding, at, detail);
    }
}

/// Client side: a machine as any answer shows it (received at `at`) keeps its shape and
/// binding rule.
pub fn on_machine(checkers: &Checkers, at: Duration, machine: &pb::Machine) {
    match from_wire(machine) {
        Some(record) => {
            if let Some(problem) = binding_problem(&record) {
                let detail = format!("answered record: {problem}");
                checkers.violation_at(Invariant::Binding, at, detail);
            }
        }
        None => checkers.violation_at(
            Invariant::Binding,
            at,
            format!("answered record {:?} has no valid id or state", machine.id),
        ),
    }
}

/// Follows a List about to be sent (event `number`): the highest revision any client had
/// been answered by then is its floor.
pub fn on_listing(checkers: &Checkers, number: u64) {
    let mut ledger = checkers.ledger();
    let floor = ledger.max_revision;
    ledger.lists.insert(number, floor);
}

/// Client side: the answer, received at `at`, to the List sent as event `sent`, if one
/// arrived. It may not go back behind its floor (`on_listing`) nor the since_revision it
/// carried (`cursor`).
pub fn on_list(
    checkers: &Checkers,
    at: Duration,
    sent: u64,
    list: Option<&pb::MachineList>,
    cursor: Option<i64>,
) {
    let floor = checkers.ledger().lists.remove(&sent).unwrap_or(i64::MIN);
    let Some(list) = list else {
        return;
    };
    let revision = parse_cursor(&list.revision).unwrap_or(i64::MIN);
    let lowest = floor.max(cursor.unwrap_or(i64::MIN));
    if revision < lowest {
        let detail = format!("a List answered revision {revision} after revision {lowest}");
        checkers.violation_at(Invariant::Revisions, at, detail);
    }
    for machine in &list.machines {
        on_machine(checkers, at, machine);
    }
    let mut ledger = checkers.ledger();
    ledger.max_revision = ledger.max_revision.max(revision);
}
