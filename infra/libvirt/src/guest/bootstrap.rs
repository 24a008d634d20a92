//! What runs inside the guest at Configure and Drain, and the libvirt transport to its
//! qemu agent.
//!
//! The in-guest contract (docs/libvirt.md §5.7, §5.8): the image ships an executable
//! `/opt/bigfleet/bootstrap` and a running `qemu-guest-agent`. Configure writes the blob
//! to `/opt/bigfleet/bootstrap.blob` (mode 0600, through `guest-file-*`, never on a
//! command line) and runs `/opt/bigfleet/bootstrap <cluster-id>`; the blob is removed when
//! the hook ends, whatever its outcome. Drain runs `/opt/bigfleet/drain <grace-seconds>`
//! when the image has one, and otherwise the reference's `kubectl cordon` + `kubectl drain`.
//! The cluster id and grace period reach the scripts as positional parameters, so no
//! value is ever quoted into shell text. Both first check that the agent allows the commands
//! they run (`probe`), so an image whose agent has them turned off fails at once.

use std::sync::Arc;

use tracing::Instrument;

use bigfleet_libvirt_ports::Clock;
use virt::error::ErrorNumber;

use crate::guest::agent::{self, AgentError, GuestAgent};
use crate::guest::probe;
use crate::host::connection::Host;
use crate::host::domains;
use crate::host::error::text;
use crate::host::lanes::Lane;
use crate::options::AgentPolicy;

/// The hook the image must provide.
pub const HOOK: &str = "/opt/bigfleet/bootstrap";

/// Where the blob is written for the hook.
pub const BLOB: &str = "/opt/bigfleet/bootstrap.blob";

/// Creates the directory and an empty 0600 blob file, so the agent's write keeps that mode.
const PREPARE: &str = "umask 077 && mkdir -p /opt/bigfleet && rm -f /opt/bigfleet/bootstrap.blob \
                       && : > /opt/bigfleet/bootstrap.blob";

/// Runs the hook with the cluster id as `$1`; the trap removes the blob however it ends.
const RUN_HOOK: &str = "umask 077; trap 'rm -f /opt/bigfleet/bootstrap.blob' EXIT; \
                        /opt/bigfleet/bootstrap \"$1\"";

/// Drains the node: the image's own drain hook if it has one, else cordon + drain.
const DRAIN: &str = r#"grace="$1"
if [ -x /opt/bigfleet/drain ]; then exec /opt/bigfleet/drain "$grace"; fi
node=$(hostname -f 2>/dev/null || hostname)
kubectl cordon "$node" || true
exec kubectl drain "$node" --ignore-daemonsets --delete-emptydir-data \
  --grace-period="$grace" --timeout="${grace}s""#;

/// Delivers the blob and runs the bootstrap hook.
///
/// # Errors
/// The first failing step, with the hook's bounded output when the hook itself failed.
pub async fn bootstrap<A: GuestAgent, C: Clock>(
    agent: &A,
    clock: &C,
    policy: &AgentPolicy,
    cluster_id: &str,
    blob: &[u8],
) -> Result<(), String> {
    let until = clock.now().saturating_add(policy.configure_wait);
    agent::wait_ready(agent, clock, policy, until).await?;
    probe::require(agent, policy, &probe::BOOTSTRAP, "Configure's bootstrap").await?;
    let prepared = agent::exec(agent, clock, policy, "/bin/sh", &["-c", PREPARE]).await?;
    agent::judge("preparing /opt/bigfleet", &prepared, policy.output_limit)?;
    if let Err(e) = agent::write_file(agent, policy, BLOB, blob).await {
        let _ = agent::exec(agent, clock, policy, "/bin/rm", &["-f", BLOB]).await;
        return Err(format!("write the bootstrap blob: {e}"));
    }
    let args = ["-c", RUN_HOOK, "bigfleet-bootstrap", cluster_id];
    let status = agent::exec(agent, clock, policy, "/bin/sh", &args).await?;
    agent::judge(
        &format!("bootstrap hook {HOOK}"),
        &status,
        policy.output_limit,
    )
}

/// Drains the node out of its cluster; `grace_seconds` below 1 become 1.
///
/// # Errors
/// The failing step, with the drain's bounded output.
pub async fn drain<A: GuestAgent, C: Clock>(
    agent: &A,
    clock: &C,
    policy: &AgentPolicy,
    grace_seconds: i64,
) -> Result<(), String> {
    let until = clock.now().saturating_add(policy.drain_wait);
    agent::wait_ready(agent, clock, policy, until).await?;
    probe::require(agent, policy, &probe::DRAIN, "Drain").await?;
    let grace = grace_seconds.max(1).to_string();
    let args = ["-c", DRAIN, "bigfleet-drain", grace.as_str()];
    let status = agent::exec(agent, clock, policy, "/bin/sh", &args).await?;
    agent::judge("drain", &status, policy.output_limit)
}

/// The qemu agent of one domain, reached through `virDomainQemuAgentCommand`.
pub(crate) struct DomainAgent {
    pub(crate) host: Arc<Host>,
    pub(crate) name: String,
}

impl GuestAgent for DomainAgent {
    async fn command(&self, json: String, timeout_secs: i32) -> Result<String, AgentError> {
        // The span names the command only: its arguments can carry bootstrap-blob chunks.
        let span = tracing::debug_span!(
            "guest_agent",
            domain = %self.name,
            command = execute_name(&json)
        );
        let name = self.name.clone();
        let called = self
            .host
            .call(Lane::Agent, move |session| {
                let domain = match session.conn.lookup_domain_by_name(&name) {
                    Ok(domain) => domain,
                    Err(e) => return Ok(Err(classify(&e, &name))),
                };
                Ok(domain
                    .qemu_agent_command(&json, timeout_secs, 0)
                    .map_err(|e| match classify(&e, &name) {
                        // A domain that is no longer running will not answer however long
                        // the caller waits (libvirt says only "domain is not running"):
                        // say so now, with its state and where its QEMU log is.
                        AgentError::NotReady(why) => domains::stopped(&domain, &name)
                            .map_or(AgentError::NotReady(why), AgentError::Unsupported),
                        other => other,
                    }))
            })
            .instrument(span)
            .await;
        match called {
            Ok(answer) => answer,
            // The host itself is unreachable: the agent may answer once it reconnects.
            Err(e) => Err(AgentError::NotReady(e.message)),
        }
    }
}

fn classify(error: &virt::error::Error, name: &str) -> AgentError {
    let message = format!("domain {name}: {}", text(error));
    let code = error.code();
    if code.is_any(vec![
        ErrorNumber::NoSupport,
        ErrorNumber::ArgumentUnsupported,
        ErrorNumber::NoDomain,
    ]) {
        AgentError::Unsupported(message)
    } else if code.is_any(vec![
        ErrorNumber::AgentUnresponsive,
        ErrorNumber::AgentUnsynced,
        ErrorNumber::AgentCommandTimeout,
        ErrorNumber::OperationInvalid,
    ]) {
        AgentError::NotReady(message)
    } else {
        AgentError::Failed(message)
    }
}

/// The `execute` name of a guest-agent request (`guest-ping`, `guest-exec`, …), read from
/// the start of the JSON the agent module builds; `unknown` if it is not there.
fn execute_name(json: &str) -> &str {
    json.split_once("\"execute\":\"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map_or("unknown", |(name, _)| name)
}

#[cfg(test)]
mod span_tests {
    use super::execute_name;

    #[test]
    fn the_span_names_the_command_and_nothing_else() {
        let json = r#"{"execute":"guest-file-write","arguments":{"handle":3,"buf-b64":"U0VD"}}"#;
        assert_eq!(execute_name(json), "guest-file-write");
        assert_eq!(execute_name(r#"{"arguments":{}}"#), "unknown");
    }
}
