//! An instance type's disks: an optional root size (`disk_gib`) and data disks
//! (`data_disks`), as the instance-types file writes them ([`RawDisks`]) and as checked
//! ([`DiskShape`]).
//!
//! Sizes are whole GiB between 1 and [`MAX_DISK_GIB`] (64 TiB, far past any disk a
//! Kubernetes node is given, so a stray digit is caught rather than handed to the pool). A
//! type has at most [`MAX_DATA_DISKS`] data disks. Each data disk has a name that is its
//! volume's suffix and the serial the guest sees it by (`/dev/disk/by-id/virtio-<name>`),
//! so names are short (virtio-blk serials hold 20 bytes), lower-case letters and digits
//! only (no `-`: the volume name ends `-data-<name>.qcow2`, and the domain name is read
//! back from it), unique within the type and not `root` (the root disk's serial).

use serde::Deserialize;

use super::CatalogError;

/// The largest disk, root or data, in GiB (64 TiB).
pub const MAX_DISK_GIB: u64 = 64 * 1024;

/// The root disk's smallest size when a type does not set `disk_gib`, in GiB.
pub const ROOT_FLOOR_GIB: u64 = 40;

/// The most data disks one type may have.
pub const MAX_DATA_DISKS: usize = 8;

/// The longest data disk name.
pub const MAX_DISK_NAME: usize = 16;

/// One data disk of an instance type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataDisk {
    /// Its name: the volume's suffix and the serial the guest sees.
    pub name: String,
    /// Its size in GiB.
    pub size_gib: u64,
}

/// The disks of an instance type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskShape {
    /// The root disk's size in GiB; `None` sizes it as the golden image asks (its virtual
    /// size, at least 40 GiB).
    pub root_gib: Option<u64>,
    /// The data disks, in the order the guest gets them.
    pub data: Vec<DataDisk>,
}

/// A data disk as the file writes it. `size_gib` defaults to 0 so a missing size fails the
/// size check with the operator-facing message.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct RawDataDisk {
    /// Its name; `dataN` (N from 1, its place in the list) when absent.
    #[serde(default)]
    pub name: Option<String>,
    /// Its size in GiB as written.
    #[serde(default)]
    pub size_gib: i64,
}

/// The disk fields of one type's entry as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct RawDisks {
    /// The root disk's size in GiB as written.
    #[serde(default)]
    pub disk_gib: Option<i64>,
    /// The data disks as written.
    #[serde(default)]
    pub data_disks: Vec<RawDataDisk>,
}

impl DiskShape {
    /// Checks type `name`'s disk fields from `source_name`.
    ///
    /// # Errors
    /// [`CatalogError::InstanceTypeField`] naming the field, the value and the fix.
    pub fn from_raw(raw: &RawDisks, source_name: &str, name: &str) -> Result<Self, CatalogError> {
        let refuse = |field: String, problem: String| CatalogError::InstanceTypeField {
            source_name: source_name.to_owned(),
            name: name.to_owned(),
            field,
            problem,
        };
        let root_gib = match raw.disk_gib {
            None => None,
            Some(gib) => Some(size(gib).map_err(|p| refuse("disk_gib".to_owned(), p))?),
        };
        if raw.data_disks.len() > MAX_DATA_DISKS {
            return Err(refuse(
                "data_disks".to_owned(),
                format!(
                    "lists {} disks, more than {MAX_DATA_DISKS}; put fewer, larger disks",
                    raw.data_disks.len()
                ),
            ));
        }
        let mut data: Vec<DataDisk> = Vec::with_capacity(raw.data_disks.len());
        for (index, disk) in raw.data_disks.iter().enumerate() {
            let field = format!("data_disks[{index}]");
            let size_gib =
                size(disk.size_gib).map_err(|p| refuse(format!("{field}.size_gib"), p))?;
            let name = match &disk.name {
                Some(given) => {
                    disk_name(given).map_err(|p| refuse(format!("{field}.name"), p))?;
                    given.clone()
                }
                None => format!("data{}", index + 1),
            };
            if data.iter().any(|d| d.name == name) {
                return Err(refuse(
                    format!("{field}.name"),
                    format!("{name:?} is used by an earlier disk; give each disk its own name"),
                ));
            }
            data.push(DataDisk { name, size_gib });
        }
        Ok(Self { root_gib, data })
    }

    /// The root disk's size in bytes over a golden image of virtual size `image_bytes`:
    /// `disk_gib`, or without it the image's size with a floor of [`ROOT_FLOOR_GIB`].
    ///
    /// # Errors
    /// When `disk_gib` is smaller than the image: the message names type `type_name`, both
    /// sizes and the fix.
    pub fn root_bytes(&self, type_name: &str, image_bytes: u64) -> Result<u64, String> {
        let Some(gib) = self.root_gib else {
            return Ok(image_bytes.max(gib_bytes(ROOT_FLOOR_GIB)));
        };
        let bytes = gib_bytes(gib);
        if bytes >= image_bytes {
            return Ok(bytes);
        }
        let needed = image_bytes.div_ceil(1 << 30);
        Err(format!(
            "instance type {type_name:?} has a {gib} GiB root disk (disk_gib), smaller than \
             the golden image's virtual size of {image_bytes} bytes ({needed} GiB rounded up); \
             set its disk_gib to at least {needed} in --instance-types, or use a smaller image"
        ))
    }

    /// The data disks' total size in bytes.
    #[must_use]
    pub fn data_bytes(&self) -> u64 {
        self.data
            .iter()
            .map(|d| gib_bytes(d.size_gib))
            .fold(0, u64::saturating_add)
    }
}

/// `gib` GiB in bytes.
#[must_use]
pub fn gib_bytes(gib: u64) -> u64 {
    gib.saturating_mul(1 << 30)
}

/// A size as written, checked.
fn size(gib: i64) -> Result<u64, String> {
    match u64::try_from(gib) {
        Ok(gib) if (1..=MAX_DISK_GIB).contains(&gib) => Ok(gib),
        Ok(0) => Err("is 0 (or missing); give a size in GiB of at least 1".to_owned()),
        Ok(gib) => Err(format!(
            "is {gib} GiB, more than the {MAX_DISK_GIB} GiB (64 TiB) this provider makes; \
             give the size in GiB (1 TiB is 1024)"
        )),
        Err(_) => Err(format!("is {gib}; give a positive size in GiB")),
    }
}

/// A data disk name as written, checked.
fn disk_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if name.is_empty() || name.len() > MAX_DISK_NAME || !name.chars().all(allowed) {
        return Err(format!(
            "{name:?} must be 1 to {MAX_DISK_NAME} lower-case letters or digits (it is the \
             volume's suffix and the disk's serial in the guest); rename it"
        ));
    }
    if name == "root" {
        return Err("\"root\" is the root disk's serial; rename the data disk".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(json: &str) -> Result<DiskShape, String> {
        let raw: RawDisks = serde_json::from_str(json).unwrap();
        DiskShape::from_raw(&raw, "types.json", "k.disk").map_err(|e| e.to_string())
    }

    #[test]
    fn absent_fields_keep_todays_shape() {
        assert_eq!(shape("{}").unwrap(), DiskShape::default());
    }

    #[test]
    fn sizes_and_names_are_read_and_defaulted() {
        let got = shape(
            r#"{"disk_gib": 20, "data_disks": [{"size_gib": 5}, {"name": "scratch", "size_gib": 64}]}"#,
        )
        .unwrap();
        assert_eq!(got.root_gib, Some(20));
        let names: Vec<(&str, u64)> = got
            .data
            .iter()
            .map(|d| (d.name.as_str(), d.size_gib))
            .collect();
        assert_eq!(names, [("data1", 5), ("scratch", 64)]);
        assert_eq!(got.data_bytes(), 69 << 30);
    }

    #[test]
    fn bad_sizes_are_refused_naming_the_field_and_the_fix() {
        for (json, field, says) in [
            (r#"{"disk_gib": 0}"#, "disk_gib", "is 0"),
            (
                r#"{"disk_gib": -3}"#,
                "disk_gib",
                "is -3; give a positive size",
            ),
            (
                r#"{"disk_gib": 65537}"#,
                "disk_gib",
                "more than the 65536 GiB",
            ),
            (
                r#"{"data_disks": [{"name": "a"}]}"#,
                "data_disks[0].size_gib",
                "is 0",
            ),
            (
                r#"{"data_disks": [{"size_gib": 1}, {"size_gib": 9999999}]}"#,
                "data_disks[1].size_gib",
                "1 TiB is 1024",
            ),
        ] {
            let msg = shape(json).unwrap_err();
            let head = format!("--instance-types types.json: \"k.disk\" {field} ");
            assert!(msg.starts_with(&head), "{json}: {msg}");
            assert!(msg.contains(says), "{json}: {msg}");
        }
    }

    #[test]
    fn the_root_is_the_types_size_and_never_smaller_than_the_image() {
        let image = (2 << 30) + 1;
        assert_eq!(DiskShape::default().root_bytes("t", image), Ok(40 << 30));
        assert_eq!(DiskShape::default().root_bytes("t", 50 << 30), Ok(50 << 30));
        let sized = shape(r#"{"disk_gib": 3}"#).unwrap();
        assert_eq!(sized.root_bytes("t", image), Ok(3 << 30));
        assert_eq!(sized.root_bytes("t", 3 << 30), Ok(3 << 30));
        let small = shape(r#"{"disk_gib": 2}"#).unwrap();
        let msg = small.root_bytes("k.small", image).unwrap_err();
        assert!(
            msg.starts_with("instance type \"k.small\" has a 2 GiB root disk"),
            "{msg}"
        );
        assert!(msg.contains("2147483649 bytes (3 GiB rounded up)"), "{msg}");
        assert!(msg.contains("set its disk_gib to at least 3"), "{msg}");
    }

    #[test]
    fn bad_names_and_too_many_disks_are_refused() {
        for (json, says) in [
            (
                r#"{"data_disks": [{"name": "", "size_gib": 1}]}"#,
                "lower-case letters or digits",
            ),
            (
                r#"{"data_disks": [{"name": "my-disk", "size_gib": 1}]}"#,
                "rename it",
            ),
            (
                r#"{"data_disks": [{"name": "Data", "size_gib": 1}]}"#,
                "rename it",
            ),
            (
                r#"{"data_disks": [{"name": "abcdefghijklmnopq", "size_gib": 1}]}"#,
                "1 to 16",
            ),
            (
                r#"{"data_disks": [{"name": "root", "size_gib": 1}]}"#,
                "root disk's serial",
            ),
            (
                r#"{"data_disks": [{"size_gib": 1}, {"name": "data1", "size_gib": 2}]}"#,
                "used by an earlier disk",
            ),
        ] {
            let msg = shape(json).unwrap_err();
            assert!(msg.contains(says), "{json}: {msg}");
        }
        let nine = format!(
            r#"{{"data_disks": [{}]}}"#,
            [r#"{"size_gib": 1}"#; 9].join(",")
        );
        assert!(
            shape(&nine)
                .unwrap_err()
                .contains("lists 9 disks, more than 8")
        );
    }
}
