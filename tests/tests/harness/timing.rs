//! How long the tests' liveness waits took, printed beside their bounds, so a run under load
//! (`stress-ng --cpu 2` beside the suite) shows how much headroom each bound has. Bounds are
//! set at least 5x above the worst value seen under that load (issue 38); the figures
//! themselves are not asserted.

use std::time::Duration;

/// Prints one `timing:` line: the test (its thread's name), what was waited for, how long it
/// took, and the bound it had to meet.
pub fn seen(what: &str, took: Duration, bound: Duration) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    println!("timing: {test}: {what}: {took:.3?} of {bound:?}");
}

/// One `timing:` line, as [`seen`] prints it.
fn line(test: &str, what: &str, took: Duration, bound: Duration) -> String {
    format!("timing: {test}: {what}: {took:.3?} of {bound:?}")
}

#[test]
fn headroom_script_reads_the_lines_this_harness_prints() {
    // scripts/timing-headroom.py builds the "Liveness bounds under load" table of
    // docs/testing.md from these lines: it must keep reading what `seen` prints, including
    // lines another test's output ran into.
    let ms = Duration::from_millis;
    let log = [
        line("a::slow", "reach Idle", ms(2_500), ms(15_000)),
        format!(
            "test b ... {}",
            line("b::fast", "reach Idle", ms(120), ms(15_000))
        ),
        line("c::log", "log line", Duration::from_micros(200), ms(10_000)),
        line("d::start", "start serving", ms(9_077), ms(30_000)),
    ]
    .join("\n");
    let script = super::repo_root().join("scripts/timing-headroom.py");
    let mut child = std::process::Command::new("python3")
        .arg(&script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run python3 scripts/timing-headroom.py");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(log.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = table.lines().skip(2).collect();
    assert_eq!(
        rows,
        [
            "| start serving | 30s | 1 | 9.077 s | `d::start` | 3.3× |",
            "| reach Idle | 15s | 2 | 2.500 s | `a::slow` | 6.0× |",
            "| log line | 10s | 1 | 0.000 s | `c::log` | 50000× |",
        ],
        "{table}"
    );
}
