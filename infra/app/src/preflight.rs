//! The `doctor` run: from a resolved [`Plan`] (the same flags serving would use) to the
//! [`Report`], probing every `--connect` host at once off the async runtime.
//!
//! A host that does not answer within the probe timeout is reported as a blocked
//! connection rather than holding the whole preflight (and a Helm hook Job) hostage. Its
//! probe thread still runs to the end, so a trial domain it started is still destroyed
//! (and libvirt auto-destroys it when the connection closes in any case).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bigfleet_libvirt_ports::Clock;

use crate::launch::Plan;
use bigfleet_libvirt_libvirt::doctor::{self, Expectations, HostFacts, Probe, Report, Slots};
use bigfleet_libvirt_libvirt::trial::{self, TrialPlan};
use bigfleet_libvirt_libvirt::{ProbeTarget, probe};

/// What the flags would run, in the terms the judgement uses.
#[must_use]
pub fn expectations(plan: &Plan) -> Expectations {
    let settings = &plan.libvirt;
    let mut per_zone: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for connection in &plan.connections {
        per_zone.entry(connection.zone.clone()).or_default();
    }
    for machine in &plan.inventory.machines {
        *per_zone
            .entry(machine.zone.clone())
            .or_default()
            .entry(machine.instance_type.clone())
            .or_insert(0) += 1;
    }
    let slots = per_zone
        .into_iter()
        .map(|(zone, types)| {
            let slots = types
                .into_iter()
                .map(|(instance_type, count)| {
                    let shape = plan.catalog.get(&instance_type);
                    Slots {
                        count,
                        vcpu: shape.map_or(0, |s| u64::from(s.vcpu)),
                        memory_mib: shape.map_or(0, |s| s.memory_mib),
                        disks: shape.map(|s| s.disks.clone()).unwrap_or_default(),
                        placement: shape.map(|s| s.placement).unwrap_or_default(),
                        devices: shape.map(|s| s.devices.clone()).unwrap_or_default(),
                        tpm: shape.is_some_and(|s| s.tpm),
                        secure_boot: shape.is_some_and(|s| s.secure_boot),
                        instance_type,
                    }
                })
                .collect();
            (zone, slots)
        })
        .collect();
    let user_data = settings.base_user_data.as_ref().map(|path| {
        let read = std::fs::read(path)
            .map(|b| b.len())
            .map_err(|e| e.to_string());
        (path.display().to_string(), read)
    });
    Expectations {
        image: settings.image.clone(),
        image_source: settings.image_source.clone(),
        storage_pool: settings.storage_pool.clone(),
        seed_pool: settings.seed_pool().to_owned(),
        network: settings.network.clone(),
        domain_type: settings.platform.domain_type.as_str().to_owned(),
        user_data,
        capacity: settings.capacity.clone(),
        slots,
        budget: settings.budget,
        connections: settings.connections,
        max_client_requests: settings.max_client_requests,
        classes: plan.catalog.device_classes().clone(),
        ignition: settings.ignition.as_ref().map(|setup| setup.delivery),
    }
}

/// How long a trial domain is left running paused before it is read back and destroyed.
const TRIAL_SETTLE: Duration = Duration::from_secs(1);

/// `--trial-domain`: every distinct CPU choice the served instance types would use.
#[must_use]
pub fn trial_plan(plan: &Plan) -> TrialPlan {
    let types: BTreeSet<&str> = (plan.inventory.machines.iter())
        .map(|m| m.instance_type.as_str())
        .collect();
    TrialPlan {
        choices: trial::choices(&plan.libvirt, types),
        platform: plan.libvirt.platform.clone(),
        settle: TRIAL_SETTLE,
    }
}

/// A doctor run's report, and whether every host's probe returned (none was left behind
/// at its timeout, its thread still inside libvirt).
#[derive(Debug)]
pub struct Probed {
    /// The judgement.
    pub report: Report,
    /// Every probe returned before its timeout.
    pub all_returned: bool,
}

/// Probes every host of `plan` (at most `timeout` each, all at once) and judges them;
/// with `trial_domain`, each host also starts and destroys one paused domain per CPU
/// choice ([`trial_plan`]).
pub async fn run<C: Clock>(
    plan: &Plan,
    clock: &C,
    timeout: Duration,
    trial_domain: bool,
) -> Probed {
    let want = expectations(plan);
    let target = ProbeTarget {
        provider: plan.provider_label.clone(),
        storage_pool: want.storage_pool.clone(),
        seed_pool: want.seed_pool.clone(),
        image: want.image.clone(),
        network: want.network.clone(),
        domain_type: want.domain_type.clone(),
        machine_ids: plan
            .inventory
            .machines
            .iter()
            .map(|m| m.id.to_string())
            .collect::<BTreeSet<_>>(),
        trial: trial_domain.then(|| trial_plan(plan)),
        placement: plan.libvirt.places(&plan.catalog),
        devices: plan.catalog.asks_devices(),
    };
    let probes = plan.connections.iter().map(|connection| {
        let (zone, uri, target) = (
            connection.zone.clone(),
            connection.uri.clone(),
            target.clone(),
        );
        let deadline = clock.now().saturating_add(timeout);
        let sleep = clock.sleep_until(deadline);
        async move {
            let (z, u) = (zone.clone(), uri.clone());
            let work = tokio::task::spawn_blocking(move || probe(&z, &u, &target));
            let timed_out = |why: String| HostFacts {
                zone: zone.clone(),
                uri: uri.clone(),
                connection: Err(why),
                domain_caps: Probe::Unsupported(String::new()),
                pool: Probe::Unsupported(String::new()),
                seed_pool: None,
                image: Probe::Unsupported(String::new()),
                network: None,
                domains: Probe::Unsupported(String::new()),
                cpu_trials: None,
                max_workers: Probe::Unsupported(String::new()),
                max_client_requests: Probe::Unsupported(String::new()),
                topology: None,
                held_devices: None,
            };
            futures::select_biased! {
                done = futures::FutureExt::fuse(work) => (done.unwrap_or_else(|e| {
                    timed_out(format!("the probe failed: {e}"))
                }), true),
                () = futures::FutureExt::fuse(sleep) => (timed_out(format!(
                    "no answer within {}s",
                    timeout.as_secs()
                )), false),
            }
        }
    });
    let probed = futures::future::join_all(probes).await;
    let all_returned = probed.iter().all(|(_, returned)| *returned);
    let hosts: Vec<HostFacts> = probed.into_iter().map(|(facts, _)| facts).collect();
    Probed {
        report: doctor::judge(&want, &hosts),
        all_returned,
    }
}
