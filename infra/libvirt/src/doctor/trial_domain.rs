//! `doctor --trial-domain`: whether QEMU starts at all with each CPU choice the flags would
//! use, tried on a throw-away domain before any Create meets the same failure.
//!
//! Some hosts accept a CPU mode on paper and abort on it at start: on nested KVM, QEMU 7.2
//! with `host-passthrough` or `host-model` dies with `failed to set MSR 0x10a` and a
//! `kvm_buf_set_msrs` assertion, while libvirt's domain capabilities still call both modes
//! supported. The only reliable test is to start QEMU, so this is the one part of `doctor`
//! that changes a host, and only behind the explicit `--trial-domain` flag.
//!
//! Each trial domain is transient (nothing is defined), has 128 MiB, one vCPU and no disk
//! or NIC, and uses the same domain type, machine, firmware and `<cpu>` element as the
//! production XML (`xml::cpu_element`, `xml::firmware_elements`). It is started paused
//! (`VIR_DOMAIN_START_PAUSED`: QEMU sets the vCPUs up, which is where a refused MSR aborts
//! it, before anything runs) and auto-destroyed (`VIR_DOMAIN_START_AUTODESTROY`: libvirt
//! kills it when doctor's connection closes, even if doctor itself dies), then resumed so
//! the vCPUs run for a short settle (in firmware that finds nothing to boot), read back
//! once, and destroyed whatever happened. Its name, `bigfleet-doctor-trial-<label hash>-<n>`,
//! can never be one of the provider's (`bigfleet-` and 24 hex digits), and it carries no
//! ownership tag, so ownership checks refuse it and orphan collection never sees it. The
//! name is the same on every run of one label: what libvirt keeps per domain name after a
//! transient domain is gone (its QEMU log, and with `--firmware efi` its NVRAM copy) is
//! reused, not piled up run after run. Two doctors of one label trying at the same moment
//! collide on the name, and the second says so (libvirt: the domain already exists).

use std::time::Duration;

use sha2::{Digest, Sha256};
use virt::connect::Connect;
use virt::domain::{Domain, DomainState};
use virt::error::{Error as VirtError, ErrorNumber};
use virt::sys;

use super::facts::CpuTrial;
use crate::host::error::{one_line, text};
use crate::options::DomainConfig;
use crate::render::devices::CpuChoice;
use crate::render::ownership::escape;
use crate::render::xml::{self, DomainType, Platform};

/// The longest libvirt message a trial quotes.
const MESSAGE_LIMIT: usize = 700;

/// Memory of a trial domain: enough for the firmware to initialise, nothing more.
const TRIAL_MEMORY_MIB: u64 = 128;

/// One CPU choice to try, and the instance types that would run with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrialCpu {
    /// The choice; `None` is the platform's default.
    pub cpu: Option<CpuChoice>,
    /// The instance types whose domains would get it.
    pub used_by: Vec<String>,
}

/// What `--trial-domain` tries on every host.
#[derive(Clone, Debug)]
pub struct TrialPlan {
    /// Every distinct CPU choice the flags would use.
    pub choices: Vec<TrialCpu>,
    /// Domain type, firmware and boot, as in production.
    pub platform: Platform,
    /// How long a started trial domain is left before it is read back.
    pub settle: Duration,
}

/// The distinct CPU choices the served `instance_types` would use, in first-use order.
#[must_use]
pub fn choices<'a>(
    options: &DomainConfig,
    instance_types: impl IntoIterator<Item = &'a str>,
) -> Vec<TrialCpu> {
    let mut out: Vec<TrialCpu> = Vec::new();
    for instance_type in instance_types {
        let cpu = options.cpu_for(instance_type).cloned();
        match out.iter_mut().find(|choice| choice.cpu == cpu) {
            Some(choice) if !choice.used_by.iter().any(|t| t == instance_type) => {
                choice.used_by.push(instance_type.to_owned());
            }
            Some(_) => {}
            None => out.push(TrialCpu {
                cpu,
                used_by: vec![instance_type.to_owned()],
            }),
        }
    }
    out
}

/// The CPU as an operator reads it: the flag spelling, or the default named as such.
#[must_use]
pub fn shown(cpu: Option<&CpuChoice>, domain_type: DomainType) -> String {
    match (cpu, domain_type) {
        (Some(cpu), _) => cpu.to_string(),
        (None, DomainType::Kvm) => "host-passthrough (the default)".to_owned(),
        (None, DomainType::Qemu) => "QEMU's default model (the default under qemu)".to_owned(),
    }
}

/// Tries every choice of `plan` on `conn` (blocking), one domain at a time.
#[must_use]
pub fn run(conn: &Connect, provider: &str, plan: &TrialPlan) -> Vec<CpuTrial> {
    let kind = plan.platform.domain_type;
    (plan.choices.iter().enumerate())
        .map(|(index, choice)| {
            let name = trial_name(provider, index);
            CpuTrial {
                cpu: shown(choice.cpu.as_ref(), kind),
                host_cpu: choice
                    .cpu
                    .as_ref()
                    .map_or(kind == DomainType::Kvm, |c| c.needs_kvm()),
                used_by: choice.used_by.clone(),
                outcome: attempt(conn, &name, choice.cpu.as_ref(), plan),
            }
        })
        .collect()
}

/// `bigfleet-doctor-trial-<8 hex of the label>-<index>`: the same on every run of one
/// label (so per-name leftovers are reused), different for every label.
fn trial_name(provider: &str, index: usize) -> String {
    let digest = Sha256::digest(provider.as_bytes());
    let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("bigfleet-doctor-trial-{hex}-{index}")
}

/// The trial domain's XML: production's type, machine, firmware and CPU; no devices.
pub(crate) fn trial_xml(name: &str, cpu: Option<&CpuChoice>, platform: &Platform) -> String {
    let kind = platform.domain_type.as_str();
    let name = escape(name);
    let (firmware, firmware_choice) = xml::firmware_elements(platform.firmware);
    let cpu = xml::cpu_element(cpu, platform.domain_type);
    format!(
        "<domain type='{kind}'>
  <name>{name}</name>
  <memory unit='MiB'>{TRIAL_MEMORY_MIB}</memory>
  <vcpu placement='static'>1</vcpu>
  <os{firmware}>
    <type arch='x86_64' machine='q35'>hvm</type>{firmware_choice}
  </os>
  <features><acpi/><apic/></features>{cpu}
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices><memballoon model='none'/></devices>
</domain>
"
    )
}

/// Destroys the trial domain when dropped: on success, on error and on a panic alike.
struct Destroy(Domain);

impl Drop for Destroy {
    fn drop(&mut self) {
        // A domain that already died is gone (transient); nothing else is left to undo.
        let _ = self.0.destroy();
    }
}

/// Starts one trial domain and reports whether it stayed up.
fn attempt(
    conn: &Connect,
    name: &str,
    cpu: Option<&CpuChoice>,
    plan: &TrialPlan,
) -> Result<String, String> {
    let document = trial_xml(name, cpu, &plan.platform);
    let flags = sys::VIR_DOMAIN_START_PAUSED | sys::VIR_DOMAIN_START_AUTODESTROY;
    let (domain, paused) = match conn.create_domain_xml(&document, flags) {
        Ok(domain) => (domain, true),
        // libvirt's test driver takes no start flags; a plain start is still destroyed below.
        Err(e) if unsupported_flags(&e) => (
            conn.create_domain_xml(&document, 0)
                .map_err(|e| refused(name, &e))?,
            false,
        ),
        Err(e) => return Err(refused(name, &e)),
    };
    let domain = Destroy(domain);
    // QEMU has set the vCPUs up; now let them run (into firmware that finds nothing to
    // boot), since some refusals only come with the first KVM_RUN.
    if paused {
        domain.0.resume().map_err(|e| {
            format!(
                "resume the trial domain {name}: {}",
                one_line(&text(&e), MESSAGE_LIMIT)
            )
        })?;
    }
    if !plan.settle.is_zero() {
        // A one-shot blocking probe thread: nothing else waits on it.
        std::thread::sleep(plan.settle);
    }
    match domain.0.state() {
        Ok((state, reason)) => match state.known() {
            Some(DomainState::Paused | DomainState::Running | DomainState::Blocked) => Ok(format!(
                "QEMU started the trial domain and it stayed up {}ms",
                plan.settle.as_millis()
            )),
            other => Err(format!(
                "QEMU started the trial domain {name} but it did not stay up (state {}, reason \
                 {reason}); its QEMU log on the host says why (/var/log/libvirt/qemu/{name}.log \
                 under qemu:///system)",
                other.map_or_else(|| "unknown".to_owned(), |s| format!("{s:?}").to_lowercase())
            )),
        },
        // A transient domain that died is gone: libvirt no longer knows it.
        Err(e) if e.code().is(ErrorNumber::NoDomain) => Err(format!(
            "QEMU started the trial domain {name} but it exited at once; its QEMU log on the \
             host says why (/var/log/libvirt/qemu/{name}.log under qemu:///system)"
        )),
        Err(e) => Err(format!(
            "read the trial domain's state: {}",
            one_line(&text(&e), MESSAGE_LIMIT)
        )),
    }
}

fn unsupported_flags(error: &VirtError) -> bool {
    error.code().is(ErrorNumber::InvalidArg) && error.message().contains("unsupported flags")
}

fn refused(name: &str, error: &VirtError) -> String {
    format!(
        "libvirt would not start the trial domain {name}: {}",
        one_line(&text(error), MESSAGE_LIMIT)
    )
}

#[cfg(test)]
#[path = "trial_domain_tests.rs"]
mod tests;
