//! How hosts, guests, capacity and orphans are handled: the operator's policies as plain
//! values, each with the default the flags start from.

use std::time::Duration;

use bigfleet_libvirt_domain::Timeouts;

use super::CpuSet;

pub use bigfleet_libvirt_ports::lanes::Budget;

pub use bigfleet_libvirt_ports::spread::{REQUESTS_PER_CALL, fit_connections};

/// How hosts are connected to and watched.
#[derive(Clone, Debug)]
pub struct HostPolicy {
    /// How often a healthy connection is probed.
    pub probe_interval: Duration,
    /// How long a probe may take before the host counts as unreachable (the connection is
    /// left to the calls still on it, and a new one is dialled).
    pub probe_timeout: Duration,
    /// First reconnect wait.
    pub backoff_min: Duration,
    /// Longest reconnect wait.
    pub backoff_max: Duration,
    /// How often the drift watch polls the state of our domains (zero = off).
    pub watch_interval: Duration,
}

impl Default for HostPolicy {
    fn default() -> Self {
        Self {
            // A hung host is unreachable within 25 s, about the window libvirt's keepalive
            // had (every 5 s, 3 misses), without keepalive's unordered close.
            probe_interval: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(20),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            watch_interval: Duration::from_secs(2),
        }
    }
}

/// Timing and size limits of the protocol.
#[derive(Clone, Debug)]
pub struct AgentPolicy {
    /// Agent timeout of one `guest-ping`.
    pub ping_timeout_secs: i32,
    /// Longest wait between failed pings (the first retries come sooner, doubling).
    pub ping_retry: Duration,
    /// Agent timeout of every other command.
    pub command_timeout_secs: i32,
    /// Longest wait between `guest-exec-status` polls (the first polls come sooner,
    /// doubling), so a short command is seen to end within milliseconds and a long one
    /// costs one poll per interval.
    pub poll_interval: Duration,
    /// Raw bytes per `guest-file-write`.
    pub chunk_bytes: usize,
    /// Bytes of each captured stream quoted in an error.
    pub output_limit: usize,
    /// How long a Configure may wait for the agent, from the start of its call, before it
    /// fails with the guest's console quoted: a little less than Configure's deadline
    /// ([`AgentPolicy::fit_to`]), so the failure and its reason land before the deadline
    /// drops the call.
    pub configure_wait: Duration,
    /// The same for a Drain.
    pub drain_wait: Duration,
}

impl Default for AgentPolicy {
    /// Fitted to the default deadlines.
    fn default() -> Self {
        Self {
            ping_timeout_secs: 2,
            ping_retry: Duration::from_secs(1),
            command_timeout_secs: 60,
            poll_interval: Duration::from_secs(2),
            chunk_bytes: 48 * 1024,
            output_limit: 1024,
            configure_wait: Duration::ZERO,
            drain_wait: Duration::ZERO,
        }
        .fit_to(&Timeouts::default())
    }
}

impl AgentPolicy {
    /// The agent waits fitted to the transitions' `timeouts`: each deadline less a tenth of
    /// it (at least 2 s, at most a minute), the time left to read the console and report.
    #[must_use]
    pub fn fit_to(self, timeouts: &Timeouts) -> Self {
        let within = |deadline: Duration| {
            let margin = (deadline / 10).clamp(Duration::from_secs(2), Duration::from_secs(60));
            deadline.saturating_sub(margin).max(Duration::from_secs(1))
        };
        Self {
            configure_wait: within(timeouts.configure),
            drain_wait: within(timeouts.drain),
            ..self
        }
    }
}

/// How much of a host the provider may hand out.
#[derive(Clone, Debug, PartialEq)]
pub struct CapacityPolicy {
    /// CPUs kept for the host itself.
    pub reserve_cpu: u32,
    /// Memory kept for the host itself, in MiB.
    pub reserve_memory_mib: u64,
    /// vCPUs allocatable per remaining physical CPU.
    pub cpu_ratio: f64,
    /// MiB allocatable per remaining MiB of RAM.
    pub memory_ratio: f64,
    /// Bytes of virtual disk allocatable per byte of storage pool capacity.
    pub disk_ratio: f64,
    /// The host CPUs machines of a `dedicated_cpus` type are pinned to, one vCPU each
    /// (`--dedicated-cpus`); every other machine we make keeps to the host's other CPUs,
    /// and the shared vCPU budget is made from those. Empty: no dedicated CPUs.
    pub dedicated_cpus: CpuSet,
}

impl Default for CapacityPolicy {
    fn default() -> Self {
        Self {
            reserve_cpu: 1,
            reserve_memory_mib: 2048,
            cpu_ratio: 4.0,
            memory_ratio: 1.0,
            disk_ratio: 1.0,
            dedicated_cpus: CpuSet::default(),
        }
    }
}

/// Whether and when orphans are collected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcPolicy {
    /// Collect (true) or only report (false, the default).
    pub collect: bool,
    /// How long an orphan must be seen before it is collectable.
    pub grace: Duration,
}

impl Default for GcPolicy {
    fn default() -> Self {
        Self {
            collect: false,
            grace: Duration::from_secs(15 * 60),
        }
    }
}
