//! The catalog's files, `--instance-types`, `--device-classes` and `--offerings`: read from disk and decoded
//! from JSON here, then handed to the domain's catalog, which decides whether they are usable.
//!
//! Reading and decoding stay out of the domain (it does no IO and links no JSON library), so
//! this is where a missing file or malformed JSON is reported, naming the flag and the shape
//! the file should have.

use std::collections::BTreeMap;
use std::path::Path;

use bigfleet_libvirt_domain::catalog::{
    DeviceClasses, InstanceCatalog, Offering, RawDeviceClass, RawInstanceType, offerings_from_raw,
};

use super::ConfigError;

const INSTANCE_TYPES_FLAG: &str = "--instance-types";
const OFFERINGS_FLAG: &str = "--offerings";
const DEVICE_CLASSES_FLAG: &str = "--device-classes";

/// Reads and parses a `--device-classes` file (a JSON object name -> class; unknown keys in
/// a class are refused, so a misspelt `pci` is not silently a class matching nothing).
///
/// # Errors
/// [`ConfigError::Read`] when the file cannot be read, [`ConfigError::Parse`] for malformed
/// JSON, otherwise the catalog's refusal as [`DeviceClasses::from_raw`] gives it.
pub fn load_device_classes(path: impl AsRef<Path>) -> Result<DeviceClasses, ConfigError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        flag: DEVICE_CLASSES_FLAG,
        path: path.to_owned(),
        source,
    })?;
    let source_name = path.display().to_string();
    let raw: Option<BTreeMap<String, RawDeviceClass>> =
        serde_json::from_str(&text).map_err(|source| ConfigError::Parse {
            flag: DEVICE_CLASSES_FLAG,
            source_name: source_name.clone(),
            source,
            expected: "a JSON object name -> {\"resource\": \"vendor.com/name\", and one of \
                       \"pci\": {\"vendor\": \"10de\", \"product\": \"20b0\"}, \"mdev\": \
                       {\"type\": \"nvidia-63\"} or \"vf\": {\"vendor\": ..., \"product\": ...}}",
        })?;
    Ok(DeviceClasses::from_raw(raw, &source_name)?)
}

/// Reads and parses an `--instance-types` file.
///
/// # Errors
/// [`ConfigError::Read`] when the file cannot be read, otherwise as
/// [`instance_types_from_json`].
pub fn load_instance_types(path: impl AsRef<Path>) -> Result<InstanceCatalog, ConfigError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        flag: INSTANCE_TYPES_FLAG,
        path: path.to_owned(),
        source,
    })?;
    instance_types_from_json(&text, &path.display().to_string())
}

/// Parses catalog JSON; `source_name` names the file in errors. Unknown keys are ignored.
///
/// # Errors
/// [`ConfigError::Parse`] for malformed JSON or non-integer numbers, otherwise the catalog's
/// refusal as [`InstanceCatalog::from_raw`] gives it.
pub fn instance_types_from_json(
    text: &str,
    source_name: &str,
) -> Result<InstanceCatalog, ConfigError> {
    let raw: Option<BTreeMap<String, RawInstanceType>> =
        serde_json::from_str(text).map_err(|source| ConfigError::Parse {
            flag: INSTANCE_TYPES_FLAG,
            source_name: source_name.to_owned(),
            source,
            expected: "a JSON object name -> {\"vcpu\": N, \"memory_mib\": N, optional \
                       \"disk_gib\": N and \"data_disks\": [{\"name\": S, \"size_gib\": N}]}",
        })?;
    Ok(InstanceCatalog::from_raw(raw, source_name)?)
}

/// Reads and parses an `--offerings` file.
///
/// # Errors
/// [`ConfigError::Read`] when the file cannot be read, otherwise as [`offerings_from_json`].
pub fn load_offerings(path: impl AsRef<Path>) -> Result<Vec<Offering>, ConfigError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        flag: OFFERINGS_FLAG,
        path: path.to_owned(),
        source,
    })?;
    offerings_from_json(&text, &path.display().to_string())
}

/// Parses offerings JSON (an array of objects; unknown keys ignored); `source` names it in
/// errors.
///
/// # Errors
/// [`ConfigError::Parse`] for malformed JSON, a missing required key or a wrong JSON type;
/// the catalog's refusal ([`offerings_from_raw`]) for `[]` or `null`.
pub fn offerings_from_json(text: &str, source: &str) -> Result<Vec<Offering>, ConfigError> {
    let parsed: Option<Vec<Offering>> =
        serde_json::from_str(text).map_err(|error| ConfigError::Parse {
            flag: OFFERINGS_FLAG,
            source_name: source.to_owned(),
            source: error,
            expected: "a JSON array of {\"instance_type\", \"zone\", \"count\", ...} objects",
        })?;
    Ok(offerings_from_raw(parsed, source)?)
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn err(text: &str) -> String {
        instance_types_from_json(text, "types.json")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn load_reads_a_file_and_names_the_flag_when_it_cannot() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        write!(file, r#"{{"x.one": {{"vcpu": 1, "memory_mib": 1024}}}}"#).unwrap();
        let catalog = load_instance_types(file.path()).unwrap();
        assert_eq!(catalog.names(), ["x.one"]);
        let missing = Path::new("/nonexistent/types.json");
        let msg = load_instance_types(missing).unwrap_err().to_string();
        assert!(
            msg.starts_with("read --instance-types /nonexistent/types.json: "),
            "{msg}"
        );
    }

    #[test]
    fn parse_errors_name_the_flag() {
        for text in ["", "[1]", "{", r#"{"a": {"vcpu": 1.5, "memory_mib": 1}}"#] {
            let msg = err(text);
            assert!(
                msg.starts_with("parse --instance-types types.json: "),
                "{msg}"
            );
        }
        assert!(err(r#"{"a": {"vcpu": "2", "memory_mib": 1}}"#).starts_with("parse "));
    }

    #[test]
    fn offerings_json_errors_name_the_flag() {
        for text in [
            "{",
            "{}",
            r#"[{"zone": "z", "count": 1}]"#,
            r#"[{"instance_type": "t", "zone": "z", "count": "1"}]"#,
            r#"[{"instance_type": "t", "zone": "z", "count": 1.5}]"#,
            r#"[{"instance_type": "t", "zone": "z", "count": 1, "labels": {"a": 1}}]"#,
        ] {
            let msg = offerings_from_json(text, "o.json").unwrap_err().to_string();
            assert!(
                msg.starts_with("parse --offerings o.json: "),
                "{text}: {msg}"
            );
        }
        for text in ["[]", "null"] {
            let msg = offerings_from_json(text, "o.json").unwrap_err().to_string();
            assert!(msg.starts_with("--offerings o.json is empty; "), "{msg}");
        }
    }

    #[test]
    fn load_offerings_reads_files_and_reports_missing_ones() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        write!(
            file,
            r#"[{{"instance_type": "kvm.small", "zone": "z", "count": 2}}]"#
        )
        .unwrap();
        assert_eq!(load_offerings(file.path()).unwrap()[0].count, 2);
        let msg = load_offerings(Path::new("/nonexistent/o.json"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("read --offerings /nonexistent/o.json: "),
            "{msg}"
        );
    }
}
