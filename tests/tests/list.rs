//! List, revision & pagination (docs/conformance.md §3.8, B901–B909). List is an unordered set with
//! no duplicate ids; this provider's cursor is the ASCII-decimal head revision (docs/contract.md
//! §8), so the capability probe must find SinceRevision and Delete.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;

use crate::harness::*;

/// The eight non-UNSPECIFIED states.
const STATES: [S; 8] = [
    S::Speculative,
    S::Creating,
    S::Idle,
    S::Configuring,
    S::Configured,
    S::Draining,
    S::Deleting,
    S::Failed,
];

/// The ids of a response, asserting none repeats.
fn ids(list: &pb::MachineList, what: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for m in &list.machines {
        assert!(seen.insert(m.id.clone()), "{what}: {} listed twice", m.id);
    }
    seen
}

/// The cursor as this provider mints it: non-empty ASCII decimal.
fn decimal(revision: &[u8]) -> i64 {
    let text = std::str::from_utf8(revision).expect("revision is UTF-8");
    assert!(
        !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()),
        "revision {revision:?} is not ASCII decimal"
    );
    text.parse().expect("revision fits i64")
}

/// List that returns the status instead of panicking.
async fn try_list(
    c: &mut Client,
    states: &[S],
    max: i32,
    since: &[u8],
) -> Result<pb::MachineList, tonic::Status> {
    let filter = pb::ListFilter {
        states: states.iter().map(|s| *s as i32).collect(),
        max_results: max,
        since_revision: since.to_vec(),
    };
    c.list(filter).await.map(tonic::Response::into_inner)
}

/// The revision of an unfiltered List.
async fn revision(c: &mut Client) -> Vec<u8> {
    list_all(c).await.revision
}

/// The extension capability probe (docs/conformance.md §1.2), returning (SinceRevision, Delete).
/// This provider supports both, so a missing capability fails instead of skipping.
async fn probe(server: &Server, c: &mut Client) -> (bool, bool) {
    let r0 = revision(c).await;
    let id = walk_to_idle(server, c).await;
    let r1 = revision(c).await;
    let since = !r0.is_empty() && r1 != r0;
    let deleted = delete(c, &id, None).await;
    let has_delete = code(&deleted) != tonic::Code::Unimplemented;
    if deleted.is_ok() {
        reach(c, &id, S::Speculative, SETTLE).await;
    }
    assert!(
        since,
        "probe: SinceRevision not detected (r0 {r0:?}, r1 {r1:?})"
    );
    assert!(has_delete, "probe: Delete not detected on the core profile");
    (since, has_delete)
}

fn transitional(s: S) -> bool {
    matches!(s, S::Creating | S::Configuring | S::Draining | S::Deleting)
}

/// B901: a single-state filter returns only that state; a multi-state filter returns exactly
/// the union of the single-state lists (allowing only for machines that have since moved).
#[tokio::test]
async fn b901_state_filters_return_exactly_matching_machines() {
    let server = core();
    let mut c = server.client().await;
    for s in STATES {
        let l = list(&mut c, &[s], 0, b"").await;
        ids(&l, &format!("List([{s:?}])"));
        for m in &l.machines {
            assert_eq!(
                state(m),
                s,
                "List([{s:?}]) returned {} in {:?}",
                m.id,
                state(m)
            );
        }
    }
    let idle = walk_to_idle(&server, &mut c).await;
    let configured = walk_to_configured(&server, &mut c, "conf-b901", &[("area", "list")]).await;

    let three = [S::Speculative, S::Idle, S::Configured];
    let union = list(&mut c, &three, 0, b"").await;
    let u = ids(&union, "List([SPECULATIVE, IDLE, CONFIGURED])");
    for m in &union.machines {
        assert!(
            three.contains(&state(m)),
            "{} in {:?} is outside the filter",
            m.id,
            state(m)
        );
    }
    assert!(
        u.contains(&idle),
        "the IDLE machine {idle} is missing from the union"
    );
    assert!(
        u.contains(&configured),
        "the CONFIGURED machine {configured} is missing"
    );

    let mut e = BTreeSet::new();
    for s in three {
        let l = list(&mut c, &[s], 0, b"").await;
        e.extend(ids(&l, &format!("List([{s:?}])")));
    }
    for id in &u {
        assert!(
            e.contains(id),
            "{id} is in the union but in none of the single-state lists"
        );
    }
    for id in e.difference(&u) {
        let m = get(&mut c, id).await.expect("Get");
        assert!(
            !three.contains(&state(&m)),
            "{id} ({:?}) is missing from the union",
            state(&m)
        );
    }
    let idle_only = ids(&list(&mut c, &[S::Idle], 0, b"").await, "List([IDLE])");
    assert!(idle_only.contains(&idle) && !idle_only.contains(&configured));
}

/// B902: max_results is an upper bound (1, 2, 3 return at most that many, at least one, all
/// from the full list) and 0 means no cap.
#[tokio::test]
async fn b902_max_results_caps_and_zero_means_no_cap() {
    let server = core();
    let mut c = server.client().await;
    let full = list_all(&mut c).await;
    let f = ids(&full, "unfiltered List");
    assert!(!f.is_empty(), "empty inventory");
    for n in 1..=3 {
        let l = list(&mut c, &[], n, b"").await;
        let got = ids(&l, &format!("List(max={n})"));
        assert!(
            got.len() <= n as usize,
            "List(max={n}) returned {}",
            got.len()
        );
        assert!(
            got.is_subset(&f),
            "List(max={n}) returned ids outside the full list"
        );
        if f.len() > n as usize {
            assert!(!got.is_empty(), "List(max={n}) returned nothing");
        }
    }
    let uncapped = list(&mut c, &[], 0, b"").await;
    assert_eq!(
        ids(&uncapped, "List(max=0)"),
        f,
        "List(max=0) is not the full list"
    );
}

/// B903: the revision advances after a mutation, and a delta since the old cursor includes
/// the mutated machine (once). Our cursor is decimal and grows.
#[tokio::test]
async fn b903_revision_advances_and_delta_includes_the_mutation() {
    let server = core();
    let mut c = server.client().await;
    probe(&server, &mut c).await;
    let r0 = revision(&mut c).await;
    assert!(!r0.is_empty(), "empty revision");
    let id = walk_to_idle(&server, &mut c).await;
    let r1 = revision(&mut c).await;
    assert_ne!(r1, r0, "revision did not change after a Create");
    assert!(
        decimal(&r1) > decimal(&r0),
        "revision went backwards: {r0:?} → {r1:?}"
    );
    let delta = list(&mut c, &[], 0, &r0).await;
    let d = ids(&delta, "delta");
    assert!(d.contains(&id), "delta since {r0:?} misses {id}");
}

/// B904: with no mutation, a delta since the current revision is empty.
#[tokio::test]
async fn b904_delta_since_head_is_empty() {
    let server = core();
    let mut c = server.client().await;
    probe(&server, &mut c).await;
    let r = revision(&mut c).await;
    decimal(&r);
    let delta = list(&mut c, &[], 0, &r).await;
    assert!(
        delta.machines.is_empty(),
        "delta since head returned {:?}",
        ids(&delta, "delta")
    );
}

/// B905: every mutation changes the revision, and a delta from any earlier cursor covers
/// every machine mutated since that cursor.
#[tokio::test]
async fn b905_delta_from_any_earlier_cursor_covers_later_mutations() {
    let server = core();
    let mut c = server.client().await;
    probe(&server, &mut c).await;
    let mut cursors = vec![revision(&mut c).await];
    let mut walked = Vec::new();
    for i in 0..4 {
        walked.push(walk_to_idle(&server, &mut c).await);
        let next = revision(&mut c).await;
        let prev = cursors.last().unwrap();
        assert_ne!(
            &next, prev,
            "cursor {i} did not change after walking {}",
            walked[i]
        );
        assert!(decimal(&next) > decimal(prev), "cursor went backwards");
        cursors.push(next);
    }
    for k in 0..4 {
        let d = ids(
            &list(&mut c, &[], 0, &cursors[k]).await,
            &format!("delta since c{k}"),
        );
        for m in &walked[k..] {
            assert!(
                d.contains(m),
                "delta since c{k} ({:?}) misses {m}",
                cursors[k]
            );
        }
    }
}

/// B906: an invalid or empty cursor (unset, empty, `not-a-real-cursor`, binary bytes, 4096 ×
/// 0xDE) is treated as no cursor: the call succeeds and returns the full list once each.
#[tokio::test]
async fn b906_garbage_cursors_return_the_full_list() {
    let server = core();
    let mut c = server.client().await;
    let f = ids(&list_all(&mut c).await, "full list");
    assert!(!f.is_empty(), "empty inventory");
    let unset = pb::ListFilter {
        states: vec![],
        max_results: 0,
        since_revision: Vec::new(),
    };
    let l = c
        .list(unset)
        .await
        .expect("List with an unset cursor")
        .into_inner();
    assert!(
        ids(&l, "unset cursor").is_superset(&f),
        "unset cursor: not the full list"
    );
    let garbage: [(&str, Vec<u8>); 4] = [
        ("empty", Vec::new()),
        ("not-a-real-cursor", b"not-a-real-cursor".to_vec()),
        ("00 FF 10 42 7F", vec![0x00, 0xFF, 0x10, 0x42, 0x7F]),
        ("4096 x DE", vec![0xDE; 4096]),
    ];
    for (name, since) in garbage {
        let l = try_list(&mut c, &[], 0, &since)
            .await
            .unwrap_or_else(|e| panic!("cursor {name}: List failed: {e:?}"));
        let got = ids(&l, &format!("cursor {name}"));
        let missing: Vec<_> = f.difference(&got).collect();
        assert!(
            missing.is_empty(),
            "cursor {name}: {} ids missing: {missing:?}",
            missing.len()
        );
    }
}

/// B907: paging with max_results + since_revision loses and duplicates nothing. This
/// provider's cursor is the head revision (not a page continuation), so every page carries
/// the head and the follow-up page is empty; completeness rests on the delta.
#[tokio::test]
async fn b907_paging_with_cursor_loses_and_duplicates_nothing() {
    let server = core();
    let mut c = server.client().await;
    probe(&server, &mut c).await;
    let base = revision(&mut c).await;
    let mut w = BTreeSet::new();
    for _ in 0..5 {
        w.insert(walk_to_idle(&server, &mut c).await);
    }
    let delta = list(&mut c, &[], 0, &base).await;
    let d = ids(&delta, "D");
    assert!(
        d.is_superset(&w),
        "delta since base misses {:?}",
        w.difference(&d).collect::<Vec<_>>()
    );

    let page0 = list(&mut c, &[], 2, &base).await;
    let p0 = ids(&page0, "page0");
    assert!(
        !p0.is_empty() && p0.len() <= 2,
        "page0 has {} machines",
        p0.len()
    );
    assert!(p0.is_subset(&d), "page0 has ids outside D");
    let n0 = page0.revision.clone();
    assert_eq!(
        n0, delta.revision,
        "a capped page's cursor should be the head revision"
    );

    let page1 = list(&mut c, &[], 2, &n0).await;
    let p1 = ids(&page1, "page1");
    assert!(p1.is_disjoint(&p0), "page1 repeats page0 ids");
    let continued = p1.intersection(&d).count();
    if continued > 0 {
        let mut seen: BTreeSet<String> = p0.union(&p1).cloned().collect();
        let mut cursor = page1.revision.clone();
        for _ in 0..64 {
            let page = list(&mut c, &[], 2, &cursor).await;
            let got = ids(&page, "page");
            if got.is_empty() || page.revision == cursor {
                break;
            }
            seen.extend(got);
            cursor = page.revision;
        }
        assert!(
            seen.is_superset(&w),
            "paging lost {:?}",
            w.difference(&seen).collect::<Vec<_>>()
        );
    } else {
        assert!(
            p1.is_empty(),
            "a head-echo cursor yielded a non-empty page1: {p1:?}"
        );
    }
}

/// B908: with no client mutation, background activity does not advance the revision: for
/// 750 ms a delta since the head, polled every 50 ms, stays empty.
#[tokio::test]
async fn b908_quiescent_provider_keeps_the_revision() {
    let server = core();
    let mut c = server.client().await;
    probe(&server, &mut c).await;
    let a = revision(&mut c).await;
    let start = Instant::now();
    // The first poll at once, then every 50 ms until the window has passed.
    for poll in 1.. {
        let delta = list(&mut c, &[], 0, &a).await;
        assert!(
            delta.machines.is_empty(),
            "poll {poll}: quiescent delta returned {:?}",
            ids(&delta, "delta")
        );
        if start.elapsed() >= Duration::from_millis(750) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        revision(&mut c).await,
        a,
        "the head revision moved while quiescent"
    );
}

/// B909: the exact cursor bytes round-trip (a delta since them is empty); corrupted cursors
/// (`!` appended, `~` prepended, 00 FF appended) fall back to the full list without error;
/// the last byte XOR 0x01 succeeds and returns only known ids.
#[tokio::test]
async fn b909_cursor_round_trips_and_corruption_falls_back() {
    let server = core();
    let mut c = server.client().await;
    probe(&server, &mut c).await;
    let full = list_all(&mut c).await;
    let f = ids(&full, "F");
    let cursor = full.revision.clone();
    assert!(!cursor.is_empty(), "empty cursor");
    decimal(&cursor);
    let same = list(&mut c, &[], 0, &cursor).await;
    assert!(
        same.machines.is_empty(),
        "delta since the exact cursor is not empty"
    );

    let mut bang = cursor.clone();
    bang.push(b'!');
    let mut tilde = vec![b'~'];
    tilde.extend_from_slice(&cursor);
    let mut binary = cursor.clone();
    binary.extend_from_slice(&[0x00, 0xFF]);
    for (name, since) in [
        ("cursor+!", bang),
        ("~+cursor", tilde),
        ("cursor+00FF", binary),
    ] {
        let l = try_list(&mut c, &[], 0, &since)
            .await
            .unwrap_or_else(|e| panic!("{name}: List failed: {e:?}"));
        let got = ids(&l, name);
        for id in f.difference(&got) {
            let m = get(&mut c, id).await.expect("Get");
            assert!(
                transitional(state(&m)),
                "{name}: {id} missing from the fallback full list"
            );
        }
    }

    let mut flipped = cursor.clone();
    *flipped.last_mut().unwrap() ^= 0x01;
    let l = try_list(&mut c, &[], 0, &flipped)
        .await
        .unwrap_or_else(|e| panic!("flipped cursor {flipped:?}: List failed: {e:?}"));
    let got = ids(&l, "flipped");
    assert!(got.is_subset(&f), "flipped cursor returned unknown ids");
}

/// What BigFleet's tooling does to pick a slot: `List(SPECULATIVE, max_results=1)`, three
/// times in a row, taking the first machine each time. The picks must differ (B302 as the
/// certification runner drives it depends on it).
#[tokio::test]
async fn back_to_back_capped_picks_return_different_machines() {
    let server = core();
    let mut c = server.client().await;
    let mut picks = Vec::new();
    for _ in 0..3 {
        picks.push(capped_pick(&mut c).await);
    }
    println!("three back-to-back List(SPECULATIVE, max_results=1) picks: {picks:?}");
    let distinct: BTreeSet<&String> = picks.iter().collect();
    assert_eq!(distinct.len(), 3, "picks repeat: {picks:?}");
}

/// Capped pages walk the whole matching set before any machine repeats, apply the state
/// filter, and always carry the head revision.
#[tokio::test]
async fn capped_pages_walk_the_matching_set_without_repeats() {
    let server = core();
    let mut c = server.client().await;
    // Two machines leave Speculative, so the filter has something to skip.
    let busy = [
        walk_to_idle(&server, &mut c).await,
        walk_to_idle(&server, &mut c).await,
    ];
    let full = list_all(&mut c).await;
    let matching: BTreeSet<String> = full
        .machines
        .iter()
        .filter(|m| state(m) == S::Speculative)
        .map(|m| m.id.clone())
        .collect();
    assert!(
        matching.len() > 10,
        "{} Speculative machines",
        matching.len()
    );
    let cap = 7;
    let mut walked = Vec::new();
    while walked.len() < matching.len() {
        let page = list(&mut c, &[S::Speculative], cap, b"").await;
        assert_eq!(
            page.revision, full.revision,
            "a capped page carries the head"
        );
        assert!(
            !page.machines.is_empty(),
            "capped page {} is empty after {} of {} machines: the walk must wrap around to \
             the start of the set, not stop at its end",
            walked.len() / cap as usize + 1,
            walked.len(),
            matching.len()
        );
        assert!(
            page.machines.len() <= cap as usize,
            "a page of {} over the cap of {cap}",
            page.machines.len()
        );
        for m in &page.machines {
            assert_eq!(state(m), S::Speculative, "{} passed the filter", m.id);
            assert!(!busy.contains(&m.id));
        }
        walked.extend(page.machines.iter().map(|m| m.id.clone()));
    }
    let first_lap = &walked[..matching.len()];
    let distinct: BTreeSet<String> = first_lap.iter().cloned().collect();
    assert_eq!(distinct, matching, "one lap covers the set exactly once");
    // The walk is periodic: past the first lap it repeats the lap in the same order.
    let next = list(&mut c, &[S::Speculative], 1, b"").await;
    let expected = &walked[walked.len() % matching.len()];
    assert_eq!(
        next.machines.iter().map(|m| &m.id).collect::<Vec<_>>(),
        vec![expected],
        "past the first lap the walk wraps around: the next pick is the lap's machine {} \
         ({expected})",
        walked.len() % matching.len()
    );
    assert_eq!(
        walked[matching.len()..],
        walked[..walked.len() - matching.len()],
        "the second lap repeats the first in the same order"
    );
}

/// Sixteen shards that each ask for one Speculative machine at the same moment, each on its
/// own connection, get sixteen different machines instead of racing for one.
#[tokio::test]
async fn concurrent_capped_pickers_get_different_machines() {
    let server = core();
    let mut clients = Vec::new();
    for _ in 0..16 {
        clients.push(server.client().await);
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(16));
    let picks = futures::future::join_all(clients.into_iter().map(|mut c| {
        let barrier = std::sync::Arc::clone(&barrier);
        async move {
            barrier.wait().await;
            capped_pick(&mut c).await
        }
    }))
    .await;
    let distinct: BTreeSet<&String> = picks.iter().collect();
    assert_eq!(distinct.len(), 16, "pickers collided: {picks:?}");
}

crate::harness::backend::on_test_driver!(
    b901_state_filters_return_exactly_matching_machines,
    b902_max_results_caps_and_zero_means_no_cap,
    b903_revision_advances_and_delta_includes_the_mutation,
    b904_delta_since_head_is_empty,
    b905_delta_from_any_earlier_cursor_covers_later_mutations,
    b906_garbage_cursors_return_the_full_list,
    b907_paging_with_cursor_loses_and_duplicates_nothing,
    b908_quiescent_provider_keeps_the_revision,
    b909_cursor_round_trips_and_corruption_falls_back,
    back_to_back_capped_picks_return_different_machines,
    capped_pages_walk_the_matching_set_without_repeats,
    concurrent_capped_pickers_get_different_machines,
);

crate::harness::backend::on_real_libvirtd!(
    b903_revision_advances_and_delta_includes_the_mutation,
    back_to_back_capped_picks_return_different_machines,
    concurrent_capped_pickers_get_different_machines,
);
