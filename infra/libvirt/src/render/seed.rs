//! The cloud-init NoCloud seed: an ISO 9660 image labelled `cidata` holding `user-data` and
//! `meta-data`, built in memory and uploaded into the seed volume; and the config drive an
//! Ignition config may travel on ([`config_drive`]).
//!
//! The image is written by `hadris-iso` (pure Rust, no external `genisoimage`), with Rock
//! Ridge and Joliet names like `cloud-localds` produces, so the Linux isofs driver and
//! cloud-init see the exact file names. The `instance-id` is the domain name followed by the
//! Create's operation id: unlike the reference's machine id it contains no `/`, which
//! cloud-init uses as a directory name, and each incarnation of a slot gets its own, so a
//! re-created slot runs its user-data again even if the image kept cloud-init's state from an
//! earlier life (a retry of the same Create keeps the same one).
//! The per-cluster bootstrap blob is never put on the seed; it travels through the guest
//! agent at Configure.
//!
//! A machine a static address pool serves gets a third file, `network-config` (version 2,
//! [`network_config`]): its first NIC, matched by the MAC the provider derived, gets the
//! fixed address, the pool's default route and DNS; its other NICs keep DHCP. Without it
//! cloud-init's own fallback (DHCP on the first NIC) applies, as before. The document is
//! JSON, which every YAML parser reads (cloud-init's included), so that no value needs
//! YAML quoting rules.

use std::io::Cursor;
use std::sync::Arc;

use hadris_iso::joliet::JolietLevel;
use hadris_iso::read::PathSeparator;
use hadris_iso::rrip::RripOptions;
use hadris_iso::write::options::{BaseIsoLevel, CreationFeatures, IsoFormatOptions};
use hadris_iso::write::{File as IsoFile, InputFiles, IsoImageWriter};
use serde_json::{Map, Value, json};

use crate::options::{DomainConfig, IgnitionDelivery, StaticAddress};
use crate::render::devices::Nic;

/// The user-data used when no `--base-user-data` file is given.
pub const DEFAULT_USER_DATA: &[u8] = b"#cloud-config\n{}\n";

/// The volume label cloud-init's NoCloud datasource looks for.
pub const LABEL: &str = "cidata";

/// The NoCloud `instance-id` of one incarnation of a domain: its name and the operation id
/// of the Create that made it.
#[must_use]
pub fn instance_id(domain_name: &str, operation_id: &str) -> String {
    format!("{domain_name}-{operation_id}")
}

/// The `meta-data` document for a domain.
#[must_use]
pub fn meta_data(domain_name: &str, instance_id: &str) -> String {
    format!("instance-id: {instance_id}\nlocal-hostname: {domain_name}\n")
}

/// The `network-config` of a domain whose first NIC (of `nics`) has the fixed `address`:
/// that NIC gets the address, a default route through the pool's gateway and its DNS; every
/// other NIC keeps DHCP. Each is matched by its MAC.
#[must_use]
pub fn network_config(nics: &[Nic], address: &StaticAddress) -> String {
    let subnet = &address.subnet;
    let mut ethernets = Map::new();
    for (index, nic) in nics.iter().enumerate() {
        let matched = json!({ "macaddress": nic.mac.to_string() });
        let entry = if index == 0 {
            let mut first = Map::new();
            first.insert("match".to_owned(), matched);
            first.insert("addresses".to_owned(), json!([address.with_prefix()]));
            if let Some(gateway) = subnet.gateway {
                let route = json!({ "to": "0.0.0.0/0", "via": gateway.to_string() });
                first.insert("routes".to_owned(), json!([route]));
            }
            if !subnet.dns.is_empty() || !subnet.search.is_empty() {
                let servers: Vec<String> = subnet.dns.iter().map(ToString::to_string).collect();
                let names = json!({ "addresses": servers, "search": subnet.search });
                first.insert("nameservers".to_owned(), names);
            }
            Value::Object(first)
        } else {
            json!({ "match": matched, "dhcp4": true })
        };
        ethernets.insert(format!("nic{index}"), entry);
    }
    let document = json!({ "version": 2, "ethernets": ethernets });
    format!("{document:#}\n")
}

/// Builds the seed ISO for `domain_name` (this incarnation: `instance_id`) with `user_data`
/// verbatim and, when given, a `network_config`.
///
/// # Errors
/// The writer's error, as text.
pub fn build(
    domain_name: &str,
    instance_id: &str,
    user_data: &[u8],
    network_config: Option<&str>,
) -> Result<Vec<u8>, String> {
    let mut files = vec![
        IsoFile::File {
            name: Arc::new("meta-data".to_owned()),
            contents: meta_data(domain_name, instance_id).into_bytes(),
        },
        IsoFile::File {
            name: Arc::new("user-data".to_owned()),
            contents: user_data.to_vec(),
        },
    ];
    files.extend(network_config.map(|text| IsoFile::File {
        name: Arc::new("network-config".to_owned()),
        contents: text.as_bytes().to_vec(),
    }));
    iso(LABEL, files, "the cloud-init seed")
}

/// The label Ignition's `openstack` platform (and cloud-init's ConfigDrive) looks for.
pub const CONFIG_DRIVE_LABEL: &str = "config-2";

/// An OpenStack config drive for `domain_name` holding `user_data` (an Ignition config) as
/// `openstack/latest/user_data`, with the `meta_data.json` beside it that names the machine.
///
/// # Errors
/// The writer's error, as text.
pub fn config_drive(domain_name: &str, user_data: &[u8]) -> Result<Vec<u8>, String> {
    let file = |name: &str, contents: Vec<u8>| IsoFile::File {
        name: Arc::new(name.to_owned()),
        contents,
    };
    let meta = json!({"uuid": domain_name, "name": domain_name, "hostname": domain_name});
    let latest = IsoFile::Directory {
        name: Arc::new("latest".to_owned()),
        children: vec![
            file("meta_data.json", meta.to_string().into_bytes()),
            file("user_data", user_data.to_vec()),
        ],
    };
    let openstack = IsoFile::Directory {
        name: Arc::new("openstack".to_owned()),
        children: vec![latest],
    };
    iso(
        CONFIG_DRIVE_LABEL,
        vec![openstack],
        "the Ignition config drive",
    )
}

/// An ISO 9660 image labelled `label` holding `files`, with Rock Ridge and Joliet names.
fn iso(label: &str, files: Vec<IsoFile>, what: &str) -> Result<Vec<u8>, String> {
    let files = InputFiles {
        path_separator: PathSeparator::ForwardSlash,
        files,
    };
    let options = IsoFormatOptions {
        volume_name: label.to_owned(),
        system_id: None,
        volume_set_id: None,
        publisher_id: None,
        preparer_id: Some("bigfleet-libvirt".to_owned()),
        application_id: None,
        sector_size: 2048,
        features: CreationFeatures {
            filenames: BaseIsoLevel::Level1 {
                supports_lowercase: false,
                supports_rrip: true,
            },
            long_filenames: false,
            joliet: Some(JolietLevel::Level3),
            rock_ridge: Some(RripOptions::default()),
            el_torito: None,
            hybrid_boot: None,
        },
        path_separator: PathSeparator::ForwardSlash,
        strict_charset: false,
    };
    let image = IsoImageWriter::create(Cursor::new(Vec::new()), files, options)
        .map_err(|e| format!("build {what} ISO: {e}"))?;
    Ok(image.into_inner())
}

/// What domain `domain_name` gets as its Ignition config at Create (nothing unless it
/// `boots_by_ignition`): the template without a join blob, as a file or a config drive.
///
/// # Errors
/// As [`ignition_bytes`].
pub(crate) fn ignition_image(
    options: &DomainConfig,
    domain_name: &str,
    boots_by_ignition: bool,
) -> Result<Vec<u8>, String> {
    if boots_by_ignition {
        ignition_bytes(options, domain_name, None)
    } else {
        Ok(Vec::new())
    }
}

/// The bytes of a domain's Ignition config volume: the config of `options`' template with
/// `blob` (`None`: without one), as a file (firmware configuration delivery) or inside a
/// config drive.
///
/// # Errors
/// No `--ignition-template` was given, or the config drive could not be built.
pub(crate) fn ignition_bytes(
    options: &DomainConfig,
    domain_name: &str,
    blob: Option<&[u8]>,
) -> Result<Vec<u8>, String> {
    let setup = options.ignition.as_ref().ok_or_else(|| {
        format!(
            "domain {domain_name} boots by Ignition and the provider has no \
             --ignition-template; give one and restart"
        )
    })?;
    let config = setup.config(blob);
    match setup.delivery {
        IgnitionDelivery::FwCfg => Ok(config),
        IgnitionDelivery::ConfigDrive => config_drive(domain_name, &config),
    }
}

#[cfg(test)]
mod tests {
    //! The image is checked with a small independent ECMA-119 reader (not hadris's own), so
    //! a writer regression cannot hide behind a matching reader bug.

    use super::*;

    const SECTOR: usize = 2048;

    fn u32_le(bytes: &[u8], at: usize) -> usize {
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize
    }

    /// The Rock Ridge `NM` name inside a directory record's system-use area.
    fn rock_ridge_name(system_use: &[u8]) -> Option<String> {
        let mut at = 0;
        while at + 4 <= system_use.len() {
            let (signature, len) = (&system_use[at..at + 2], system_use[at + 2] as usize);
            if len < 4 || at + len > system_use.len() {
                return None;
            }
            if signature == b"NM" {
                return Some(String::from_utf8_lossy(&system_use[at + 5..at + len]).into());
            }
            at += len;
        }
        None
    }

    /// (Rock Ridge name, contents) of every file under the directory whose record is
    /// `directory`, at any depth (names joined by `/`), in name order.
    fn files_under(image: &[u8], directory: &[u8], prefix: &str) -> Vec<(String, Vec<u8>)> {
        let (extent, size) = (u32_le(directory, 2) * SECTOR, u32_le(directory, 10));
        let mut files = Vec::new();
        let mut at = extent;
        while at < extent + size {
            let len = image[at] as usize;
            if len == 0 {
                at = (at / SECTOR + 1) * SECTOR;
                continue;
            }
            let record = &image[at..at + len];
            let name_len = record[32] as usize;
            let is_dir = record[25] & 2 != 0;
            let su_start = 33 + name_len + (1 - name_len % 2);
            match (is_dir, rock_ridge_name(&record[su_start..])) {
                (false, Some(name)) => {
                    let (data, data_len) = (u32_le(record, 2) * SECTOR, u32_le(record, 10));
                    files.push((
                        format!("{prefix}{name}"),
                        image[data..data + data_len].to_vec(),
                    ));
                }
                (true, Some(name)) if name_len > 1 => {
                    files.extend(files_under(image, record, &format!("{prefix}{name}/")));
                }
                _ => {}
            }
            at += len;
        }
        files.sort();
        files
    }

    /// Every file of the image, by path.
    fn root_files(image: &[u8]) -> Vec<(String, Vec<u8>)> {
        let pvd = &image[16 * SECTOR..17 * SECTOR];
        files_under(image, &pvd[156..190], "")
    }

    /// The volume label.
    fn label(image: &[u8]) -> String {
        let label = String::from_utf8_lossy(&image[16 * SECTOR + 40..16 * SECTOR + 72]);
        label.trim_end().to_owned()
    }

    #[test]
    fn a_config_drive_holds_the_config_where_openstack_images_read_it() {
        let config = br#"{"ignition": {"version": "3.3.0"}}"#;
        let image = config_drive("bigfleet-d", config).unwrap();
        assert_eq!(label(&image), CONFIG_DRIVE_LABEL);
        let files = root_files(&image);
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "openstack/latest/meta_data.json",
                "openstack/latest/user_data"
            ]
        );
        assert_eq!(files[1].1, config);
        let meta: serde_json::Value = serde_json::from_slice(&files[0].1).unwrap();
        assert_eq!(meta["hostname"], "bigfleet-d");
    }

    #[test]
    fn the_seed_is_a_cidata_iso_with_both_files() {
        let user_data = b"#cloud-config\npackages: [qemu-guest-agent]\n";
        let name = "bigfleet-0123456789abcdef01234567";
        let image = build(name, &instance_id(name, "op-17"), user_data, None).unwrap();
        assert_eq!(image.len() % SECTOR, 0);
        assert_eq!(&image[16 * SECTOR + 1..16 * SECTOR + 6], b"CD001");
        assert_eq!(label(&image), LABEL);
        let files = root_files(&image);
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["meta-data", "user-data"]);
        assert_eq!(files[1].1, user_data);
        let meta = String::from_utf8(files[0].1.clone()).unwrap();
        assert_eq!(
            meta,
            "instance-id: bigfleet-0123456789abcdef01234567-op-17\n\
             local-hostname: bigfleet-0123456789abcdef01234567\n"
        );
        assert!(!meta.lines().next().unwrap().contains('/'));
    }

    #[test]
    fn empty_and_default_user_data_are_kept_verbatim() {
        let files = root_files(&build("d", "d-op-1", b"", None).unwrap());
        assert_eq!(files[1], ("user-data".to_owned(), Vec::new()));
        let files = root_files(&build("d", "d-op-1", DEFAULT_USER_DATA, None).unwrap());
        assert_eq!(files[1].1, DEFAULT_USER_DATA);
    }

    #[test]
    fn a_network_config_is_a_third_file_when_given() {
        let config = "{\"version\": 2}\n";
        let files = root_files(&build("d", "d-op-1", b"", Some(config)).unwrap());
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["meta-data", "network-config", "user-data"]);
        assert_eq!(files[1].1, config.as_bytes());
    }
}
