//! The command line: every flag, its default and its `BIGFLEET_LIBVIRT_<FLAG>` variable,
//! and the conversion into the library's plain `Flags` (clap stays in the binary).

use std::path::PathBuf;
use std::time::Duration;

use bigfleet_libvirt_app::launch::{Flags, LimitFlags};
use clap::{ArgAction, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "bigfleet-libvirt",
    version,
    about = "BigFleet capacity provider for libvirt hosts"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// gRPC listen address (`:PORT` listens on every interface).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_ADDR",
        default_value = ":9000"
    )]
    pub addr: String,
    /// Label stamped on every HostRef.provider and used in machine ids.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_PROVIDER",
        default_value = "libvirt"
    )]
    pub provider: String,
    /// libvirt | fake | auto (auto = libvirt when --connect is set, else the fake).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_LIBVIRT_BACKEND",
        default_value = "auto"
    )]
    pub libvirt_backend: String,
    /// Force the in-memory fake hypervisor whatever else is set (conformance runs).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_USE_FAKE_BACKEND", action = ArgAction::Set,
          num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    pub use_fake_backend: bool,
    /// A bare libvirt URI for --default-zone, or a zone=uri,... list (one libvirt host per zone).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_CONNECT",
        default_value = ""
    )]
    pub connect: String,
    /// Zone label for a single bare --connect URI; also the stem of the fake's zones.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_DEFAULT_ZONE",
        default_value = "local"
    )]
    pub default_zone: String,
    /// Durable state file (redb); empty = in-memory only, nothing survives a restart.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_STATE",
        default_value = ""
    )]
    pub state: String,
    /// Golden base-image volume in --storage-pool (required by the libvirt backend).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_IMAGE",
        default_value = ""
    )]
    pub image: String,
    /// Local qcow2 or raw golden image: uploaded to every host's --storage-pool that lacks it,
    /// as a volume named after its sha256 (--image may then be empty, or must name it).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_IMAGE_SOURCE")]
    pub image_source: Option<PathBuf>,
    /// Storage pool for overlay and cloud-init volumes (libvirt backend).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_STORAGE_POOL",
        default_value = "default"
    )]
    pub storage_pool: String,
    /// libvirt network for the domain NIC (libvirt backend); empty = no NIC.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_NETWORK",
        default_value = "default"
    )]
    pub network: String,
    /// A NIC of every domain, in order, replacing --network's: network=NAME, bridge=NAME or
    /// direct=DEVICE[:bridge|vepa|private|passthrough] (libvirt backend; repeatable).
    #[arg(long, global = true, value_name = "SOURCE")]
    pub nic: Vec<String>,
    /// The NICs of one instance type instead, as TYPE:SOURCE (repeatable, one NIC each).
    #[arg(long, global = true, value_name = "TYPE:SOURCE")]
    pub instance_nic: Vec<String>,
    /// Guest CPU: host-passthrough, host-model or a model name, optionally with ,+feature or
    /// ,-feature (libvirt backend; default host-passthrough on kvm, QEMU's model on qemu).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_CPU")]
    pub cpu: Option<String>,
    /// The guest CPU of one instance type instead, as TYPE:CPU (repeatable).
    #[arg(long, global = true, value_name = "TYPE:CPU")]
    pub instance_cpu: Vec<String>,
    /// Domain type: kvm, or qemu for software emulation where KVM cannot run guests.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_DOMAIN_TYPE",
        default_value = "kvm"
    )]
    pub domain_type: String,
    /// Guest firmware: bios, or efi for UEFI (OVMF chosen by libvirt, Secure Boot off).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_FIRMWARE",
        default_value = "bios"
    )]
    pub firmware: String,
    /// Direct kernel boot: kernel path on the libvirt host; empty = boot the image's disk.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_GUEST_KERNEL",
        default_value = ""
    )]
    pub guest_kernel: String,
    /// Direct kernel boot: initramfs path on the libvirt host (needs --guest-kernel).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_GUEST_INITRD",
        default_value = ""
    )]
    pub guest_initrd: String,
    /// Direct kernel boot: kernel command line (needs --guest-kernel).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_GUEST_CMDLINE",
        default_value = ""
    )]
    pub guest_cmdline: String,
    /// Cloud-init user-data file baked into every new domain (libvirt backend).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_BASE_USER_DATA",
        default_value = ""
    )]
    pub base_user_data: String,
    /// on_demand (Delete implemented) or bare_metal (fixed pool) for the built-in offerings.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_CAPACITY_TYPE",
        default_value = "on_demand"
    )]
    pub capacity_type: String,
    /// JSON catalog name -> {vcpu, memory_mib}; replaces the built-in kvm.* sizes.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_INSTANCE_TYPES",
        default_value = ""
    )]
    pub instance_types: String,
    /// Explicit USD/hour prices, type=usd,...
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_PRICES",
        default_value = ""
    )]
    pub prices: String,
    /// Synthetic USD/hour per vCPU.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_PRICE_PER_VCPU_HOUR",
        default_value_t = 0.0030
    )]
    pub price_per_vcpu_hour: f64,
    /// Synthetic USD/hour per GiB of RAM.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_PRICE_PER_GIB_HOUR",
        default_value_t = 0.0008
    )]
    pub price_per_gib_hour: f64,
    /// JSON offerings file; empty = a built-in mix sized by --seed-count.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_OFFERINGS",
        default_value = ""
    )]
    pub offerings: String,
    /// Speculative slots in the built-in offerings (values <= 0 mean 16).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_SEED_COUNT",
        default_value_t = 32
    )]
    pub seed_count: i64,
    /// Background reconcile interval (0 = off), e.g. 30s, 2m.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_RECONCILE_INTERVAL", default_value = "2m",
          value_parser = parse_duration)]
    pub reconcile_interval: Duration,
    /// HTTP address for /metrics, /healthz, /readyz; empty disables it.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_METRICS_ADDR",
        default_value = ":9090"
    )]
    pub metrics_addr: String,
    /// Register gRPC server reflection (v1 and v1alpha).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_REFLECTION", action = ArgAction::Set,
          num_args = 0..=1, default_value_t = true, default_missing_value = "true")]
    pub reflection: bool,
    /// Server certificate (PEM); enables TLS 1.3. Reloaded when the file changes or on SIGHUP.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_TLS_CERT",
        default_value = ""
    )]
    pub tls_cert: String,
    /// Server private key (PEM).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_TLS_KEY",
        default_value = ""
    )]
    pub tls_key: String,
    /// Client CA bundle (PEM); enables mTLS (client certificates required and verified).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_TLS_CA",
        default_value = ""
    )]
    pub tls_ca: String,
    /// Under mTLS: enforce (default) checks every call against the client certificate's
    /// bigfleet:// identity; off lets every verified client call everything. Needs --tls-ca.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_CLIENT_IDENTITY")]
    pub client_identity: Option<String>,
    /// Fake only: honour the conformance fault hooks (fault slots and fault-* cluster ids).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_FAKE_FAULT_HOOKS", action = ArgAction::Set,
          num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    pub fake_fault_hooks: bool,
    /// Override every transition deadline (e.g. 2s); default Create 5m, Configure 8m, Drain 15m, Delete 5m.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_TRANSITION_TIMEOUT", value_parser = parse_duration)]
    pub transition_timeout: Option<Duration>,
    /// libvirt: physical CPUs per host kept for the host itself (not offered to slots).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_HOST_RESERVE_CPU",
        default_value_t = 1
    )]
    pub host_reserve_cpu: u32,
    /// libvirt: MiB of RAM per host kept for the host itself (not offered to slots).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_HOST_RESERVE_MEMORY_MIB",
        default_value_t = 2048
    )]
    pub host_reserve_memory_mib: u64,
    /// libvirt: vCPUs offered per remaining physical CPU of a host.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_CPU_ALLOCATION_RATIO",
        default_value_t = 4.0
    )]
    pub cpu_allocation_ratio: f64,
    /// libvirt: MiB offered per remaining MiB of host RAM (1 = no memory overcommit).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_MEMORY_ALLOCATION_RATIO",
        default_value_t = 1.0
    )]
    pub memory_allocation_ratio: f64,
    /// libvirt: delete orphaned domains and volumes after --orphan-grace (default: report only).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_GC_ORPHANS", action = ArgAction::Set,
          num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    pub gc_orphans: bool,
    /// libvirt: how long an orphan must be seen before it may be collected, e.g. 15m.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_ORPHAN_GRACE", default_value = "15m",
          value_parser = parse_duration)]
    pub orphan_grace: Duration,
    /// libvirt: the most libvirt calls in flight per host, all lanes together; keep it
    /// below the host's libvirtd `max_client_requests` (default 5).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_HOST_BUDGET",
          default_value_t = bigfleet_libvirt_libvirt::lanes::DEFAULT_HOST_BUDGET)]
    pub host_budget: usize,
    /// libvirt: of --host-budget, the most guest-agent calls in flight per host.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_AGENT_BUDGET",
          default_value_t = bigfleet_libvirt_libvirt::lanes::DEFAULT_AGENT_BUDGET)]
    pub agent_budget: usize,
    /// Fake only: shortest simulated hypervisor latency.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_FAKE_DELAY_MIN", default_value = "20ms",
          value_parser = parse_duration)]
    pub fake_delay_min: Duration,
    /// Fake only: longest simulated hypervisor latency.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_FAKE_DELAY_MAX", default_value = "200ms",
          value_parser = parse_duration)]
    pub fake_delay_max: Duration,
    /// Fake only: seed of the latency generator.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_FAKE_SEED",
        default_value_t = 1
    )]
    pub fake_seed: u64,
    /// gRPC connections open at once on --addr; a new client past it evicts the oldest idle one.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_MAX_CONNECTIONS",
        default_value_t = 1024
    )]
    pub max_connections: usize,
    /// Concurrent HTTP/2 streams per gRPC connection; streams past it get REFUSED_STREAM.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_MAX_CONCURRENT_STREAMS",
        default_value_t = 256
    )]
    pub max_concurrent_streams: u32,
    /// How long a new gRPC connection may take to finish TLS and send the HTTP/2 preface.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_HANDSHAKE_TIMEOUT", default_value = "10s",
          value_parser = parse_duration)]
    pub handshake_timeout: Duration,
    /// HTTP/2 keepalive ping period on a quiet gRPC connection.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_HTTP2_KEEPALIVE_INTERVAL",
          default_value = "30s", value_parser = parse_duration)]
    pub http2_keepalive_interval: Duration,
    /// How long a keepalive ping may go unanswered before the gRPC connection is dropped.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_HTTP2_KEEPALIVE_TIMEOUT",
          default_value = "10s", value_parser = parse_duration)]
    pub http2_keepalive_timeout: Duration,
    /// Connections open at once on --metrics-addr; a new client past it evicts the oldest idle one.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_METRICS_MAX_CONNECTIONS",
        default_value_t = 64
    )]
    pub metrics_max_connections: usize,
    /// How long a request head on --metrics-addr may take (from connect or the last response).
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_HTTP_HEADER_READ_TIMEOUT",
          default_value = "10s", value_parser = parse_duration)]
    pub http_header_read_timeout: Duration,
    /// How long a connection on --metrics-addr may move no byte before it is closed.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_HTTP_IDLE_TIMEOUT", default_value = "60s",
          value_parser = parse_duration)]
    pub http_idle_timeout: Duration,
    /// MiB of large List answers (over 1 MiB each) held for their readers at once; further
    /// large Lists wait until earlier answers are sent. Size it within the pod's memory limit.
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_LIST_MEMORY_BUDGET_MIB",
        default_value_t = 64
    )]
    pub list_memory_budget_mib: usize,
    /// Log format.
    #[arg(long, global = true, env = "BIGFLEET_LIBVIRT_LOG_FORMAT", value_enum, default_value_t = Format::Text)]
    pub log_format: Format,
    /// OTLP/gRPC endpoint for traces (e.g. http://collector:4317); unset = no export.
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Log level (RUST_LOG, when set, wins).
    #[arg(
        long,
        global = true,
        env = "BIGFLEET_LIBVIRT_LOG_LEVEL",
        default_value = "info"
    )]
    pub log_level: String,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the Speculative inventory these flags would serve, as JSON, and exit.
    Offerings,
    /// Check every --connect host against these flags (read-only) and print a verdict:
    /// exit 0 when nothing blocks, 1 when something blocks, 2 for warnings only.
    Doctor {
        /// table for a person, json for tools.
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// How long one host may take to answer every check.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        host_timeout: Duration,
        /// Exit 0 instead of 2 when there are warnings but no blockers (for hook Jobs).
        #[arg(long)]
        allow_warnings: bool,
        /// Also start (paused) and destroy one throw-away domain per CPU choice on every
        /// host, to find a CPU mode QEMU aborts on; without it doctor changes nothing.
        #[arg(long)]
        trial_domain: bool,
    },
    /// Work with a --state file without serving it.
    State {
        #[command(subcommand)]
        action: StateCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum StateCommand {
    /// Print what the --state file holds (read-only; refused while a provider holds it).
    Inspect {
        /// Show only this machine's record, fence marks and operation ids.
        #[arg(long)]
        machine: Option<String>,
        /// table for a person, json for tools.
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

/// How a report is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    if raw.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(raw.trim()).map_err(|e| format!("{e} (use e.g. 500ms, 30s, 2m, 1h)"))
}

fn path(raw: &str) -> Option<PathBuf> {
    (!raw.is_empty()).then(|| PathBuf::from(raw))
}

impl Cli {
    pub fn flags(&self) -> Flags {
        Flags {
            addr: self.addr.clone(),
            provider: self.provider.clone(),
            libvirt_backend: self.libvirt_backend.clone(),
            use_fake_backend: self.use_fake_backend,
            connect: self.connect.clone(),
            default_zone: self.default_zone.clone(),
            state: path(&self.state),
            image: self.image.clone(),
            image_source: self.image_source.clone(),
            storage_pool: self.storage_pool.clone(),
            network: self.network.clone(),
            nic: self.nic.clone(),
            instance_nic: self.instance_nic.clone(),
            cpu: self.cpu.clone(),
            instance_cpu: self.instance_cpu.clone(),
            domain_type: self.domain_type.clone(),
            firmware: self.firmware.clone(),
            guest_kernel: self.guest_kernel.clone(),
            guest_initrd: self.guest_initrd.clone(),
            guest_cmdline: self.guest_cmdline.clone(),
            base_user_data: path(&self.base_user_data),
            capacity_type: self.capacity_type.clone(),
            instance_types: path(&self.instance_types),
            prices: self.prices.clone(),
            price_per_vcpu_hour: self.price_per_vcpu_hour,
            price_per_gib_hour: self.price_per_gib_hour,
            offerings: path(&self.offerings),
            seed_count: self.seed_count,
            reconcile_interval: self.reconcile_interval,
            metrics_addr: self.metrics_addr.clone(),
            reflection: self.reflection,
            tls_cert: path(&self.tls_cert),
            tls_key: path(&self.tls_key),
            tls_ca: path(&self.tls_ca),
            client_identity: self.client_identity.clone().filter(|v| !v.is_empty()),
            fake_fault_hooks: self.fake_fault_hooks,
            transition_timeout: self.transition_timeout,
            fake_delay_min: self.fake_delay_min,
            fake_delay_max: self.fake_delay_max,
            fake_seed: self.fake_seed,
            host_reserve_cpu: self.host_reserve_cpu,
            host_reserve_memory_mib: self.host_reserve_memory_mib,
            cpu_allocation_ratio: self.cpu_allocation_ratio,
            memory_allocation_ratio: self.memory_allocation_ratio,
            gc_orphans: self.gc_orphans,
            orphan_grace: self.orphan_grace,
            host_budget: self.host_budget,
            agent_budget: self.agent_budget,
        }
    }
}

impl Cli {
    pub fn limit_flags(&self) -> LimitFlags {
        LimitFlags {
            max_connections: self.max_connections,
            max_concurrent_streams: self.max_concurrent_streams,
            handshake_timeout: self.handshake_timeout,
            http2_keepalive_interval: self.http2_keepalive_interval,
            http2_keepalive_timeout: self.http2_keepalive_timeout,
            metrics_max_connections: self.metrics_max_connections,
            http_header_read_timeout: self.http_header_read_timeout,
            http_idle_timeout: self.http_idle_timeout,
            list_memory_budget_mib: self.list_memory_budget_mib,
        }
    }
}
