//! The `host budget` check: `--host-budget` spread over `--host-connections` against the
//! host's libvirtd `max_client_requests`, the most requests libvirtd serves of one client
//! connection at once; and the `host workers` check: `--host-budget` against its
//! `max_workers`, the calls libvirtd executes at once for all its clients together.

use super::facts::{Expectations, HostFacts, Probe};
use super::report::{Check, Status, check};
use crate::host::dial::connections_for;
use crate::options::REQUESTS_PER_CALL;

/// libvirtd's default `max_workers` (libvirtd.conf / virtqemud.conf).
const LIBVIRTD_DEFAULT_MAX_WORKERS: usize = 20;

/// Workers left for everyone else on the host (virsh, monitoring, other tools) and for the
/// calls libvirtd runs beside a client's: the budget should stay this far below
/// `max_workers`.
const WORKER_HEADROOM: usize = 5;

/// The setting an operator raises, and where.
const SETTING: &str = "max_client_requests in the host's libvirtd.conf (virtqemud.conf for \
                       the modular daemons)";

/// Warns when one connection may carry as many requests as the host's limit (or
/// `--host-max-client-requests` when the limit cannot be read, which the start-up already
/// kept the spread below): the most calls the provider puts on one connection, each with
/// an upload's data packet beside it.
pub(super) fn host_budget(want: &Expectations, host: &HostFacts, limit: &Probe<usize>) -> Check {
    let zone = host.zone.as_str();
    if host.uri.starts_with("test://") {
        return check(
            zone,
            "host budget",
            Status::Skip,
            "not checked: libvirt's test driver runs inside this process, with no daemon and \
             no per-connection limit"
                .to_owned(),
            "",
        );
    }
    let budget = want.budget.host;
    let connections = connections_for(&host.uri, want.connections);
    let share = budget.div_ceil(connections);
    let requests = share * REQUESTS_PER_CALL;
    let (limit, source) = match limit {
        Probe::Found(value) => (*value, "the host's max_client_requests".to_owned()),
        _ => (
            want.max_client_requests,
            format!(
                "--host-max-client-requests {} (libvirt does not report the host's \
                 max_client_requests: keep the flag at the smallest value in the hosts' \
                 libvirtd.conf or virtqemud.conf)",
                want.max_client_requests
            ),
        ),
    };
    let spread = format!(
        "--host-budget {budget} over --host-connections {connections} puts at most {share} \
         call(s) on a connection, {requests} requests with an upload's data beside each"
    );
    if requests < limit {
        return check(
            zone,
            "host budget",
            Status::Ok,
            format!(
                "{spread}, below {source} of {limit} (--agent-budget {})",
                want.budget.agent
            ),
            "",
        );
    }
    let per_connection = (limit.saturating_sub(1) / REQUESTS_PER_CALL).max(1);
    let fix = format!(
        "set --host-connections {} (or lower --host-budget to {}), or raise {SETTING} above \
         {requests} and pass it as --host-max-client-requests",
        budget.div_ceil(per_connection).min(budget),
        connections * per_connection
    );
    check(
        zone,
        "host budget",
        Status::Warn,
        format!(
            "{spread}, not below {source} of {limit}: libvirtd stops reading a connection at \
             its limit (\"Client hit max requests limit\"), so calls queue where the provider \
             cannot see them"
        ),
        &fix,
    )
}

/// The host's value of `name` when read, else libvirtd's `default`, with words saying which.
fn setting(probe: &Probe<usize>, name: &str, default: usize) -> (usize, String) {
    match probe {
        Probe::Found(value) => (*value, format!("the host's {name}")),
        Probe::Missing | Probe::Unsupported(_) | Probe::Failed(_) => {
            let why = match probe {
                Probe::Unsupported(why) | Probe::Failed(why) => why.as_str(),
                _ => "not reported",
            };
            (
                default,
                format!("libvirtd's default {name} (the host's is not read: {why})"),
            )
        }
    }
}

/// Warns when the budget leaves fewer than [`WORKER_HEADROOM`] of libvirtd's workers to
/// everyone else (the host's `max_workers`, or libvirtd's default 20 when it cannot be
/// read): the provider's calls would then queue in the daemon behind each other and other
/// clients' calls would wait for them.
pub(super) fn host_workers(want: &Expectations, zone: &str, workers: &Probe<usize>) -> Check {
    let budget = want.budget.host;
    let (workers, source) = setting(workers, "max_workers", LIBVIRTD_DEFAULT_MAX_WORKERS);
    if budget + WORKER_HEADROOM <= workers {
        return check(
            zone,
            "host workers",
            Status::Ok,
            format!(
                "--host-budget {budget} leaves {} of {source} of {workers} to other clients",
                workers - budget
            ),
            "",
        );
    }
    check(
        zone,
        "host workers",
        Status::Warn,
        format!(
            "--host-budget {budget} leaves {} of {source} of {workers} to other clients (at \
             least {WORKER_HEADROOM} should stay free): the provider's calls would wait for \
             workers in the daemon, and so would everyone else's",
            workers.saturating_sub(budget)
        ),
        &format!(
            "lower --host-budget to {} or less, or raise max_workers in the host's \
             libvirtd.conf (virtqemud.conf for the modular daemons) to {} or more",
            workers.saturating_sub(WORKER_HEADROOM).max(1),
            budget + WORKER_HEADROOM
        ),
    )
}
