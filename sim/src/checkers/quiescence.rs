//! The final checks, after faults stopped, the shards finished, the provider was restarted
//! once more and given time to converge (bounded by a simulated-time budget).
//!
//! - No machine is left in a transitional state, and the provider's state equals the disk.
//! - Hosts and state agree: every domain belongs to a record that names it as its host
//!   (no orphan), and every Idle/Configuring/Configured/Draining record has its domain.
//! - Every volume on a host belongs to a domain on that host: a failed Create's rollback and
//!   Delete leave none behind.
//! - No domain's configuration holds a join blob while its machine is Idle (or has no
//!   record): Drain took it out, whatever crashes and lost replies came between.
//! - No host holds the domain of a machine whose Delete failed (Failed with its host and
//!   no binding): its shard asked for it to go and can never ask again, so the provider's
//!   compensation finishes the removal, whatever cut the Delete off.
//! - Each watcher's delta-maintained view, after one more delta, equals a full List.
//! - The last acknowledged token of every (shard, machine) is still rejected, asked over
//!   the same simulated network path the shards use.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::{HostRef, ListQuery, MachineState};
use bigfleet_libvirt_proto::v1alpha1 as pb;

use super::Checkers;
use crate::hosts::{volume_owner, zone_index};
use crate::net::{self, Answer, Client, Outcome, Rpc};
use crate::server::Serving;
use crate::time::elapsed;
use crate::verdict::Invariant;
use crate::workload::{Watchers, watcher_delta};
use crate::world::World;

/// How long the provider gets to converge after the final restart.
pub const CONVERGENCE_BUDGET: Duration = Duration::from_secs(15 * 60);

/// Domains the state does not account for, and records whose domain is missing.
fn disagreements(world: &World, serving: &Serving) -> Vec<String> {
    let Some(provider) = serving.get() else {
        return vec!["the provider is not serving".to_owned()];
    };
    let page = provider.peek(&ListQuery::default());
    let hosts = world.hosts();
    let mut problems = Vec::new();
    for (zone, domains) in hosts.domains.iter().enumerate() {
        for (id, domain) in domains {
            let expected = HostRef {
                provider: world.provider_label.clone(),
                reference: format!("zone-{zone}/{}", domain.name),
            };
            let record = page.machines.iter().find(|m| &m.id == id);
            if record.and_then(|m| m.host.as_ref()) != Some(&expected) {
                let state = record.map_or("unknown".to_owned(), |m| m.state.to_string());
                problems.push(format!(
                    "domain {} of machine {id} on zone-{zone} is unknown to the state ({state})",
                    domain.name
                ));
            }
        }
    }
    for machine in &page.machines {
        let runs = matches!(
            machine.state,
            MachineState::Idle
                | MachineState::Configuring
                | MachineState::Configured
                | MachineState::Draining
        );
        let zone = zone_index(&machine.zone);
        let present = hosts.domains[zone]
            .get(&machine.id)
            .is_some_and(|d| d.running);
        if runs && !present {
            problems.push(format!(
                "machine {} is {} but its domain does not run",
                machine.id, machine.state
            ));
        }
    }
    problems
}

/// Volumes whose domain is not on their host.
fn volumes_without_domain(world: &World) -> Vec<String> {
    let hosts = world.hosts();
    let mut problems = Vec::new();
    for (zone, volumes) in hosts.volumes.iter().enumerate() {
        for volume in volumes {
            let owner = volume_owner(volume);
            if !hosts.domains[zone].values().any(|d| d.name == owner) {
                problems.push(format!(
                    "volume {volume} on zone-{zone} has no domain {owner}"
                ));
            }
        }
    }
    problems
}

/// Domains whose configuration still holds a join blob while their machine is Idle,
/// Speculative or unknown.
fn blobs_after_idle(world: &World, serving: &Serving) -> Vec<String> {
    let Some(provider) = serving.get() else {
        return vec!["the provider is not serving".to_owned()];
    };
    let page = provider.peek(&ListQuery::default());
    let hosts = world.hosts();
    let held = (hosts.domains.iter().enumerate())
        .flat_map(|(zone, domains)| domains.iter().map(move |(id, d)| (zone, id, d)))
        .filter(|(_, _, domain)| domain.blob);
    let state_of = |id| page.machines.iter().find(|m| &m.id == id).map(|m| m.state);
    held.filter_map(|(zone, id, domain)| match state_of(id) {
        Some(MachineState::Idle | MachineState::Speculative) | None => Some(format!(
            "domain {} of machine {id} on zone-{zone} still holds a join blob, and the \
             machine is {}",
            domain.name,
            state_of(id).map_or("unknown".to_owned(), |s| s.to_string())
        )),
        Some(_) => None,
    })
    .collect()
}

/// Domains of machines whose Delete failed: Failed, with a host and no cluster (a failed
/// Configure or Drain keeps its binding, and a Delete starts only from Idle).
fn failed_delete_leftovers(world: &World, serving: &Serving) -> Vec<String> {
    let Some(provider) = serving.get() else {
        return vec!["the provider is not serving".to_owned()];
    };
    let page = provider.peek(&ListQuery::default());
    let hosts = world.hosts();
    (page.machines.iter())
        .filter(|m| m.state == MachineState::Failed && m.has_host() && m.cluster.is_empty())
        .filter_map(|m| {
            let domain = hosts.domains[zone_index(&m.zone)].get(&m.id)?;
            Some(format!(
                "machine {}'s Delete failed ({}), and its domain {} is still on its host",
                m.id, m.last_error, domain.name
            ))
        })
        .collect()
}

fn transitional(serving: &Serving) -> Vec<String> {
    let Some(provider) = serving.get() else {
        return vec!["the provider is not serving".to_owned()];
    };
    provider
        .peek(&ListQuery::default())
        .machines
        .iter()
        .filter(|m| m.state.is_transitional())
        .map(|m| format!("machine {} is still {}", m.id, m.state))
        .collect()
}

/// Waits (bounded) for convergence, then runs every final check, on the process
/// `serving` holds and the views `watchers` kept.
pub async fn run(checkers: &Checkers, serving: &Serving, watchers: &Watchers) {
    let world = checkers.world();
    let give_up = elapsed() + CONVERGENCE_BUDGET;
    let converged = || {
        transitional(serving).is_empty()
            && disagreements(world, serving).is_empty()
            && failed_delete_leftovers(world, serving).is_empty()
    };
    while elapsed() < give_up && !converged() {
        madsim::time::sleep(Duration::from_secs(5)).await;
    }
    checkers.read_history();
    world.trace("quiescence checks");
    for problem in transitional(serving) {
        checkers.violation(Invariant::Convergence, problem);
    }
    for problem in disagreements(world, serving) {
        checkers.violation(Invariant::OrphanDomain, problem);
    }
    for problem in volumes_without_domain(world) {
        checkers.violation(Invariant::VolumeWithoutDomain, problem);
    }
    for problem in blobs_after_idle(world, serving) {
        checkers.violation(Invariant::BlobAfterIdle, problem);
    }
    for problem in failed_delete_leftovers(world, serving) {
        checkers.violation(Invariant::FailedDeleteLeftover, problem);
    }
    check_memory_equals_disk(checkers, serving);
    check_watchers(checkers, watchers).await;
    probe_fences(checkers).await;
}

fn check_memory_equals_disk(checkers: &Checkers, serving: &Serving) {
    let Some(provider) = serving.get() else {
        return;
    };
    let page = provider.peek(&ListQuery::default());
    let differing: Vec<String> = {
        let disk = checkers.world().disk();
        page.machines
            .iter()
            .filter(|m| disk.machine(&m.id).map(|d| d.as_ref()) != Some(m.as_ref()))
            .map(|m| format!("machine {} in memory differs from its durable record", m.id))
            .collect()
    };
    for detail in differing {
        checkers.violation(Invariant::DurableBeforeAnswer, detail);
    }
}

async fn full_list(world: &Arc<World>) -> Option<pb::MachineList> {
    match net::call(world, Client::Auditor, Rpc::List(pb::ListFilter::default())).await {
        Outcome::Answered(Ok(Answer::List(list))) => Some(list),
        _ => None,
    }
}

async fn check_watchers(checkers: &Checkers, watchers: &Watchers) {
    let world = checkers.world();
    for shard in 0..world.plan.shards {
        let mut view = watchers.view(shard);
        let (Some(delta), Some(full)) = (
            watcher_delta(world, Client::Auditor, &view).await,
            full_list(world).await,
        ) else {
            checkers.violation(Invariant::Convergence, "the final List calls got no answer");
            return;
        };
        view.apply(delta);
        let seen: Vec<&String> = view.machines.keys().collect();
        let listed: Vec<&String> = full.machines.iter().map(|m| &m.id).collect();
        if seen != listed {
            let detail = format!(
                "watcher-{shard} knows {} machines, a full List {}",
                seen.len(),
                listed.len()
            );
            checkers.violation(Invariant::Revisions, detail);
        }
        for machine in &full.machines {
            if view.machines.get(&machine.id) != Some(machine) {
                let detail = format!(
                    "watcher-{shard}'s since_revision view of {} is stale (state {} vs {})",
                    machine.id,
                    view.machines.get(&machine.id).map_or(0, |m| m.state),
                    machine.state
                );
                checkers.violation(Invariant::Revisions, detail);
            }
        }
    }
}

async fn probe_fences(checkers: &Checkers) {
    let world = checkers.world();
    let marks = checkers.ledger().acked_marks.clone();
    for ((shard, machine), mark) in marks {
        let rpc = Rpc::Create(pb::CreateRequest {
            machine_id: machine.clone(),
            shard_id: shard.clone(),
            shard_epoch: mark.epoch,
            sequence_number: mark.sequence,
        });
        match net::call(world, Client::Auditor, rpc).await {
            Outcome::Answered(Err(s)) if s.code() == tonic::Code::FailedPrecondition => {}
            Outcome::Answered(reply) => {
                let answer = reply.map_or_else(|s| format!("{:?}", s.code()), |_| "OK".to_owned());
                let detail = format!(
                    "at the end, the acknowledged token {mark:?} of {shard} on {machine} is \
                     answered {answer} instead of FAILED_PRECONDITION"
                );
                checkers.violation(Invariant::AckedSurvivesRestart, detail);
            }
            other => {
                let detail = format!("a fence probe got no answer: {other:?}");
                checkers.violation(Invariant::Convergence, detail);
            }
        }
    }
}
