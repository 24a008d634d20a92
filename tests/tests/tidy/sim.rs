//! The simulator's shape (sim/README.md): everything that acts in a run (the fakes, the
//! provider process in `server.rs`, the shards in `workload/`, the span layer) only
//! appends what it saw to the history; the checkers read the history and judge it, and
//! only the scenario, which runs a run, runs them. So no file under `sim/src/` names the
//! checkers module but the scenario (`scenario.rs`), the checkers themselves
//! (`checkers/`) and the crate root's declaration of the module.

use super::citing_files;

/// The simulator's sources, from the repository root.
const SIM_SRC: &str = "sim/src/";

/// The files that may name the checkers: the one that runs a scenario, and the checkers.
const MAY_NAME_CHECKERS: [&str; 2] = ["sim/src/scenario.rs", "sim/src/checkers/"];

/// The crate root, which may name the checkers module only to declare it.
const CRATE_ROOT: (&str, &str) = ("sim/src/lib.rs", "pub mod checkers;");

/// Every `path:line` of `files` under [`SIM_SRC`], outside [`MAY_NAME_CHECKERS`], whose
/// code (comment lines aside) names the checkers module.
fn naming_checkers(files: &[(String, String)]) -> Vec<String> {
    files
        .iter()
        .filter(|(path, _)| path.starts_with(SIM_SRC))
        .filter(|(path, _)| !MAY_NAME_CHECKERS.iter().any(|may| path.starts_with(may)))
        .flat_map(|(path, text)| {
            text.lines()
                .enumerate()
                .filter(|(_, line)| !line.trim_start().starts_with("//"))
                .filter(|(_, line)| line.contains("checkers"))
                .filter(move |(_, line)| (path.as_str(), line.trim()) != CRATE_ROOT)
                .map(move |(n, line)| format!("{path}:{}: {}", n + 1, line.trim()))
        })
        .collect()
}

#[test]
fn only_the_scenario_names_the_checkers() {
    let root = super::workspace_root();
    let files: Vec<(String, String)> = citing_files()
        .into_iter()
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let relative = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (relative, text)
        })
        .collect();
    for expected in ["sim/src/fakes/", "sim/src/server.rs", "sim/src/workload/"] {
        assert!(
            files.iter().any(|(path, _)| path.starts_with(expected)),
            "no simulator sources found under {expected}"
        );
    }
    let calls = naming_checkers(&files);
    assert!(
        calls.is_empty(),
        "only the scenario (sim/src/scenario.rs) runs the checkers: a fake, the provider \
         process (server.rs) or a shard (workload/) records what it saw in the history \
         (world.record(Event::...)) and a checker reads it from there:\n{}",
        calls.join("\n")
    );
}

#[test]
fn the_checkers_rule_catches_any_other_file_naming_them() {
    let file = |path: &str, text: &str| (path.to_owned(), text.to_owned());
    let files = [
        file(
            "sim/src/fakes/store.rs",
            "    checkers::durable::on_commit(&w, &s);",
        ),
        file(
            "sim/src/fakes/hypervisor.rs",
            "// the checkers read this later",
        ),
        file("sim/src/server.rs", "use crate::checkers;"),
        file(
            "sim/src/workload/calls.rs",
            "        online::on_send(&self.checkers, scope, token);",
        ),
        file(
            "sim/src/scenario.rs",
            "use crate::checkers::{self, Checkers, quiescence};",
        ),
        file(
            "sim/src/checkers/mod.rs",
            "pub fn read_history(checkers: &C)",
        ),
        file("sim/src/lib.rs", "pub mod checkers;\npub use checkers::*;"),
        file(
            "sim/tests/sim.rs",
            "use bigfleet_libvirt_sim::checkers::Checkers;",
        ),
    ];
    assert_eq!(
        naming_checkers(&files),
        [
            "sim/src/fakes/store.rs:1: checkers::durable::on_commit(&w, &s);",
            "sim/src/server.rs:1: use crate::checkers;",
            "sim/src/workload/calls.rs:1: online::on_send(&self.checkers, scope, token);",
            "sim/src/lib.rs:2: pub use checkers::*;",
        ]
    );
}
