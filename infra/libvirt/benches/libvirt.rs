//! Create→Idle latency of the libvirt backend for 100 machines on libvirt's test driver,
//! next to raw `virt` define+start of the same domain documents in the same run.
//!
//! Both sides get a fresh in-memory host from the same node file. The raw side is the
//! floor: 100 sequential `virDomainDefineXML` + `virDomainCreate` calls and nothing else.
//! The provider side is everything a shard's Create pays for up to Idle, on the provider as
//! the composition root (`app::assemble`) builds it: the provider's accept and persist
//! (memory store), the metrics decorator, the adapter's ownership check, capacity reservation,
//! overlay and seed volumes, the seed ISO, define, start, autostart, and completion. The
//! 100 Creates are submitted together, as a shard would. Each side runs several rounds,
//! alternating, each on a fresh host. On a shared 2-core machine other work only ever
//! adds time, so the headline ratio compares the fastest round of each side (the cost
//! with the least interference); the ratio of medians is printed too. Target: at most 1.5×.
//!
//! Run: `cargo bench -p bigfleet-libvirt-libvirt --bench libvirt`.

#[path = "../../../tests/benches/common/results.rs"]
mod results;

use crate::results::say;
use std::collections::BTreeMap;
use std::error::Error;
use std::sync::{Arc, Mutex};

use bigfleet_libvirt_app as app;
use bigfleet_libvirt_config::HostConnection;
use bigfleet_libvirt_config::naming::domain_name;
use bigfleet_libvirt_domain::catalog::{
    InstanceCatalog, InventoryConfig, Offering, PriceTable, build_inventory,
};
use bigfleet_libvirt_domain::{
    FenceToken, Kind, Machine, MachineState, MutateRequest, Mutation, StringMap,
};
use bigfleet_libvirt_libvirt::devices::{Mac, Nic, NicSource};
use bigfleet_libvirt_libvirt::fixture::Fixture;
use bigfleet_libvirt_libvirt::metrics::LibvirtMetrics;
use bigfleet_libvirt_libvirt::xml::{self, Base, Disks, DomainSpec, VolumePaths};
use bigfleet_libvirt_libvirt::{CapacityPolicy, LibvirtConfig, LibvirtHypervisor, Tag};
use bigfleet_libvirt_memory::MemoryStateStore;
use bigfleet_libvirt_ports::{BootstrapBlob, Observer, ProviderConfig, TransitionEvent};
use bigfleet_libvirt_system::{Stopwatch, SystemClock, TokioSpawner};

type BoxError = Box<dyn Error + Send + Sync>;

const MACHINES: usize = 100;
const PROVIDER: &str = "bench";
const ZONE: &str = "bench";
const TARGET: f64 = 1.5;
const ROUNDS: usize = 7;

fn main() -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run())?;
    results::write("libvirt (libvirt's test driver)")
}

async fn run() -> Result<(), BoxError> {
    virt::error::clear_error_callback();
    let dir = tempfile::tempdir()?;
    let fixture = Fixture {
        cpus: 1024,
        memory_mib: 4 << 20,
        ..Fixture::default()
    };
    let uri = fixture.write(dir.path(), "node.xml")?;
    let slots = slots(MACHINES)?;
    // Warm both paths once (page cache, lazy libvirt initialisation), then measure.
    raw(&uri, &slots).await?;
    provider_side(&uri, &slots).await?;
    let (mut raws, mut totals, mut latencies) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        raws.push(raw(&uri, &slots).await?);
        let (total, round) = provider_side(&uri, &slots).await?;
        totals.push(total);
        latencies.extend(round);
    }
    report(&raws, &totals, &latencies);
    Ok(())
}

fn slots(count: usize) -> Result<Vec<Machine>, BoxError> {
    let catalog = InstanceCatalog::builtin();
    let prices = PriceTable::new(BTreeMap::new(), 0.003, 0.0008, &catalog)?;
    let offering = Offering {
        instance_type: "kvm.small".to_owned(),
        zone: ZONE.to_owned(),
        capacity_type: String::new(),
        count: i64::try_from(count)?,
        resources: StringMap::new(),
        labels: StringMap::new(),
    };
    let cfg = InventoryConfig {
        provider: PROVIDER,
        catalog: &catalog,
        prices: &prices,
        require_zones: None,
    };
    Ok(build_inventory(&[offering], &cfg)?.machines)
}

/// The domain documents the adapter defines for these slots.
fn documents(slots: &[Machine]) -> Vec<String> {
    slots
        .iter()
        .map(|slot| {
            let name = domain_name(PROVIDER, slot.id.as_str());
            let (overlay, seed) = (
                format!("{name}-overlay.qcow2"),
                format!("{name}-cidata.iso"),
            );
            let overlay_path = format!("/var/lib/libvirt/images/{overlay}");
            let seed_path = format!("/var/lib/libvirt/images/{seed}");
            let nics = vec![Nic {
                source: NicSource::Network("default".to_owned()),
                mac: Mac::derive(PROVIDER, slot.id.as_str(), 0, 0),
                vlan: None,
            }];
            let spec = DomainSpec {
                instance_type: slot.instance_type.clone(),
                instance_id: format!("{name}-bench"),
                tag: Tag::new(PROVIDER, slot.id.as_str()),
                vcpu: 2,
                memory_mib: 4096,
                placed: xml::Placed::default(),
                cpu: None,
                nics,
                address: None,
                platform: xml::Platform::default(),
                disks: Disks {
                    overlay,
                    seed,
                    console: String::new(),
                    base: Base {
                        path: "/var/lib/libvirt/images/base.qcow2".to_owned(),
                        format: "qcow2".to_owned(),
                        overlay_bytes: 40 << 30,
                        rbd: None,
                    },
                    data: Vec::new(),
                    ignition: None,
                },
                user_data: Arc::from(&b"#cloud-config\n{}\n"[..]),
                tpm: false,
                secure_boot: false,
                name,
            };
            let paths = VolumePaths {
                overlay: &overlay_path,
                seed: &seed_path,
                console: None,
                data: &[],
                ignition: None,
            };
            xml::domain(&spec, paths)
        })
        .collect()
}

/// Seconds for sequential define+start of every slot's domain on a fresh host.
async fn raw(uri: &str, slots: &[Machine]) -> Result<f64, BoxError> {
    let (uri, documents) = (uri.to_owned(), documents(slots));
    let seconds = tokio::task::spawn_blocking(move || -> Result<f64, BoxError> {
        let conn = virt::connect::Connect::open(Some(&uri))?;
        let watch = Stopwatch::start();
        for document in &documents {
            conn.define_domain_xml(document)?.create()?;
        }
        Ok(watch.seconds())
    })
    .await??;
    Ok(seconds)
}

/// Total seconds until every Create is Idle, and each Create's accept→Idle latency.
async fn provider_side(uri: &str, slots: &[Machine]) -> Result<(f64, Vec<f64>), BoxError> {
    let connections = vec![HostConnection {
        zone: ZONE.to_owned(),
        uri: uri.to_owned(),
    }];
    let catalog = InstanceCatalog::builtin();
    let mut config =
        LibvirtConfig::new(PROVIDER, connections, slots.to_vec(), catalog, "base.qcow2");
    config.options.capacity = CapacityPolicy {
        reserve_cpu: 0,
        reserve_memory_mib: 0,
        cpu_ratio: 1.0,
        memory_ratio: 1.0,
        // The test driver's pools report 100 GiB; the bench's thousands of slots need more.
        disk_ratio: 1e9,
        ..CapacityPolicy::default()
    };
    // The root is linked without its libvirt feature: the adapter's series stand alone.
    let libvirt_metrics = LibvirtMetrics::unexposed();
    let libvirt = LibvirtHypervisor::connect(config, SystemClock, &TokioSpawner, libvirt_metrics);
    let libvirt = libvirt.await;
    let (done, mut finished) = tokio::sync::mpsc::unbounded_channel::<TransitionEvent>();
    let done = Mutex::new(done);
    let timer: Observer = Arc::new(move |event: &TransitionEvent| {
        let sender = done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = sender.send(event.clone());
    });
    // Built as the binary builds it: through the composition root.
    let provider = app::assemble(app::Parts {
        config: ProviderConfig::default(),
        hypervisor: libvirt,
        store: MemoryStateStore::new(),
        clock: SystemClock,
        spawner: TokioSpawner,
        metrics: app::Metrics::new(),
        observers: vec![timer],
    })
    .await?;
    let provider = Arc::new(provider);
    let watch = Stopwatch::start();
    let submitted = slots.iter().map(|slot| {
        let provider = Arc::clone(&provider);
        let mutation = Mutation {
            machine_id: slot.id.to_string(),
            token: FenceToken::default(),
            request: MutateRequest::Create,
        };
        async move { provider.mutate(mutation, BootstrapBlob::default()).await }
    });
    for ack in futures::future::join_all(submitted).await {
        ack?;
    }
    let mut latencies = Vec::with_capacity(slots.len());
    while latencies.len() < slots.len() {
        let event = finished
            .recv()
            .await
            .ok_or("the provider stopped reporting")?;
        let idle = event
            .machine
            .as_ref()
            .is_some_and(|m| m.state == MachineState::Idle);
        if event.kind != Kind::Create || !idle {
            return Err(format!("a Create did not reach Idle: {:?}", event.machine).into());
        }
        latencies.push(event.elapsed.as_secs_f64());
    }
    Ok((watch.seconds(), latencies))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    // Nearest-rank on a sample of 100: the index is small and exact.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn sorted(values: &[f64]) -> Vec<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
}

fn report(raws: &[f64], totals: &[f64], latencies: &[f64]) {
    let (raws, totals, sorted) = (sorted(raws), sorted(totals), sorted(latencies));
    let (raw_seconds, total) = (raws[0], totals[0]);
    let median_ratio = percentile(&totals, 50.0) / percentile(&raws, 50.0);
    let ms = |s: f64| s * 1000.0;
    #[allow(clippy::cast_precision_loss)]
    let per = |s: f64| ms(s) / MACHINES as f64;
    let ratio = total / raw_seconds;
    let rounds = |values: &[f64]| {
        let shown: Vec<String> = values.iter().map(|v| format!("{:.1}", ms(*v))).collect();
        shown.join(" ")
    };
    say!(
        "libvirt backend: {MACHINES} machines (kvm.small) on the libvirt test driver, best of \
         {ROUNDS} rounds"
    );
    say!("  rounds, raw ms (sorted):      {}", rounds(&raws));
    say!("  rounds, provider ms (sorted): {}", rounds(&totals));
    say!(
        "  raw virt define+start, sequential:  total {:8.2} ms  ({:.3} ms per domain)",
        ms(raw_seconds),
        per(raw_seconds)
    );
    say!(
        "  provider Create->Idle, concurrent:  total {:8.2} ms  ({:.3} ms per machine)",
        ms(total),
        per(total)
    );
    say!(
        "  Create->Idle latency per machine, all rounds: p50 {:.2} ms  p90 {:.2} ms  \
         p99 {:.2} ms  max {:.2} ms",
        ms(percentile(&sorted, 50.0)),
        ms(percentile(&sorted, 90.0)),
        ms(percentile(&sorted, 99.0)),
        ms(percentile(&sorted, 100.0)),
    );
    let verdict = if ratio <= TARGET { "within" } else { "ABOVE" };
    say!(
        "  ratio (provider total / raw total): {ratio:.2}x  ({verdict} the {TARGET}x target); \
         ratio of medians {median_ratio:.2}x"
    );
}
