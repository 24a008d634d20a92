//! Two provider labels on one host, and a new provider process after state loss. These
//! share `test:///default` (one host per process), each test with its own labels and base
//! volume.

use bigfleet_libvirt_domain::MachineState;
use bigfleet_libvirt_ports::Hypervisor;

use super::*;
use crate::metrics::DriftLabels;
use crate::render::ownership::Tag;
use bigfleet_libvirt_config::naming::domain_name;

const SHARED: &str = "test:///default";
const POOL: &str = "default-pool";

/// One shared-host test at a time, so domain counts are not disturbed by the other.
static SHARED_HOST: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Creates a base volume unique to the test in the shared host's pool. The returned
/// connection keeps the shared host alive: the test driver discards `test:///default` when
/// its last connection closes.
fn shared_base(name: &str) -> virt::connect::Connect {
    virt::error::clear_error_callback();
    let conn = virt::connect::Connect::open(Some(SHARED)).unwrap();
    let pool = conn.lookup_storage_pool_by_name(POOL).unwrap();
    let xml = format!(
        "<volume type='file'><name>{name}</name><capacity unit='GiB'>1</capacity>\
         <target><format type='raw'/></target></volume>"
    );
    virt::storage_vol::StorageVol::create_xml(&pool, &xml, 0).unwrap();
    conn
}

async fn shared(provider: &str, base: &str) -> LibvirtHypervisor<SystemClock> {
    let connections = vec![HostConnection {
        zone: ZONE.to_owned(),
        uri: SHARED.to_owned(),
    }];
    let mut config = config(
        provider,
        connections,
        slots(provider, ZONE, "kvm.small", 3),
        base,
    );
    config.options.storage_pool = POOL.to_owned();
    // The default test host has 3 GiB: let memory overcommit so kvm.small fits.
    config.options.capacity.memory_ratio = 1000.0;
    config.options.capacity.cpu_ratio = 1000.0;
    LibvirtHypervisor::connect(
        config,
        SystemClock,
        &TokioSpawner,
        LibvirtMetrics::unexposed(),
    )
    .await
}

fn drift(metrics: &LibvirtMetrics, kind: &str) -> i64 {
    let labels = DriftLabels {
        zone: ZONE.to_owned(),
        kind: kind.to_owned(),
    };
    metrics.drift.get_or_create(&labels).get()
}

#[tokio::test]
async fn two_provider_labels_never_see_or_touch_each_others_domains() {
    let (a, b) = (unique("iso-a"), unique("iso-b"));
    let base = unique("iso-base");
    let _one_at_a_time = SHARED_HOST.lock().await;
    let _keep = shared_base(&base);
    let hv_a = shared(&a, &base).await;
    let slot_a = hv_a.inner.config.slots[0].clone();
    let made_a = create(&hv_a, &slot_a).await.unwrap();

    let hv_b = shared(&b, &base).await;
    let described = hv_b.describe().await.unwrap();
    assert!(
        described
            .iter()
            .all(|m| m.state == MachineState::Speculative)
    );
    assert!(described.iter().all(|m| m.id.as_str().starts_with(&b)));
    assert_eq!(drift(&hv_b.inner.metrics, "orphan_domain"), 0);

    // B is handed a forged record pointing at A's domain: refused, nothing touched.
    let mut forged = hv_b.inner.config.slots[0].clone();
    forged.host = made_a.host.clone();
    let error = delete(&hv_b, &forged).await.unwrap_err();
    assert!(error.message.contains("refusing"), "{}", error.message);
    let name_a = domain_name(&a, slot_a.id.as_str());
    assert!(domains(&hv_a, ZONE).await.contains(&name_a));

    // A domain squatting B's name but tagged for A is neither adopted nor offered.
    let slot_b = hv_b.inner.config.slots[1].clone();
    let squat = domain_name(&b, slot_b.id.as_str());
    let tag = Tag::new(&a, "someone/else");
    let document = planted_domain(&squat, tag, 1, 64, ("/x", "/y"));
    on_host(&hv_b, ZONE, move |s| {
        s.conn.define_domain_xml(&document).unwrap();
    })
    .await;
    let error = create(&hv_b, &slot_b).await.unwrap_err();
    assert!(
        error.message.contains("tagged for machine"),
        "{}",
        error.message
    );
    let described = hv_b.describe().await.unwrap();
    assert!(
        !described.iter().any(|m| m.id == slot_b.id),
        "the squatted slot is withheld"
    );
    delete(&hv_a, &made_a).await.unwrap();
}

#[tokio::test]
async fn a_new_provider_process_adopts_tagged_domains_after_state_loss() {
    let label = unique("adopt");
    let base = unique("adopt-base");
    let _one_at_a_time = SHARED_HOST.lock().await;
    let _keep = shared_base(&base);
    let first = shared(&label, &base).await;
    let slots = first.inner.config.slots.clone();
    let running = create(&first, &slots[0]).await.unwrap();
    create(&first, &slots[1]).await.unwrap();
    let stopped = domain_name(&label, slots[1].id.as_str());
    on_host(&first, ZONE, move |s| {
        s.conn
            .lookup_domain_by_name(&stopped)
            .unwrap()
            .destroy()
            .unwrap();
    })
    .await;
    drop(first);

    // A second process with an empty store: describe seeds from the tags.
    let second = shared(&label, &base).await;
    let described = second.describe().await.unwrap();
    let by_id = |id: &str| described.iter().find(|m| m.id.as_str() == id).unwrap();
    let idle = by_id(slots[0].id.as_str());
    assert_eq!(idle.state, MachineState::Idle);
    assert_eq!(idle.host, running.host);
    let adoptable = by_id(slots[1].id.as_str());
    assert_eq!(adoptable.state, MachineState::Speculative);
    assert_eq!(adoptable.host, None);
    // Creating the stopped slot adopts and powers on its domain; nothing new is defined.
    let before = domains(&second, ZONE).await.len();
    create(&second, &slots[1]).await.unwrap();
    assert_eq!(domains(&second, ZONE).await.len(), before);
    let described = second.describe().await.unwrap();
    assert!(
        described
            .iter()
            .filter(|m| m.state == MachineState::Idle)
            .count()
            == 2
    );
    for slot in &slots[..2] {
        let mut machine = slot.clone();
        machine.host = None;
        delete(&second, &machine).await.unwrap();
    }
}
