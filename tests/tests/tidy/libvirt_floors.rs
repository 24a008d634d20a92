//! The libvirt adapter's floors (docs/architecture.md §7): `infra/libvirt/src` is one folder
//! a subsystem, and a folder uses only the folders drawn below it. Checked on the code's own
//! paths: a product file of a folder names another folder only as `crate::<folder>`, and
//! only a folder [`FLOORS`] lets it use; it never reaches the crate's face (`lib.rs`, which
//! stands above every folder) through `crate::<item>`, `crate::{...}` or `super::` out of
//! its folder. Unit-test files (`*_tests.rs`, `tests.rs`, `src/tests/`) may reach anywhere.

use std::collections::BTreeSet;
use std::path::Path;

use super::workspace_root;

/// The adapter's sources, from the repository root.
const SRC: &str = "infra/libvirt/src";

/// Each folder, bottom floor first, and the folders it may use. The same arrows as the
/// table of docs/architecture.md §7 (checked by `the_floors_are_drawn_as_the_rule_keeps_them`).
const FLOORS: &[(&str, &[&str])] = &[
    ("options", &[]),
    ("metrics", &[]),
    ("render", &["options"]),
    ("host", &["options", "metrics", "render"]),
    ("storage", &["options", "render", "host"]),
    ("guest", &["options", "host"]),
    ("doctor", &["options", "render", "host"]),
    (
        "drift",
        &["options", "metrics", "render", "host", "storage"],
    ),
    (
        "service",
        &[
            "options", "metrics", "render", "host", "storage", "guest", "drift",
        ],
    ),
];

/// Whether `file` (relative to its folder) is a unit-test file, which the rule leaves alone.
fn is_test_file(name: &str) -> bool {
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// The lines of `text` that are product code: comment lines and `#[cfg(test)]` modules
/// aside. Each with its 1-based line number.
fn code_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((n, line)) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") {
            continue;
        }
        if trimmed == "#[cfg(test)]" {
            let Some((_, next)) = lines.peek() else { break };
            let next = next.trim_start();
            if next.starts_with("mod ") || next.starts_with("#[path") {
                // An inline test module runs to its closing brace; `mod tests;` is one line.
                let mut depth = 0usize;
                let mut opened = false;
                for (_, line) in lines.by_ref() {
                    depth += line.matches('{').count();
                    depth = depth.saturating_sub(line.matches('}').count());
                    opened |= line.contains('{');
                    if (opened && depth == 0) || (!opened && line.trim_end().ends_with(';')) {
                        break;
                    }
                }
                continue;
            }
        }
        out.push((n + 1, line));
    }
    out
}

/// The word after each `crate::` on `line` (`{` for a group).
fn crate_paths(line: &str) -> Vec<String> {
    line.match_indices("crate::")
        .filter(|(at, _)| {
            // `bigfleet_libvirt_crate::` and the like are not this crate.
            !line[..*at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
        })
        .map(|(at, _)| {
            let rest = &line[at + "crate::".len()..];
            if rest.starts_with('{') {
                return "{".to_owned();
            }
            rest.chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

/// What is wrong with one product file of `folder`: each problem as `path:line: why`.
fn file_problems(folder: &str, path: &str, is_face: bool, text: &str) -> Vec<String> {
    let folders: BTreeSet<&str> = FLOORS.iter().map(|(name, _)| *name).collect();
    let allowed: &[&str] = FLOORS
        .iter()
        .find(|(name, _)| *name == folder)
        .map_or(&[], |(_, allowed)| allowed);
    let mut problems = Vec::new();
    for (n, line) in code_lines(text) {
        let mut why = Vec::new();
        if line.contains("super::super") || (is_face && line.contains("super::")) {
            why.push("reaches out of its folder through `super::`; name `crate::<folder>`".into());
        }
        for word in crate_paths(line) {
            if word == folder {
                continue;
            }
            if folders.contains(word.as_str()) {
                if !allowed.contains(&word.as_str()) {
                    why.push(format!(
                        "`{folder}` may not use `{word}` (it may use {allowed:?}): the import \
                         runs back up, or sideways, across the floors of docs/architecture.md §7"
                    ));
                }
            } else {
                why.push(format!(
                    "names the crate's face (`crate::{word}`); lib.rs stands above every folder: \
                     import the item from its folder"
                ));
            }
        }
        problems.extend(
            why.into_iter()
                .map(|w| format!("{path}:{n}: {w}: {}", line.trim())),
        );
    }
    problems
}

/// Every product `.rs` file under `dir`, with its path from `root`.
fn sources(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.push((relative, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

#[test]
fn libvirt_folders_import_only_the_floors_below_them() {
    let root = workspace_root();
    let src = root.join(SRC);
    let mut problems = Vec::new();
    let mut on_disk = BTreeSet::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let Some(folder) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        if !path.is_dir() || folder == "tests" {
            continue;
        }
        if !FLOORS.iter().any(|(name, _)| *name == folder) {
            problems.push(format!(
                "{SRC}/{folder}/ is on no floor: add it to FLOORS in tests/tests/tidy/\
                 libvirt_floors.rs and to the table of docs/architecture.md §7"
            ));
        }
        let mut files = Vec::new();
        sources(&root, &path, &mut files);
        for (file, text) in files {
            let name = file.rsplit('/').next().unwrap_or_default();
            if is_test_file(name) {
                continue;
            }
            let is_face = file == format!("{SRC}/{folder}/mod.rs");
            problems.extend(file_problems(&folder, &file, is_face, &text));
        }
        on_disk.insert(folder);
    }
    for (folder, _) in FLOORS {
        assert!(
            on_disk.contains(*folder),
            "FLOORS names {folder}, which is not a folder of {SRC}"
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_floor_check_names_what_runs_back_up() {
    let text = "//! A doc line naming crate::service is no import.\n\
                use crate::host::error::text;\n\
                use crate::service::Inner;\n\
                use crate::LibvirtConfig;\n\
                use crate::{host, drift};\n\
                use super::super::spec;\n\
                #[cfg(test)]\nmod tests {\n    use crate::service::Inner;\n}\n";
    let problems = file_problems("storage", "s/volumes.rs", false, text);
    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(problems[0].starts_with("s/volumes.rs:3: `storage` may not use `service`"));
    assert!(problems[1].contains("names the crate's face (`crate::LibvirtConfig`)"));
    assert!(problems[2].contains("names the crate's face (`crate::{`)"));
    assert!(problems[3].starts_with("s/volumes.rs:6: reaches out of its folder"));
    let face = file_problems("guest", "g/mod.rs", true, "use super::Inner;\n");
    assert_eq!(face.len(), 1, "{face:#?}");
    assert!(
        file_problems(
            "host",
            "h/x.rs",
            false,
            "use bigfleet_libvirt_crate::drift;\n"
        )
        .is_empty()
    );
}

#[test]
fn the_floors_are_drawn_as_the_rule_keeps_them() {
    let doc = std::fs::read_to_string(workspace_root().join("docs/architecture.md")).unwrap();
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("7. "))
        .expect("docs/architecture.md has a section 7 drawing the libvirt adapter's floors");
    for (folder, allowed) in FLOORS {
        let row = section
            .lines()
            .find(|line| line.starts_with(&format!("| `{folder}/` |")))
            .unwrap_or_else(|| panic!("docs/architecture.md §7 has no row for `{folder}/`"));
        let uses = row.split('|').nth(2).unwrap_or_default();
        let drawn: BTreeSet<&str> = uses
            .split('`')
            .filter_map(|word| word.strip_suffix('/'))
            .collect();
        let kept: BTreeSet<&str> = allowed.iter().copied().collect();
        assert_eq!(
            drawn, kept,
            "docs/architecture.md §7 draws `{folder}/` using {drawn:?}, the tidy rule lets it \
             use {kept:?}: change both together"
        );
    }
}
