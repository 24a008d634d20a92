//! One composition root (docs/architecture.md §2): every builder of the provider (the
//! binary, the simulator, the benchmarks) goes through `app::assemble`, so a decorator or a
//! hand-off added there reaches all of them, and one builder of the gRPC service
//! (`app::capacity_server`), which the binary's `serve` and the simulator both host. Checked
//! where it would break: outside the ports crate's own tests and the contract suites, the
//! metrics decorator is applied, and `Provider::start` called, only in
//! `infra/app/src/assemble.rs`; `CapacityService::new` is called only in
//! `infra/app/src/service.rs`.

use std::path::Path;

use super::{citing_files, workspace_root};

/// Where the one composition root lives.
const ROOT: &str = "infra/app/src/assemble.rs";

/// Where the one builder of the gRPC service lives.
const SERVICE: &str = "infra/app/src/service.rs";

/// The calls only one file makes: the call, that file, and the places allowed it besides:
/// the contract suites wrap the fake themselves, and the provider's own unit tests start it
/// bare.
const ROOT_ONLY: &[(&str, &str, &[&str])] = &[
    (
        "InstrumentedHypervisor::new(",
        ROOT,
        &["contract_tests.rs", "testkit/"],
    ),
    ("Provider::start(", ROOT, &["ports/src/"]),
    ("CapacityService::new(", SERVICE, &[]),
];

/// Every `path:line` (paths from the repository root) that makes one of [`ROOT_ONLY`]'s
/// calls outside the root and its allowed places. Comment lines are not calls.
fn stray_builders(files: &[(String, String)]) -> Vec<String> {
    let mut stray = Vec::new();
    for (path, text) in files {
        for (call, home, allowed) in ROOT_ONLY {
            if path == home || allowed.iter().any(|a| path.contains(a)) {
                continue;
            }
            for (n, line) in text.lines().enumerate() {
                if !line.trim_start().starts_with("//") && line.contains(call) {
                    stray.push(format!("{path}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    stray
}

/// How many times the root itself makes each call.
fn root_calls(text: &str, call: &str) -> usize {
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//") && line.contains(call))
        .count()
}

/// The repository's Rust sources, by path from its root, the tidy test's own aside (it
/// names the calls it looks for).
fn rust_sources(root: &Path) -> Vec<(String, String)> {
    citing_files()
        .into_iter()
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .map(|path| {
            let relative = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (relative, std::fs::read_to_string(&path).unwrap())
        })
        .filter(|(path, _)| !path.starts_with("tests/tests/tidy"))
        .collect()
}

#[test]
fn the_provider_is_built_by_one_composition_root() {
    let root = workspace_root();
    let sources = rust_sources(&root);
    let stray = stray_builders(&sources);
    assert!(
        stray.is_empty(),
        "build the provider through app::assemble ({ROOT}) and the gRPC service through \
         app::capacity_server ({SERVICE}), not by hand:\n{}",
        stray.join("\n")
    );
    for (call, home, _) in ROOT_ONLY {
        let (_, text) = sources.iter().find(|(path, _)| path == home).unwrap();
        assert_eq!(root_calls(text, call), 1, "{home} makes `{call}` once");
    }
}

#[test]
fn the_root_check_catches_a_second_builder() {
    let file = |path: &str, text: &str| (path.to_owned(), text.to_owned());
    let bypass = [
        file(
            ROOT,
            "let h = InstrumentedHypervisor::new(h, m);\nProvider::start(c, h)",
        ),
        file(
            "sim/src/server.rs",
            "    let h = InstrumentedHypervisor::new(raw, metrics);",
        ),
        file(
            "tests/benches/b.rs",
            "let p = Provider::start(config, h, s, c, e, vec![]);",
        ),
        file(
            "infra/memory/src/fake/contract_tests.rs",
            "InstrumentedHypervisor::new(f, m)",
        ),
        file(
            "ports/src/provider/tests.rs",
            "Provider::start(config, host, disk)",
        ),
        file(
            "infra/app/src/run.rs",
            "// not InstrumentedHypervisor::new(raw, metrics)",
        ),
        file(SERVICE, "let service = CapacityService::new(p, m, s);"),
        file(
            "sim/src/server.rs",
            "let service = CapacityService::new(provider, grpc, settings);",
        ),
    ];
    assert_eq!(
        stray_builders(&bypass),
        [
            "sim/src/server.rs:1: let h = InstrumentedHypervisor::new(raw, metrics);",
            "tests/benches/b.rs:1: let p = Provider::start(config, h, s, c, e, vec![]);",
            "sim/src/server.rs:1: let service = CapacityService::new(provider, grpc, settings);",
        ]
    );
    assert_eq!(
        root_calls("a\n// Provider::start(\n", "Provider::start("),
        0
    );
}
