//! Maps shared between records instead of repeated in each.
//!
//! Every slot of one offering carries the same resources, allocatable and labels; at 100k
//! machines a private copy of those maps in every record (and in every copy of every record)
//! was most of the provider's memory. A [`SharedMap`] is one reference-counted map: cloning a
//! record clones a pointer, and editing a shared map copies it first, so no record ever sees
//! another's edit. [`Interner`] makes equal maps that were built or loaded apart share one.

use std::collections::BTreeSet;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::machine::StringMap;

/// A [`StringMap`] shared by every record that holds an equal one. It reads as the map
/// (`Deref`), writes copy-on-write (`DerefMut`), compares and serialises as the map.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SharedMap(Arc<StringMap>);

impl SharedMap {
    /// An owned copy of the map.
    #[must_use]
    pub fn to_map(&self) -> StringMap {
        StringMap::clone(&self.0)
    }

    /// Whether `self` and `other` are the same allocation (not just equal).
    #[must_use]
    pub fn shares(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Deref for SharedMap {
    type Target = StringMap;

    fn deref(&self) -> &StringMap {
        &self.0
    }
}

impl DerefMut for SharedMap {
    /// Copies the map first when another record shares it.
    fn deref_mut(&mut self) -> &mut StringMap {
        Arc::make_mut(&mut self.0)
    }
}

impl From<StringMap> for SharedMap {
    fn from(map: StringMap) -> Self {
        Self(Arc::new(map))
    }
}

impl From<SharedMap> for StringMap {
    fn from(map: SharedMap) -> Self {
        Arc::unwrap_or_clone(map.0)
    }
}

impl PartialEq<StringMap> for SharedMap {
    fn eq(&self, other: &StringMap) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<SharedMap> for StringMap {
    fn eq(&self, other: &SharedMap) -> bool {
        *self == *other.0
    }
}

impl fmt::Debug for SharedMap {
    /// As the map itself: sharing is not part of a record's value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'a> IntoIterator for &'a SharedMap {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl FromIterator<(String, String)> for SharedMap {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<StringMap>())
    }
}

/// Hands out one shared allocation per distinct map.
#[derive(Debug, Default)]
pub struct Interner {
    seen: BTreeSet<SharedMap>,
}

impl Interner {
    /// Replaces `map` with the allocation of an equal map seen before, or remembers it.
    pub fn intern(&mut self, map: &mut SharedMap) {
        match self.seen.get(map) {
            Some(seen) if !seen.shares(map) => *map = seen.clone(),
            Some(_) => {}
            None => {
                self.seen.insert(map.clone());
            }
        }
    }

    /// Interns a record's resources, allocatable and labels.
    pub fn intern_machine(&mut self, machine: &mut crate::machine::Machine) {
        self.intern(&mut machine.resources);
        self.intern(&mut machine.allocatable);
        self.intern(&mut machine.labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> StringMap {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn an_edit_of_a_shared_map_leaves_the_other_holders_alone() {
        let a = SharedMap::from(map(&[("cpu", "2")]));
        let mut b = a.clone();
        assert!(a.shares(&b));
        b.insert("memory".to_owned(), "4Gi".to_owned());
        assert!(!a.shares(&b));
        assert_eq!(a, map(&[("cpu", "2")]));
        assert_eq!(b, map(&[("cpu", "2"), ("memory", "4Gi")]));
    }

    #[test]
    fn equal_maps_interned_apart_end_up_sharing_one_allocation() {
        let mut interner = Interner::default();
        let mut first = SharedMap::from(map(&[("cpu", "2")]));
        let mut second = SharedMap::from(map(&[("cpu", "2")]));
        let mut other = SharedMap::from(map(&[("cpu", "4")]));
        assert!(!first.shares(&second));
        interner.intern(&mut first);
        interner.intern(&mut second);
        interner.intern(&mut other);
        assert!(first.shares(&second));
        assert!(!first.shares(&other));
        assert_eq!(other, map(&[("cpu", "4")]));
    }

    #[test]
    fn a_shared_map_serialises_as_the_map() {
        let shared = SharedMap::from(map(&[("cpu", "2")]));
        let json = serde_json::to_string(&shared).unwrap();
        assert_eq!(json, serde_json::to_string(&map(&[("cpu", "2")])).unwrap());
        let back: SharedMap = serde_json::from_str(&json).unwrap();
        assert_eq!(back, shared);
    }
}
