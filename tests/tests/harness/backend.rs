//! Which backend the conformance profiles launch: the in-memory fake (the default), or the
//! libvirt backend on libvirt's test driver, where every Create, Configure, Drain and Delete
//! defines, starts, stops and undefines a real (in-memory) libvirt domain and its volumes.
//!
//! The choice belongs to the test's thread: `run_on_test_driver` sets it, runs a test body that
//! was written against the profiles, and puts it back. `on_test_driver!` runs the
//! conformance modules' behaviours this way.
//!
//! The test driver has no qemu guest agent, so the machines there are of first-boot types
//! whose image runs none (`"boot": "nocloud", "guest_agent": false`, docs/libvirt.md §3.5):
//! Configure writes the join blob into the seed and starts the domain, Drain asks the guest
//! to shut down and writes the seed back. The agent's own steps are walked on real libvirtd
//! in the real-QEMU tier.

use std::cell::Cell;
use std::path::Path;

use bigfleet_libvirt_libvirt::fixture::Fixture;

use super::Server;

/// Launches a provider with `seed` slots and `extra` flags on some backend.
pub type Launch = fn(seed: u32, extra: &[&str]) -> Server;

/// A backend the profiles can launch.
#[derive(Clone, Copy, Debug)]
pub enum Backend {
    /// `--use-fake-backend`.
    Fake,
    /// `--connect test:///…/node.xml` with `--image` and agentless first-boot types.
    TestDriver,
    /// Real libvirtd daemons with real guests (the real-QEMU tier), launched by the tier's
    /// own function (`tests/tests/qemu_conformance.rs`).
    Real(Launch),
}

thread_local! {
    static BACKEND: Cell<Backend> = const { Cell::new(Backend::Fake) };
}

/// The backend this thread's profiles launch.
pub fn current() -> Backend {
    BACKEND.with(Cell::get)
}

/// Runs `test` (a `#[test]` function written against the profiles) with the profiles
/// launching on libvirt's test driver, and puts the fake back after (also when it panics,
/// so the thread never leaks the choice).
pub fn run_on_test_driver(test: fn()) {
    run_on(Backend::TestDriver, test);
}

/// Runs `test` with the profiles launching on `backend`, and puts the fake back after.
pub fn run_on(backend: Backend, test: fn()) {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            BACKEND.with(|b| b.set(Backend::Fake));
        }
    }
    let _restore = Restore;
    BACKEND.with(|b| b.set(backend));
    test();
}

/// How long to wait for a state at most, for a wait of `timeout` on the fake: real guests
/// boot and run their hooks under software emulation in the tier, so its waits are eight
/// times as long (the provider's own deadlines still decide every outcome).
pub fn stretch(timeout: std::time::Duration) -> std::time::Duration {
    match current() {
        Backend::Real(_) => timeout * 8,
        Backend::Fake | Backend::TestDriver => timeout,
    }
}

/// The instance types of the test-driver profile: the built-in catalog's shapes, booting by
/// NoCloud without a guest agent.
const TYPES: &str = r#"{
  "kvm.small": {"vcpu": 2, "memory_mib": 4096, "disk_gib": 40, "boot": "nocloud", "guest_agent": false},
  "kvm.medium": {"vcpu": 4, "memory_mib": 8192, "disk_gib": 80, "boot": "nocloud", "guest_agent": false},
  "kvm.large": {"vcpu": 8, "memory_mib": 16384, "disk_gib": 160, "boot": "nocloud", "guest_agent": false},
  "kvm.xlarge": {"vcpu": 16, "memory_mib": 32768, "disk_gib": 320, "boot": "nocloud", "guest_agent": false}
}"#;

/// Writes the test-driver host (a node file big enough for every slot of the scale lane to
/// run at once: the test driver reports every pool as 100 GiB and caps a node's CPUs, so the
/// disk and CPU ratios make the room for 4000 machines of the four types) and the types file into `dir`, and returns the flags that launch the
/// libvirt backend on them in place of `--use-fake-backend`.
pub fn test_driver_flags(dir: &Path) -> Vec<String> {
    let fixture = Fixture {
        cpus: 4096,
        memory_mib: 256 * 1024 * 1024,
        ..Fixture::default()
    };
    let node = fixture.write(dir, "node.xml").expect("write the node file");
    let types = dir.join("types.json");
    std::fs::write(&types, TYPES).expect("write the types file");
    vec![
        format!("--connect={node}"),
        "--image=base.qcow2".to_owned(),
        format!("--instance-types={}", types.display()),
        "--disk-allocation-ratio=100000".to_owned(),
        "--cpu-allocation-ratio=64".to_owned(),
    ]
}

/// Runs the named `#[test]` functions of the module it is called in a second time, on
/// libvirt's test driver: `on_test_driver!(b101_x, b103_y)` adds a child module
/// `on_test_driver` with one test per name (`lifecycle::on_test_driver::b101_x`).
#[allow(unused_macros)] // the benchmarks share this harness and list no tests
macro_rules! on_test_driver {
    ($($test:ident),* $(,)?) => {
        /// This module's behaviours again, on libvirt's test driver (harness/backend.rs).
        mod on_test_driver {
            $(
                #[test]
                fn $test() {
                    $crate::harness::backend::run_on_test_driver(super::$test);
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_test_driver;

/// As [`on_test_driver!`], on the real-QEMU tier's libvirtd daemons: a child module
/// `on_real_libvirtd` whose tests are ignored outside the tier (`scripts/qemu-tier/run.sh ci`
/// runs them as the group `on_real_libvirtd`).
#[allow(unused_macros)] // the benchmarks share this harness and list no tests
macro_rules! on_real_libvirtd {
    ($($test:ident),* $(,)?) => {
        /// This module's behaviours again, on real libvirtd (harness/backend.rs).
        mod on_real_libvirtd {
            $(
                #[test]
                #[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
                fn $test() {
                    let real = $crate::harness::backend::Backend::Real(
                        $crate::qemu_conformance::launch,
                    );
                    $crate::harness::backend::run_on(real, super::$test);
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_real_libvirtd;
