//! The crate split's two promises, checked on the real dependency graph: the simulator's
//! closure holds neither libvirt's bindings nor redb (so it builds without `libvirt-dev`,
//! and a sim build cannot reach either by accident), each of those libraries is linked by
//! exactly one adapter crate, the one that owns it, and no adapter names another adapter
//! (only the composition root wires them together).

use std::collections::BTreeSet;
use std::process::Command;

use super::{declared_dependencies, workspace_root};

/// Libraries the simulator must never link, whatever path would bring them in.
const KEPT_OUT_OF_THE_SIM: [&str; 3] = ["virt", "virt-sys", "redb"];

/// The packages in `package`'s normal and build dependency closure (itself included), as
/// `cargo tree` resolves them for a build of that package alone (its own feature set, as
/// `scripts/sim.sh` builds it).
fn closure(package: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
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
    KEPT_OUT_OF_THE_SIM
        .into_iter()
        .filter(|name| closure.contains(*name))
        .collect()
}

#[test]
fn the_simulator_links_neither_libvirt_nor_redb() {
    let sim = closure("bigfleet-libvirt-sim");
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
