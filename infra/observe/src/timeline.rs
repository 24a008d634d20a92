//! The per-machine timeline: the last [`EVENTS_PER_MACHINE`] events of every machine the
//! provider holds, in memory, for an operator asking "what happened to machine X" without a
//! tracing backend. Served read-only as JSON on the metrics port (`GET /timeline?machine=ID`,
//! see `http`); docs/observability.md says what each event means and what it costs.
//!
//! Events are recorded by the adapters that see them: the gRPC service (a mutating call
//! received, with its shard and fencing token, completed with its answer: the transition
//! it started and its operation id, a replay, or a refusal), the instrumented hypervisor
//! (each phase of a transition, with its duration), the provider's transition observer (the
//! transition's end), the libvirt adapter (a domain changed behind the provider's back, seen
//! by its drift watch; the guest's addresses its agent reported after a Configure; the last
//! lines of a guest's serial console when it did not come up) and the
//! reconcile pass (records it changed). Each carries the trace id
//! of the span it was recorded in, so the operator can jump from a line to its trace.
//!
//! Bounded: only machines registered with [`Timeline::track`] (the provider's inventory) get
//! a ring, so calls naming unknown ids add nothing; each ring keeps its newest
//! [`EVENTS_PER_MACHINE`] events and drops the oldest; every text an event carries is cut to
//! [`MAX_TEXT_BYTES`]. No event carries a bootstrap blob: none of the recording sites has one.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bigfleet_libvirt_domain::{EchoField, Kind, MachineState, Timestamp};
use opentelemetry::trace::TraceId;
use serde::Serialize;

/// How many events each machine keeps: a full Create → Configure → Drain → Delete walk
/// records 13 (four calls, five phases, four ends), so one walk and its retries fit.
pub const EVENTS_PER_MACHINE: usize = 16;

/// The longest text (an error, a shard id) an event keeps, in bytes; longer ones are cut.
pub const MAX_TEXT_BYTES: usize = 256;

/// The hypervisor calls a phase can be, as the instrumented hypervisor names them.
pub const PHASES: [&str; 6] = [
    "DescribeManaged",
    "CreateDomain",
    "Configure",
    "NodeReady",
    "Drain",
    "DeleteDomain",
];

/// What happened. Kept small (24 bytes): a call's details are boxed, durations are whole
/// milliseconds, names are indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum What {
    /// A mutating call arrived for this machine, and how it was answered.
    Call(Box<Call>),
    /// One hypervisor call of a transition ended.
    Phase {
        /// Which call: an index into [`PHASES`].
        op: u8,
        /// How long it took, in whole milliseconds (saturating).
        millis: u32,
        /// Its error, if it failed.
        error: Option<Box<str>>,
    },
    /// A transition ended and its outcome was committed.
    Ended {
        /// The transition.
        kind: Kind,
        /// The state it left the machine in (`Failed` on failure).
        state: MachineState,
        /// From acceptance to completion, in whole milliseconds (saturating).
        millis: u32,
        /// The machine's `last_error` when it failed.
        error: Option<Box<str>>,
    },
    /// The libvirt drift watch saw the machine's domain change outside the provider.
    Drift(Drift),
    /// A reconcile pass changed the record: added it (`true`) or refreshed it (the
    /// hypervisor reported something the record did not say: drift).
    Reconciled {
        /// Added rather than refreshed.
        added: bool,
    },
    /// The guest's addresses as its agent reported them after a Configure (`NAME MAC
    /// ADDR/PREFIX ...` per interface, `; ` between them; cut to [`MAX_TEXT_BYTES`]).
    Addresses(Box<str>),
    /// The last lines of the guest's serial console, read when it did not come up (its
    /// start failed, it stopped, or its agent could not be reached): lines joined with ` | `, the
    /// end kept (see [`bounded_end`]).
    Console(Box<str>),
}

/// What the drift watch saw of a machine's domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drift {
    /// Undefined by someone else.
    Vanished,
    /// Destroyed, shut down or crashed by someone else.
    Stopped,
    /// Running again, or no longer watched.
    BackInLine,
}

impl Drift {
    /// The name the endpoint shows.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Drift::Vanished => "vanished",
            Drift::Stopped => "stopped",
            Drift::BackInLine => "back in line",
        }
    }
}

/// A mutating call on the timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The transition the call asks for.
    pub kind: Kind,
    /// The caller's shard id, as the echo rules show it (cut to [`MAX_TEXT_BYTES`]).
    pub shard_id: Box<str>,
    /// The fencing token's epoch.
    pub epoch: i64,
    /// The fencing token's sequence.
    pub sequence: i64,
    /// How it was answered; `None` until it is (or when its caller left before).
    pub answer: Option<Answer>,
}

/// A call's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Accepted: it started the transition with this operation id.
    Started(Box<str>),
    /// It repeated an earlier call and got that call's operation id again.
    Replayed(Box<str>),
    /// Refused, with the status code's name and message (cut to [`MAX_TEXT_BYTES`]).
    Refused(Box<str>, Box<str>),
}

/// One event on a machine's timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// When it happened (a phase: when it began), on the provider's clock.
    pub at: Timestamp,
    /// The trace of the span it was recorded in; all zero when there was none.
    pub trace_id: [u8; 16],
    /// What happened.
    pub what: What,
}

/// A duration in whole milliseconds, saturating.
#[must_use]
pub fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// The index of a phase name in [`PHASES`] (an unknown name is the last).
#[must_use]
pub fn phase_index(op: &str) -> u8 {
    let index = PHASES
        .iter()
        .position(|p| *p == op)
        .unwrap_or(PHASES.len() - 1);
    u8::try_from(index).unwrap_or(u8::MAX)
}

type Now = Box<dyn Fn() -> Timestamp + Send + Sync>;

/// The shared timeline; clones share it.
#[derive(Clone, Default)]
pub struct Timeline {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    clock: OnceLock<Now>,
    machines: Mutex<BTreeMap<Box<str>, VecDeque<Event>>>,
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeline").finish_non_exhaustive()
    }
}

impl Timeline {
    /// Stamps events with `now` from here on (the provider's clock; the first call wins).
    /// Until then events are not recorded.
    pub fn use_clock(&self, now: impl Fn() -> Timestamp + Send + Sync + 'static) {
        let _first = self.inner.clock.set(Box::new(now));
    }

    /// The current time on the timeline's clock, if it has one.
    #[must_use]
    pub fn now(&self) -> Option<Timestamp> {
        self.inner.clock.get().map(|now| now())
    }

    /// Gives each of `ids` a (still empty) timeline; events for other ids are not kept.
    pub fn track<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        let mut machines = self.lock();
        for id in ids {
            if !machines.contains_key(id) {
                machines.insert(id.into(), VecDeque::new());
            }
        }
    }

    /// Records `what` for `machine_id` at `at` (now when `None`), in the current span's
    /// trace. Kept in time order: an event recorded late (a phase, stamped when it began)
    /// goes before the later ones already there. The oldest event goes when the ring is full.
    pub fn record(&self, machine_id: &str, at: Option<Timestamp>, what: What) {
        let Some(at) = at.or_else(|| self.now()) else {
            return;
        };
        let trace_id = crate::trace_context::current_trace_id()
            .map(|t| t.to_bytes())
            .unwrap_or_default();
        let mut machines = self.lock();
        let Some(ring) = machines.get_mut(machine_id) else {
            return;
        };
        // The ring grows as events arrive (4, 8, 16 places), so a machine with a few events
        // does not hold room for sixteen; it never passes 16, as one goes before one comes.
        if ring.len() == EVENTS_PER_MACHINE {
            ring.pop_front();
        }
        let position = ring.partition_point(|e| e.at <= at);
        let event = Event { at, trace_id, what };
        ring.insert(position, event);
    }

    /// Fills in the answer of the call on `machine_id` that arrived at `at` (the newest
    /// such call still unanswered; none when it has left the ring).
    pub fn answer(&self, machine_id: &str, at: Timestamp, answer: Answer) {
        let mut machines = self.lock();
        let Some(ring) = machines.get_mut(machine_id) else {
            return;
        };
        let call = ring.iter_mut().rev().find_map(|e| match &mut e.what {
            What::Call(call) if e.at == at && call.answer.is_none() => Some(call),
            _ => None,
        });
        if let Some(call) = call {
            call.answer = Some(answer);
        }
    }

    /// The events of `machine_id`, oldest first; `None` when it is not tracked.
    #[must_use]
    pub fn events(&self, machine_id: &str) -> Option<Vec<Event>> {
        let machines = self.lock();
        machines
            .get(machine_id)
            .map(|ring| ring.iter().cloned().collect())
    }

    /// How many machines are tracked.
    #[must_use]
    pub fn machines(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Box<str>, VecDeque<Event>>> {
        self.inner
            .machines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// `text` cut to [`MAX_TEXT_BYTES`] at a character boundary.
#[must_use]
pub fn bounded(text: &str) -> Box<str> {
    if text.len() <= MAX_TEXT_BYTES {
        return text.into();
    }
    let mut end = MAX_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len()).into_boxed_str()
}

/// `text` cut to [`MAX_TEXT_BYTES`] from the front, at a character boundary: for texts
/// whose end says the most (a console's last lines).
#[must_use]
pub fn bounded_end(text: &str) -> Box<str> {
    if text.len() <= MAX_TEXT_BYTES {
        return text.into();
    }
    let mut start = text.len() - MAX_TEXT_BYTES;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("({} bytes) …{}", text.len(), &text[start..]).into_boxed_str()
}

// ---------------------------------------------------------------------------------------
// The JSON the endpoint answers with.

/// The answer of `GET /timeline?machine=ID`.
#[derive(Serialize)]
pub struct Page<'a> {
    machine_id: &'a str,
    /// How many events a machine keeps at most.
    kept_at_most: usize,
    events: Vec<EventJson>,
}

/// One event as JSON: the fields that apply to its `event`, the others left out.
#[derive(Serialize, Default)]
struct EventJson {
    at: String,
    at_unix_nanos: u64,
    event: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shard_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sequence: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    answer: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    operation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    op: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    change: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_ms: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    addresses: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    console: Option<String>,
}

impl<'a> Page<'a> {
    /// The page for `machine_id`'s `events`.
    #[must_use]
    pub fn new(machine_id: &'a str, events: &[Event]) -> Self {
        Page {
            machine_id,
            kept_at_most: EVENTS_PER_MACHINE,
            events: events.iter().map(event_json).collect(),
        }
    }
}

fn event_json(event: &Event) -> EventJson {
    let at = std::time::UNIX_EPOCH + Duration::from_nanos(event.at.0);
    let base = EventJson {
        at: humantime::format_rfc3339_millis(at).to_string(),
        at_unix_nanos: event.at.0,
        trace_id: (event.trace_id != [0; 16])
            .then(|| TraceId::from_bytes(event.trace_id).to_string()),
        ..EventJson::default()
    };
    let text = |t: &Option<Box<str>>| t.as_deref().map(str::to_owned);
    match &event.what {
        What::Call(call) => call_json(call, base),
        What::Phase { op, millis, error } => EventJson {
            event: "phase",
            op: PHASES.get(usize::from(*op)).copied(),
            duration_ms: Some(*millis),
            error: text(error),
            ..base
        },
        What::Ended {
            kind,
            state,
            millis,
            error,
        } => EventJson {
            event: if *state == MachineState::Failed {
                "transition failed"
            } else {
                "transition completed"
            },
            kind: Some(kind.name()),
            state: Some(state.name()),
            duration_ms: Some(*millis),
            error: text(error),
            ..base
        },
        What::Drift(drift) => EventJson {
            event: "drift",
            change: Some(drift.name()),
            ..base
        },
        What::Reconciled { added } => EventJson {
            event: "reconciled",
            change: Some(if *added { "added" } else { "refreshed" }),
            ..base
        },
        What::Addresses(addresses) => EventJson {
            event: "addresses",
            addresses: Some(addresses.to_string()),
            ..base
        },
        What::Console(lines) => EventJson {
            event: "console",
            console: Some(lines.to_string()),
            ..base
        },
    }
}

fn call_json(call: &Call, base: EventJson) -> EventJson {
    let (answer, operation_id, code, error) = match &call.answer {
        None => ("none", None, None, None),
        Some(Answer::Started(op)) => ("transition started", Some(op.to_string()), None, None),
        Some(Answer::Replayed(op)) => ("replayed", Some(op.to_string()), None, None),
        Some(Answer::Refused(code, message)) => (
            "refused",
            None,
            Some(code.to_string()),
            Some(message.to_string()),
        ),
    };
    EventJson {
        event: "received",
        kind: Some(call.kind.name()),
        shard_id: Some(call.shard_id.to_string()),
        epoch: Some(call.epoch),
        sequence: Some(call.sequence),
        answer: Some(answer),
        operation_id,
        code,
        error,
        ..base
    }
}

/// The query of `GET /timeline`.
#[derive(serde::Deserialize, Debug, Default)]
pub struct Query {
    /// The machine id.
    pub machine: Option<String>,
}

/// The endpoint's answer: 200 and the JSON page, 400 without `machine`, 404 for a machine
/// the provider does not hold.
#[must_use]
pub fn answer(timeline: &Timeline, query: &Query) -> (u16, String) {
    let Some(id) = query.machine.as_deref() else {
        return (400, "name the machine: /timeline?machine=<id>\n".to_owned());
    };
    match timeline.events(id) {
        None => (
            404,
            format!("no machine {}\n", bigfleet_libvirt_domain::Echo(id)),
        ),
        Some(events) => match serde_json::to_string_pretty(&Page::new(id, &events)) {
            Ok(mut json) => {
                json.push('\n');
                (200, json)
            }
            Err(e) => (500, format!("render the timeline: {e}\n")),
        },
    }
}

/// A shard id as the timeline keeps it: bounded and escaped like every echoed id.
#[must_use]
pub fn shard_text(shard_id: &str) -> Box<str> {
    bounded(&EchoField(shard_id).to_string())
}

#[cfg(test)]
#[path = "timeline_tests.rs"]
mod tests;
