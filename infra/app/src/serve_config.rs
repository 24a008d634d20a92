//! How the servers run ([`ServeConfig`]): the per-client bounds on both ports
//! ([`NetLimits`], the flags' defaults) and the facts of the serving log line ([`Banner`]).
//! Plain settings, compiled in every build: `run` fills them from the launch plan, the
//! benchmarks by hand, and `serve` reads them.

use std::time::Duration;

/// How the servers run.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Register gRPC reflection (v1 and v1alpha).
    pub reflection: bool,
    /// Background reconcile period; `None` disables it.
    pub reconcile_interval: Option<Duration>,
    /// How long in-flight RPCs may finish after a shutdown signal.
    pub drain_period: Duration,
    /// Facts for the serving log line.
    pub banner: Banner,
    /// TLS material for the gRPC port; `None` serves plaintext.
    pub tls: Option<bigfleet_libvirt_grpc::tls::TlsState>,
    /// Honour the fake's test-only hooks in the gRPC layer (the injected handler panic).
    pub fault_hooks: bool,
    /// Check every call against the client certificate's `bigfleet://` identity (mTLS).
    pub client_identity: bigfleet_libvirt_domain::authorization::IdentityMode,
    /// Per-client bounds on both ports.
    pub limits: NetLimits,
}

/// Per-client bounds on both ports (the flags' defaults are [`NetLimits::default`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetLimits {
    /// gRPC connections open at once (`--max-connections`).
    pub grpc_max_connections: usize,
    /// Concurrent HTTP/2 streams per gRPC connection, advertised in SETTINGS; excess
    /// streams are refused with REFUSED_STREAM (`--max-concurrent-streams`).
    pub max_concurrent_streams: u32,
    /// How long a new gRPC connection may take to finish TLS and send the HTTP/2 preface
    /// (`--handshake-timeout`).
    pub handshake_timeout: Duration,
    /// HTTP/2 keepalive ping period on an otherwise quiet connection
    /// (`--http2-keepalive-interval`).
    pub http2_keepalive_interval: Duration,
    /// How long a keepalive ping may go unanswered before the connection is dropped
    /// (`--http2-keepalive-timeout`).
    pub http2_keepalive_timeout: Duration,
    /// The HTTP side server's bounds (`--metrics-max-connections`,
    /// `--http-header-read-timeout`, `--http-idle-timeout`).
    pub http: bigfleet_libvirt_observe::limits::HttpLimits,
    /// MiB the large List answers being streamed may hold at once, measured
    /// (`--list-memory-budget-mib`; see `bigfleet_libvirt_grpc::list_budget`).
    pub list_memory_budget_mib: usize,
    /// How long a List stream's reader may take nothing before the stream is cut
    /// (`--list-progress-timeout`; see `bigfleet_libvirt_grpc::list_stream`).
    pub list_progress_timeout: Duration,
}

impl Default for NetLimits {
    fn default() -> Self {
        Self {
            grpc_max_connections: 1024,
            max_concurrent_streams: 256,
            handshake_timeout: Duration::from_secs(10),
            http2_keepalive_interval: Duration::from_secs(30),
            http2_keepalive_timeout: Duration::from_secs(10),
            http: bigfleet_libvirt_observe::limits::HttpLimits {
                max_connections: 64,
                header_read_timeout: Duration::from_secs(10),
                idle_timeout: Duration::from_secs(60),
            },
            list_memory_budget_mib: bigfleet_libvirt_grpc::list_budget::DEFAULT_BUDGET_MIB,
            list_progress_timeout: bigfleet_libvirt_grpc::list_stream::DEFAULT_PROGRESS_TIMEOUT,
        }
    }
}

/// What the "serving CapacityProvider" line reports.
#[derive(Clone, Debug, Default)]
pub struct Banner {
    /// `--provider`.
    pub provider: String,
    /// `fake` or `libvirt`.
    pub backend: String,
    /// `insecure`, `TLS` or `mTLS`.
    pub security: String,
    /// Number of offering entries.
    pub offerings: usize,
    /// Configured zones, sorted.
    pub zones: Vec<String>,
    /// `enforce` or `off`: whether calls are checked against the client identity.
    pub client_identity: String,
}
