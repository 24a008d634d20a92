//! The drift watch against a real (test-driver) host: a domain destroyed or undefined behind
//! the provider's back is reported between reconciles, a Delete is not drift, and the
//! machine's record is never touched.

use std::time::Duration;

use bigfleet_libvirt_ports::Clock;

use super::*;
use crate::metrics::DriftLabels;
use bigfleet_libvirt_config::naming::domain_name;
use bigfleet_libvirt_system::Stopwatch;

pub(super) async fn pause(ms: u64) {
    let clock = SystemClock;
    clock
        .sleep_until(clock.now().saturating_add(Duration::from_millis(ms)))
        .await;
}

pub(super) fn drift(metrics: &LibvirtMetrics, kind: &str) -> i64 {
    let labels = DriftLabels {
        zone: ZONE.to_owned(),
        kind: kind.to_owned(),
    };
    metrics.drift.get_or_create(&labels).get()
}

/// Waits (real time, generously) until the gauge of `kind` reads `want`.
pub(super) async fn until(metrics: &LibvirtMetrics, kind: &str, want: i64) {
    let start = Stopwatch::start();
    while drift(metrics, kind) != want {
        assert!(start.seconds() < 30.0, "drift {kind} never became {want}");
        pause(20).await;
    }
}

/// Destroys domain `name` behind the provider's back.
pub(super) async fn destroy_behind(rig: &Rig, name: &str) {
    let target = name.to_owned();
    on_host(&rig.hv, ZONE, move |s| {
        let domain = s.conn.lookup_domain_by_name(&target).unwrap();
        domain.destroy().unwrap();
    })
    .await;
}

async fn watched_rig() -> Rig {
    rig_with(
        &Fixture::default(),
        slots("libvirt", ZONE, "kvm.small", 3),
        |config| config.hosts.watch_interval = Duration::from_millis(100),
    )
    .await
}

#[tokio::test]
async fn destroyed_and_undefined_domains_are_reported_without_a_reconcile() {
    let rig = watched_rig().await;
    let machine = create(&rig.hv, &rig.slots[0]).await.unwrap();
    let kept = create(&rig.hv, &rig.slots[1]).await.unwrap();
    pause(400).await;
    assert_eq!(
        drift(&rig.metrics, "stopped"),
        0,
        "nothing is out of line yet"
    );
    assert_eq!(drift(&rig.metrics, "vanished"), 0);

    let name = domain_name("libvirt", machine.id.as_str());
    destroy_behind(&rig, &name).await;
    until(&rig.metrics, "stopped", 1).await;
    assert_eq!(drift(&rig.metrics, "vanished"), 0);

    on_host(&rig.hv, ZONE, move |s| {
        s.conn
            .lookup_domain_by_name(&name)
            .unwrap()
            .undefine()
            .unwrap();
    })
    .await;
    until(&rig.metrics, "vanished", 1).await;
    assert_eq!(drift(&rig.metrics, "stopped"), 0);

    // The vanished machine's Delete succeeds (and cleans up); then nothing is reported.
    delete(&rig.hv, &machine).await.unwrap();
    until(&rig.metrics, "vanished", 0).await;

    // A Delete through the provider is not drift, however the polls fall.
    delete(&rig.hv, &kept).await.unwrap();
    pause(400).await;
    assert_eq!(drift(&rig.metrics, "vanished"), 0);
    assert_eq!(drift(&rig.metrics, "stopped"), 0);
}

#[tokio::test]
async fn a_zero_interval_turns_the_watch_off() {
    let rig = rig_with(
        &Fixture::default(),
        slots("libvirt", ZONE, "kvm.small", 1),
        |_| {},
    )
    .await;
    let machine = create(&rig.hv, &rig.slots[0]).await.unwrap();
    let name = domain_name("libvirt", machine.id.as_str());
    on_host(&rig.hv, ZONE, move |s| {
        s.conn
            .lookup_domain_by_name(&name)
            .unwrap()
            .destroy()
            .unwrap();
    })
    .await;
    pause(400).await;
    assert_eq!(
        drift(&rig.metrics, "stopped"),
        0,
        "only a reconcile reports it"
    );
}
