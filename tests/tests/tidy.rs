//! Mechanical rules that keep the hexagon honest (docs/design.md §2.3 and §5): the pure
//! core depends on nothing async or IO, every product source file says what it is for, no
//! stub or debug macro ships, no file or function grows past its size limit (see `length`),
//! no test skips itself silently (see `skips`), and every document (and numbered section of
//! one) that a file cites is in the repository.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

mod deps;
mod docs;
mod length;
mod libvirt_floors;
mod root;
mod shell;
mod sim;
mod skips;

fn workspace_root() -> PathBuf {
    crate::harness::repo_root()
}

/// `cargo metadata --no-deps` of the workspace, offline: every workspace crate and the
/// dependencies it declares.
fn workspace_metadata() -> serde_json::Value {
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
    serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON")
}

/// The normal (non-dev, non-build) dependencies each workspace crate declares.
fn declared_dependencies() -> Vec<(String, BTreeSet<String>)> {
    let metadata = workspace_metadata();
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
            "{crate_name} must not depend on {extra:?} (docs/design.md §2.3)"
        );
    }
}

fn product_sources() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = Vec::new();
    for dir in ["domain/src", "ports/src", "proto/src"] {
        collect(&root.join(dir), &mut files);
    }
    // Every adapter crate and the composition root under infra/ (their benches aside).
    for entry in std::fs::read_dir(root.join("infra")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            collect(&src, &mut files);
        }
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

// ---------------------------------------------------------------------------------------
// Documentation citations: every document the repository cites is in the repository, and
// every numbered section it cites in one of the `docs/` documents is a heading there.

/// The section sign, written as an escape so that this file's own text holds no citation.
const SECTION: char = '\u{a7}';

/// Names the old, out-of-repository documents went by. Built with `concat!` for the same
/// reason as [`SECTION`].
const RETIRED_NAMES: [&str; 4] = [
    concat!("libvirt", "-reference"),
    concat!("../", "shared/"),
    concat!("/work", "/shared"),
    concat!("sty", "le R"),
];

/// Every `.rs`, `.toml`, `.sh` and `.md` file of the repository, outside build output and
/// hidden folders (`.git`, `.tools`).
fn citing_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "node_modules" {
                    walk(&path, files);
                }
            } else if ["rs", "toml", "sh", "md"]
                .iter()
                .any(|ext| path.extension().is_some_and(|e| e == *ext))
            {
                files.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&workspace_root(), &mut files);
    files.sort();
    files
}

/// The section numbers a Markdown document's headings carry (`## 8. List` gives `8`,
/// `### 2.3 Order` gives `2.3`).
fn headings(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| line.starts_with('#'))
        .filter_map(|line| line.trim_start_matches('#').split_whitespace().next())
        .map(|first| first.trim_end_matches('.').to_owned())
        .filter(|n| n.starts_with(|c: char| c.is_ascii_digit()))
        .filter(|n| n.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .collect()
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_./-".contains(c)
}

/// Skips what may sit between a document name and its sections: blanks, line breaks,
/// comment markers and Markdown code quotes.
fn skip_filler(text: &[char], mut at: usize) -> usize {
    while at < text.len() && (text[at].is_whitespace() || "/!#*`".contains(text[at])) {
        at += 1;
    }
    at
}

/// Reads a section number (`2.3`) at `at`; returns it and where it ends.
fn section_number(text: &[char], at: usize) -> (String, usize) {
    let mut end = at;
    while end < text.len() && (text[end].is_ascii_digit() || text[end] == '.') {
        end += 1;
    }
    let number: String = text[at..end].iter().collect();
    (number.trim_end_matches('.').to_owned(), end)
}

/// The headings of a `docs/` document by file name; `None` when it does not exist.
type Headings<'a> = &'a dyn Fn(&str) -> Option<BTreeSet<String>>;

/// Checks the section cited by the sign at `at` against `doc`'s headings; returns the
/// problem, if any, and where the number ends.
fn check_section(
    chars: &[char],
    at: usize,
    doc: &str,
    headings_of: Headings<'_>,
) -> (Option<String>, usize) {
    let (number, end) = section_number(chars, at + 1);
    let problem = if number.is_empty() {
        Some("a section sign without a number".to_owned())
    } else if headings_of(doc).is_some_and(|h| !h.contains(&number)) {
        Some(format!("docs/{doc} has no section {number}"))
    } else {
        None
    };
    (problem, end)
}

/// Every problem with the citations in `text`, the contents of `file` (relative to `root`).
fn citation_problems(
    root: &Path,
    file: &Path,
    text: &str,
    headings_of: Headings<'_>,
) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let line_of = |at: usize| 1 + chars[..at].iter().filter(|c| **c == '\n').count();
    let shown = file.display();
    let mut problems = Vec::new();
    let mut consumed = BTreeSet::new();
    let mut at = 0;
    while let Some(offset) = find(&chars[at..], ".md") {
        let dot = at + offset;
        at = dot + 3;
        if chars.get(at).is_some_and(|c| c.is_ascii_alphanumeric()) {
            continue;
        }
        let mut start = dot;
        while start > 0 && is_path_char(chars[start - 1]) {
            start -= 1;
        }
        let token: String = chars[start..at].iter().collect();
        // Not a document: a URL, a glob (`*.md`), or code such as a field `x.md` (a document's
        // name has at least two characters).
        let url = token.contains("//") || (start > 0 && chars[start - 1] == ':');
        let stem = token.rsplit('/').next().unwrap_or_default().len() - 3;
        if url || stem < 2 {
            continue;
        }
        let here = file.parent().unwrap_or(root);
        let inside = |p: PathBuf| p.canonicalize().is_ok_and(|p| p.starts_with(root));
        if !inside(root.join(&token)) && !inside(root.join(here).join(&token)) {
            let line = line_of(dot);
            problems.push(format!(
                "{shown}:{line}: cites {token}, which is not in the repository"
            ));
            continue;
        }
        let Some(doc) = token.strip_prefix("docs/") else {
            continue;
        };
        // A document followed by one or more sections, as a list: "2.2, 5 and 6".
        let mut next = skip_filler(&chars, at);
        while chars.get(next) == Some(&SECTION) {
            consumed.insert(next);
            let (problem, end) = check_section(&chars, next, doc, headings_of);
            if let Some(problem) = problem {
                problems.push(format!("{shown}:{}: {problem}", line_of(next)));
            }
            let mut after = skip_filler(&chars, end);
            if chars.get(after) == Some(&',') {
                after = skip_filler(&chars, after + 1);
            }
            if chars[after..].starts_with(&['a', 'n', 'd', ' ']) {
                after = skip_filler(&chars, after + 4);
            }
            next = after;
        }
    }
    problems.extend(bare_sections(file, &chars, &consumed, headings_of));
    problems.extend(retired_names(file, text));
    problems
}

/// Section signs no document name claimed. Inside a `docs/` document such a sign means that
/// document; anywhere else it is a citation that does not say of what.
fn bare_sections(
    file: &Path,
    chars: &[char],
    consumed: &BTreeSet<usize>,
    headings_of: Headings<'_>,
) -> Vec<String> {
    let own_doc = file
        .strip_prefix("docs")
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    let mut problems = Vec::new();
    for (at, c) in chars.iter().enumerate() {
        if *c != SECTION || consumed.contains(&at) {
            continue;
        }
        let problem = match &own_doc {
            Some(doc) => check_section(chars, at, doc, headings_of).0,
            None => Some("a section cited without its document: name the docs/ file".to_owned()),
        };
        if let Some(problem) = problem {
            let line = 1 + chars[..at].iter().filter(|c| **c == '\n').count();
            problems.push(format!("{}:{line}: {problem}", file.display()));
        }
    }
    problems
}

/// Mentions of the documents that used to live outside the repository.
fn retired_names(file: &Path, text: &str) -> Vec<String> {
    RETIRED_NAMES
        .iter()
        .filter_map(|name| {
            let offset = text.find(name)?;
            let line = 1 + text[..offset].matches('\n').count();
            Some(format!(
                "{}:{line}: cites {name:?}, a document outside the repository; cite docs/",
                file.display()
            ))
        })
        .collect()
}

fn find(haystack: &[char], needle: &str) -> Option<usize> {
    let needle: Vec<char> = needle.chars().collect();
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn repository_docs(root: &Path) -> impl Fn(&str) -> Option<BTreeSet<String>> + '_ {
    move |doc: &str| {
        std::fs::read_to_string(root.join("docs").join(doc))
            .ok()
            .map(|text| headings(&text))
    }
}

#[test]
fn every_cited_document_and_section_exists() {
    let root = workspace_root();
    let docs = repository_docs(&root);
    let mut problems = Vec::new();
    for path in citing_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        let relative = path.strip_prefix(&root).unwrap();
        problems.extend(citation_problems(&root, relative, &text, &docs));
    }
    assert!(
        problems.is_empty(),
        "dangling documentation citations:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_citation_check_catches_dangling_citations() {
    let root = workspace_root();
    let docs = repository_docs(&root);
    let check = |file: &str, text: String| {
        let problems = citation_problems(&root, Path::new(file), &text, &docs);
        println!("{file} {text:?}: {problems:?}");
        problems.len()
    };
    let (s, md) = (SECTION, |stem: &str| format!("{stem}.{}", "md"));
    // Good citations pass: one section, a list of them, one broken over comment lines, a
    // quoted name, a bare section inside the document itself, a file relative to its folder.
    let contract = md("docs/contract");
    assert_eq!(check("a.rs", format!("({contract} {s}2.3)")), 0);
    assert_eq!(
        check("a.rs", format!("{contract} {s}2.2, {s}5 and {s}6")),
        0
    );
    assert_eq!(check("a.rs", format!("({contract}\n    /// {s}2.1)")), 0);
    assert_eq!(check("a.rs", format!("(`{contract}` {s}12)")), 0);
    assert_eq!(check(&contract, format!("see {s}3")), 0);
    assert_eq!(check("sim/a.rs", md("README")), 0);
    assert_eq!(check("a.rs", "m.shard_metadata == b.md".to_owned()), 0);
    // A missing document, a missing section (alone or in a list), a section without its
    // document, a missing section of the document itself, a retired name, a path that
    // leaves the repository.
    assert_eq!(check("a.rs", md("docs/nowhere")), 1);
    assert_eq!(check("a.rs", format!("{contract} {s}99")), 1);
    assert_eq!(check("a.rs", format!("{contract} {s}2.3, {s}77")), 1);
    assert_eq!(check("a.rs", format!("contract {s}2.3")), 1);
    assert_eq!(check(&md("docs/design"), format!("see {s}42")), 1);
    assert_eq!(check("a.sh", RETIRED_NAMES[0].to_owned()), 1);
    assert_eq!(check("a.rs", md(&[".", "./shared/design"].concat())), 2);
}
