//! Every span a transition's work opens is in the trace of the call that accepted it
//! (`spans-in-call-trace`), read from the history (the span layer, `crate::spans`, records
//! each `transition`, `compensation` and `hypervisor` span as it is opened, with the
//! transition it runs under and that transition's `rpc` ancestor).
//!
//! The rule: a `transition` span, and every `compensation` or `hypervisor` span, runs
//! under a `transition` span that has an `rpc` ancestor for the same machine and method
//! (the call that accepted it: a transition is only ever started by `Provider::mutate`,
//! inside the call's span). Exempt, because no call stands behind them:
//! - spans opened under the simulator's `provider_start` span with no transition above
//!   them: the restore hand-off and the start-up compensation of Failed Creates without a
//!   host (`compensate_failed`, and its hypervisor calls), which run when a process
//!   (re)starts, for transitions whose call belonged to a process that is gone;
//! - `hypervisor` `DescribeManaged` spans with no transition above them: reading the hosts
//!   (restore, the background reconcile pass) is no transition's work.
//!
//! A transition failed by the deadline sweep is failed inside its own stored span, so the
//! compensation that follows is checked like the worker's.

use std::time::Duration;

use super::Checkers;
use crate::history::{Fields, SpanSeen};
use crate::spans::{HYPERVISOR, TRANSITION};
use crate::verdict::Invariant;

/// The hypervisor call that reads the hosts outside any transition.
const DESCRIBE: &str = "DescribeManaged";

/// Checks one span opened at `at`.
pub fn on_span(checkers: &Checkers, at: Duration, seen: &SpanSeen) {
    if let Some(problem) = problem(seen) {
        checkers.violation_at(Invariant::SpansInCallTrace, at, problem);
    }
}

/// What is wrong with `seen`, if anything.
#[must_use]
pub fn problem(seen: &SpanSeen) -> Option<String> {
    let what = describe(seen.name, &seen.fields);
    let Some((transition, rpc)) = &seen.transition else {
        let describes = seen.name == HYPERVISOR && seen.fields.what.as_deref() == Some(DESCRIBE);
        return (!seen.at_start && !describes)
            .then(|| format!("{what} is under no transition span (so in no call's trace)"));
    };
    let under = if seen.name == TRANSITION {
        String::new()
    } else {
        format!(" under {}", describe(TRANSITION, transition))
    };
    let Some(rpc) = rpc else {
        return Some(format!(
            "{what}{under} has no rpc ancestor: not in the accepting call's trace"
        ));
    };
    let same_machine = rpc.machine_id == transition.machine_id;
    let same_method = match (&rpc.what, &transition.what) {
        (Some(method), Some(kind)) => method.eq_ignore_ascii_case(kind),
        _ => false,
    };
    (!same_machine || !same_method).then(|| {
        format!(
            "{what}{under} is under the rpc span of another call ({})",
            describe("rpc", rpc)
        )
    })
}

fn describe(name: &str, fields: &Fields) -> String {
    let what = fields.what.as_deref().unwrap_or("?");
    let machine = fields.machine_id.as_deref().unwrap_or("?");
    format!("{name} span ({what}, machine {machine})")
}

#[cfg(test)]
mod tests {
    use super::problem;
    use crate::history::{Fields, SpanSeen};
    use crate::spans::{COMPENSATION, HYPERVISOR, TRANSITION};

    fn fields(what: &str, machine: &str) -> Fields {
        Fields {
            machine_id: Some(machine.to_owned()),
            what: Some(what.to_owned()),
        }
    }

    fn seen(name: &'static str, own: Fields, rpc: Option<Fields>, at_start: bool) -> SpanSeen {
        let transition = (name != COMPENSATION || !at_start).then(|| (fields("create", "m"), rpc));
        SpanSeen {
            name,
            fields: own,
            transition,
            at_start,
        }
    }

    #[test]
    fn a_transition_is_under_its_own_call() {
        let create = fields("create", "m");
        let ok = seen(
            TRANSITION,
            create.clone(),
            Some(fields("Create", "m")),
            false,
        );
        assert_eq!(problem(&ok), None);
        let root = seen(TRANSITION, create.clone(), None, false);
        assert!(problem(&root).unwrap().contains("no rpc ancestor"));
        let other = seen(TRANSITION, create, Some(fields("Create", "n")), false);
        assert!(problem(&other).unwrap().contains("another call"));
        let call = seen(HYPERVISOR, fields("CreateDomain", "m"), None, false);
        assert!(problem(&call).unwrap().contains("under transition span"));
    }

    #[test]
    fn start_up_work_and_host_reads_are_exempt() {
        let compensation = seen(COMPENSATION, fields("?", "m"), None, true);
        assert_eq!(problem(&compensation), None);
        let describe = SpanSeen {
            name: HYPERVISOR,
            fields: Fields {
                machine_id: None,
                what: Some("DescribeManaged".to_owned()),
            },
            transition: None,
            at_start: false,
        };
        assert_eq!(problem(&describe), None);
        let stray = SpanSeen {
            name: COMPENSATION,
            at_start: false,
            ..compensation
        };
        assert!(problem(&stray).unwrap().contains("under no transition"));
    }
}
