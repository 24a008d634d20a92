//! A guest that boots but whose agent never answers (the tier's init with
//! `bigfleet.agent=off`), under a 20 s `--transition-timeout`: Configure stops waiting a
//! little before its deadline (18 s) and fails with the reason and the last lines of the
//! guest's console (the init's own words), in `last_error` and on the machine's timeline.
//! Before, the deadline dropped the wait and `last_error` said only that time ran out.

use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;

use super::{BOOT, Libvirt, Tier, domain_name};
use crate::harness::*;

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn a_silent_agent_fails_configure_before_its_deadline_with_the_console() {
    let base = Tier::from_env();
    let tier = Tier {
        cmdline: format!("{} bigfleet.agent=off", base.cmdline),
        ..base
    };
    let dir = tempfile::tempdir().unwrap();
    let mut args = tier.flags(dir.path(), "e2esilent", "qemu");
    args.push("--transition-timeout=20s".to_owned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start(&args);
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let virt = Libvirt::open(tier);

    let accepted = create(&mut c, &id, None).await;
    let (idle, _) = settle(&mut c, &id, accepted, S::Idle, BOOT, Instant::now()).await;
    let name = domain_name(&idle);
    let sent = Instant::now();
    configure(&mut c, &id, "silent-e2e", &[], None)
        .await
        .expect("Configure accepted");
    let failed = loop {
        let m = get(&mut c, &id).await.expect("Get");
        if state(&m) != S::Configuring {
            break m;
        }
        assert!(sent.elapsed() < Duration::from_secs(60), "{m:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = sent.elapsed();
    let error = &failed.last_error;
    println!("Configure failed {took:.1?} after it was sent: {error}");
    assert_eq!(state(&failed), S::Failed, "{failed:?}");
    assert!(
        error.contains("the qemu guest agent did not answer for 1"),
        "the wait's own reason, not the deadline's: {error}"
    );
    assert!(
        error.contains("the guest's console ended with:") && error.contains("bigfleet-init"),
        "the guest's console: {error}"
    );
    let metrics = server.metrics_addr.expect("the tier serves --metrics-addr");
    let events = timeline_events(metrics, &id).await;
    assert!(
        (events.iter()).any(|e| e["event"] == "console"
            && e["console"]
                .as_str()
                .is_some_and(|t| t.contains("bigfleet-init"))),
        "the console on the timeline: {events:?}"
    );

    // Failed keeps its domain for the operator; clean up by hand as one would.
    let domain = virt
        .domain(&name)
        .expect("a Failed machine keeps its domain");
    if domain.is_active().unwrap() {
        domain.destroy().expect("destroy");
    }
    domain.undefine().expect("undefine");
    let pool = virt.pool();
    let own = |all: Vec<String>| -> Vec<String> {
        (all.into_iter())
            .filter(|v| v.starts_with(&format!("{name}-")))
            .collect()
    };
    for volume in own(virt.volumes()) {
        let vol = pool.lookup_storage_vol_by_name(&volume).unwrap();
        vol.delete(0)
            .expect("delete a volume of the failed machine");
    }
    assert_eq!(own(virt.volumes()), Vec::<String>::new());
}
