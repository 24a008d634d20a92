//! The `host budget` check: `--host-budget` against the host's libvirtd
//! `max_client_requests`, the most calls libvirtd serves of one client connection at once.

use super::facts::{Expectations, Probe};
use super::report::{Check, Status, check};
use crate::host::lanes::LIBVIRTD_DEFAULT_MAX_CLIENT_REQUESTS;

/// The setting an operator raises, and where.
const SETTING: &str = "max_client_requests in the host's libvirtd.conf (virtqemud.conf for \
                       the modular daemons)";

/// Warns when the budget leaves libvirtd no headroom: at or above the host's limit, or at
/// or above libvirtd's default 5 when the limit cannot be read.
pub(super) fn host_budget(want: &Expectations, zone: &str, limit: &Probe<usize>) -> Check {
    let budget = want.budget.host;
    let (limit, source) = match limit {
        Probe::Found(limit) => (*limit, "the host's max_client_requests".to_owned()),
        Probe::Missing | Probe::Unsupported(_) | Probe::Failed(_) => {
            let why = match limit {
                Probe::Unsupported(why) | Probe::Failed(why) => why.as_str(),
                _ => "not reported",
            };
            (
                LIBVIRTD_DEFAULT_MAX_CLIENT_REQUESTS,
                format!("libvirtd's default max_client_requests (the host's is not read: {why})"),
            )
        }
    };
    if budget < limit {
        return check(
            zone,
            "host budget",
            Status::Ok,
            format!(
                "--host-budget {budget} is below {source} of {limit}, with --agent-budget {}",
                want.budget.agent
            ),
            "",
        );
    }
    let fix = format!(
        "lower --host-budget to {} or less, or raise {SETTING} above {budget}",
        limit.saturating_sub(1).max(1)
    );
    check(
        zone,
        "host budget",
        Status::Warn,
        format!(
            "--host-budget {budget} is not below {source} of {limit}: libvirtd queues the \
             surplus where the provider cannot see it, and a saturated connection can miss \
             its keepalives"
        ),
        &fix,
    )
}
