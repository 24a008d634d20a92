//! The `host budget` check: `--host-budget` spread over `--host-connections` against the
//! host's libvirtd `max_client_requests`, the most requests libvirtd serves of one client
//! connection at once.

use super::facts::{Expectations, Probe};
use super::report::{Check, Status, check};
use crate::host::lanes::LIBVIRTD_DEFAULT_MAX_CLIENT_REQUESTS;
use crate::options::REQUESTS_PER_CALL;

/// The setting an operator raises, and where.
const SETTING: &str = "max_client_requests in the host's libvirtd.conf (virtqemud.conf for \
                       the modular daemons)";

/// Warns when one connection may carry as many requests as the host's limit (or
/// libvirtd's default 5 when the limit cannot be read): the most calls the provider puts
/// on one connection, each with an upload's data packet beside it.
pub(super) fn host_budget(want: &Expectations, zone: &str, limit: &Probe<usize>) -> Check {
    let budget = want.budget.host;
    let connections = want.connections.max(1);
    let share = budget.div_ceil(connections);
    let requests = share * REQUESTS_PER_CALL;
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
         {requests}",
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
