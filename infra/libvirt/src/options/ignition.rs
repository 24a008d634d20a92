//! Ignition first boot (an instance type's `"boot": "ignition"`, docs/libvirt.md §5.14): the
//! operator's config template (`--ignition-template`), checked once at start-up, and the
//! config a machine's guest reads at its first boot ([`IgnitionSetup::config`]).
//!
//! The template is never edited. With a join blob the provider writes a small config of
//! the template's own spec version that asks Ignition to merge the template (as a `data:`
//! URL in `ignition.config.merge`) and adds one file, [`JOIN_PATH`] (mode 0600), holding the
//! blob; Ignition itself does the merge, so every field of every 3.x spec the guest's
//! Ignition knows works as the operator wrote it. Without a blob (a machine defined by
//! Create, or drained) the config is the template as it is.
//!
//! How the config reaches the guest is [`IgnitionDelivery`]: QEMU's firmware configuration
//! device (what Ignition's `qemu` platform reads: Flatcar's and Fedora CoreOS's QEMU images),
//! or, for hosts or images that cannot use it, an OpenStack config drive (Ignition's
//! `openstack` platform).

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

/// The flag that names the template.
pub const FLAG: &str = "--ignition-template";

/// The largest template accepted (a Kubernetes ConfigMap holds at most 1 MiB).
pub const MAX_TEMPLATE_BYTES: u64 = 1 << 20;

/// Where the join blob lands in the guest (root-only: mode 0600).
pub const JOIN_PATH: &str = "/etc/bigfleet/join";

/// The firmware configuration entry Ignition's `qemu` platform reads.
pub const FW_CFG_ENTRY: &str = "opt/com.coreos/config";

/// How a machine's Ignition config reaches its guest (`--ignition-delivery`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IgnitionDelivery {
    /// `fw-cfg` (the default): a file in the seed pool that QEMU hands the guest as the
    /// firmware configuration entry [`FW_CFG_ENTRY`] (libvirt's `<sysinfo type='fwcfg'>`,
    /// libvirt 6.5 or later). QEMU reads the file when the domain starts, so the provider
    /// writes the join blob out of it again right after the start.
    #[default]
    FwCfg,
    /// `config-drive`: an ISO 9660 volume labelled `config-2` with the config as
    /// `openstack/latest/user_data`, attached like the seed, for images whose Ignition runs
    /// on the `openstack` platform, or hosts whose libvirt predates `fwcfg`. The guest
    /// reads the disk while it boots, so the blob leaves it at Drain.
    ConfigDrive,
}

impl IgnitionDelivery {
    /// Reads `--ignition-delivery`.
    ///
    /// # Errors
    /// An unknown value, naming the accepted ones.
    pub fn parse(raw: &str) -> Result<Self, String> {
        match raw {
            "" | "fw-cfg" => Ok(Self::FwCfg),
            "config-drive" => Ok(Self::ConfigDrive),
            other => Err(format!(
                "--ignition-delivery {other:?} is not a delivery; use fw-cfg (QEMU's firmware \
                 configuration entry {FW_CFG_ENTRY}, Ignition's qemu platform) or config-drive \
                 (an OpenStack config drive, Ignition's openstack platform)"
            )),
        }
    }

    /// The flag's spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FwCfg => "fw-cfg",
            Self::ConfigDrive => "config-drive",
        }
    }
}

/// The checked template and how its configs are delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IgnitionSetup {
    template: Arc<[u8]>,
    version: String,
    /// How the configs reach the guests.
    pub delivery: IgnitionDelivery,
}

impl IgnitionSetup {
    /// Checks the template `bytes` (read from `source`): a JSON object whose
    /// `ignition.version` is a 3.x spec version, that does not write [`JOIN_PATH`] itself.
    ///
    /// # Errors
    /// What is wrong, naming the file and the fix.
    pub fn parse(bytes: &[u8], source: &str, delivery: IgnitionDelivery) -> Result<Self, String> {
        let refuse = |problem: String| format!("{FLAG} {source}: {problem}");
        if bytes.len() as u64 > MAX_TEMPLATE_BYTES {
            return Err(refuse(format!(
                "is larger than {MAX_TEMPLATE_BYTES} bytes; fetch large parts from the config \
                 (ignition.config.merge or a file's contents.source) instead of inlining them"
            )));
        }
        let document: Value = serde_json::from_slice(bytes).map_err(|e| {
            refuse(format!(
                "is not JSON ({e}); write the Ignition config as JSON (Butane's output, for one)"
            ))
        })?;
        let version = (document.pointer("/ignition/version"))
            .and_then(Value::as_str)
            .ok_or_else(|| {
                refuse(
                    "has no ignition.version; an Ignition config starts with \
                     {\"ignition\": {\"version\": \"3.3.0\"}}"
                        .to_owned(),
                )
            })?;
        if !spec_3(version) {
            return Err(refuse(format!(
                "ignition.version is {version:?}; the provider writes Ignition spec 3 configs, \
                 so translate the template to a 3.x version (3.0.0 to 3.5.0)"
            )));
        }
        let files = (document.pointer("/storage/files"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten();
        if (files.filter_map(|f| f.get("path"))).any(|path| path == JOIN_PATH) {
            return Err(refuse(format!(
                "writes {JOIN_PATH} itself, where the provider puts the join blob; read the \
                 blob from that file instead of writing it"
            )));
        }
        Ok(Self {
            template: Arc::from(bytes),
            version: version.to_owned(),
            delivery,
        })
    }

    /// The template's spec version.
    #[must_use]
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The config a guest reads: the template as it is (`None`), or a config that merges it
    /// and writes `blob` to [`JOIN_PATH`].
    #[must_use]
    pub fn config(&self, blob: Option<&[u8]>) -> Vec<u8> {
        let Some(blob) = blob else {
            return self.template.to_vec();
        };
        let data = |bytes: &[u8]| format!("data:;base64,{}", STANDARD.encode(bytes));
        let config = json!({
            "ignition": {
                "version": self.version,
                "config": {"merge": [{"source": data(&self.template)}]},
            },
            "storage": {"files": [{
                "path": JOIN_PATH,
                "mode": 0o600,
                "overwrite": true,
                "contents": {"source": data(blob)},
            }]},
        });
        let mut bytes = config.to_string().into_bytes();
        bytes.push(b'\n');
        bytes
    }
}

/// Whether `version` is an Ignition spec 3 version (`3.N.M`, maybe `-experimental`).
fn spec_3(version: &str) -> bool {
    let plain = version.strip_suffix("-experimental").unwrap_or(version);
    let parts: Vec<&str> = plain.split('.').collect();
    parts.len() == 3
        && parts[0] == "3"
        && (parts[1..].iter()).all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATE: &str = r#"{"ignition": {"version": "3.3.0"},
        "systemd": {"units": [{"name": "join.service", "enabled": true}]}}"#;

    fn setup(text: &str) -> Result<IgnitionSetup, String> {
        IgnitionSetup::parse(text.as_bytes(), "t.ign", IgnitionDelivery::FwCfg)
    }

    /// The bytes of a `data:;base64,` URL.
    fn decoded(url: &Value) -> Vec<u8> {
        let text = url.as_str().unwrap();
        STANDARD
            .decode(text.strip_prefix("data:;base64,").unwrap())
            .unwrap()
    }

    #[test]
    fn the_config_merges_the_template_and_adds_the_blob_as_a_root_only_file() {
        let setup = setup(TEMPLATE).unwrap();
        assert_eq!(setup.version(), "3.3.0");
        let blob = b"join \x00\xff secret";
        let config: Value = serde_json::from_slice(&setup.config(Some(blob))).unwrap();
        assert_eq!(config["ignition"]["version"], "3.3.0");
        let merged = &config["ignition"]["config"]["merge"];
        assert_eq!(merged.as_array().unwrap().len(), 1);
        assert_eq!(decoded(&merged[0]["source"]), TEMPLATE.as_bytes());
        let file = &config["storage"]["files"][0];
        assert_eq!(file["path"], JOIN_PATH);
        assert_eq!(file["mode"], 384);
        assert_eq!(file["overwrite"], true);
        assert_eq!(decoded(&file["contents"]["source"]), blob);
        assert_eq!(config["storage"]["files"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn without_a_blob_the_config_is_the_template_itself() {
        let setup = setup(TEMPLATE).unwrap();
        assert_eq!(setup.config(None), TEMPLATE.as_bytes());
        let with = setup.config(Some(b"s3cret"));
        assert!(!String::from_utf8_lossy(&setup.config(None)).contains("czNjcmV0"));
        assert!(
            String::from_utf8_lossy(&with).contains("czNjcmV0"),
            "base64 of the blob"
        );
    }

    #[test]
    fn spec_3_versions_are_accepted() {
        for version in ["3.0.0", "3.3.0", "3.5.0", "3.4.0-experimental", "3.10.2"] {
            let text = format!(r#"{{"ignition": {{"version": "{version}"}}}}"#);
            assert_eq!(setup(&text).unwrap().version(), version);
        }
    }

    #[test]
    fn bad_templates_are_refused_naming_the_file_and_the_fix() {
        let cases = [
            ("{", "t.ign: is not JSON"),
            ("[]", "has no ignition.version"),
            (r#"{"ignition": {}}"#, "has no ignition.version"),
            (r#"{"ignition": {"version": 3}}"#, "has no ignition.version"),
            (
                r#"{"ignition": {"version": "2.3.0"}}"#,
                "ignition.version is \"2.3.0\"; the provider writes Ignition spec 3",
            ),
            (r#"{"ignition": {"version": "3.3"}}"#, "is \"3.3\""),
            (r#"{"ignition": {"version": "3.x.0"}}"#, "is \"3.x.0\""),
            (
                r#"{"ignition": {"version": "3.3.0"},
                    "storage": {"files": [{"path": "/etc/bigfleet/join"}]}}"#,
                "writes /etc/bigfleet/join itself",
            ),
        ];
        for (text, expected) in cases {
            let error = setup(text).unwrap_err();
            assert!(error.starts_with("--ignition-template t.ign: "), "{error}");
            assert!(error.contains(expected), "{text}: {error}");
        }
        let big = format!(
            r#"{{"ignition": {{"version": "3.3.0"}}, "pad": "{}"}}"#,
            "x".repeat(1 << 20)
        );
        assert!(
            setup(&big)
                .unwrap_err()
                .contains("is larger than 1048576 bytes")
        );
    }

    #[test]
    fn deliveries_parse_by_their_flag_spelling() {
        for delivery in [IgnitionDelivery::FwCfg, IgnitionDelivery::ConfigDrive] {
            assert_eq!(IgnitionDelivery::parse(delivery.as_str()), Ok(delivery));
        }
        assert_eq!(IgnitionDelivery::parse(""), Ok(IgnitionDelivery::FwCfg));
        let error = IgnitionDelivery::parse("iso").unwrap_err();
        assert!(
            error.contains("\"iso\" is not a delivery; use fw-cfg"),
            "{error}"
        );
    }
}
