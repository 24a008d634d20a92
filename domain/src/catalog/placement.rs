//! How an instance type's machine sits on its host beyond its vCPU and memory counts:
//! guest memory backed by huge pages of one size (`hugepages`), and vCPUs on host CPUs of
//! their own (`dedicated_cpus`), as the instance-types file writes them ([`RawPlacement`])
//! and as checked ([`Placement`]).
//!
//! A page size is written the way Kubernetes names huge page resources: a power of two with
//! a binary suffix, `2Mi` or `1Gi` on x86-64 (anything from 64Ki to 16Gi is accepted, for
//! other architectures' sizes). The type's memory must be a whole number of pages.

use serde::Deserialize;

use super::CatalogError;

/// The smallest huge page accepted, in KiB (64 KiB pages exist on arm64).
const MIN_PAGE_KIB: u64 = 64;

/// The largest huge page accepted, in KiB (16 GiB pages exist on ppc64).
const MAX_PAGE_KIB: u64 = 16 << 20;

/// The placement of an instance type's machines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// Guest memory from huge pages of this size, in KiB; `None`: ordinary memory.
    pub hugepage_kib: Option<u64>,
    /// Each vCPU pinned to a host CPU no other dedicated machine holds.
    pub dedicated_cpus: bool,
}

impl Placement {
    /// Whether anything beyond the defaults is asked for.
    #[must_use]
    pub fn is_default(self) -> bool {
        self == Self::default()
    }

    /// How many huge pages a machine of `memory_mib` holds, when it is backed by them.
    #[must_use]
    pub fn pages(self, memory_mib: u64) -> Option<u64> {
        let page = self.hugepage_kib?;
        Some(memory_mib.saturating_mul(1024) / page)
    }
}

/// The placement fields of one type's entry as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct RawPlacement {
    /// The huge page size as written (`2Mi`, `1Gi`).
    #[serde(default)]
    pub hugepages: Option<String>,
    /// Whether the vCPUs are dedicated.
    #[serde(default)]
    pub dedicated_cpus: bool,
}

impl Placement {
    /// Checks type `name`'s placement fields from `source_name`, for a type of `memory_mib`.
    ///
    /// # Errors
    /// [`CatalogError::InstanceTypeField`] naming the field, the value and the fix.
    pub fn from_raw(
        raw: &RawPlacement,
        memory_mib: u64,
        source_name: &str,
        name: &str,
    ) -> Result<Self, CatalogError> {
        let hugepage_kib = match &raw.hugepages {
            None => None,
            Some(text) => {
                let refuse = |problem: String| CatalogError::InstanceTypeField {
                    source_name: source_name.to_owned(),
                    name: name.to_owned(),
                    field: "hugepages".to_owned(),
                    problem,
                };
                let kib = page_kib(text).map_err(&refuse)?;
                if memory_mib.saturating_mul(1024) % kib != 0 {
                    return Err(refuse(format!(
                        "is {text:?}, and memory_mib {memory_mib} is not a whole number of \
                         such pages; make memory_mib a multiple of {} MiB",
                        kib.div_ceil(1024)
                    )));
                }
                Some(kib)
            }
        };
        Ok(Self {
            hugepage_kib,
            dedicated_cpus: raw.dedicated_cpus,
        })
    }
}

/// A page size such as `2Mi` or `1Gi` in KiB.
///
/// # Errors
/// What is wrong with the text, and what to write instead.
pub fn page_kib(text: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "is {text:?}, not a huge page size; write a power of two with Ki, Mi or Gi \
             between 64Ki and 16Gi, such as \"2Mi\" or \"1Gi\" on x86-64"
        )
    };
    let (digits, scale) = [("Ki", 1u64), ("Mi", 1 << 10), ("Gi", 1 << 20)]
        .into_iter()
        .find_map(|(suffix, scale)| text.strip_suffix(suffix).map(|d| (d, scale)))
        .ok_or_else(bad)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let kib = (digits.parse::<u64>().ok())
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(bad)?;
    if !kib.is_power_of_two() || !(MIN_PAGE_KIB..=MAX_PAGE_KIB).contains(&kib) {
        return Err(bad());
    }
    Ok(kib)
}

/// `kib` the way the catalog writes page sizes (`2Mi`, `1Gi`, `64Ki`).
#[must_use]
pub fn page_name(kib: u64) -> String {
    if kib % (1 << 20) == 0 {
        format!("{}Gi", kib >> 20)
    } else if kib % (1 << 10) == 0 {
        format!("{}Mi", kib >> 10)
    } else {
        format!("{kib}Ki")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_sizes_read_as_kubernetes_writes_them() {
        assert_eq!(page_kib("2Mi"), Ok(2048));
        assert_eq!(page_kib("1Gi"), Ok(1 << 20));
        assert_eq!(page_kib("64Ki"), Ok(64));
        assert_eq!(page_kib("16Gi"), Ok(16 << 20));
        for bad in [
            "", "2", "2M", "2MiB", "Mi", "-2Mi", "3Mi", "4Ki", "32Gi", "2 Mi", "1e3Ki",
        ] {
            let why = page_kib(bad).unwrap_err();
            assert!(why.contains("such as \"2Mi\" or \"1Gi\""), "{bad}: {why}");
        }
        for kib in [64, 2048, 1 << 20, 512 << 10] {
            assert_eq!(page_kib(&page_name(kib)), Ok(kib));
        }
    }

    #[test]
    fn memory_must_be_whole_pages() {
        let raw = |hugepages: &str| RawPlacement {
            hugepages: Some(hugepages.to_owned()),
            dedicated_cpus: true,
        };
        let placed = Placement::from_raw(&raw("2Mi"), 4096, "t.json", "k.huge").unwrap();
        assert_eq!(placed.hugepage_kib, Some(2048));
        assert!(placed.dedicated_cpus);
        assert_eq!(placed.pages(4096), Some(2048));
        let why = Placement::from_raw(&raw("1Gi"), 1536, "t.json", "k.huge")
            .unwrap_err()
            .to_string();
        assert_eq!(
            why,
            "--instance-types t.json: \"k.huge\" hugepages is \"1Gi\", and memory_mib 1536 is \
             not a whole number of such pages; make memory_mib a multiple of 1024 MiB"
        );
        let plain = Placement::from_raw(&RawPlacement::default(), 1536, "t", "k").unwrap();
        assert!(plain.is_default());
        assert_eq!(plain.pages(1536), None);
    }
}
