//! Get, List and revisions (docs/contract.md §8): filters, cap, strictly-greater deltas, the head
//! revision, what does and does not bump it, cursor parsing and restart re-listing.

mod common;

use std::collections::BTreeSet;

use bigfleet_libvirt_domain::{
    Core, Kind, ListQuery, ListRotation, MachineState, Policy, TransitionResult, parse_cursor,
};
use common::*;

fn states(list: &[MachineState]) -> ListQuery {
    ListQuery {
        states: Some(list.iter().copied().collect()),
        ..ListQuery::default()
    }
}

fn ids(list: &[usize]) -> BTreeSet<String> {
    list.iter().map(|i| id(*i)).collect()
}

#[test]
fn seed_bumps_once_per_machine_and_lists_everything() {
    let core = seeded(5);
    assert_eq!(core.revision(), 5);
    assert_eq!(listed(&core, &ListQuery::default()), ids(&[0, 1, 2, 3, 4]));
    assert_eq!(
        listed(&core, &since(2)),
        ids(&[2, 3, 4]),
        "seed stamps one revision each"
    );
}

#[test]
fn states_filter_none_some_and_empty() {
    let mut core = seeded(3);
    drive(&mut core, &id(1), MachineState::Idle);
    assert_eq!(
        listed(&core, &states(&[MachineState::Speculative])),
        ids(&[0, 2])
    );
    assert_eq!(
        listed(&core, &states(&[MachineState::Idle, MachineState::Failed])),
        ids(&[1])
    );
    assert!(
        listed(&core, &states(&[])).is_empty(),
        "Some(empty) matches nothing"
    );
    assert_eq!(listed(&core, &ListQuery::default()).len(), 3);
}

#[test]
fn max_results_caps_but_the_revision_is_the_head() {
    let core = seeded(5);
    for cap in [1, 2, 5, 9] {
        let page = core.list(&ListQuery {
            max_results: Some(cap),
            ..ListQuery::default()
        });
        assert_eq!(page.machines.len(), cap.min(5), "cap {cap}");
        assert_eq!(page.revision, 5, "head even when capped");
    }
}

#[test]
fn since_revision_is_strictly_greater() {
    let mut core = seeded(3);
    let before = core.revision();
    accept(&mut core, plain(&id(1), Kind::Create));
    let head = core.revision();
    assert_eq!(listed(&core, &since(before)), ids(&[1]));
    assert_eq!(listed(&core, &since(head - 1)), ids(&[1]));
    let page = core.list(&since(head));
    assert!(
        page.machines.is_empty(),
        "a cursor at the head sees nothing"
    );
    assert_eq!(page.revision, head);
}

#[test]
fn extreme_cursors() {
    let core = seeded(3);
    assert_eq!(
        listed(&core, &since(-1)).len(),
        3,
        "negative returns everything"
    );
    assert_eq!(listed(&core, &since(i64::MIN)).len(), 3);
    assert!(listed(&core, &since(i64::MAX)).is_empty());
    assert_eq!(core.list(&since(i64::MAX)).revision, 3);
}

#[test]
fn a_machine_modified_many_times_appears_once_in_a_delta() {
    let mut core = seeded(2);
    let cursor = core.revision();
    drive(&mut core, &id(0), MachineState::Configured);
    let page = core.list(&since(cursor));
    assert_eq!(page.machines.len(), 1);
    assert_eq!(page.machines[0].state, MachineState::Configured);
}

#[test]
fn filters_apply_since_then_state_then_cap() {
    let mut core = seeded(4);
    let cursor = core.revision();
    accept(&mut core, plain(&id(1), Kind::Create));
    accept(&mut core, plain(&id(3), Kind::Create));
    let speculative_delta = ListQuery {
        states: Some([MachineState::Speculative].into()),
        ..since(cursor)
    };
    assert!(
        listed(&core, &speculative_delta).is_empty(),
        "since first: nothing Speculative changed"
    );
    let capped = ListQuery {
        states: Some([MachineState::Creating].into()),
        max_results: Some(1),
        since_revision: Some(0),
    };
    let page = core.list(&capped);
    assert_eq!(page.machines.len(), 1, "state before cap");
    assert_eq!(page.machines[0].state, MachineState::Creating);
    let full = ListQuery {
        states: Some([MachineState::Creating].into()),
        max_results: Some(1),
        ..ListQuery::default()
    };
    assert_eq!(core.list(&full).machines[0].state, MachineState::Creating);
}

#[test]
fn get_unknown_or_empty_is_none() {
    let core = seeded(1);
    assert!(core.get("ghost").is_none());
    assert!(core.get("").is_none());
    assert_eq!(core.get(&id(0)).expect("known").id, mid(0));
}

#[test]
fn nothing_but_real_changes_bumps_the_revision() {
    let policy = Policy {
        delete_supported: false,
        ..policy()
    };
    let mut core = seeded_with(policy, vec![speculative(0), speculative(1)]);
    let ack = accept(&mut core, mutation(&id(0), Kind::Create, token("s", 1, 1)));
    let rev = core.revision();
    let _ = core.list(&ListQuery::default());
    let _ = core.get(&id(0));
    call(&mut core, plain(&id(0), Kind::Create));
    call(&mut core, mutation(&id(0), Kind::Create, token("s", 1, 2)));
    call(&mut core, mutation(&id(0), Kind::Create, token("s", 1, 1)));
    call(&mut core, mutation(&id(1), Kind::Drain, token("s", 1, 1)));
    call(&mut core, mutation("ghost", Kind::Create, token("s", 1, 1)));
    call(&mut core, plain("", Kind::Create));
    call(&mut core, plain(&id(1), Kind::Delete));
    call(&mut core, configure(&id(1), "", Default::default()));
    assert!(
        core.reconcile(vec![speculative(0), speculative(1)])
            .changes
            .is_none()
    );
    let mut stale = completion_for(&ack, success(Kind::Create));
    stale.operation_id = bigfleet_libvirt_domain::OperationId::from_stored("op-9".to_owned());
    core.complete(stale, T0);
    assert_eq!(
        core.revision(),
        rev,
        "reads, retries, rejections, fences, no-op reconcile"
    );
    assert!(listed(&core, &since(rev)).is_empty());
}

#[test]
fn every_accept_and_completion_bumps_exactly_once() {
    let mut core = seeded(1);
    for kind in [Kind::Create, Kind::Configure, Kind::Drain, Kind::Delete] {
        let rev = core.revision();
        let ack = accept(&mut core, plain(&id(0), kind));
        assert_eq!(core.revision(), rev + 1, "{kind} accept");
        settle(&mut core, &ack, success(kind));
        assert_eq!(core.revision(), rev + 2, "{kind} completion");
    }
    let rev = core.revision();
    let ack = accept(&mut core, plain(&id(0), Kind::Create));
    settle(&mut core, &ack, TransitionResult::Failed("x".to_owned()));
    assert_eq!(core.revision(), rev + 2, "a failed completion bumps too");
}

#[test]
fn reconcile_bumps_once_per_changed_machine() {
    let mut core = seeded(3);
    let rev = core.revision();
    let mut pricier = speculative(1);
    pricier.price_per_hour = 0.75;
    let report = core.reconcile(vec![
        speculative(0),
        pricier,
        speculative(2),
        speculative(5),
    ]);
    assert_eq!(core.revision(), rev + 2);
    assert_eq!(report.changes.expect("changed").revision, rev + 2);
    assert_eq!(listed(&core, &since(rev)), ids(&[1, 5]));
}

#[test]
fn cursor_parsing() {
    for (text, expected) in [
        (&b"42"[..], Some(42)),
        (b"+7", Some(7)),
        (b"-3", Some(-3)),
        (b"0", Some(0)),
        (b"-9223372036854775808", Some(i64::MIN)),
        (b"9223372036854775807", Some(i64::MAX)),
    ] {
        assert_eq!(parse_cursor(text), expected, "{text:?}");
    }
    for junk in [
        &b""[..],
        b"abc",
        b"4 2",
        b"42\n",
        b"0x10",
        b"1e3",
        b"+-1",
        b"\xff\xfe",
        b"99999999999999999999",
    ] {
        assert_eq!(parse_cursor(junk), None, "{junk:?}");
    }
}

#[test]
fn the_head_revision_round_trips_as_a_cursor() {
    let mut core = seeded(2);
    let cursor = core.list(&ListQuery::default()).revision.to_string();
    accept(&mut core, plain(&id(0), Kind::Create));
    let parsed = parse_cursor(cursor.as_bytes()).expect("decimal");
    assert_eq!(listed(&core, &since(parsed)), ids(&[0]));
}

fn restarted(core: &Core) -> (Core, i64) {
    let stored = core.snapshot();
    let (restored, changes) = Core::restore(policy(), stored.clone()).expect("restores");
    assert_eq!(
        changes.is_some(),
        stored.machines.iter().any(|m| m.state.is_transitional())
    );
    (restored, stored.revision)
}

#[test]
fn restore_relists_old_cursors_and_keeps_the_counter() {
    let mut core = seeded(3);
    let old_cursor = core.revision();
    drive(&mut core, &id(0), MachineState::Idle);
    let (mut core, stored) = restarted(&core);
    assert_eq!(core.revision(), stored);
    assert_eq!(
        listed(&core, &since(old_cursor)).len(),
        3,
        "pre-restart cursor re-lists"
    );
    assert_eq!(listed(&core, &since(stored - 1)).len(), 3);
    assert!(
        listed(&core, &since(stored)).is_empty(),
        "cursor at the counter: nothing new"
    );
    accept(&mut core, plain(&id(1), Kind::Create));
    assert_eq!(
        listed(&core, &since(stored)),
        ids(&[1]),
        "only post-restart changes"
    );
}

#[test]
fn restore_recovery_bumps_and_shows_in_deltas_at_the_stored_counter() {
    let mut core = seeded(3);
    drive(&mut core, &id(0), MachineState::Creating);
    drive(&mut core, &id(2), MachineState::Deleting);
    let (core, stored) = restarted(&core);
    assert_eq!(
        core.revision(),
        stored + 2,
        "one bump per recovered machine"
    );
    assert_eq!(listed(&core, &since(stored)), ids(&[0, 2]));
}

#[test]
fn deltas_never_repeat_a_machine_across_a_restart() {
    let mut core = seeded(3);
    drive(&mut core, &id(0), MachineState::Creating);
    let (mut core, stored) = restarted(&core);
    drive(&mut core, &id(1), MachineState::Idle);
    let mut pricier = speculative(0);
    pricier.price_per_hour = 0.8;
    assert_eq!(core.reconcile(vec![pricier]).refreshed, vec![mid(0)]);
    for cursor in [0, stored - 1, stored, stored + 1] {
        let page = core.list(&since(cursor)).machines;
        let unique: BTreeSet<String> = page.iter().map(|m| m.id.to_string()).collect();
        assert_eq!(
            page.len(),
            unique.len(),
            "cursor {cursor}: each machine once"
        );
    }
}

/// The encoding memo an adapter keeps on a record never outlives the version it encodes:
/// a change empties it whether the old version is still held elsewhere (copy on write) or
/// not (edited in place), and equality ignores it.
#[test]
fn a_change_empties_the_encoding_memo() {
    let mut core = seeded(2);
    let first = core.get(&id(0)).unwrap();
    assert_eq!(&*first.encoded.get_or_init(|| b"v1".to_vec()), b"v1");
    assert_eq!(
        &*core.get(&id(0)).unwrap().encoded.get_or_init(Vec::new),
        b"v1",
        "an unchanged record keeps its memo"
    );
    // Held elsewhere: the change copies the record, and the copy starts empty.
    accept(&mut core, plain(&id(0), Kind::Create));
    let changed = core.get(&id(0)).unwrap();
    assert!(!changed.encoded.is_set(), "{changed:?}");
    assert!(
        first.encoded.is_set(),
        "the old version keeps its own bytes"
    );
    drop((first, changed));

    // Held by nobody: the change edits the record in place and must still empty the memo.
    core.get(&id(1))
        .unwrap()
        .encoded
        .get_or_init(|| b"old".to_vec());
    accept(&mut core, plain(&id(1), Kind::Create));
    let changed = core.get(&id(1)).unwrap();
    assert!(!changed.encoded.is_set(), "{changed:?}");
    let copy = (*changed).clone();
    copy.encoded.get_or_init(|| b"x".to_vec());
    assert_eq!(copy, *changed, "the memo takes no part in equality");
}

fn capped(query: ListQuery, cap: usize) -> ListQuery {
    ListQuery {
        max_results: Some(cap),
        ..query
    }
}

fn page_ids(core: &Core, query: &ListQuery, rotation: &mut ListRotation) -> Vec<String> {
    let page = core.list_rotating(query, rotation);
    assert_eq!(page.revision, core.revision(), "the revision is the head");
    page.machines.iter().map(|m| m.id.to_string()).collect()
}

#[test]
fn capped_pages_walk_the_whole_set_before_repeating() {
    let core = seeded(7);
    let mut rotation = ListRotation::default();
    let query = capped(ListQuery::default(), 3);
    let pages: Vec<Vec<String>> = (0..3)
        .map(|_| page_ids(&core, &query, &mut rotation))
        .collect();
    assert_eq!(pages[0], [id(0), id(1), id(2)]);
    assert_eq!(pages[1], [id(3), id(4), id(5)]);
    assert_eq!(
        pages[2],
        [id(6), id(0), id(1)],
        "wraps around once the set is walked"
    );
    // One at a time: seven distinct picks, then the walk repeats.
    let one = capped(ListQuery::default(), 1);
    let mut rotation = ListRotation::default();
    let picks: Vec<String> = (0..8)
        .flat_map(|_| page_ids(&core, &one, &mut rotation))
        .collect();
    let distinct: BTreeSet<&String> = picks[..7].iter().collect();
    assert_eq!(distinct.len(), 7, "{picks:?}");
    assert_eq!(picks[7], picks[0]);
}

#[test]
fn a_capped_page_larger_than_the_set_returns_each_record_once() {
    let core = seeded(4);
    let mut rotation = ListRotation::default();
    let query = capped(ListQuery::default(), 3);
    page_ids(&core, &query, &mut rotation);
    let big = capped(ListQuery::default(), 10);
    let page = page_ids(&core, &big, &mut rotation);
    assert_eq!(
        page,
        [id(3), id(0), id(1), id(2)],
        "no duplicates across the wrap"
    );
}

#[test]
fn rotation_applies_the_state_filter_and_skips_what_does_not_match() {
    let mut core = seeded(6);
    drive(&mut core, &id(1), MachineState::Idle);
    drive(&mut core, &id(4), MachineState::Idle);
    let query = capped(states(&[MachineState::Speculative]), 1);
    let mut rotation = ListRotation::default();
    let picks: Vec<String> = (0..5)
        .flat_map(|_| page_ids(&core, &query, &mut rotation))
        .collect();
    assert_eq!(picks, [id(0), id(2), id(3), id(5), id(0)]);
    let none = capped(states(&[MachineState::Failed]), 1);
    assert!(page_ids(&core, &none, &mut rotation).is_empty());
    assert_eq!(
        page_ids(&core, &query, &mut rotation),
        [id(2)],
        "an empty page leaves the rotation where it was"
    );
}

#[test]
fn uncapped_lists_ignore_and_keep_the_rotation() {
    let core = seeded(4);
    let mut rotation = ListRotation::default();
    page_ids(&core, &capped(ListQuery::default(), 1), &mut rotation);
    let before = rotation.clone();
    let full = page_ids(&core, &ListQuery::default(), &mut rotation);
    assert_eq!(
        full,
        [id(0), id(1), id(2), id(3)],
        "a full list is in id order"
    );
    assert_eq!(rotation, before);
    assert_eq!(
        core.list_rotating(&ListQuery::default(), &mut rotation),
        core.list(&ListQuery::default())
    );
}

#[test]
fn capped_deltas_rotate_within_the_delta_only() {
    let mut core = seeded(6);
    let base = core.revision();
    for i in [4, 1, 3] {
        accept(&mut core, plain(&id(i), Kind::Create));
    }
    let query = capped(since(base), 2);
    let mut rotation = ListRotation::default();
    let first = page_ids(&core, &query, &mut rotation);
    let second = page_ids(&core, &query, &mut rotation);
    assert_eq!(first, [id(4), id(1)], "oldest change first");
    assert_eq!(
        second,
        [id(3), id(4)],
        "continues, then wraps inside the delta"
    );
    // A later cursor excludes the earlier position; the walk restarts inside the new delta.
    let later = capped(since(base + 1), 5);
    assert_eq!(page_ids(&core, &later, &mut rotation), [id(1), id(3)]);
    // The full walk has its own position, untouched by deltas.
    assert_eq!(
        page_ids(&core, &capped(ListQuery::default(), 1), &mut rotation),
        [id(0)]
    );
}
