//! The timeline's rules without a process: tracked machines only, time order, the bound per
//! machine, the JSON page; and what it costs at 100,000 machines (printed, not asserted).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

fn timeline_at(clock: &Arc<AtomicU64>) -> Timeline {
    let timeline = Timeline::default();
    let now = Arc::clone(clock);
    timeline.use_clock(move || Timestamp(now.load(Ordering::SeqCst)));
    timeline
}

fn phase(op: &'static str) -> What {
    What::Phase {
        op: phase_index(op),
        millis: 5,
        error: None,
    }
}

fn call(shard: &str, sequence: i64) -> What {
    What::Call(Box::new(Call {
        kind: Kind::Configure,
        shard_id: shard_text(shard),
        epoch: 2,
        sequence,
        answer: None,
    }))
}

#[test]
fn only_tracked_machines_keep_events() {
    let clock = Arc::new(AtomicU64::new(1));
    let timeline = timeline_at(&clock);
    timeline.track(["m1"]);
    timeline.record("m1", None, phase("CreateDomain"));
    timeline.record("unknown", None, phase("CreateDomain"));
    assert_eq!(timeline.events("m1").map(|e| e.len()), Some(1));
    assert_eq!(timeline.events("unknown"), None);
    assert_eq!(timeline.machines(), 1);
}

#[test]
fn without_a_clock_nothing_is_recorded() {
    let timeline = Timeline::default();
    timeline.track(["m1"]);
    timeline.record("m1", None, phase("CreateDomain"));
    assert_eq!(timeline.events("m1"), Some(vec![]));
}

#[test]
fn a_late_event_goes_in_time_order() {
    let clock = Arc::new(AtomicU64::new(100));
    let timeline = timeline_at(&clock);
    timeline.track(["m1"]);
    timeline.record("m1", None, phase("CreateDomain"));
    clock.store(300, Ordering::SeqCst);
    timeline.record("m1", None, phase("Configure"));
    // Stamped when it began, recorded after the later one.
    timeline.record("m1", Some(Timestamp(200)), phase("NodeReady"));
    // Same instant as an earlier one: after it.
    timeline.record("m1", Some(Timestamp(100)), phase("Drain"));
    let ops: Vec<_> = timeline
        .events("m1")
        .unwrap()
        .into_iter()
        .map(|e| match e.what {
            What::Phase { op, .. } => PHASES[usize::from(op)],
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(ops, ["CreateDomain", "Drain", "NodeReady", "Configure"]);
}

#[test]
fn each_machine_keeps_its_newest_events_only() {
    let clock = Arc::new(AtomicU64::new(0));
    let timeline = timeline_at(&clock);
    timeline.track(["m1", "m2"]);
    for i in 0..(EVENTS_PER_MACHINE as u64 + 10) {
        clock.store(i, Ordering::SeqCst);
        timeline.record("m1", None, phase("Drain"));
    }
    timeline.record("m2", None, phase("Drain"));
    let kept = timeline.events("m1").unwrap();
    assert_eq!(kept.len(), EVENTS_PER_MACHINE);
    assert_eq!(kept[0].at, Timestamp(10), "the oldest ten went");
    assert_eq!(timeline.events("m2").unwrap().len(), 1);
}

#[test]
fn texts_are_cut() {
    let long = "é".repeat(MAX_TEXT_BYTES);
    let cut = bounded(&long);
    assert!(cut.len() < MAX_TEXT_BYTES + 32, "{}", cut.len());
    assert!(cut.ends_with(&format!("({} bytes)", long.len())));
    assert_eq!(&*bounded("short"), "short");
    // A console's end says the most: bounded_end keeps it.
    let console = format!("{long} | reboot: Power down");
    let kept = bounded_end(&console);
    assert!(kept.len() < MAX_TEXT_BYTES + 32, "{}", kept.len());
    assert!(
        kept.starts_with(&format!("({} bytes) …", console.len())),
        "{kept}"
    );
    assert!(kept.ends_with("é | reboot: Power down"), "{kept}");
    assert_eq!(&*bounded_end("short"), "short");
}

#[test]
fn the_page_names_each_event() {
    let clock = Arc::new(AtomicU64::new(1_700_000_000_000_000_000));
    let timeline = timeline_at(&clock);
    timeline.track(["m1"]);
    timeline.record("m1", None, call("shard-a", 9));
    timeline.record("m1", None, call("shard-a", 10));
    let at = timeline.now().unwrap();
    // Both calls arrived at the same instant: the newest unanswered one gets the answer.
    timeline.answer("m1", at, Answer::Started("op-7".into()));
    let failed = What::Ended {
        kind: Kind::Configure,
        state: MachineState::Failed,
        millis: 1500,
        error: Some(bounded("bootstrap failed: exit 1")),
    };
    timeline.record("m1", None, failed);
    let shown = "enp1s0 52:54:00:aa:bb:cc 10.0.0.7/24 fe80::1/64";
    timeline.record("m1", None, What::Addresses(bounded(shown)));
    let console = "[ 1.0] Run /init as init process | reboot: Power down";
    timeline.record("m1", None, What::Console(bounded_end(console)));
    let query = Query {
        machine: Some("m1".to_owned()),
    };
    let (status, body) = answer(&timeline, &query);
    assert_eq!(status, 200, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    let events = page["events"].as_array().unwrap();
    assert_eq!(events[0]["event"], "received");
    assert_eq!(events[0]["kind"], "configure");
    assert_eq!(events[0]["shard_id"], "shard-a");
    assert_eq!(events[0]["sequence"], 9);
    assert_eq!(events[0]["answer"], "none");
    assert_eq!(events[0]["at"], "2023-11-14T22:13:20.000Z");
    assert_eq!(events[1]["sequence"], 10);
    assert_eq!(events[1]["answer"], "transition started");
    assert_eq!(events[1]["operation_id"], "op-7");
    assert_eq!(events[2]["event"], "transition failed");
    assert_eq!(events[2]["error"], "bootstrap failed: exit 1");
    assert_eq!(events[2]["duration_ms"], 1500);
    assert_eq!(events[3]["event"], "addresses");
    assert_eq!(events[3]["addresses"], shown);
    assert_eq!(events[3].as_object().unwrap().len(), 4, "{}", events[3]);
    assert_eq!(events[4]["event"], "console");
    assert_eq!(events[4]["console"], console);
    assert_eq!(events[4].as_object().unwrap().len(), 4, "{}", events[4]);
    assert_eq!(page["kept_at_most"], EVENTS_PER_MACHINE);
    assert_eq!(answer(&timeline, &Query::default()).0, 400);
    let unknown = Query {
        machine: Some("nope".to_owned()),
    };
    assert_eq!(answer(&timeline, &unknown).0, 404);
}

fn resident_bytes() -> u64 {
    let me = procfs::process::Process::myself().unwrap();
    me.statm().unwrap().resident * procfs::page_size()
}

const MACHINES: usize = 100_000;

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The first `steps` of a Create → Configure → Drain → Delete walk, as the provider records
/// them: per step a call with a shard and an operation id, its phases, its end (13 events
/// for the whole walk).
fn walk(timeline: &Timeline, id: &str, steps: usize) {
    let mut at = 0;
    let mut next = || {
        at += 1;
        Timestamp(at)
    };
    let phases: [&[&str]; 4] = [
        &["CreateDomain"],
        &["Configure", "NodeReady"],
        &["Drain"],
        &["DeleteDomain"],
    ];
    for (kind, ops) in [Kind::Create, Kind::Configure, Kind::Drain, Kind::Delete]
        .into_iter()
        .zip(phases)
        .take(steps)
    {
        let arrived = next();
        timeline.record(id, Some(arrived), call("shard-0123456789abc", 1));
        timeline.answer(id, arrived, Answer::Started("op-123456".into()));
        for op in ops {
            timeline.record(id, Some(next()), phase(op));
        }
        let end = What::Ended {
            kind,
            state: MachineState::Idle,
            millis: 40,
            error: None,
        };
        timeline.record(id, Some(next()), end);
    }
}

/// The worst a ring holds: calls with a 20-byte shard id and an operation id, failures
/// with a 64-byte message, phases, 16 of them.
fn fill(timeline: &Timeline, id: &str) {
    for i in 0..EVENTS_PER_MACHINE {
        let what = match i % 4 {
            0 => call("shard-0123456789abc", i as i64),
            1 => What::Ended {
                kind: Kind::Configure,
                state: MachineState::Failed,
                millis: 10,
                error: Some(bounded(&"x".repeat(64))),
            },
            _ => phase("Configure"),
        };
        timeline.record(id, Some(Timestamp(i as u64)), what);
        if i % 4 == 0 {
            timeline.answer(id, Timestamp(i as u64), Answer::Started("op-123456".into()));
        }
    }
}

/// What the timeline costs at 100,000 machines: tracked with no events, Created and
/// Configured (7 events), after one full walk each (13 events), and with every ring full
/// of the largest events. The resident
/// memory each takes is printed (a measurement, not a bound; other tests in this binary
/// allocate meanwhile, so these are upper estimates).
#[test]
fn cost_at_100_000_machines() {
    let clock = Arc::new(AtomicU64::new(0));
    let ids: Vec<String> = (0..MACHINES)
        .map(|i| format!("bigfleet-libvirt/OnDemand/m1.large/zone-a/{i}"))
        .collect();
    let before = resident_bytes();
    let walked = timeline_at(&clock);
    walked.track(ids.iter().map(String::as_str));
    let tracked = resident_bytes();
    ids.iter().for_each(|id| walk(&walked, id, 4));
    let walks = resident_bytes().saturating_sub(tracked);
    let in_use = timeline_at(&clock);
    in_use.track(ids.iter().map(String::as_str));
    let start = resident_bytes();
    ids.iter().for_each(|id| walk(&in_use, id, 2));
    let configured = resident_bytes().saturating_sub(start);
    let full = timeline_at(&clock);
    full.track(ids.iter().map(String::as_str));
    let start = resident_bytes();
    ids.iter().for_each(|id| fill(&full, id));
    let fills = resident_bytes().saturating_sub(start);
    assert!(ids.iter().all(|id| walked.events(id).unwrap().len() == 13));
    assert!(ids.iter().all(|id| in_use.events(id).unwrap().len() == 7));
    assert!(
        ids.iter()
            .all(|id| full.events(id).unwrap().len() == EVENTS_PER_MACHINE)
    );
    let per_machine = |b: u64| b / MACHINES as u64;
    println!(
        "timeline at {MACHINES} machines ({} bytes per event): tracked {:.1} MiB; Created and \
         Configured {:.1} MiB more ({} bytes per machine); one full walk {:.1} MiB more ({} \
         bytes per machine); full rings of the largest events {:.1} MiB more ({} bytes per \
         machine)",
        std::mem::size_of::<Event>(),
        mib(tracked.saturating_sub(before)),
        mib(configured),
        per_machine(configured),
        mib(walks),
        per_machine(walks),
        mib(fills),
        per_machine(fills),
    );
}
