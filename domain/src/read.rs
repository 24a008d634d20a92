//! The read calls' request rules (docs/contract.md §8), beside the mutating calls'
//! processing order: which Get ids are refused before any lookup, and how a List filter's
//! wire fields become a [`ListQuery`].

use std::collections::BTreeSet;

use crate::cursor::parse_cursor;
use crate::echo::MAX_ID_BYTES;
use crate::list::ListQuery;
use crate::machine::MachineState;

/// Why a Get id is refused before it is looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GetIdError {
    /// The id is empty.
    #[error("id required")]
    Missing,
    /// The id is longer than [`MAX_ID_BYTES`] (its length in bytes): no machine has it.
    #[error("id is {0} bytes; at most {MAX_ID_BYTES} are accepted")]
    Oversized(usize),
}

/// Checks a Get id before it is looked up: empty and oversized ids are refused (and an
/// oversized one is never echoed).
///
/// # Errors
/// The refusal.
pub fn check_get_id(id: &str) -> Result<(), GetIdError> {
    if id.is_empty() {
        Err(GetIdError::Missing)
    } else if id.len() > MAX_ID_BYTES {
        Err(GetIdError::Oversized(id.len()))
    } else {
        Ok(())
    }
}

impl ListQuery {
    /// A List filter from its wire fields. Unknown or unspecified state numbers match
    /// nothing (a filter naming only those lists nothing); a `max_results` of zero or less
    /// caps nothing; a cursor that does not parse means a full list, never an error.
    #[must_use]
    pub fn from_filter(states: &[i32], max_results: i32, since_revision: &[u8]) -> Self {
        let states = (!states.is_empty()).then(|| {
            states
                .iter()
                .filter_map(|n| MachineState::from_wire(*n))
                .collect::<BTreeSet<_>>()
        });
        Self {
            states,
            max_results: usize::try_from(max_results).ok().filter(|n| *n > 0),
            since_revision: parse_cursor(since_revision),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_oversized_get_ids_are_refused() {
        assert_eq!(check_get_id(""), Err(GetIdError::Missing));
        assert_eq!(check_get_id("m-1"), Ok(()));
        assert_eq!(check_get_id(&"x".repeat(MAX_ID_BYTES)), Ok(()));
        let long = "x".repeat(MAX_ID_BYTES + 1);
        assert_eq!(
            check_get_id(&long),
            Err(GetIdError::Oversized(MAX_ID_BYTES + 1))
        );
    }

    #[test]
    fn list_filters_become_queries() {
        assert_eq!(ListQuery::from_filter(&[], 0, b""), ListQuery::default());
        let idle = MachineState::Idle as i32;
        let query = ListQuery::from_filter(&[idle, 0, 99], -1, b"42");
        assert_eq!(query.states, Some([MachineState::Idle].into()));
        assert_eq!((query.max_results, query.since_revision), (None, Some(42)));
        let unknown = ListQuery::from_filter(&[99], 3, b"junk");
        assert_eq!(unknown.states, Some(BTreeSet::new()));
        assert_eq!(
            (unknown.max_results, unknown.since_revision),
            (Some(3), None)
        );
    }
}
