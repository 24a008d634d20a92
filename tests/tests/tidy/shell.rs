//! Every shell script the repository tracks passes `shellcheck` (installed by
//! `scripts/install-deps.sh`). A script is a tracked file whose first line is a `sh` or `bash`
//! shebang, whatever its name, so the guest's hooks under `scripts/qemu-tier/` and
//! `.ci/run` are checked too.

use std::path::Path;
use std::process::Command;

use super::workspace_root;

/// Tracked files that start with a shell shebang, as repository-relative paths.
fn shell_scripts(root: &Path) -> Vec<String> {
    let listed = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output()
        .expect("run git ls-files");
    assert!(listed.status.success(), "git ls-files failed");
    String::from_utf8_lossy(&listed.stdout)
        .split('\0')
        .filter(|path| !path.is_empty())
        .filter(|path| {
            let Ok(text) = std::fs::read(root.join(path)) else {
                return false;
            };
            let first = text.split(|b| *b == b'\n').next().unwrap_or_default();
            is_shell_shebang(&String::from_utf8_lossy(first))
        })
        .map(str::to_owned)
        .collect()
}

fn is_shell_shebang(line: &str) -> bool {
    let Some(rest) = line.strip_prefix("#!") else {
        return false;
    };
    let mut words = rest.split_whitespace();
    let program = words.next().unwrap_or_default();
    let program = if program.ends_with("/env") {
        words.next().unwrap_or_default()
    } else {
        program.rsplit('/').next().unwrap_or_default()
    };
    matches!(program, "sh" | "bash" | "dash")
}

#[test]
fn the_shebang_check_finds_shell_scripts_only() {
    for yes in ["#!/bin/sh", "#!/usr/bin/env bash", "#!/bin/bash -e"] {
        assert!(is_shell_shebang(yes), "{yes}");
    }
    for no in [
        "#!/usr/bin/env python3",
        "// a comment",
        "",
        "#!/usr/bin/perl",
    ] {
        assert!(!is_shell_shebang(no), "{no}");
    }
}

#[test]
fn every_shell_script_passes_shellcheck() {
    let root = workspace_root();
    let scripts = shell_scripts(&root);
    assert!(
        scripts.iter().any(|s| s == "scripts/test.sh") && scripts.iter().any(|s| s == ".ci/run"),
        "the script scan missed known scripts: {scripts:?}"
    );
    let out = Command::new("shellcheck")
        .arg("--external-sources")
        .args(&scripts)
        .current_dir(&root)
        .output()
        .expect("run shellcheck: install it with scripts/install-deps.sh");
    assert!(
        out.status.success(),
        "shellcheck found problems in {scripts:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
