//! The benchmarks' one results file, `docs/results.md`: every line a benchmark prints with
//! [`say!`] is also kept, and at the end of a full run [`write`] replaces that benchmark's
//! own section of the file with them, headed by the date and `git rev-parse --short HEAD`
//! (marked `-dirty` when the tree has changes other than to the results file itself, which
//! an earlier benchmark of the same run may have written). Sections of other benchmarks are
//! left as they are. A smoke run (`BENCH_QUICK=1`, or a start without `--bench`, as `cargo test --benches`
//! does) writes nothing, so the test suite never changes the file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// `println!` that also keeps the line for the results file.
macro_rules! say {
    () => {
        $crate::results::say!("")
    };
    ($($arg:tt)*) => {{
        let line = format!($($arg)*);
        println!("{line}");
        $crate::results::record(line);
    }};
}
pub(crate) use say;

/// Keeps one printed line (it may hold several) for the results file.
pub fn record(line: String) {
    LINES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(line);
}

/// The file's heading, written when it does not exist yet.
const PREAMBLE: &str = "# Benchmark results\n\n\
Written by the benchmarks themselves (`tests/benches/common/results.rs`): each full run\n\
replaces its own section with what it printed, the date and the commit it ran at. What the\n\
numbers mean, and the measurements before this file, are in docs/benchmarks.md.\n";

/// Whether this run writes its section: a full run, not a smoke run.
fn full_run() -> bool {
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    !quick && std::env::args().any(|arg| arg == "--bench")
}

/// The repository root: the first folder above this crate's manifest holding `Cargo.lock`.
fn repo_root() -> Result<PathBuf, BoxError> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").is_file())
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("no Cargo.lock above {}", manifest.display()).into())
}

/// The trimmed output of `program args` run in `dir`, or an error naming the command.
fn run(dir: &Path, program: &str, args: &[&str]) -> Result<String, BoxError> {
    let output = Command::new(program).args(args).current_dir(dir).output()?;
    if !output.status.success() {
        return Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    Ok(String::from_utf8(output.stdout)?.trim().to_owned())
}

/// `text` with the section `## {name}` (up to the next `## ` heading) replaced by `body`, or
/// `body` appended when there is no such section.
pub fn replace_section(text: &str, name: &str, body: &str) -> String {
    let heading = format!("## {name}\n");
    let section = format!("{heading}\n{}\n", body.trim_end());
    let Some(start) = text.find(&heading) else {
        return format!("{}\n\n{section}", text.trim_end());
    };
    let after = start + heading.len();
    let end = text[after..]
        .find("\n## ")
        .map_or(text.len(), |at| after + at + 1);
    let rest = &text[end..];
    let separator = if rest.is_empty() { "" } else { "\n" };
    format!("{}{section}{separator}{rest}", &text[..start])
}

/// Replaces the section `name` of `docs/results.md` with every line [`say!`] printed, headed
/// by the date and the commit; a smoke run writes nothing and says so.
pub fn write(name: &str) -> Result<(), BoxError> {
    if !full_run() {
        println!("results: a smoke run; docs/results.md not written");
        return Ok(());
    }
    let root = repo_root()?;
    let commit = run(&root, "git", &["rev-parse", "--short", "HEAD"])?;
    let dirty = !run(
        &root,
        "git",
        &[
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":(exclude)docs/results.md",
        ],
    )?
    .is_empty();
    let date = run(&root, "date", &["-u", "+%Y-%m-%d %H:%M UTC"])?;
    let lines = LINES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .join("\n");
    let body = format!(
        "Measured {date} at commit `{commit}{}`.\n\n```text\n{lines}\n```",
        if dirty { "-dirty" } else { "" }
    );
    let path = root.join("docs/results.md");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => PREAMBLE.to_owned(),
        Err(e) => return Err(format!("read {}: {e}", path.display()).into()),
    };
    std::fs::write(&path, replace_section(&text, name, &body))
        .map_err(|e| format!("write {}: {e}", path.display()))?;
    println!("results: wrote section {name:?} of {}", path.display());
    Ok(())
}
