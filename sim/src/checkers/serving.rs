//! The serving check: a host that is not stalled answers a lone call in its usual time. So
//! a stall on one host holds up no other host, and a stalled host serves again once it
//! resumes.
//!
//! Read from the history: the hypervisor fake records each call the provider sends to a
//! host (`Event::HostCall`, whether a fault was drawn for it) and when it ends
//! (`Event::HostCallEnd`: answered, finished by the host unanswered, or dropped by its
//! caller before it reached the host). A call is *judged* when, as it is sent, nothing else is in flight on
//! its host (no call of any provider process holds a lane slot, a daemon worker or its
//! domain's queue there), no fault was drawn for it, and no outage or stall of its host
//! overlaps the time it has. Such a call has nothing to wait for but the host's service
//! time: the lanes grant a free slot at once, the daemon has a free worker (the budget is
//! below `max_client_requests`), its domain has nothing queued. So it must be answered
//! within the slowest usual service time plus [`SLACK`], counted from when it was sent or,
//! if a stall of its host overlaps that time, from when the host has resumed
//! (`Window::resumed_by`). A call of another host that waits for a stalled one (a shared
//! lock, a shared lane, a host model that freezes every host) breaks that, as does a
//! stalled host that does not resume, or resumes without answering what it held.
//!
//! Judging per call and not per transition: a transition on another host that waits for the
//! stalled one is failed by the provider's deadline sweep, within the bound the
//! `transition-deadline` check allows, and a transition that times out cannot be told from
//! one behind a latency spike or a busy lane without the host's facts.

use std::sync::Arc;
use std::time::Duration;

use super::Checkers;
use crate::faults::Window;
use crate::history::CallEnd;
use crate::time::elapsed;
use crate::verdict::Invariant;

/// How often calls in flight are looked at.
const EVERY: Duration = Duration::from_millis(500);
/// Allowed on top of the slowest usual service time (the send and reply legs take at most
/// 2 ms each).
const SLACK: Duration = Duration::from_secs(1);

/// A call in flight on a host, as the history tells it.
#[derive(Clone, Copy, Debug)]
pub struct CallSeen {
    /// The host's index.
    pub host: usize,
    /// When the provider sent it.
    pub sent: Duration,
    /// When it must be answered by, if it is judged (and not yet reported).
    pub answer_by: Option<Duration>,
}

fn any_overlaps(windows: &[Window], host: usize, from: Duration, to: Duration) -> bool {
    windows.iter().any(|w| w.overlaps(host, from, to))
}

/// When a lone call to `host` sent at `at` must be answered by, and whether it can be
/// judged: not if an outage of its host, or a second stall, overlaps the time it has.
fn bound(checkers: &Checkers, host: usize, at: Duration) -> (Duration, bool) {
    let host_faults = &checkers.world().plan.host;
    let usual = host_faults.service.1 + SLACK;
    let stall = host_faults
        .stalls
        .iter()
        .find(|w| w.overlaps(host, at, at + usual));
    let answer_by = stall.map_or(at, |w| at.max(w.resumed_by())) + usual;
    let others = host_faults.stalls.iter().filter(|w| Some(*w) != stall);
    let judged = !any_overlaps(&host_faults.outages, host, at, answer_by)
        && !others.into_iter().any(|w| w.overlaps(host, at, answer_by));
    (answer_by, judged)
}

/// A call `call` to `host` was sent at `at`, with a fault drawn for it (`faulted`) or not.
pub fn on_call(checkers: &Checkers, at: Duration, call: u64, host: usize, faulted: bool) {
    let plan = &checkers.world().plan;
    let (answer_by, quiet) = bound(checkers, host, at);
    let mut ledger = checkers.ledger();
    let alone = !ledger.calls.values().any(|c| c.host == host);
    let judged = alone && !faulted && quiet;
    ledger.calls.insert(
        call,
        CallSeen {
            host,
            sent: at,
            answer_by: judged.then_some(answer_by),
        },
    );
    drop(ledger);
    if judged {
        let stalls = &plan.host.stalls;
        let mut stats = checkers.world().stats();
        if stalls
            .iter()
            .any(|w| w.target != host && w.start <= at && at < w.end)
        {
            stats.judged_beside_stall += 1;
        }
        if stalls
            .iter()
            .any(|w| w.target == host && w.start <= answer_by && at < w.end)
        {
            stats.judged_held += 1;
        }
        if stalls.iter().any(|w| w.target == host && w.end <= at) {
            stats.judged_after_stall += 1;
        }
    }
}

/// Call `call` ended at `at`, as `how` says.
pub fn on_call_end(checkers: &Checkers, at: Duration, call: u64, how: CallEnd) {
    let Some(seen) = checkers.ledger().calls.remove(&call) else {
        return;
    };
    let Some(answer_by) = seen.answer_by else {
        return;
    };
    match how {
        CallEnd::Answered if at > answer_by => {
            report(checkers, at, call, &seen, answer_by, "answered");
        }
        CallEnd::Unanswered => {
            report(
                checkers,
                at,
                call,
                &seen,
                answer_by,
                "finished by the host unanswered",
            );
        }
        // Dropped before it reached the host: its caller gave up (or its process died).
        CallEnd::Answered | CallEnd::Dropped => {}
    }
}

fn report(checkers: &Checkers, at: Duration, call: u64, seen: &CallSeen, by: Duration, how: &str) {
    let stalls: Vec<String> = checkers
        .world()
        .plan
        .host
        .stalls
        .iter()
        .map(|w| {
            let (start, end) = (w.start.as_secs_f64(), w.end.as_secs_f64());
            format!("zone-{} {start:.3}-{end:.3}s", w.target)
        })
        .collect();
    let detail = format!(
        "call {call} to zone-{}, sent at {:.3}s alone on its host and with no fault, {how} \
         at {:.3}s; it was due by {:.3}s (the slowest usual service time and {}s of slack, \
         counted from when the host resumed if a stall held it); stalls: [{}]",
        seen.host,
        seen.sent.as_secs_f64(),
        at.as_secs_f64(),
        by.as_secs_f64(),
        SLACK.as_secs(),
        stalls.join(", "),
    );
    checkers.violation_at(Invariant::HostsKeepServing, at, detail);
}

/// Looks at the calls in flight every [`EVERY`] for the rest of the run and reports each
/// judged call still unanswered past its bound, once.
pub async fn watch(checkers: Arc<Checkers>) {
    loop {
        madsim::time::sleep(EVERY).await;
        checkers.read_history();
        let now = elapsed();
        let overdue: Vec<(u64, CallSeen, Duration)> = {
            let mut ledger = checkers.ledger();
            let mut late = Vec::new();
            for (call, seen) in &mut ledger.calls {
                if let Some(by) = seen.answer_by.filter(|by| now > *by) {
                    late.push((*call, *seen, by));
                    seen.answer_by = None;
                }
            }
            late
        };
        for (call, seen, by) in overdue {
            report(&checkers, now, call, &seen, by, "still unanswered");
        }
    }
}
