//! A set of host CPU ids written the way Linux and libvirt write them (`0-3,8,10-11`):
//! `--dedicated-cpus`, and the `cpuset` attributes of a domain's `<vcpu>`, `<vcpupin>` and
//! `<emulatorpin>`.

use std::collections::BTreeSet;
use std::fmt;

/// The largest CPU id accepted (libvirt's own limit on a host's CPUs is lower).
pub const MAX_CPU_ID: u32 = 65_535;

/// A set of host CPU ids.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet(BTreeSet<u32>);

impl CpuSet {
    /// Reads `0-3,8,10-11` (libvirt also writes `^N` to take a CPU out of the ranges
    /// before it, which is honoured).
    ///
    /// # Errors
    /// What is wrong with the text, and the form to use.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |part: &str, why: &str| {
            format!(
                "{text:?}: {part:?} {why}; write CPU ids and ranges such as 2-7,10 (ids up to \
                 {MAX_CPU_ID})"
            )
        };
        let number = |part: &str, digits: &str| -> Result<u32, String> {
            let id: u32 = (digits.trim().parse().ok())
                .filter(|id| *id <= MAX_CPU_ID)
                .ok_or_else(|| bad(part, "is not a CPU id"))?;
            Ok(id)
        };
        let mut set = BTreeSet::new();
        for part in text.split(',').map(str::trim) {
            if part.is_empty() {
                return Err(bad(part, "is empty"));
            }
            if let Some(excluded) = part.strip_prefix('^') {
                set.remove(&number(part, excluded)?);
            } else if let Some((low, high)) = part.split_once('-') {
                let (low, high) = (number(part, low)?, number(part, high)?);
                if low > high {
                    return Err(bad(part, "runs backwards"));
                }
                set.extend(low..=high);
            } else {
                set.insert(number(part, part)?);
            }
        }
        Ok(Self(set))
    }

    /// The ids, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    /// How many CPUs.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `id` is in the set.
    #[must_use]
    pub fn contains(&self, id: u32) -> bool {
        self.0.contains(&id)
    }

    /// Adds every CPU of `other`.
    pub fn extend(&mut self, other: &CpuSet) {
        self.0.extend(other.iter());
    }

    /// The CPUs of this set that are not in `other`.
    #[must_use]
    pub fn minus(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }

    /// The CPUs in both sets.
    #[must_use]
    pub fn and(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(ids: I) -> Self {
        Self(ids.into_iter().collect())
    }
}

impl fmt::Display for CpuSet {
    /// Ranges of consecutive ids joined with commas (`0-3,8`); empty for no CPU.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids = self.iter().peekable();
        let mut first = true;
        while let Some(low) = ids.next() {
            let mut high = low;
            while ids.peek() == Some(&(high + 1)) {
                high = ids.next().unwrap_or(high);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if high == low {
                write!(f, "{low}")?;
            } else {
                write!(f, "{low}-{high}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_linux_cpu_lists() {
        let set = CpuSet::parse("0-3, 8,10-11,^2").unwrap();
        assert_eq!(set.iter().collect::<Vec<_>>(), [0, 1, 3, 8, 10, 11]);
        assert_eq!(set.to_string(), "0-1,3,8,10-11");
        assert_eq!(CpuSet::parse(&set.to_string()), Ok(set.clone()));
        assert_eq!(CpuSet::parse("5").unwrap().to_string(), "5");
        assert_eq!(CpuSet::default().to_string(), "");
        let other = CpuSet::parse("1-8").unwrap();
        assert_eq!(set.minus(&other).to_string(), "0,10-11");
        assert_eq!(set.and(&other).to_string(), "1,3,8");
    }

    #[test]
    fn refuses_what_is_not_a_cpu_list() {
        for (text, why) in [
            ("", "\"\" is empty"),
            ("1,,2", "\"\" is empty"),
            ("a", "\"a\" is not a CPU id"),
            ("3-1", "\"3-1\" runs backwards"),
            ("-1", "\"-1\" is not a CPU id"),
            ("70000", "\"70000\" is not a CPU id"),
        ] {
            let error = CpuSet::parse(text).unwrap_err();
            assert!(error.contains(why), "{text}: {error}");
            assert!(error.contains("such as 2-7,10"), "{text}: {error}");
        }
    }
}
