//! Unit tests for `list_budget`: what answers are charged (references, and superseded
//! versions held by Lists alone, once), first-come admission, sharing by query and revision.

use std::collections::BTreeSet;

use bigfleet_libvirt_domain::MachineState;

use super::*;

const MACHINES: usize = 1000;
const ENCODING: usize = 200;
const REFERENCES: usize = MACHINES * size_of::<Arc<[u8]>>();
/// The answers' own fixed parts (about 140 bytes each), besides references and encodings.
const OVERHEAD: usize = 512;

/// The inventory's memoised encodings, one per machine.
fn inventory() -> Vec<Arc<[u8]>> {
    (0..MACHINES)
        .map(|i| Arc::from(vec![u8::try_from(i % 256).unwrap(); ENCODING]))
        .collect()
}

/// A full List answer built from the inventory's encodings.
fn answer_from(inventory: &[Arc<[u8]>]) -> EncodedMachineList {
    EncodedMachineList {
        machines: inventory.to_vec(),
        revision: b"42".to_vec(),
    }
}

fn full() -> ListQuery {
    ListQuery::default()
}

fn within(value: usize, low: usize, what: &str) {
    assert!(
        (low..low + OVERHEAD).contains(&value),
        "{what}: {value} bytes, expected {low} (+ at most {OVERHEAD})"
    );
}

#[test]
fn an_answer_made_of_the_inventorys_encodings_is_charged_its_references_only() {
    let budget = ListBudget::new(4);
    let memo = inventory();
    let list = answer_from(&memo);
    let wire = list.encoded_len();
    assert!(wire > MACHINES * ENCODING, "{wire} bytes on the wire");
    let answer = budget.keep(list, &full(), 42);
    within(budget.in_use(), REFERENCES, "a fresh answer");
    // Every record changes: the answer alone holds the versions it was built from.
    drop(memo);
    within(
        budget.in_use(),
        REFERENCES + MACHINES * ENCODING,
        "an answer whose records all changed",
    );
    drop(answer);
    assert_eq!(budget.in_use(), 0, "given back with the answer");
}

#[test]
fn a_version_held_by_several_answers_alone_is_counted_once() {
    let budget = ListBudget::new(4);
    let mut memo = inventory();
    let first = budget.keep(answer_from(&memo), &full(), 1);
    let second = budget.keep(answer_from(&memo), &full(), 2);
    within(budget.in_use(), 2 * REFERENCES, "two fresh answers");
    // Half the records change: both answers hold the old halves, nothing else does.
    for (i, encoding) in memo.iter_mut().enumerate().take(MACHINES / 2) {
        *encoding = Arc::from(vec![u8::try_from(i % 256).unwrap(); ENCODING + 1]);
    }
    within(
        budget.in_use(),
        2 * REFERENCES + MACHINES / 2 * ENCODING,
        "two answers sharing 500 superseded versions",
    );
    drop(first);
    within(
        budget.in_use(),
        REFERENCES + MACHINES / 2 * ENCODING,
        "the second answer alone",
    );
    drop(second);
    assert_eq!(budget.in_use(), 0);
}

#[tokio::test]
async fn reservations_wait_for_room_first_come_first_served() {
    let budget = ListBudget::new(1);
    let first = budget.reserve(700 << 10).await;
    assert_eq!(budget.in_use(), 700 << 10);
    let second = budget.reserve(500 << 10);
    let third = budget.reserve(10 << 10);
    tokio::pin!(second, third);
    assert!(
        futures::poll!(second.as_mut()).is_pending(),
        "500 KiB more do not fit"
    );
    assert!(
        futures::poll!(third.as_mut()).is_pending(),
        "10 KiB would fit but wait behind the earlier List"
    );
    drop(first);
    let second = second.await;
    let third = third.await;
    assert_eq!(budget.in_use(), 510 << 10);
    drop((second, third));
    assert_eq!(budget.in_use(), 0);
}

#[tokio::test]
async fn held_answers_count_against_admission_and_shrinking_makes_room() {
    let budget = ListBudget::new(1);
    let memo = inventory();
    // What an answer reserves while it is built, then only its stream's working bytes.
    let mut building = budget.reserve(ListBudget::estimate(MACHINES)).await;
    let answer = budget.keep(answer_from(&memo), &full(), 1);
    building.shrink_to(STREAM_WORKING);
    within(budget.in_use(), REFERENCES + STREAM_WORKING, "one stream");
    // The records change: the answer's superseded versions fill the budget.
    drop(memo);
    let next = budget.reserve(1000 << 10);
    tokio::pin!(next);
    assert!(
        futures::poll!(next.as_mut()).is_pending(),
        "{} bytes held: 1000 KiB more do not fit in 1 MiB",
        budget.in_use()
    );
    drop(answer);
    let still = futures::poll!(next.as_mut());
    assert!(
        still.is_pending(),
        "the stream's working bytes are still reserved"
    );
    drop(building);
    let _next = next.await;
}

#[tokio::test]
async fn an_answer_larger_than_the_whole_budget_is_admitted_alone() {
    let budget = ListBudget::new(1);
    let small = budget.reserve(STREAM_WORKING).await;
    let huge = budget.reserve(64 << 20);
    tokio::pin!(huge);
    assert!(futures::poll!(huge.as_mut()).is_pending());
    drop(small);
    let _huge = huge.await;
    assert_eq!(budget.in_use(), 64 << 20);
}

#[test]
fn a_list_joins_only_the_answer_to_the_same_query_at_the_same_revision() {
    let budget = ListBudget::new(4);
    let memo = inventory();
    let answer = budget.keep(answer_from(&memo), &full(), 7);
    assert!(budget.sharing(&full()));
    let joined = budget
        .shared(&full(), 7)
        .expect("the same query at the same revision");
    assert!(Arc::ptr_eq(&joined, &answer));
    assert!(budget.shared(&full(), 8).is_none(), "the head moved on");
    let speculative = ListQuery {
        states: Some(BTreeSet::from([MachineState::Speculative])),
        ..ListQuery::default()
    };
    assert!(!budget.sharing(&speculative));
    assert!(budget.shared(&speculative, 7).is_none(), "another query");
    let capped = ListQuery {
        max_results: Some(MACHINES),
        ..ListQuery::default()
    };
    let page = budget.keep(answer_from(&memo), &capped, 7);
    assert!(
        budget.shared(&capped, 7).is_none(),
        "capped pages vary per call"
    );
    drop((answer, joined, page));
    assert!(!budget.sharing(&full()), "nothing left to join");
}

#[test]
fn the_estimate_follows_the_last_large_answer() {
    let budget = ListBudget::new(4);
    assert!(budget.may_be_large(100_000));
    assert!(!budget.may_be_large(1000));
    budget.observe(10_000, 1000);
    assert!(!budget.may_be_large(100_000), "10 bytes a machine");
}
