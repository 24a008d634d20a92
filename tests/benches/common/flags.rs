//! The flags both benchmarks start the provider with: the binary's defaults, the fake
//! backend with no latency, and a fresh loopback port. Built as plain values, as the binary
//! turns its command line into them.

use std::time::Duration;

use bigfleet_libvirt_app::launch::Flags;
use bigfleet_libvirt_domain::catalog::{DEFAULT_PER_GIB_HOUR, DEFAULT_PER_VCPU_HOUR};

/// The binary's flags for the zero-latency fake with `seed_count` Speculative slots on
/// `127.0.0.1:0`, no `--state`, no HTTP side server and no reconcile loop.
pub(crate) fn fake(seed_count: usize) -> Flags {
    Flags {
        addr: "127.0.0.1:0".to_owned(),
        provider: "libvirt".to_owned(),
        libvirt_backend: "fake".to_owned(),
        use_fake_backend: true,
        connect: String::new(),
        default_zone: "local".to_owned(),
        state: None,
        image: String::new(),
        image_source: None,
        storage_pool: "default".to_owned(),
        network: "default".to_owned(),
        nic: Vec::new(),
        instance_nic: Vec::new(),
        cpu: None,
        instance_cpu: Vec::new(),
        domain_type: "kvm".to_owned(),
        firmware: "bios".to_owned(),
        guest_kernel: String::new(),
        guest_initrd: String::new(),
        guest_cmdline: String::new(),
        base_user_data: None,
        capacity_type: "on_demand".to_owned(),
        instance_types: None,
        prices: String::new(),
        price_per_vcpu_hour: DEFAULT_PER_VCPU_HOUR,
        price_per_gib_hour: DEFAULT_PER_GIB_HOUR,
        offerings: None,
        seed_count: i64::try_from(seed_count).unwrap_or(i64::MAX),
        reconcile_interval: Duration::ZERO,
        metrics_addr: String::new(),
        reflection: false,
        tls_cert: None,
        tls_key: None,
        tls_ca: None,
        client_identity: None,
        fake_fault_hooks: false,
        transition_timeout: None,
        fake_delay_min: Duration::ZERO,
        fake_delay_max: Duration::ZERO,
        fake_seed: 1,
        // The binary's defaults for the libvirt-only capacity and GC flags.
        host_reserve_cpu: 1,
        host_reserve_memory_mib: 2048,
        cpu_allocation_ratio: 4.0,
        memory_allocation_ratio: 1.0,
        gc_orphans: false,
        orphan_grace: Duration::from_secs(15 * 60),
        host_budget: 4,
        agent_budget: 1,
    }
}
