//! Mechanical rules that keep the hexagon honest (design.md §2, style R2/R27): the pure
//! core depends on nothing async or IO, every product source file says what it is for, no
//! stub or debug macro ships, and no file grows past the hard size limit.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// The normal (non-dev, non-build) dependencies each workspace crate declares.
fn declared_dependencies() -> Vec<(String, BTreeSet<String>)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|package| {
            let deps = package["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null() && d["target"].is_null())
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .collect();
            (package["name"].as_str().unwrap().to_owned(), deps)
        })
        .collect()
}

#[test]
fn dependencies_point_inward() {
    let allowed: &[(&str, &[&str])] = &[
        ("bigfleet-libvirt-domain", &["thiserror", "serde"]),
        (
            "bigfleet-libvirt-ports",
            &["bigfleet-libvirt-domain", "futures", "tracing", "thiserror"],
        ),
        ("bigfleet-libvirt-proto", &["prost", "tonic", "tonic-prost"]),
    ];
    let declared = declared_dependencies();
    for (crate_name, permitted) in allowed {
        let (_, deps) = declared
            .iter()
            .find(|(name, _)| name == crate_name)
            .unwrap_or_else(|| panic!("{crate_name} is not in the workspace"));
        let extra: Vec<&String> = deps
            .iter()
            .filter(|d| !permitted.contains(&d.as_str()))
            .collect();
        assert!(
            extra.is_empty(),
            "{crate_name} must not depend on {extra:?} (design.md §2)"
        );
    }
}

fn product_sources() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = Vec::new();
    for dir in ["domain/src", "ports/src", "infra/src", "proto/src"] {
        collect(&root.join(dir), &mut files);
    }
    files
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

#[test]
fn every_product_file_starts_with_a_module_doc() {
    let missing: Vec<PathBuf> = product_sources()
        .into_iter()
        .filter(|path| {
            !std::fs::read_to_string(path)
                .unwrap()
                .trim_start()
                .starts_with("//!")
        })
        .collect();
    assert!(
        missing.is_empty(),
        "files without a //! module doc: {missing:?}"
    );
}

#[test]
fn no_stub_or_debug_macro_ships() {
    let banned = ["todo!(", "unimplemented!(", "dbg!("];
    for path in product_sources() {
        let text = std::fs::read_to_string(&path).unwrap();
        for macro_call in banned {
            assert!(
                !text.contains(macro_call),
                "{} contains {macro_call}",
                path.display()
            );
        }
    }
}

#[test]
fn no_product_file_exceeds_the_hard_size_limit() {
    for path in product_sources() {
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        assert!(
            lines <= 800,
            "{} has {lines} lines (hard limit 800: split it)",
            path.display()
        );
    }
}
