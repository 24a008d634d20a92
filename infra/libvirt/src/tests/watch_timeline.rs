//! The drift watch's findings on the machine's timeline, against a test-driver host: a
//! domain destroyed behind the provider's back is a `stopped` drift event on that machine
//! only, and undefining it a `vanished` one.

use std::time::Duration;

use bigfleet_libvirt_observe::timeline::{Drift, What};
use bigfleet_libvirt_ports::Clock;
use bigfleet_libvirt_system::Stopwatch;

use super::*;
use bigfleet_libvirt_config::naming::domain_name;

fn drifts(metrics: &LibvirtMetrics, id: &str) -> Vec<Drift> {
    let events = metrics.timeline.events(id).expect("tracked");
    events
        .into_iter()
        .filter_map(|e| match e.what {
            What::Drift(drift) => Some(drift),
            _ => None,
        })
        .collect()
}

/// Waits (real time, generously) until `id`'s drift events are `want`.
async fn until(metrics: &LibvirtMetrics, id: &str, want: &[Drift]) {
    let start = Stopwatch::start();
    while drifts(metrics, id) != want {
        assert!(
            start.seconds() < 30.0,
            "drift events of {id}: {:?}, want {want:?}",
            drifts(metrics, id)
        );
        let clock = SystemClock;
        let next = clock.now().saturating_add(Duration::from_millis(20));
        clock.sleep_until(next).await;
    }
}

#[tokio::test]
async fn a_domain_changed_behind_the_providers_back_is_on_its_timeline() {
    let rig = rig_with(
        &Fixture::default(),
        slots("libvirt", ZONE, "kvm.small", 2),
        |config| config.hosts.watch_interval = Duration::from_millis(100),
    )
    .await;
    let timeline = &rig.metrics.timeline;
    timeline.use_clock(|| SystemClock.now());
    timeline.track(rig.slots.iter().map(|m| m.id.as_str()));
    let machine = create(&rig.hv, &rig.slots[0]).await.unwrap();
    let kept = create(&rig.hv, &rig.slots[1]).await.unwrap();

    let name = domain_name("libvirt", machine.id.as_str());
    let target = name.clone();
    on_host(&rig.hv, ZONE, move |s| {
        let domain = s.conn.lookup_domain_by_name(&target).unwrap();
        domain.destroy().unwrap();
    })
    .await;
    until(&rig.metrics, machine.id.as_str(), &[Drift::Stopped]).await;
    on_host(&rig.hv, ZONE, move |s| {
        s.conn
            .lookup_domain_by_name(&name)
            .unwrap()
            .undefine()
            .unwrap();
    })
    .await;
    let want = [Drift::Stopped, Drift::Vanished];
    until(&rig.metrics, machine.id.as_str(), &want).await;
    assert_eq!(
        drifts(&rig.metrics, kept.id.as_str()),
        [],
        "the other machine"
    );
}
