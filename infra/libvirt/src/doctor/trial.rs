//! The `cpu trial` checks: one line per CPU choice tried on a throw-away paused domain
//! (`doctor --trial-domain`), or one line saying the trial was not asked for.

use super::facts::CpuTrial;
use super::report::{Check, Status, check};

/// The `cpu trial` lines of one host.
pub(super) fn cpu_trials(zone: &str, trials: Option<&[CpuTrial]>) -> Vec<Check> {
    let Some(trials) = trials else {
        return vec![check(
            zone,
            "cpu trial",
            Status::Skip,
            "not tried: doctor changes nothing without --trial-domain; pass it to start one \
             throw-away paused domain per CPU choice and see whether QEMU stays up"
                .to_owned(),
            "",
        )];
    };
    trials.iter().map(|trial| one(zone, trial)).collect()
}

fn one(zone: &str, trial: &CpuTrial) -> Check {
    let users = trial.used_by.join(", ");
    match &trial.outcome {
        Ok(seen) => check(
            zone,
            "cpu trial",
            Status::Ok,
            format!("{} (for {users}): {seen}", trial.cpu),
            "",
        ),
        Err(why) => {
            let fix = if trial.host_cpu {
                format!(
                    "{} cannot start on this host (host-passthrough and host-model abort this \
                     way on nested KVM: 'failed to set MSR'): pass --cpu, or --instance-cpu \
                     TYPE:CPU for {users}, with a named model the host runs (one that virsh \
                     domcapabilities --virttype kvm lists as usable; qemu64 needs -svm on \
                     Intel hosts), then run doctor --trial-domain again",
                    trial.cpu
                )
            } else {
                format!(
                    "pass --cpu, or --instance-cpu TYPE:CPU for {users}, with a model and \
                     features this host runs (virsh domcapabilities lists the usable models; \
                     name each feature once), then run doctor --trial-domain again"
                )
            };
            check(
                zone,
                "cpu trial",
                Status::Block,
                format!("{} (for {users}): {why}", trial.cpu),
                &fix,
            )
        }
    }
}
