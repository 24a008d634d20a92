//! A machine given a passthrough device that is not there (docs/placement.md): the tier
//! plants, in zone a only, a PCI device with no hardware behind it — an A100's ids at
//! `$BIGFLEET_QEMU_PHANTOM_PCI`, in an IOMMU group, on no driver (scripts/qemu-tier/zones.sh)
//! — which the zone's libvirtd lists through its node-device API like any other. `doctor`
//! and the provider discover it; the provider offers a GPU slot, claims the device for a
//! Create and defines the domain with its `<hostdev>`; libvirt refuses to start it. The
//! Create must fail with libvirt's reason and the device it was given on one line, give the
//! device back (the next slot is offered, the `devices_a100` series reads 0 held), leave no
//! domain and no volume, and a restarted provider must find no claim either.

use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;

use super::{BOOT, Libvirt, Tier};
use crate::harness::scrape::{Scrape, scrape_within};
use crate::harness::*;

/// How long a series set by describe may take: the next reconcile (every second here) of a
/// real host, on a machine that may be busy.
const DESCRIBED: Duration = Duration::from_secs(60);

/// The `devices_a100` capacity series of zone `local`: (allocatable, committed).
fn devices(scrape: &Scrape) -> (f64, f64) {
    let of = |of: &str| {
        scrape.value(
            "bigfleet_libvirt_host_capacity",
            &[("zone", "local"), ("resource", "devices_a100"), ("of", of)],
        )
    };
    (
        of("allocatable").unwrap_or(-1.0),
        of("committed").unwrap_or(-1.0),
    )
}

/// The slots List offers, once it offers `n`.
async fn offered(c: &mut Client, n: usize) -> Vec<pb::Machine> {
    let start = Instant::now();
    loop {
        let speculative = list(c, &[S::Speculative], 0, b"").await.machines;
        if speculative.len() == n {
            return speculative;
        }
        assert!(
            start.elapsed() < DESCRIBED,
            "List offers {} GPU slots, not {n}: {speculative:?}",
            speculative.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates `id` and waits for it to fail; checks the failure says what it must: libvirt
/// refused the start, the device it was given, how to check the host; one bounded line.
async fn create_fails_naming(c: &mut Client, id: &str, device: &str) {
    let start = Instant::now();
    let accepted = create(c, id, None).await;
    let (failed, took) = settle(c, id, accepted, S::Failed, BOOT, start).await;
    let error = &failed.last_error;
    println!(
        "{id}: Create → Failed in {took:.2?}; last_error ({} bytes): {error}",
        error.len()
    );
    assert!(error.contains("start domain"), "{error}");
    assert!(
        error.contains(device),
        "names the device it was given: {error}"
    );
    assert!(
        error.contains("doctor"),
        "says how to check the host: {error}"
    );
    assert!(!error.contains('\n'), "one line: {error}");
    assert!(error.len() < 2048, "bounded: {} bytes", error.len());
}

/// The tier provider's flags with three slots of a type asking for one device of class
/// `a100` (the phantom's ids), a state file so a restart keeps what it knew, and a reconcile
/// every second (a describe counts the devices and withholds slots that cannot be placed).
fn gpu_flags(tier: &Tier, dir: &std::path::Path) -> Vec<String> {
    let mut args = tier.flags(dir, "e2ephantom", "qemu");
    std::fs::write(
        dir.join("instance-types.json"),
        r#"{ "e2e.tiny": { "vcpu": 1, "memory_mib": 384, "devices": { "a100": 1 } } }"#,
    )
    .unwrap();
    let classes = dir.join("device-classes.json");
    std::fs::write(
        &classes,
        r#"{ "a100": { "resource": "nvidia.com/gpu",
             "pci": { "vendor": "10de", "product": "20b0" } } }"#,
    )
    .unwrap();
    args.push(format!("--device-classes={}", classes.display()));
    std::fs::write(
        dir.join("offerings.json"),
        r#"[{ "instance_type": "e2e.tiny", "zone": "local",
             "capacity_type": "on_demand", "count": 3 }]"#,
    )
    .unwrap();
    args.push(format!("--state={}", dir.join("state.redb").display()));
    args.push("--reconcile-interval=1s".to_owned());
    args
}

/// `doctor` reads the device through the same node-device API, usable: in an IOMMU group,
/// on no host driver; one machine's worth, not every slot's.
fn doctor_sees(args: &[String], phantom: &str) {
    let (_, report) = super::doctor::doctor(args);
    let line = super::doctor::check(&report, "devices");
    let detail = line["detail"].as_str().unwrap_or_default();
    assert_eq!(line["status"], "warn", "{line}");
    assert!(
        detail.contains(&format!("1 usable ({phantom}), 0 held by domains, 1 free")),
        "{line}"
    );
    assert!(
        detail.contains("one machine needs 1, every slot 3"),
        "{line}"
    );
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn a_device_that_is_not_there_fails_the_start_and_is_given_back() {
    let _wall = crate::qemu_image::WallTime::start("qemu_e2e::passthrough");
    let tier = Tier::from_env();
    let phantom = std::env::var("BIGFLEET_QEMU_PHANTOM_PCI")
        .expect("BIGFLEET_QEMU_PHANTOM_PCI (eval \"$(scripts/qemu-tier/run.sh env)\")");
    let dir = tempfile::tempdir().unwrap();
    let args = gpu_flags(&tier, dir.path());

    doctor_sees(&args, &phantom);

    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start(&args);
    let mut c = server.client().await;
    let metrics = server.metrics_addr.expect("a metrics address");

    // Discovered and offered: one device, so one of the three slots is offered (a slot is
    // offered only while its host has the devices free), advertising the GPU.
    let first = offered(&mut c, 1).await.remove(0);
    let gpu = (first.allocatable.as_ref()).and_then(|a| a.resources.get("nvidia.com/gpu"));
    assert_eq!(gpu.map(String::as_str), Some("1"), "{first:?}");
    let free = |s: &Scrape| devices(s) == (1.0, 0.0);
    scrape_within(
        metrics,
        "the phantom counted usable and free",
        DESCRIBED,
        free,
    )
    .await;

    let virt = Libvirt::open(Tier::from_env());
    let domains = || -> Vec<String> {
        let all = virt
            .conn
            .list_all_domains(0)
            .expect("list the zone's domains");
        let mut names: Vec<String> = all.iter().filter_map(|d| d.name().ok()).collect();
        names.sort();
        names
    };
    let (volumes_before, domains_before) = (virt.volumes(), domains());
    create_fails_naming(&mut c, &first.id, &phantom).await;

    // Given back: nothing of the attempt on the host, the device free (a describe counts
    // none held), another slot offered, and its Create is given the same device (a claim
    // kept would withhold every slot and refuse it: "needs 1 devices of class \"a100\" but
    // 0 ... are free").
    assert_eq!(
        virt.volumes(),
        volumes_before,
        "the attempt was rolled back"
    );
    assert_eq!(domains(), domains_before, "the domain was undefined");
    scrape_within(metrics, "the device given back", DESCRIBED, free).await;
    let second = offered(&mut c, 1).await.remove(0);
    assert_ne!(second.id, first.id, "the failed machine stays Failed");
    create_fails_naming(&mut c, &second.id, &phantom).await;

    // A restart on the same state finds no claim: the device free, the last slot offered.
    drop(c);
    drop(server);
    let server = Server::start(&args);
    let mut c = server.client().await;
    let metrics = server.metrics_addr.expect("a metrics address");
    scrape_within(metrics, "no claim after a restart", DESCRIBED, free).await;
    for id in [&first.id, &second.id] {
        let kept = get(&mut c, id).await.expect("the failed machine is kept");
        assert_eq!(state(&kept), S::Failed, "{kept:?}");
    }
    let third = offered(&mut c, 1).await.remove(0);
    assert!(third.id != first.id && third.id != second.id, "{third:?}");
    assert_eq!(virt.volumes(), volumes_before);
    assert_eq!(domains(), domains_before);
}
