//! A guest that stops by itself right after it started (here: the initramfs's first process is
//! `poweroff -f`, so the kernel powers the machine off as soon as it has booted). Whichever
//! call meets the stopped domain says so in `last_error`: its state and libvirt's reason, and
//! where the QEMU log is, and the last lines of the guest's serial console (the kernel's own
//! words, read back through libvirt from the console log), which are on the machine's
//! timeline too. Before, Configure kept pinging an agent that could never answer until its
//! deadline (minutes), and then reported only a timeout.

use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;

use super::{BOOT, Libvirt, Tier, domain_name};
use crate::harness::*;

/// Waits until the machine leaves Creating (or Configuring): Idle or Failed.
async fn settled(c: &mut Client, id: &str, within: Duration) -> pb::Machine {
    let start = Instant::now();
    loop {
        let m = get(c, id).await.expect("Get");
        if matches!(state(&m), S::Idle | S::Failed | S::Configured) {
            return m;
        }
        assert!(
            start.elapsed() < within,
            "{id} still in transition after {within:?}: {m:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `last_error` names the stopped state with libvirt's reason beside it, and the QEMU log, on
/// one line. The state is `shutoff` (reason `shutdown`: the guest powered itself off), or,
/// when the call looked while QEMU was still powering the guest off, `shutdown` (being shut
/// down, reason `unknown`): a loaded machine stretches that moment, and both say the guest
/// stopped by itself. A running or paused state here would be wrong.
fn assert_explains_stop(error: &str) {
    println!("last_error ({} bytes): {error}", error.len());
    let named = [
        "(shutoff: shutdown)",
        "(now shutoff: shutdown)",
        "state shutoff, reason shutdown",
        "(shutdown: ",
        "(now shutdown: ",
        "state shutdown, reason ",
    ];
    assert!(
        named.iter().any(|form| error.contains(form)),
        "the stopped state and libvirt's reason are named: {error}"
    );
    assert!(
        error.contains("/var/log/libvirt/qemu/"),
        "where to look: {error}"
    );
    assert!(!error.contains('\n'), "one line: {error}");
    // The kernel's lines carry its timestamps (`[    1.234567] ...`, spaces collapsed).
    assert!(
        error.contains("the guest's console ended with: ["),
        "the guest's console: {error}"
    );
}

/// The newest `console` event on `id`'s timeline: the kernel's last lines too.
async fn assert_console_on_timeline(server: &Server, id: &str) {
    let metrics = server.metrics_addr.expect("the tier serves --metrics-addr");
    let events = timeline_events(metrics, id).await;
    let console = (events.iter().rev())
        .find(|e| e["event"] == "console")
        .and_then(|e| e["console"].as_str())
        .unwrap_or_else(|| panic!("no console event on the timeline: {events:?}"));
    println!("the timeline's console event: {console}");
    assert!(console.contains('['), "the kernel's lines: {console}");
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn a_guest_that_stops_after_start_fails_with_its_state() {
    let base = Tier::from_env();
    let tier = Tier {
        cmdline: format!("{} rdinit=/sbin/poweroff -- -f", base.cmdline),
        ..base
    };
    let dir = tempfile::tempdir().unwrap();
    let server = tier.provider(dir.path(), "e2estop");
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let virt = Libvirt::open(tier);
    let volumes_before = virt.volumes();

    create(&mut c, &id, None).await.expect("Create accepted");
    let created = settled(&mut c, &id, BOOT).await;
    let name = domain_name(&created);
    if state(&created) == S::Failed {
        // The guest was already off when Create checked it: the attempt is rolled back.
        println!("the Create saw the stop");
        assert_explains_stop(&created.last_error);
        assert_console_on_timeline(&server, &id).await;
        assert_eq!(
            virt.volumes(),
            volumes_before,
            "the attempt was rolled back"
        );
    } else {
        assert_eq!(state(&created), S::Idle, "{created:?}");
        // Configure powers the domain on again; the guest powers itself off again.
        let sent = Instant::now();
        configure(&mut c, &id, "stop-e2e", &[], None)
            .await
            .expect("Configure accepted");
        let failed = settled(&mut c, &id, BOOT).await;
        println!(
            "the Configure saw the stop, {:?} after it was sent",
            sent.elapsed()
        );
        assert_eq!(state(&failed), S::Failed, "{failed:?}");
        assert_explains_stop(&failed.last_error);
        assert!(failed.last_error.contains(&name), "{}", failed.last_error);
        assert_console_on_timeline(&server, &id).await;

        // Failed keeps its domain for the operator; clean up by hand as one would.
        let domain = virt
            .domain(&name)
            .expect("a Failed machine keeps its domain");
        assert!(!domain.is_active().unwrap(), "the domain is off");
        domain.undefine().expect("undefine");
        let pool = virt.pool();
        for volume in virt.volumes() {
            if !volumes_before.contains(&volume) {
                let vol = pool.lookup_storage_vol_by_name(&volume).unwrap();
                vol.delete(0)
                    .expect("delete a volume of the failed machine");
            }
        }
        assert_eq!(virt.volumes(), volumes_before);
    }
}
