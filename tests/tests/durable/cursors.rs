//! Part 3: Revision cursors across a restart: old cursors re-list, the head never goes back,
//! recoveries and later changes show up in deltas.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;

use super::*;
use crate::harness::*;

/// A cursor taken before the kill re-lists everything after the restart; a cursor at the
/// post-restart head yields nothing; the head never goes backwards; a transition cut off by
/// the kill shows up in the delta from the pre-kill head (its recovery bumps the revision);
/// later changes show up in deltas from the new head.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revision_cursors_survive_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Fault hooks only so that one transition can be held open across the second kill.
    let args = lane_args(
        &dir.path().join("cursor-state.redb"),
        64,
        &["--fake-fault-hooks", "--transition-timeout=30s"],
    );
    let mut server = boot(&args);
    let mut c = server.client().await;
    let boot_list = list_all(&mut c).await;
    let total = boot_list.machines.len();
    let old_cursor = boot_list.revision.clone();
    let a = walk_to_idle(&server, &mut c).await;
    let b = walk_to_configured(&server, &mut c, "cursor-cluster", &[("c/k", "v")]).await;
    let head_before = list_all(&mut c).await.revision;
    assert!(
        decimal(&head_before) > decimal(&old_cursor),
        "mutations did not advance the revision"
    );
    let mut claimed: BTreeSet<String> = [a.clone(), b.clone()].into();
    sigkill(&mut server);

    let mut server = boot(&args);
    let mut c = server.client().await;
    let full = list_all(&mut c).await;
    let head = full.revision.clone();
    assert!(
        decimal(&head) >= decimal(&head_before),
        "head went backwards across the restart: {:?} -> {:?}",
        String::from_utf8_lossy(&head_before),
        String::from_utf8_lossy(&head)
    );
    let relist = list(&mut c, &[], 0, &old_cursor).await;
    assert_eq!(
        relist.machines.len(),
        total,
        "a pre-restart cursor must re-list every machine"
    );
    let full_view: BTreeMap<String, _> = full
        .machines
        .iter()
        .map(|m| (m.id.clone(), durable_view(m)))
        .collect();
    for m in &relist.machines {
        assert_eq!(
            full_view.get(&m.id),
            Some(&durable_view(m)),
            "re-listed {} differs",
            m.id
        );
    }
    assert_eq!(
        state(
            relist
                .machines
                .iter()
                .find(|m| m.id == b)
                .expect("b re-listed")
        ),
        S::Configured
    );
    let at_head = list(&mut c, &[], 0, &head).await;
    assert!(
        at_head.machines.is_empty(),
        "List(since=head) right after the restart returned {:?}",
        at_head.machines.iter().map(|m| &m.id).collect::<Vec<_>>()
    );
    let at_old_head = list(&mut c, &[], 0, &head_before).await;
    assert!(
        at_old_head.machines.is_empty(),
        "quiescent kill: nothing changed after the pre-kill head, yet got {:?}",
        at_old_head
            .machines
            .iter()
            .map(|m| &m.id)
            .collect::<Vec<_>>()
    );

    // A post-restart change shows in the delta from the new head, and only it.
    let fresh = pick_excluding(&mut c, &claimed).await;
    claimed.insert(fresh.clone());
    create(&mut c, &fresh, None)
        .await
        .expect("post-restart Create");
    let delta = list(&mut c, &[], 0, &head).await;
    let ids: BTreeSet<&str> = delta.machines.iter().map(|m| m.id.as_str()).collect();
    assert!(
        ids.contains(fresh.as_str()),
        "the post-restart Create is missing from the delta"
    );
    assert!(
        ids.len() == 1,
        "the delta holds more than the one change: {ids:?}"
    );
    assert!(
        decimal(&delta.revision) > decimal(&head),
        "the head did not advance"
    );
    reach(&mut c, &fresh, S::Idle, WALK).await;

    // Second kill with a transition held open: its recovery shows in the delta from the
    // pre-kill head, and the head still does not go backwards.
    let held = pick_excluding(&mut c, &claimed).await;
    create(&mut c, &held, None).await.expect("Create");
    reach(&mut c, &held, S::Idle, WALK).await;
    configure(&mut c, &held, "fault-timeout", &[("h/k", "v")], None)
        .await
        .expect("held Configure ack");
    reach(&mut c, &held, S::Configuring, Duration::from_secs(5)).await;
    let head_before = list_all(&mut c).await.revision;
    sigkill(&mut server);

    let server = boot(&args);
    let mut c = server.client().await;
    let head = list_all(&mut c).await.revision;
    assert!(
        decimal(&head) > decimal(&head_before),
        "restart recovery must bump the revision: {:?} -> {:?}",
        String::from_utf8_lossy(&head_before),
        String::from_utf8_lossy(&head)
    );
    let delta = list(&mut c, &[], 0, &head_before).await;
    let ids: Vec<&str> = delta.machines.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, vec![held.as_str()], "delta from the pre-kill head");
    assert_eq!(state(&delta.machines[0]), S::Failed);
    assert!(is_interrupted(&delta.machines[0].last_error, "configure"));
    let relist = list(&mut c, &[], 0, &old_cursor).await;
    assert_eq!(
        relist.machines.len(),
        total,
        "the oldest cursor must still re-list everything"
    );
}
