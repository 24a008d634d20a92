//! `--ignition-template` and `--ignition-delivery`: the Ignition config of the instance
//! types that boot by Ignition (`"boot": "ignition"`, docs/libvirt.md §5.14), read and
//! checked at start-up. A type that boots by Ignition needs the template, and a template
//! no offered type uses is refused, so a typo in either place shows at once.

use bigfleet_libvirt_domain::Machine;
use bigfleet_libvirt_domain::catalog::{BootMode, InstanceCatalog};
use bigfleet_libvirt_libvirt::ignition::{FLAG, MAX_TEMPLATE_BYTES};
use bigfleet_libvirt_libvirt::{DomainConfig, IgnitionDelivery, IgnitionSetup};

use super::devices::read_limited;
use super::{Flags, LaunchError, flag};

/// Reads the template into `libvirt` when the offered types (`slots`' types) need it.
pub(super) fn setup(
    flags: &Flags,
    catalog: &InstanceCatalog,
    slots: &[Machine],
    libvirt: &mut DomainConfig,
) -> Result<(), LaunchError> {
    let booting = catalog.booting(BootMode::Ignition);
    let offered = (booting.iter()).find(|name| slots.iter().any(|m| m.instance_type == **name));
    let path = match (&flags.ignition_template, offered) {
        (None, None) if flags.ignition_delivery.is_empty() => return Ok(()),
        (None, None) => {
            return Err(flag(format!(
                "--ignition-delivery is set without {FLAG}; give the template too, or drop it"
            )));
        }
        (None, Some(name)) => {
            return Err(flag(format!(
                "instance type {name:?} boots by Ignition (\"boot\": \"ignition\") and no \
                 {FLAG} is given; give the Ignition config template its machines should get"
            )));
        }
        (Some(path), None) => {
            return Err(flag(format!(
                "{FLAG} {} is given and no offered instance type boots by Ignition; set \
                 \"boot\": \"ignition\" on the types that should, or drop the flag",
                path.display()
            )));
        }
        (Some(path), Some(_)) => path,
    };
    let delivery = IgnitionDelivery::parse(&flags.ignition_delivery).map_err(flag)?;
    let template = read_limited(
        FLAG,
        path,
        MAX_TEMPLATE_BYTES,
        "fetch large parts from the config (ignition.config.merge) instead of inlining them",
    )?;
    let source = path.display().to_string();
    libvirt.ignition = Some(IgnitionSetup::parse(&template, &source, delivery).map_err(flag)?);
    Ok(())
}
