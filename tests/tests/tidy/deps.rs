//! The crate split's promises, checked on the real dependency graph: the simulator's
//! closure holds neither libvirt's bindings nor redb (so it builds without `libvirt-dev`,
//! and a sim build cannot reach either by accident), nor what only the real servers need
//! (the OTLP exporter, axum, procfs), each of those libraries is linked by
//! exactly one adapter crate, the one that owns it, and no adapter names another adapter
//! (only the composition root wires them together).

use std::collections::BTreeSet;
use std::process::Command;

use super::{declared_dependencies, workspace_metadata, workspace_root};

/// Libraries the simulator must never link, whatever path would bring them in.
const KEPT_OUT_OF_THE_SIM: [&str; 3] = ["virt", "virt-sys", "redb"];

/// What only the real servers link: the OTLP exporter, the HTTP side server's axum (also
/// tonic's router), and procfs (the `process_*` series).
const SERVING_ONLY: [&str; 3] = ["opentelemetry-otlp", "axum", "procfs"];

/// The packages in `package`'s normal and build dependency closure (itself included), as
/// `cargo tree` resolves them for a build of that package alone (its own feature set, as
/// `scripts/sim.sh` builds it), with `rustflags` as `RUSTFLAGS` (`--cfg madsim` for the
/// simulation build's target-specific dependencies).
fn closure(package: &str, rustflags: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .env("RUSTFLAGS", rustflags)
        .args([
            "tree",
            "--locked",
            "--offline",
            "-p",
            package,
            "--edges",
            "normal,build",
            "--prefix",
            "none",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("run cargo tree");
    assert!(
        output.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    packages_in_tree(&String::from_utf8_lossy(&output.stdout))
}

/// The package names of `cargo tree --prefix none` output: the first word of each line.
fn packages_in_tree(tree: &str) -> BTreeSet<String> {
    tree.lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The libraries of [`KEPT_OUT_OF_THE_SIM`] found in `closure`.
fn forbidden_in(closure: &BTreeSet<String>) -> Vec<&'static str> {
    found_in(closure, &KEPT_OUT_OF_THE_SIM)
}

/// The `libraries` found in `closure`.
fn found_in(closure: &BTreeSet<String>, libraries: &[&'static str]) -> Vec<&'static str> {
    libraries
        .iter()
        .copied()
        .filter(|name| closure.contains(*name))
        .collect()
}

#[test]
fn the_simulator_links_neither_libvirt_nor_redb() {
    let sim = closure("bigfleet-libvirt-sim", "");
    assert!(
        sim.contains("bigfleet-libvirt-app"),
        "the simulator is expected to build through the composition root: {sim:?}"
    );
    let found = forbidden_in(&sim);
    assert!(
        found.is_empty(),
        "bigfleet-libvirt-sim's dependency closure contains {found:?}; the simulator must build \
         without libvirt and redb: depend on bigfleet-libvirt-app with default-features = false \
         and never on bigfleet-libvirt-libvirt or bigfleet-libvirt-redb (see `cargo tree -p \
         bigfleet-libvirt-sim -i <crate>` for the path that brings it in)"
    );
}

#[test]
fn the_closure_check_names_what_it_finds() {
    let tree = "bigfleet-libvirt-sim v0.1.0 (/w/sim)\nbigfleet-libvirt-app v0.1.0 (/w/infra/app)\n\
                redb v4.6.0\nvirt v0.5.0\nvirt-sys v0.3.0\nvirtue v1.0.0\n";
    assert_eq!(
        forbidden_in(&packages_in_tree(tree)),
        ["virt", "virt-sys", "redb"]
    );
    assert!(
        forbidden_in(&packages_in_tree(
            "bigfleet-libvirt-sim v0.1.0\nvirtue v1.0.0\n"
        ))
        .is_empty()
    );
}

#[test]
fn the_simulator_links_no_otlp_axum_or_procfs() {
    let hint = "(see `cargo tree -p bigfleet-libvirt-sim -e normal,features -i <crate>` for the \
                path that brings it in): depend on bigfleet-libvirt-observe without its \
                features and on bigfleet-libvirt-app without `serve`, and turn on no tonic \
                default or `router` feature outside the binary";
    let plain = closure("bigfleet-libvirt-sim", "");
    let found = found_in(&plain, &SERVING_ONLY);
    assert!(
        found.is_empty(),
        "bigfleet-libvirt-sim's dependency closure contains {found:?} {hint}"
    );
    // As scripts/sim.sh builds it. madsim-tonic itself depends on tonic with tonic's default
    // features, whose `router` brings axum into that build whatever this workspace asks
    // for (`no_crate_asks_for_tonics_router` keeps the rest of the workspace from it); the
    // OTLP exporter and procfs stay out there too.
    let madsim = closure("bigfleet-libvirt-sim", "--cfg madsim");
    assert!(
        madsim.contains("madsim-tonic"),
        "the --cfg madsim closure is expected to hold madsim-tonic: {madsim:?}"
    );
    let found = found_in(&madsim, &["opentelemetry-otlp", "procfs"]);
    assert!(
        found.is_empty(),
        "bigfleet-libvirt-sim's --cfg madsim closure contains {found:?} {hint}"
    );
}

#[test]
fn the_serving_check_names_what_it_finds() {
    let tree = "bigfleet-libvirt-sim v0.1.0\naxum v0.8.9\naxum-core v0.5.6\nprocfs v0.18.0\n\
                opentelemetry-otlp v0.33.1\n";
    assert_eq!(
        found_in(&packages_in_tree(tree), &SERVING_ONLY),
        ["opentelemetry-otlp", "axum", "procfs"]
    );
    let clean = "bigfleet-libvirt-sim v0.1.0\naxum-core v0.5.6\nprocfs-core v0.18.0\n";
    assert!(found_in(&packages_in_tree(clean), &SERVING_ONLY).is_empty());
}

/// Every workspace crate's normal dependency on tonic: (crate, default features on,
/// features asked for).
fn tonic_dependencies() -> Vec<(String, bool, Vec<String>)> {
    let metadata = workspace_metadata();
    let mut found = Vec::new();
    for package in metadata["packages"].as_array().unwrap() {
        for dep in package["dependencies"].as_array().unwrap() {
            if dep["name"] == "tonic" && dep["kind"].is_null() {
                let features = dep["features"].as_array().unwrap().iter();
                found.push((
                    package["name"].as_str().unwrap().to_owned(),
                    dep["uses_default_features"].as_bool().unwrap(),
                    features.map(|f| f.as_str().unwrap().to_owned()).collect(),
                ));
            }
        }
    }
    found
}

#[test]
fn no_crate_asks_for_tonics_router() {
    let deps = tonic_dependencies();
    assert!(
        deps.iter()
            .any(|(name, ..)| name == "bigfleet-libvirt-grpc"),
        "the grpc crate is expected to depend on tonic: {deps:?}"
    );
    // The composition root turns `tonic/router` on in its `serve` feature, which the
    // binary enables and the simulator does not.
    for (name, defaults, features) in deps {
        assert!(
            !defaults && !features.iter().any(|f| f == "router"),
            "{name} depends on tonic with default features {defaults} and {features:?}: \
             tonic's defaults and `router` bring axum, which the simulator must not link; \
             ask for `server` or `channel` (workspace tonic has default-features = false)"
        );
    }
}

#[test]
fn libvirt_and_redb_are_each_linked_by_one_adapter() {
    let owners: &[(&str, &str)] = &[
        ("virt", "bigfleet-libvirt-libvirt"),
        ("redb", "bigfleet-libvirt-redb"),
    ];
    for (library, owner) in owners {
        let users: Vec<String> = declared_dependencies()
            .into_iter()
            .filter(|(_, deps)| deps.contains(*library))
            .map(|(name, _)| name)
            .collect();
        assert_eq!(
            users,
            [owner.to_string()],
            "only {owner} may depend on {library}; other crates reach it through that adapter"
        );
    }
}

#[test]
fn adapters_use_only_the_shared_crates_below_them() {
    // Each infra crate and the workspace crates it may depend on; only the composition root
    // (`app`) and the binary may name the adapters themselves.
    let shared: &[(&str, &[&str])] = &[
        ("bigfleet-libvirt-system", &[]),
        ("bigfleet-libvirt-config", &[]),
        ("bigfleet-libvirt-observe", &["system"]),
        ("bigfleet-libvirt-memory", &["config"]),
        ("bigfleet-libvirt-redb", &[]),
        ("bigfleet-libvirt-grpc", &["system", "observe"]),
        ("bigfleet-libvirt-libvirt", &["config", "system", "observe"]),
    ];
    let core = ["domain", "ports", "proto"];
    let declared = declared_dependencies();
    for (crate_name, permitted) in shared {
        let (_, deps) = declared
            .iter()
            .find(|(name, _)| name == crate_name)
            .unwrap_or_else(|| panic!("{crate_name} is not in the workspace"));
        let extra: Vec<&str> = deps
            .iter()
            .filter_map(|d| d.strip_prefix("bigfleet-libvirt-"))
            .filter(|d| !core.contains(d) && !permitted.contains(d))
            .collect();
        assert!(
            extra.is_empty(),
            "{crate_name} must not depend on the workspace crates {extra:?}: an adapter uses \
             only domain, ports, proto and {permitted:?}; wire adapters together in \
             bigfleet-libvirt-app instead (docs/architecture.md)"
        );
    }
}

/// clap stays at the edge (docs/design.md §2.3): the binary declares it, and the composition
/// root only as an optional dependency of the `libvirt` feature that brings `launch`, where
/// the flags are declared once. No other crate declares it, and the simulator never links it.
#[test]
fn clap_is_declared_only_by_the_binary_and_the_roots_launch() {
    let metadata = workspace_metadata();
    let mut declared = Vec::new();
    for package in metadata["packages"].as_array().unwrap() {
        for dep in package["dependencies"].as_array().unwrap() {
            if dep["name"] == "clap" && dep["kind"].is_null() {
                declared.push((
                    package["name"].as_str().unwrap().to_owned(),
                    dep["optional"].as_bool().unwrap(),
                ));
            }
        }
    }
    declared.sort();
    assert_eq!(
        declared,
        [
            ("bigfleet-libvirt".to_owned(), false),
            ("bigfleet-libvirt-app".to_owned(), true),
        ],
        "clap belongs to the binary and, optionally, to app's `launch` (infra/app/src/launch/flags.rs)"
    );
    let app = &metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|package| package["name"] == "bigfleet-libvirt-app")
        .unwrap()["features"];
    assert!(
        app["libvirt"]
            .as_array()
            .unwrap()
            .iter()
            .any(|feature| feature == "dep:clap"),
        "app's clap must come with the `libvirt` feature (the one that compiles `launch`): {app}"
    );
    let sim = closure("bigfleet-libvirt-sim", "");
    assert!(
        !sim.contains("clap"),
        "bigfleet-libvirt-sim's dependency closure contains clap: depend on bigfleet-libvirt-app \
         without the `libvirt` feature"
    );
}
