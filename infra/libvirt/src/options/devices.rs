//! The operator's choices for a domain's CPU and NICs (`--cpu`, `--nic` and their
//! per-instance-type forms), as plain values parsed from flag text and printed back the
//! same way. Their XML is `render::devices`'s.

use std::fmt;

/// Where a NIC plugs in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NicSource {
    /// A libvirt network (`network=NAME`): `<interface type='network'>`.
    Network(String),
    /// An existing host bridge (`bridge=NAME`): `<interface type='bridge'>`.
    Bridge(String),
    /// An existing Open vSwitch bridge (`ovs=NAME`): `<interface type='bridge'>` with
    /// `<virtualport type='openvswitch'/>`, which can carry a VLAN tag.
    Ovs(String),
    /// macvtap on a host device (`direct=DEV` or `direct=DEV:MODE`):
    /// `<interface type='direct'>`.
    Direct {
        /// The host's network device.
        device: String,
        /// The macvtap mode.
        mode: DirectMode,
    },
}

/// macvtap modes libvirt knows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DirectMode {
    /// Guests on the same device talk to each other through it (libvirt's default here).
    #[default]
    Bridge,
    /// Every frame goes to the external switch.
    Vepa,
    /// Guests cannot talk to each other.
    Private,
    /// The device is handed to one guest.
    Passthrough,
}

impl DirectMode {
    const ALL: [(Self, &'static str); 4] = [
        (Self::Bridge, "bridge"),
        (Self::Vepa, "vepa"),
        (Self::Private, "private"),
        (Self::Passthrough, "passthrough"),
    ];

    /// The name in the XML and on the command line.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bridge => "bridge",
            Self::Vepa => "vepa",
            Self::Private => "private",
            Self::Passthrough => "passthrough",
        }
    }
}

impl NicSource {
    /// Parses `network=NAME`, `bridge=NAME`, `ovs=NAME` or `direct=DEV[:MODE]`.
    ///
    /// # Errors
    /// What is wrong with `text`, and the accepted forms.
    pub fn parse(text: &str) -> Result<Self, String> {
        let forms = "network=NAME, bridge=NAME, ovs=NAME or \
                     direct=DEVICE[:bridge|vepa|private|passthrough]";
        let (kind, value) = text
            .split_once('=')
            .ok_or_else(|| format!("NIC {text:?} has no '=': use {forms}"))?;
        if value.is_empty() {
            return Err(format!("NIC {text:?} names no {kind}: use {forms}"));
        }
        match kind {
            "network" => Ok(Self::Network(value.to_owned())),
            "bridge" => Ok(Self::Bridge(value.to_owned())),
            "ovs" => Ok(Self::Ovs(value.to_owned())),
            "direct" => {
                let (device, mode) = match value.split_once(':') {
                    None => (value, DirectMode::default()),
                    Some((device, mode)) => {
                        let mode = DirectMode::ALL
                            .iter()
                            .find(|(_, name)| *name == mode)
                            .map(|(mode, _)| *mode)
                            .ok_or_else(|| {
                                format!("NIC {text:?}: unknown macvtap mode {mode:?}: use {forms}")
                            })?;
                        (device, mode)
                    }
                };
                if device.is_empty() {
                    return Err(format!("NIC {text:?} names no device: use {forms}"));
                }
                Ok(Self::Direct {
                    device: device.to_owned(),
                    mode,
                })
            }
            other => Err(format!(
                "NIC {text:?}: unknown source {other:?}: use {forms}"
            )),
        }
    }
}

impl fmt::Display for NicSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Network(name) => write!(f, "network={name}"),
            Self::Bridge(name) => write!(f, "bridge={name}"),
            Self::Ovs(name) => write!(f, "ovs={name}"),
            Self::Direct { device, mode } => write!(f, "direct={device}:{}", mode.as_str()),
        }
    }
}

/// The guest CPU (`--cpu`, `--instance-cpu`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuChoice {
    /// The mode or model.
    pub mode: CpuMode,
    /// Features switched on (`+name`) or off (`-name`), in the order given.
    pub features: Vec<(bool, String)>,
}

/// How the guest CPU is chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CpuMode {
    /// The host CPU exactly, every feature it has (KVM only).
    HostPassthrough,
    /// The named model closest to the host CPU, as libvirt computes it (KVM only).
    HostModel,
    /// A named model QEMU knows (`virsh cpu-models x86_64`), exactly.
    Custom(String),
}

impl CpuChoice {
    /// Parses `host-passthrough`, `host-model` or a model name, each optionally followed by
    /// `,+feature` / `,-feature` items.
    ///
    /// # Errors
    /// What is wrong with `text`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut items = text.split(',');
        let head = items.next().unwrap_or_default();
        let mode = match head {
            "" => {
                return Err(format!(
                    "CPU {text:?} names no mode: use host-passthrough, host-model or a model \
                     name (virsh cpu-models x86_64), optionally with ,+feature or ,-feature"
                ));
            }
            "host-passthrough" => CpuMode::HostPassthrough,
            "host-model" => CpuMode::HostModel,
            model => CpuMode::Custom(model.to_owned()),
        };
        let features = items
            .map(|item| match item.split_at_checked(1) {
                Some(("+", name)) if !name.is_empty() => Ok((true, name.to_owned())),
                Some(("-", name)) if !name.is_empty() => Ok((false, name.to_owned())),
                _ => Err(format!(
                    "CPU {text:?}: feature {item:?} must be +name (require) or -name (disable)"
                )),
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { mode, features })
    }

    /// Whether the mode needs hardware virtualisation (no TCG equivalent).
    #[must_use]
    pub fn needs_kvm(&self) -> bool {
        matches!(self.mode, CpuMode::HostPassthrough | CpuMode::HostModel)
    }
}

impl fmt::Display for CpuChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.mode {
            CpuMode::HostPassthrough => f.write_str("host-passthrough")?,
            CpuMode::HostModel => f.write_str("host-model")?,
            CpuMode::Custom(model) => f.write_str(model)?,
        }
        for (on, name) in &self.features {
            write!(f, ",{}{name}", if *on { '+' } else { '-' })?;
        }
        Ok(())
    }
}
