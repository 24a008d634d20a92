//! Hosts: capacity bounds what is offered and created, a dropped connection comes back,
//! and a dead host neither blocks nor hides another.

use bigfleet_libvirt_domain::MachineState;
use bigfleet_libvirt_ports::Hypervisor;

use super::*;
use crate::host::connection::Health;
use crate::host::fixture;
use crate::metrics::HostLabels;
use crate::storage::volumes::overlay_name;
use bigfleet_libvirt_config::naming::domain_name;
use bigfleet_libvirt_system::Stopwatch;

fn health_gauge(metrics: &LibvirtMetrics, zone: &str, state: &str) -> i64 {
    let labels = HostLabels {
        zone: zone.to_owned(),
        state: state.to_owned(),
    };
    metrics.host_health.get_or_create(&labels).get()
}

#[tokio::test]
async fn capacity_bounds_offers_and_refuses_creates_that_do_not_fit() {
    // 4 CPUs and 8 GiB: two kvm.small (2 vCPU, 4 GiB) fit, a third does not.
    let fixture = Fixture {
        cpus: 4,
        memory_mib: 8192,
        ..Fixture::default()
    };
    let rig = rig_with(&fixture, slots("libvirt", ZONE, "kvm.small", 3), |_| {}).await;
    let offered = rig.hv.describe().await.unwrap();
    let ids: Vec<&str> = offered.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, [rig.slots[0].id.as_str(), rig.slots[1].id.as_str()]);
    create(&rig.hv, &rig.slots[0]).await.unwrap();
    create(&rig.hv, &rig.slots[1]).await.unwrap();
    let started = Stopwatch::start();
    let error = create(&rig.hv, &rig.slots[2]).await.unwrap_err();
    assert!(started.seconds() < 2.0, "a refusal is fast");
    assert!(error.message.contains("has no room"), "{}", error.message);
    assert!(
        error
            .message
            .contains("needs 2 vCPU and 4096 MiB but only 0 vCPU and 0 MiB"),
        "{}",
        error.message
    );
    let name = domain_name("libvirt", rig.slots[2].id.as_str());
    let volumes = volumes(&rig.hv, ZONE, "default").await;
    assert!(!volumes.contains(&overlay_name(&name)), "nothing was made");
    let described = rig.hv.describe().await.unwrap();
    let idle = described
        .iter()
        .filter(|m| m.state == MachineState::Idle)
        .count();
    assert_eq!((described.len(), idle), (2, 2));
}

#[tokio::test]
async fn a_dropped_connection_is_reestablished() {
    let rig = rig().await;
    assert_eq!(rig.hv.health(ZONE), Some(Health::Healthy));
    assert_eq!(health_gauge(&rig.metrics, ZONE, "healthy"), 1);
    let host = Arc::clone(&rig.hv.inner.hosts[ZONE]);
    host.sever();
    let Err(refused) = host.session() else {
        panic!("a severed host has no session");
    };
    assert!(
        refused.message.contains("unreachable"),
        "{}",
        refused.message
    );
    assert_eq!(health_gauge(&rig.metrics, ZONE, "healthy"), 0);
    tokio::time::timeout(Duration::from_secs(10), rig.hv.wait_healthy(ZONE))
        .await
        .expect("reconnected");
    assert_eq!(health_gauge(&rig.metrics, ZONE, "healthy"), 1);
    assert_eq!(health_gauge(&rig.metrics, ZONE, "unreachable"), 0);
    // The new connection works (a test-driver reconnect is a fresh, empty host).
    create(&rig.hv, &rig.slots[0]).await.unwrap();
    assert_eq!(domains(&rig.hv, ZONE).await.len(), 1);
}

#[tokio::test]
async fn a_dead_host_never_blocks_or_hides_another() {
    let dir = tempfile::tempdir().unwrap();
    let good = Fixture::default().write(dir.path(), "good.xml").unwrap();
    let dead = fixture::uri(&dir.path().join("missing.xml"));
    let connections = vec![
        HostConnection {
            zone: "good".to_owned(),
            uri: good,
        },
        HostConnection {
            zone: "dead".to_owned(),
            uri: dead,
        },
    ];
    let mut all = slots("libvirt", "good", "kvm.small", 2);
    all.extend(slots("libvirt", "dead", "kvm.small", 2));
    let metrics = LibvirtMetrics::unexposed();
    let started = Stopwatch::start();
    let config = config("libvirt", connections, all.clone(), "base.qcow2");
    let hv = LibvirtHypervisor::connect(config, SystemClock, &TokioSpawner, metrics.clone()).await;
    assert!(
        started.seconds() < 5.0,
        "start-up does not wait on the dead host"
    );
    assert_eq!(hv.health("dead"), Some(Health::Unreachable));
    assert_eq!(health_gauge(&metrics, "dead", "unreachable"), 1);
    let described = hv.describe().await.unwrap();
    assert!(
        described.iter().all(|m| m.zone == "good"),
        "dead host's slots withheld"
    );
    assert_eq!(described.len(), 2);
    create(&hv, &all[0]).await.unwrap();
    let error = create(&hv, &all[2]).await.unwrap_err();
    assert!(error.message.contains("\"dead\" is"), "{}", error.message);
    assert!(started.seconds() < 5.0);
}
