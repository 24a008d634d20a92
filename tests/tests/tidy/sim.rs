//! The simulator's cycle around `World` (sim/README.md): the fakes act and append what they
//! saw to the history; only the checkers judge it. So no file under `sim/src/fakes/` names
//! the checkers module.

use super::citing_files;

/// Where the fakes live, from the repository root.
const FAKES: &str = "sim/src/fakes/";

/// Every `path:line` of `files` under [`FAKES`] whose code (comment lines aside) names the
/// checkers module.
fn fakes_calling_checkers(files: &[(String, String)]) -> Vec<String> {
    files
        .iter()
        .filter(|(path, _)| path.starts_with(FAKES))
        .flat_map(|(path, text)| {
            text.lines()
                .enumerate()
                .filter(|(_, line)| !line.trim_start().starts_with("//"))
                .filter(|(_, line)| line.contains("checkers"))
                .map(move |(n, line)| format!("{path}:{}: {}", n + 1, line.trim()))
        })
        .collect()
}

#[test]
fn no_fake_calls_a_checker() {
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
    assert!(
        files.iter().any(|(path, _)| path.starts_with(FAKES)),
        "no fakes found under {FAKES}"
    );
    let calls = fakes_calling_checkers(&files);
    assert!(
        calls.is_empty(),
        "a fake records what it saw in the history (world.record) instead of calling a \
         checker:\n{}",
        calls.join("\n")
    );
}

#[test]
fn the_fake_check_catches_a_fake_calling_a_checker() {
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
        file(
            "sim/src/server.rs",
            "checkers::online::on_answer(&w, &r, &a);",
        ),
    ];
    assert_eq!(
        fakes_calling_checkers(&files),
        ["sim/src/fakes/store.rs:1: checkers::durable::on_commit(&w, &s);"]
    );
}
