//! Mutating calls and transition completions.
//!
//! The order inside [`Core::mutate`] is that of docs/contract.md §2.3 and is load-bearing: empty
//! or oversized id, an empty cluster id, then the Delete capability (before the fence, so an
//! unsupported Delete never moves a mark), then the fence (before not-found, so a zombie learns
//! nothing), then not-found, the idempotent short-circuit, the position check, and finally accept.

use std::sync::Arc;
use std::time::Duration;

use crate::changes::ChangeSet;
use crate::core::{Core, InFlight};
use crate::echo::MAX_ID_BYTES;
use crate::fence::FenceKey;
use crate::machine::{HostRef, Machine, MachineId, MachineState, StringMap, Timestamp};
use crate::mutate::{Ack, Dispatch, MutateDecision, MutateError, MutateRequest, Mutation};
use crate::operation::{Kind, OperationId};

/// How a hypervisor call ended.
#[derive(Clone, Debug, PartialEq)]
pub enum TransitionResult {
    /// Create succeeded on `host`; resources/allocatable replace the record's when given.
    Created {
        /// Where the machine now runs.
        host: HostRef,
        /// New resources, if the hypervisor reports them.
        resources: Option<StringMap>,
        /// New allocatable, if the hypervisor reports it.
        allocatable: Option<StringMap>,
    },
    /// Configure (bootstrap and readiness) succeeded.
    Configured,
    /// Drain succeeded.
    Drained,
    /// Delete succeeded.
    Deleted,
    /// The call failed with this message.
    Failed(String),
    /// The deadline passed first.
    TimedOut,
}

/// The end of one dispatched transition.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The machine.
    pub machine_id: MachineId,
    /// The transition kind.
    pub kind: Kind,
    /// The operation that was dispatched.
    pub operation_id: OperationId,
    /// How it ended.
    pub result: TransitionResult,
}

/// What a completion did.
#[derive(Clone, Debug, PartialEq)]
pub enum CompletionOutcome {
    /// The machine moved to this state.
    Applied(Arc<Machine>),
    /// The completion was stale (late, superseded or for a vanished machine) and ignored.
    Dropped,
}

impl Core {
    /// Decides one mutating call at time `now`.
    pub fn mutate(&mut self, mutation: Mutation, now: Timestamp) -> MutateDecision {
        let kind = mutation.request.kind();
        let rejected = |error| MutateDecision {
            outcome: Err(error),
            changes: None,
        };
        let Ok(id) = MachineId::new(mutation.machine_id.clone()) else {
            return rejected(MutateError::MissingMachineId);
        };
        // Oversized ids are refused at the same step as an empty one: before any fence
        // mark is read or minted, so a huge id never reaches the state or a message.
        for (field, value) in [
            ("machine_id", &mutation.machine_id),
            ("shard_id", &mutation.token.shard_id),
        ] {
            if value.len() > MAX_ID_BYTES {
                return rejected(MutateError::IdTooLong {
                    field,
                    length: value.len(),
                });
            }
        }
        if matches!(&mutation.request, MutateRequest::Configure { cluster, .. } if cluster.is_empty())
        {
            return rejected(MutateError::MissingClusterId);
        }
        if kind == Kind::Delete && !self.policy.delete_supported {
            return rejected(MutateError::DeleteUnsupported);
        }
        #[cfg(feature = "bug-fence-after-idempotency")]
        if let Some(ack) = self.idempotent_replay(&id, kind) {
            return MutateDecision {
                outcome: Ok(ack),
                changes: None,
            };
        }
        let mut changes = ChangeSet::default();
        if !mutation.token.is_unfenced() {
            let key = FenceKey {
                shard_id: mutation.token.shard_id.clone(),
                // Injected bug (simulator bug hunt only): one mark per shard.
                machine_id: if cfg!(feature = "bug-per-shard-fence") {
                    String::new()
                } else {
                    mutation.machine_id.clone()
                },
            };
            let presented = mutation.token.mark();
            if let Some(&mark) = self.fences.get(&key) {
                if presented <= mark {
                    return rejected(MutateError::Fenced {
                        key,
                        presented,
                        mark,
                    });
                }
            }
            self.remember_fence(&key);
            self.fences.insert(key.clone(), presented);
            changes.fences.push((key, presented));
        }
        let outcome = self.decide(&id, mutation.request, now, &mut changes);
        self.stamp(&mut changes);
        let changes = (!changes.is_empty()).then_some(changes);
        MutateDecision { outcome, changes }
    }

    /// Injected bug (simulator bug hunt only): the idempotent short-circuit before the fence,
    /// so a zombie's replay learns the cached operation id.
    #[cfg(feature = "bug-fence-after-idempotency")]
    fn idempotent_replay(&self, id: &MachineId, kind: Kind) -> Option<Ack> {
        let record = self.records.get(id)?;
        let op = self.operations.get(&(id.clone(), kind))?;
        kind.reuses_in(record.machine.state).then(|| Ack {
            operation_id: op.clone(),
            machine: Arc::clone(&record.machine),
            dispatch: None,
        })
    }

    /// Steps 5–8: not-found, idempotency, position, accept (the fence already passed).
    fn decide(
        &mut self,
        id: &MachineId,
        request: MutateRequest,
        now: Timestamp,
        changes: &mut ChangeSet,
    ) -> Result<Ack, MutateError> {
        let kind = request.kind();
        let Some(record) = self.records.get(id) else {
            return Err(MutateError::NotFound {
                machine_id: id.to_string(),
            });
        };
        let state = record.machine.state;
        if let Some(op) = self.operations.get(&(id.clone(), kind)) {
            if kind.reuses_in(state) {
                let machine = Arc::clone(&record.machine);
                return Ok(Ack {
                    operation_id: op.clone(),
                    machine,
                    dispatch: None,
                });
            }
        }
        if state != kind.source() {
            return Err(MutateError::OutOfPosition {
                machine_id: id.to_string(),
                kind,
                state,
            });
        }
        Ok(self.accept(id, request, now, changes))
    }

    /// Step 8 of a mutating call: accepts `request` on the machine, which is in its source
    /// state: mints the operation id, moves the machine to the transitional state, records the
    /// transition in flight with its deadline, and returns the ack with the dispatch.
    fn accept(
        &mut self,
        id: &MachineId,
        request: MutateRequest,
        now: Timestamp,
        changes: &mut ChangeSet,
    ) -> Ack {
        let kind = request.kind();
        self.next_operation += 1;
        let operation_id = OperationId::mint(&self.policy.operation_prefix, self.next_operation);
        let timeout = self.policy.timeouts.for_kind(kind);
        let deadline = now.saturating_add(timeout);
        let grace_period_seconds = match &request {
            MutateRequest::Drain {
                grace_period_seconds,
            } => *grace_period_seconds,
            _ => 0,
        };
        let machine = self.update(id, |m| {
            m.state = kind.transitional();
            if let MutateRequest::Configure {
                cluster,
                shard_metadata,
            } = request
            {
                m.cluster = cluster;
                m.shard_metadata = shard_metadata;
            }
        });
        let record = self.records.get_mut(id).expect("accepted record exists");
        record.in_flight = Some(InFlight {
            kind,
            operation_id: operation_id.clone(),
            deadline,
            timeout,
        });
        self.remember_operation(id, kind);
        self.operations
            .insert((id.clone(), kind), operation_id.clone());
        changes.machines.push(Arc::clone(&machine));
        changes
            .operations
            .push((id.clone(), kind, operation_id.clone()));
        let dispatch = Dispatch {
            kind,
            operation_id: operation_id.clone(),
            machine: Arc::clone(&machine),
            deadline,
            timeout,
            grace_period_seconds,
        };
        Ack {
            operation_id,
            machine,
            dispatch: Some(dispatch),
        }
    }

    /// Finishes a dispatched transition at time `now`. A completion for anything but the
    /// transition currently in flight is dropped, and a success that arrives at or after the
    /// deadline counts as a timeout: a machine that timed out is Failed for good.
    pub fn complete(
        &mut self,
        completion: Completion,
        now: Timestamp,
    ) -> (CompletionOutcome, Option<ChangeSet>) {
        let Completion {
            machine_id,
            kind,
            operation_id,
            result,
        } = completion;
        let Some(record) = self.records.get(&machine_id) else {
            return (CompletionOutcome::Dropped, None);
        };
        let Some(in_flight) = record.in_flight.as_ref() else {
            return (CompletionOutcome::Dropped, None);
        };
        if in_flight.kind != kind
            || in_flight.operation_id != operation_id
            || record.machine.state != kind.transitional()
        {
            return (CompletionOutcome::Dropped, None);
        }
        let late = now >= in_flight.deadline && !matches!(result, TransitionResult::Failed(_));
        let result = if late {
            TransitionResult::TimedOut
        } else {
            result
        };
        let timeout = in_flight.timeout;
        let machine = self.update(&machine_id, |m| settle(m, kind, result, timeout));
        self.records
            .get_mut(&machine_id)
            .expect("completed record exists")
            .in_flight = None;
        let mut changes = ChangeSet {
            machines: vec![Arc::clone(&machine)],
            ..ChangeSet::default()
        };
        self.stamp(&mut changes);
        (CompletionOutcome::Applied(machine), Some(changes))
    }
}

impl Core {
    /// The transition in flight on `id`, as its dispatch, when its deadline is at or before
    /// `now`: what the provider's deadline sweep fails as timed out when no result came back
    /// from its worker by then (a worker that never started, or one that hung). `None` when
    /// nothing is in flight there or its deadline is still ahead.
    #[must_use]
    pub fn overdue(&self, id: &MachineId, now: Timestamp) -> Option<Dispatch> {
        let record = self.records.get(id)?;
        let in_flight = record.in_flight.as_ref()?;
        if now < in_flight.deadline || record.machine.state != in_flight.kind.transitional() {
            return None;
        }
        Some(Dispatch {
            kind: in_flight.kind,
            operation_id: in_flight.operation_id.clone(),
            machine: Arc::clone(&record.machine),
            deadline: in_flight.deadline,
            timeout: in_flight.timeout,
            grace_period_seconds: 0,
        })
    }
}

/// Moves a transitional record to its target or to Failed.
fn settle(machine: &mut Machine, kind: Kind, result: TransitionResult, timeout: Duration) {
    let fail = |machine: &mut Machine, error: String| {
        machine.state = MachineState::Failed;
        machine.last_error = if error.is_empty() {
            format!("{kind} transition failed without an error message")
        } else {
            error
        };
    };
    match (kind, result) {
        (_, TransitionResult::Failed(error)) => fail(machine, error),
        (_, TransitionResult::TimedOut) => fail(
            machine,
            format!(
                "{kind} transition timed out after {}: context deadline exceeded",
                go_duration(timeout)
            ),
        ),
        (
            Kind::Create,
            TransitionResult::Created {
                host,
                resources,
                allocatable,
            },
        ) => {
            if !host.is_set() {
                return fail(
                    machine,
                    "create returned no host for a created machine".to_owned(),
                );
            }
            machine.state = MachineState::Idle;
            machine.host = Some(host);
            if let Some(resources) = resources {
                machine.resources = resources.into();
            }
            if let Some(allocatable) = allocatable {
                machine.allocatable = allocatable.into();
            }
        }
        (Kind::Configure, TransitionResult::Configured) => machine.state = MachineState::Configured,
        (Kind::Drain, TransitionResult::Drained) => {
            machine.state = MachineState::Idle;
            machine.cluster.clear();
            // Injected bug (simulator bug hunt only): the metadata outlives the binding.
            if !cfg!(feature = "bug-keep-metadata-on-drain") {
                machine.shard_metadata.clear();
            }
        }
        (Kind::Delete, TransitionResult::Deleted) => {
            machine.state = MachineState::Speculative;
            machine.host = None;
        }
        (kind, result) => panic!("{kind} transition completed with a mismatched result {result:?}"),
    }
}

/// Formats a duration the way the shard's logs expect (`2s`, `1m30s`, `5m0s`, `250ms`).
#[must_use]
pub(crate) fn go_duration(duration: Duration) -> String {
    let total_ms = duration.as_millis();
    if total_ms < 1000 {
        return format!("{total_ms}ms");
    }
    let secs = duration.as_secs();
    let millis = duration.subsec_millis();
    let frac = if millis == 0 {
        String::new()
    } else {
        format!(".{millis:03}").trim_end_matches('0').to_owned()
    };
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}{frac}s"),
        (0, _) => format!("{m}m{s}{frac}s"),
        _ => format!("{h}h{m}m{s}{frac}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::go_duration;
    use std::time::Duration;

    #[test]
    fn durations_print_like_the_reference() {
        assert_eq!(go_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(go_duration(Duration::from_secs(2)), "2s");
        assert_eq!(go_duration(Duration::from_millis(2500)), "2.5s");
        assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(go_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
    }
}
