mod common;
use std::collections::BTreeMap;
use common::script::{Harness, steps};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
#[test]
fn stats() {
    let mut runner = TestRunner::default();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..64 {
        let script = steps(60).new_tree(&mut runner).unwrap().current();
        let mut h = Harness::new();
        for s in &script {
            let c = h.run(s);
            let tag = format!("{:?}", s).split_whitespace().next().unwrap().to_owned();
            *counts.entry(format!("{tag} changed={}", c.is_some())).or_default() += 1;
            for m in h.core.snapshot().machines { *counts.entry(format!("state {:?}", m.state)).or_default() += 1; }
        }
    }
    println!("{counts:#?}");
}
