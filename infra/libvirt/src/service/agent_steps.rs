//! The steps of Configure and Drain that talk to a machine's guest agent: waiting for it
//! (with the console's last lines when it stays silent), and reading the guest's addresses
//! for the Configure log line. A first-boot type whose image has no agent
//! (`"guest_agent": false`) skips both.

use bigfleet_libvirt_domain::{Machine, Timestamp};
use bigfleet_libvirt_ports::{Clock, HypervisorError};
use tracing::{info, warn};

use super::LibvirtHypervisor;
use crate::guest::addresses;
use crate::guest::agent;
use crate::guest::bootstrap::DomainAgent;
use crate::host::error::maybe_done;
use crate::host::lanes::Lane;
use crate::storage::console;
use bigfleet_libvirt_observe::timeline::{self, What};
use bigfleet_libvirt_system::Stopwatch;

impl<C: Clock> LibvirtHypervisor<C> {
    /// Whether `machine`'s image runs the qemu guest agent (its type's `guest_agent`).
    pub(super) fn has_agent(&self, machine: &Machine) -> bool {
        self.inner.config.catalog.has_agent(&machine.instance_type)
    }

    /// Waits for the guest agent until `until` and records how long it took (the
    /// `agent_ready` phase). An agent that cannot be reached (the guest stopped, or agent
    /// calls cannot work) or stays silent until `until` (set a little before the call's
    /// deadline, `AgentPolicy::fit_to`) fails with the last lines of the guest's console after
    /// the reason.
    pub(super) async fn agent_ready(
        &self,
        what: &str,
        machine: &Machine,
        agent: &DomainAgent,
        until: Timestamp,
    ) -> Result<(), HypervisorError> {
        let (clock, policy) = (&self.inner.clock, &self.inner.config.agent);
        let watch = Stopwatch::start();
        if let Err(e) = agent::wait_ready(agent, clock, policy, until).await {
            let mut message = format!("{what}: {e}");
            let (name, id) = (agent.name.clone(), machine.id.to_string());
            let timeline = self.inner.metrics.timeline.clone();
            let explained = agent.host.call(Lane::Agent, move |session| {
                if let Ok(domain) = session.conn.lookup_domain_by_name(&name) {
                    console::explain(&mut message, session, &domain, &id, &timeline);
                }
                Ok(message)
            });
            let message = explained.await.unwrap_or_else(|_| format!("{what}: {e}"));
            return Err(maybe_done(message));
        }
        self.inner
            .metrics
            .observe_phase("agent_ready", watch.seconds());
        Ok(())
    }

    /// The Configure log line, with the guest's addresses read once through its agent (and
    /// put on the machine's timeline); a failure to read them is a warning and never fails
    /// the Configure.
    pub(super) async fn log_addresses(
        &self,
        agent: &DomainAgent,
        machine: &Machine,
        cluster: &str,
    ) {
        match addresses::read(agent, &self.inner.clock).await {
            Ok(found) => {
                let summary = addresses::summary(&found);
                let shown = What::Addresses(timeline::bounded(&summary));
                self.inner
                    .metrics
                    .timeline
                    .record(machine.id.as_str(), None, shown);
                info!(
                    machine = %machine.id, domain = %agent.name, cluster, addresses = %summary,
                    "configured"
                );
            }
            Err(e) => warn!(
                machine = %machine.id, domain = %agent.name, cluster, error = %e,
                "configured, but the guest's addresses could not be read through its agent"
            ),
        }
    }
}
