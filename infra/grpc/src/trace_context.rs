//! A call's place in its caller's trace, and its lines on the machine's timeline.
//!
//! - [`carrier`] reads the W3C headers (`traceparent`, `tracestate`, `baggage`) out of a
//!   call's metadata for `observe::trace_context::adopt`, which parents the call's `rpc` span
//!   on the caller's span. A header that is not visible ASCII is treated as absent.
//! - [`Received`] is a mutating call's `received` line on its machine's timeline (its shard
//!   and fencing token), written in the call's trace when the call arrives, and completed
//!   with the answer (`transition started` with the operation id, `replayed`, or `refused`
//!   with the code and message) once there is one.

use bigfleet_libvirt_domain::{Mutation, Timestamp};
use bigfleet_libvirt_observe::timeline::{self, Answer, Call, Timeline, What};
use bigfleet_libvirt_observe::trace_context::Carrier;
use tonic::Status;
use tonic::metadata::MetadataMap;

/// The trace-context headers of a call.
#[must_use]
pub fn carrier(metadata: &MetadataMap) -> Carrier<'_> {
    let header = |name: &str| metadata.get(name).and_then(|v| v.to_str().ok());
    Carrier {
        traceparent: header("traceparent"),
        tracestate: header("tracestate"),
        baggage: header("baggage"),
    }
}

/// A mutating call on the timeline, from its arrival to its answer.
pub struct Received<'a> {
    timeline: &'a Timeline,
    machine_id: String,
    at: Option<Timestamp>,
}

impl<'a> Received<'a> {
    /// Writes the `received` line of `mutation`, now.
    pub fn arrive(timeline: &'a Timeline, mutation: &Mutation) -> Self {
        let at = timeline.now();
        let token = &mutation.token;
        let call = Call {
            kind: mutation.request.kind(),
            shard_id: timeline::shard_text(&token.shard_id),
            epoch: token.epoch,
            sequence: token.sequence,
            answer: None,
        };
        timeline.record(&mutation.machine_id, at, What::Call(Box::new(call)));
        Received {
            timeline,
            machine_id: mutation.machine_id.clone(),
            at,
        }
    }

    /// Adds the answer to the line: the operation id and whether it started a transition,
    /// or the refusal.
    pub fn answered(self, answer: Result<(&str, bool), &Status>) {
        let Some(at) = self.at else {
            return;
        };
        let answer = match answer {
            Ok((operation_id, true)) => Answer::Started(operation_id.into()),
            Ok((operation_id, false)) => Answer::Replayed(operation_id.into()),
            Err(status) => Answer::Refused(
                crate::status::outcome_name(Some(status)).into(),
                timeline::bounded(status.message()),
            ),
        };
        self.timeline.answer(&self.machine_id, at, answer);
    }
}
