//! Checks the books of what machines hold alone, after every Create and Delete on a host
//! (the hypervisor fake records each with what every domain's definition there holds, and
//! the claims the acting process's books still hold as in flight): no dedicated CPU and no
//! device is named by two domains' definitions, and no claim is left in flight once the
//! Create's sequence is over (its machine is Speculative again, or its domain holds the
//! claim and the books say so). A pair of domains one of which a dead process's late
//! Create defined is exempt (`fakes::books` says why).

use std::collections::BTreeMap;
use std::time::Duration;

use super::Checkers;
use crate::fakes::books::Holding;
use crate::verdict::Invariant;

/// Checks the books of host `host` at `at`.
pub fn on_books(
    checkers: &Checkers,
    at: Duration,
    host: usize,
    holdings: &[Holding],
    in_flight: &[String],
) {
    let mut holder: BTreeMap<&str, &Holding> = BTreeMap::new();
    for holding in holdings {
        for what in &holding.held {
            let Some(first) = holder.insert(what, holding) else {
                continue;
            };
            if !first.late && !holding.late {
                let detail = format!(
                    "zone-{host}: {what} is held by both {} and {}",
                    first.domain, holding.domain
                );
                checkers.violation_at(Invariant::ClaimsHeldOnce, at, detail);
            }
        }
    }
    for domain in in_flight {
        let detail = format!(
            "zone-{host}: the claim of {domain} is still held as in flight after its Create's \
             sequence ended (its rollback forgot it)"
        );
        checkers.violation_at(Invariant::ClaimsHeldOnce, at, detail);
    }
}
