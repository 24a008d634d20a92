//! The phase table that `.ci/run` and `scripts/test.sh` print at exit (`scripts/phases.sh`),
//! and the steps the real-QEMU tier's `ci` adds to it (`scripts/qemu-tier/ci.sh`), run with
//! stand-ins for the phases' commands (the real ones take an hour and a QEMU host): every
//! phase shows with its seconds and outcome, a failed one with its exit status, and the tier
//! runs each test group even after one failed. Needs bash only.

use std::path::Path;
use std::process::Command;

use crate::harness::repo_root;

/// Runs `script` with bash in `dir`, with no phase log inherited; returns (exit code, stdout).
fn bash(dir: &Path, script: &str, env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("REPO", repo_root())
        .env_remove("BIGFLEET_PHASE_LOG")
        .envs(env.iter().copied())
        .output()
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("stdout:\n{stdout}\nstderr:\n{stderr}");
    (out.status.code().expect("bash exited"), stdout)
}

/// The table's row for `name`: its seconds and outcome, e.g. ("0", "ok").
fn row(table: &str, name: &str) -> Option<(String, String)> {
    table.lines().find_map(|line| {
        let rest = line.strip_prefix("  ")?.strip_prefix(name)?;
        let (seconds, outcome) = rest.trim_start().split_once(" s  ")?;
        Some((seconds.to_owned(), outcome.to_owned()))
    })
}

#[test]
fn the_table_shows_every_phase_run_and_the_one_that_failed() {
    let dir = tempfile::tempdir().unwrap();
    let (code, table) = bash(
        dir.path(),
        r#"set -euo pipefail
           source "$REPO/scripts/phases.sh"
           phase "first phase" sleep 1
           phase "second phase" bash -c 'exit 7'
           phase "never run" true"#,
        &[],
    );
    assert_eq!(code, 7, "the failed phase's status is the script's");
    assert!(table.contains("phases (wall seconds)"), "{table}");
    let (seconds, outcome) = row(&table, "first phase").expect("the first phase's row");
    assert!(
        seconds.parse::<u64>().unwrap() >= 1,
        "it slept 1 s: {seconds}"
    );
    assert_eq!(outcome, "ok");
    let failed = row(&table, "second phase").expect("the failed phase's row");
    assert_eq!(failed.1, "failed (exit status 7)");
    assert_eq!(row(&table, "total").unwrap().1, "failed (exit status 7)");
    assert_eq!(row(&table, "never run"), None, "{table}");
}

#[test]
fn a_nested_script_adds_its_phases_to_the_table_of_the_one_that_runs_it() {
    let dir = tempfile::tempdir().unwrap();
    let inner = dir.path().join("inner.sh");
    std::fs::write(
        &inner,
        r#"set -euo pipefail
           source "$REPO/scripts/phases.sh"
           phase "inner phase" true
           printf 'tier: a step\t3\tok\n' >>"$BIGFLEET_PHASE_LOG""#,
    )
    .unwrap();
    let (code, table) = bash(
        dir.path(),
        r#"set -euo pipefail
           source "$REPO/scripts/phases.sh"
           phase "outer phase" true
           bash inner.sh
           phase "outer again" true"#,
        &[],
    );
    assert_eq!(code, 0);
    assert_eq!(table.matches("phases (wall seconds)").count(), 1, "{table}");
    for name in ["outer phase", "inner phase", "outer again", "total"] {
        assert_eq!(row(&table, name).unwrap().1, "ok", "{name} in {table}");
    }
    assert_eq!(
        row(&table, "tier: a step").unwrap(),
        ("3".into(), "ok".into())
    );
}

/// Runs the tier's `cmd_ci` from `scripts/qemu-tier/ci.sh` with its other parts stubbed out
/// (`PREPARE_STATUS`, `FAIL_GROUP` and `BENCH_STATUS` choose what fails) and a fake `cargo`;
/// returns its exit code and the lines it appended to the phase log.
fn tier_ci(env: &[(&str, &str)]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    let bench = dir.path().join("scripts/bench");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&bench).unwrap();
    let cargo = r#"#!/usr/bin/env bash
for a in "$@"; do [[ $a == "${FAIL_GROUP:-none}::" ]] && exit 101; done
exit 0
"#;
    for (path, text) in [
        (bin.join("cargo"), cargo),
        (
            bench.join("real-libvirt.sh"),
            "#!/usr/bin/env bash\nexit \"${BENCH_STATUS:-0}\"\n",
        ),
    ] {
        std::fs::write(&path, text).unwrap();
        let status = Command::new("chmod").arg("+x").arg(&path).status().unwrap();
        assert!(status.success());
    }
    let log = dir.path().join("phases.log");
    std::fs::write(&log, "").unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let repo = dir.path().to_str().unwrap();
    let mut all = vec![
        ("PATH", path.as_str()),
        ("BIGFLEET_PHASE_LOG", log.to_str().unwrap()),
        ("FAKE_REPO", repo),
    ];
    all.extend_from_slice(env);
    let (code, _) = bash(
        dir.path(),
        r#"set -euo pipefail
           repo=$FAKE_REPO tier_dir=$FAKE_REPO/tier
           say() { echo "qemu-tier: $*" >&2; }
           skipped() { return 1; }
           lock() { :; }
           cmd_stop() { :; }
           cmd_prepare() { return "${PREPARE_STATUS:-0}"; }
           cmd_start() { :; }
           cmd_env() { echo "export BIGFLEET_QEMU_STUB=1"; }
           cmd_ceph_start() { :; }
           cmd_ceph_env() { echo "export BIGFLEET_QEMU_CEPH_STUB=1"; }
           source "$REPO/scripts/qemu-tier/ci.sh"
           cmd_ci"#,
        &all,
    );
    let lines = std::fs::read_to_string(&log).unwrap();
    println!("phase log:\n{lines}");
    (code, lines)
}

/// The (name, outcome) of each line of a phase log.
fn steps(log: &str) -> Vec<(String, String)> {
    log.lines()
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            assert_eq!(fields.len(), 3, "NAME<TAB>SECONDS<TAB>OUTCOME: {line:?}");
            fields[1].parse::<u64>().expect("whole seconds");
            (fields[0].to_owned(), fields[2].to_owned())
        })
        .collect()
}

#[test]
fn the_tier_records_each_step_and_runs_every_test_group_after_a_failure() {
    let ok = |name: &str| (format!("tier: {name}"), "ok".to_owned());
    let (code, log) = tier_ci(&[("FAIL_GROUP", "qemu_faults"), ("BENCH_STATUS", "3")]);
    assert_eq!(
        code, 101,
        "the first failure's status (the tests', then the bench's)"
    );
    let failed = |name: &str, status: u8| {
        (
            format!("tier: {name}"),
            format!("failed (exit status {status})"),
        )
    };
    assert_eq!(
        steps(&log),
        vec![
            ok("wait-background-prepare"),
            ok("stop-leftovers"),
            ok("prepare"),
            ok("start"),
            ok("ceph"),
            ok("build-tests"),
            ok("test qemu_e2e"),
            failed("test qemu_faults", 101),
            ok("test qemu_crash"),
            ok("test qemu_slow"),
            ok("test on_real_libvirtd"),
            ok("test qemu_ceph"),
            ok("test qemu_lanes"),
            ok("test qemu_remote"),
            ok("test qemu_image (beside the others)"),
            failed("bench", 3),
            ok("stop"),
        ]
    );

    let (code, log) = tier_ci(&[("FAIL_GROUP", "qemu_image")]);
    assert_eq!(code, 101, "the group beside the others fails the tier too");
    assert!(
        steps(&log).contains(&failed("test qemu_image (beside the others)", 101)),
        "{log}"
    );

    let (code, log) = tier_ci(&[("PREPARE_STATUS", "5")]);
    assert_eq!(code, 5);
    assert_eq!(
        steps(&log),
        vec![
            ok("wait-background-prepare"),
            ok("stop-leftovers"),
            failed("prepare", 5),
            ok("stop"),
        ],
        "a failed step ends ci, still recorded, and the tier is stopped"
    );
}
