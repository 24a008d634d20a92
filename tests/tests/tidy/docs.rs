//! The README stays a front door (at most [`README_MAX_LINES`] lines; the operator guide, the
//! real-QEMU tier and the benchmarks live in `docs/`), and every relative link in the README
//! and the documents (`docs/*.md`, `deploy/README.md`, `sim/README.md`) points at a file
//! that exists and, when it names one, at a heading of that file.

use std::collections::BTreeSet;
use std::path::Path;

use super::workspace_root;

/// The README's length limit (issue 39): what the project is, set-up, layout and the
/// documentation map, what works, a behaviour summary and the one flag table.
const README_MAX_LINES: usize = 350;

/// The problem with a README of `text`, if it is too long.
fn readme_length_problem(text: &str) -> Option<String> {
    let lines = text.lines().count();
    (lines > README_MAX_LINES).then(|| {
        format!(
            "README.md has {lines} lines, more than {README_MAX_LINES}: move the detail into \
             docs/operating.md, docs/testing.md or docs/benchmarks.md and keep a line with \
             a link"
        )
    })
}

#[test]
fn the_readme_is_a_front_door_of_at_most_350_lines() {
    let text = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    if let Some(problem) = readme_length_problem(&text) {
        panic!("{problem}");
    }
}

#[test]
fn the_length_check_catches_a_long_readme() {
    assert_eq!(readme_length_problem(&"line\n".repeat(350)), None);
    let problem = readme_length_problem(&"line\n".repeat(351)).expect("351 lines refused");
    assert!(problem.contains("351 lines"), "{problem}");
}

/// GitHub's anchor of a heading: lower case, letters, digits, `-` and `_` kept, spaces made
/// dashes, everything else dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown document's headings (fenced code left out).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            found.insert(anchor(line.trim_start_matches('#')));
        }
    }
    found
}

/// The targets of the inline links `[text](target)` in `text`, each with its line, outside
/// fenced code.
fn link_targets(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut targets = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push((index + 1, after[..end].to_owned()));
            rest = &after[end..];
        }
    }
    targets
}

/// Every relative link in `file` (its `text`; paths from `root`) whose file or heading does
/// not exist. `read` gives a document's text by path from `root`, `None` when it is missing.
fn link_problems(file: &str, text: &str, read: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let folder = Path::new(file).parent().unwrap_or(Path::new(""));
    let mut problems = Vec::new();
    for (line, target) in link_targets(text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, fragment) = match target.split_once('#') {
            Some((path, fragment)) => (path, Some(fragment)),
            None => (target.as_str(), None),
        };
        let resolved = if path.is_empty() {
            file.to_owned()
        } else {
            normalise(&folder.join(path))
        };
        let Some(linked) = read(&resolved) else {
            problems.push(format!(
                "{file}:{line}: links to {target}, but {resolved} does not exist"
            ));
            continue;
        };
        let Some(fragment) = fragment else { continue };
        if resolved.ends_with(".md") && !anchors(&linked).contains(fragment) {
            problems.push(format!(
                "{file}:{line}: links to {target}, but {resolved} has no heading #{fragment}"
            ));
        }
    }
    problems
}

/// `docs/../README.md` as `README.md`: the path without `.` and `..` steps.
fn normalise(path: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for part in path.components() {
        match part.as_os_str().to_string_lossy().as_ref() {
            "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other.to_owned()),
        }
    }
    parts.join("/")
}

/// The documents whose links are checked, by path from the repository root.
fn linking_documents(root: &Path) -> Vec<String> {
    let mut files = vec![
        "README.md".to_owned(),
        "deploy/README.md".to_owned(),
        "sim/README.md".to_owned(),
    ];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            files.push(format!("docs/{name}"));
        }
    }
    files.sort();
    files
}

#[test]
fn every_relative_link_in_the_documents_resolves() {
    let root = workspace_root();
    let read = |path: &str| {
        let full = root.join(path);
        if full.is_dir() {
            return Some(String::new());
        }
        std::fs::read_to_string(full).ok()
    };
    let mut problems = Vec::new();
    for file in linking_documents(&root) {
        let text = read(&file).unwrap_or_else(|| panic!("{file} is missing"));
        problems.extend(link_problems(&file, &text, &read));
    }
    assert!(
        problems.is_empty(),
        "dangling links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_link_check_catches_dangling_links() {
    // Built from parts, so that the citation check does not take these for citations.
    let md = |stem: &str| format!("{stem}.{}", "md");
    let (readme, guide_path) = (md("README"), md("docs/guide"));
    let guide = "# Guide\n\n## Golden-image distribution (`--image-source`)\n\n```sh\n# not a heading\n```\n";
    let read = |path: &str| {
        if path == readme {
            Some("# Front\n\n## Set-up\n".to_owned())
        } else if path == guide_path {
            Some(guide.to_owned())
        } else {
            None
        }
    };
    let check = |file: &str, text: String| {
        let problems = link_problems(file, &text, &read);
        println!("{file} {text:?}: {problems:?}");
        problems.len()
    };
    let (g, up) = (&guide_path, md("../README"));
    // Good links pass: a file, a heading with punctuation, a link up and out of docs/, a
    // heading of the file itself, a URL, a link inside fenced code.
    assert_eq!(check(&readme, format!("[g]({g})")), 0);
    assert_eq!(
        check(
            &readme,
            format!("[g]({g}#golden-image-distribution---image-source)")
        ),
        0
    );
    assert_eq!(check(g, format!("[r]({up}#set-up)")), 0);
    assert_eq!(check(&readme, "[s](#set-up)".to_owned()), 0);
    assert_eq!(
        check(&readme, format!("[b](https://example.com/{}#y)", md("x"))),
        0
    );
    assert_eq!(
        check(&readme, format!("```\n[x]({})\n```", md("nowhere"))),
        0
    );
    // A missing file, a missing heading, a heading only in fenced code, a link from docs/
    // written as if from the root, a missing heading of the file itself.
    assert_eq!(check(&readme, format!("[n]({})", md("docs/nowhere"))), 1);
    assert_eq!(check(&readme, format!("[g]({g}#supply-chain)")), 1);
    assert_eq!(check(&readme, format!("[g]({g}#not-a-heading)")), 1);
    assert_eq!(check(g, format!("[g]({g})")), 1);
    assert_eq!(
        check(&readme, "[s](#metrics) and [t](#set-up)".to_owned()),
        1
    );
}

#[allow(dead_code, unused_imports, unused_macros)]
#[path = "../../benches/common/results.rs"]
mod results;

/// The benchmarks write only their own section of `docs/results.md`: a section is replaced
/// in place, the others (before and after it) are kept byte for byte, and a new one is
/// appended.
#[test]
fn a_benchmark_rewrites_only_its_own_results_section() {
    let text = "# Results\n\nintro\n\n## a\n\nold a\n\n## b\n\nold b\n";
    assert_eq!(
        results::replace_section(text, "a", "new a"),
        "# Results\n\nintro\n\n## a\n\nnew a\n\n## b\n\nold b\n"
    );
    assert_eq!(
        results::replace_section(text, "b", "new b\nmore"),
        "# Results\n\nintro\n\n## a\n\nold a\n\n## b\n\nnew b\nmore\n"
    );
    assert_eq!(
        results::replace_section(text, "c", "new c"),
        format!("{text}\n## c\n\nnew c\n")
    );
}
