//! Size limits, for every `.rs` file of the repository (each crate, `tests/`, the benches and
//! the simulator; build output and hidden folders excluded): no file over 800 lines, no
//! product file (a crate's `src/`, its unit tests aside) over 600, and no function over 70
//! code lines unless [`LONG_FUNCTIONS`] names it with its length and the reason it stays
//! long. Product functions are never listed: they are split.
//!
//! A function's length counts its code lines only: a line that holds nothing but a comment
//! (line, block or doc comment), and a blank line, do not count; a line with code and a
//! trailing comment does, and so does a non-blank line of a multi-line string literal. So a
//! comment that says why never costs a function its room, and deleting one never buys any.
//!
//! The allowlist is a ratchet: an entry records the function's length, and the check fails
//! when the function grows past it (split it instead) and when it shrinks below it (lower
//! the entry, so the room is not spent later). An entry whose function is gone, or no longer
//! long, fails too.
//!
//! How functions are found (a heuristic, not a parser): comments, string literals (raw and
//! byte strings included) and character literals are blanked first, so braces inside them do
//! not count. Then every `fn <name>` with a body is measured, at any depth (free functions,
//! methods, functions nested in functions): the code lines from the line of its `fn` keyword
//! to the line of the brace that closes its body; attributes and doc comments above it are
//! not counted. Its
//! body is the first `{` after the name outside parentheses and brackets (so `[u8; 4]` in a
//! signature is not mistaken for the `;` of a declaration without a body). A function is
//! named `<path from the repository root>::<name>`; two long functions of the same name in
//! one file share an entry.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::{citing_files, workspace_root};

/// The hard limit on a source file's lines.
const MAX_FILE_LINES: usize = 800;
/// The limit on a product file's lines (see [`is_product`]).
const MAX_PRODUCT_FILE_LINES: usize = 600;
/// Functions of more code lines than this must be split or listed in [`LONG_FUNCTIONS`].
const MAX_FUNCTION_LINES: usize = 70;

/// Functions allowed over [`MAX_FUNCTION_LINES`] (none of them product code), each with its
/// length in code lines and the reason it stays one piece.
const LONG_FUNCTIONS: &[(&str, usize, &str)] = &[
    (
        "domain/tests/seed_reconcile.rs::seed_rejects_every_field_shape_rule",
        98,
        "a table: one (bad machine, expected error) case per field-shape rule",
    ),
    (
        "tests/benches/provider.rs::bench",
        111,
        "the benchmark driver: the phases in their required order (List sizes on fresh providers first), then the report",
    ),
    (
        "tests/benches/provider/ack.rs::print_ack_table",
        90,
        "prints the ack table and its verdicts, one column after another",
    ),
    (
        "tests/benches/provider/list.rs::print_list_table",
        88,
        "prints the List table and its verdicts, one column after another",
    ),
    (
        "tests/tests/deploy/chart.rs::offerings_and_instance_types_via_set_file",
        92,
        "a scenario test: one render, then the ConfigMaps, mounts, flags and checksum roll in turn",
    ),
    (
        "tests/tests/disk_full.rs::a_full_disk_fails_only_its_calls_and_heals_without_a_restart",
        159,
        "a scenario test that reads top to bottom: fill the disk, calls fail, grow it, calls heal",
    ),
    (
        "tests/tests/durable/choreography.rs::b1001_to_b1007_durability_lane",
        110,
        "the B1001-B1007 lane, step by step in the conformance lane's order",
    ),
    (
        "tests/tests/durable/cursors.rs::revision_cursors_survive_restart",
        126,
        "a scenario test across two kills that reads top to bottom",
    ),
    (
        "tests/tests/durable/load/mod.rs::run_task",
        182,
        "one traffic task's loop: each action updates the model right next to the answer that justifies it",
    ),
    (
        "tests/tests/durable/load/verify.rs::sigkill_under_concurrent_load_loses_nothing_acknowledged",
        150,
        "the rounds driver (load, kill, restart, verify, report); the checks are in verify_restart",
    ),
    (
        "tests/tests/durable/load/verify.rs::verify_restart",
        145,
        "checks (a)-(f) after a restart, in order, against one listing",
    ),
    (
        "tests/tests/durable/mid_traffic.rs::list_cursor_taken_mid_traffic_misses_nothing_after_restart",
        192,
        "a scenario test: rounds of traffic, cursors, a kill, and the three properties checked after each restart",
    ),
    (
        "tests/tests/durable/strong_b1006.rs::b1006_strong_interrupted_configure_comes_back_failed",
        72,
        "a scenario test across one kill that reads top to bottom",
    ),
    (
        "tests/tests/echo.rs::a_megabyte_id_is_invalid_argument_with_a_short_message_and_mints_no_mark",
        75,
        "one oversized id per RPC, then the proof that no mark was minted: a list of cases",
    ),
    (
        "tests/tests/identity.rs::the_refusal_counter_moves_by_exactly_one_per_refusal_and_each_is_logged_once",
        95,
        "a table of refusals, each checked against the counter and the log",
    ),
    (
        "tests/tests/limits.rs::one_connection_opening_20000_streams_is_refused_past_the_cap",
        94,
        "a scenario test over raw HTTP/2 that reads top to bottom",
    ),
    (
        "tests/tests/observe.rs::promtool_checks_the_rules_and_every_alert_fires_and_stays_silent",
        88,
        "writes one promtool unit test per alert (fires, stays silent) and runs them",
    ),
    (
        "tests/tests/observe_live.rs::prometheus_scrapes_the_provider_and_fires_host_unreachable",
        75,
        "a scenario test against a real Prometheus that reads top to bottom",
    ),
    (
        "tests/tests/observe_live.rs::series_in",
        85,
        "a small PromQL tokenizer: one match arm per token kind",
    ),
    (
        "tests/tests/ops/metrics.rs::metrics_follow_rpcs_fencing_hypervisor_calls_and_machines",
        99,
        "a scenario test: each call, then the series it must move",
    ),
    (
        "tests/tests/ops/startup.rs::bad_tls_flags_fail_at_startup_with_one_line_naming_the_flag",
        94,
        "a table: one (bad TLS flags, flag named) case per start-up error",
    ),
    (
        "tests/tests/property.rs::b1205_request_shape_code_discipline",
        107,
        "a list of request shapes, each with the codes it may get",
    ),
    (
        "tests/tests/qemu_e2e.rs::a_real_guest_goes_create_configure_drain_delete",
        105,
        "a real guest's whole life, step by step, with timings printed",
    ),
    (
        "tests/tests/qemu_faults.rs::daemon_restart",
        96,
        "two daemon restarts (mid-Create, mid-Delete) on real libvirtd, each checked to the end",
    ),
    (
        "tests/tests/qemu_faults.rs::orphan_gc",
        93,
        "plants orphans and a foreign domain on a real host, then checks report, GC and survivors",
    ),
    (
        "tests/tests/qemu_faults.rs::out_of_band",
        72,
        "three out-of-band changes on a real host, each timed against the 5 s bound",
    ),
];

/// Every `.rs` file of the repository, as (path from the root, text).
pub(super) fn rust_sources() -> Vec<(String, String)> {
    let root = workspace_root();
    citing_files()
        .into_iter()
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            (relative(&root, &path), text)
        })
        .collect()
}

fn relative(root: &Path, path: &Path) -> String {
    let relative = path.strip_prefix(root).unwrap();
    relative.to_string_lossy().replace('\\', "/")
}

pub(super) fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` with every comment, string literal and character literal replaced by spaces; line
/// breaks are kept, so line numbers stay those of `text`.
pub(super) fn code_only(text: &str) -> Vec<char> {
    blanked(text, true)
}

/// `text` with every comment replaced by spaces, and every string and character literal too
/// when `literals`; line breaks are kept.
fn blanked(text: &str, literals: bool) -> Vec<char> {
    let mut chars: Vec<char> = text.chars().collect();
    let blank = |chars: &mut Vec<char>, from: usize, to: usize| {
        let to = to.min(chars.len());
        for c in &mut chars[from..to] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    let mut at = 0;
    while at < chars.len() {
        let end = literal_or_comment_end(&chars, at);
        if end > at {
            let comment = chars[at] == '/' && matches!(chars.get(at + 1), Some('/' | '*'));
            if comment || literals {
                blank(&mut chars, at, end);
            }
            at = end;
        } else {
            at += 1;
        }
    }
    chars
}

/// Where the comment or literal starting at `at` ends (one past it); `at` if none starts there.
fn literal_or_comment_end(chars: &[char], at: usize) -> usize {
    let next = |k: usize| chars.get(at + k).copied();
    let after_ident = at > 0 && is_ident(chars[at - 1]);
    match chars[at] {
        '/' if next(1) == Some('/') => (at..chars.len())
            .find(|&k| chars[k] == '\n')
            .unwrap_or(chars.len()),
        '/' if next(1) == Some('*') => {
            let (mut depth, mut k) = (0usize, at);
            while k < chars.len() {
                if chars[k] == '/' && chars.get(k + 1) == Some(&'*') {
                    depth += 1;
                    k += 2;
                } else if chars[k] == '*' && chars.get(k + 1) == Some(&'/') {
                    depth -= 1;
                    k += 2;
                    if depth == 0 {
                        return k;
                    }
                } else {
                    k += 1;
                }
            }
            chars.len()
        }
        '"' => {
            let mut k = at + 1;
            while k < chars.len() && chars[k] != '"' {
                k += if chars[k] == '\\' { 2 } else { 1 };
            }
            k + 1
        }
        // A raw string: r"…", r#"…"#, br"…" (an `r` that does not end an identifier).
        'r' if !after_ident || (chars[at - 1] == 'b' && (at < 2 || !is_ident(chars[at - 2]))) => {
            let hashes = chars[at + 1..].iter().take_while(|c| **c == '#').count();
            if chars.get(at + 1 + hashes) != Some(&'"') {
                return at;
            }
            let closing: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let body = at + 2 + hashes;
            (body..chars.len())
                .find(|&k| chars[k..].starts_with(&closing))
                .map_or(chars.len(), |k| k + closing.len())
        }
        // A character literal ('x', '\n', '\''), not a lifetime or a label ('a).
        '\'' if next(1) == Some('\\') => (at + 3..chars.len())
            .find(|&k| chars[k] == '\'')
            .map_or(chars.len(), |k| k + 1),
        '\'' if next(2) == Some('\'') => at + 3,
        _ => at,
    }
}

/// Whether each line of `text` holds code: anything but blanks and comments.
fn code_lines(text: &str) -> Vec<bool> {
    let uncommented: String = blanked(text, false).into_iter().collect();
    uncommented
        .split('\n')
        .map(|line| !line.trim().is_empty())
        .collect()
}

/// Every function with a body in `text`: (name, code lines from `fn` to its closing brace;
/// see [`code_lines`]).
fn functions(text: &str) -> Vec<(String, usize)> {
    let code = code_only(text);
    let counted = code_lines(text);
    let line_at = |at: usize| code[..at].iter().filter(|c| **c == '\n').count();
    let mut found = Vec::new();
    for at in 0..code.len().saturating_sub(2) {
        let keyword = code[at] == 'f' && code[at + 1] == 'n' && code[at + 2].is_whitespace();
        if !keyword || (at > 0 && is_ident(code[at - 1])) {
            continue;
        }
        let mut k = at + 2;
        while k < code.len() && code[k].is_whitespace() {
            k += 1;
        }
        let name: String = code[k..]
            .iter()
            .take_while(|c| is_ident(**c) || **c == '#')
            .collect();
        let name = name.trim_start_matches("r#").to_owned();
        if name.is_empty() {
            continue;
        }
        if let Some(end) = body_end(&code, k + name.len()) {
            let lines = &counted[line_at(at)..=line_at(end)];
            found.push((name, lines.iter().filter(|code| **code).count()));
        }
    }
    found
}

/// The index of the brace closing the body of the function whose name ends at `from`; `None`
/// for a declaration without a body.
fn body_end(code: &[char], from: usize) -> Option<usize> {
    body(code, from).map(|(_, close)| close)
}

/// The indices of the braces opening and closing the body of the function whose name ends at
/// `from`; `None` for a declaration without a body.
pub(super) fn body(code: &[char], from: usize) -> Option<(usize, usize)> {
    let mut nesting = 0i32;
    let mut k = from;
    let open = loop {
        match code.get(k)? {
            '(' | '[' => nesting += 1,
            ')' | ']' => nesting -= 1,
            ';' if nesting == 0 => return None,
            '{' if nesting == 0 => break k,
            _ => {}
        }
        k += 1;
    };
    let mut depth = 0usize;
    for (k, c) in code.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some((open, k));
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether `path` (from the repository root) is product code: a crate's `src/` (the core,
/// the ports, the proto crate, every adapter and the composition root), its unit-test files
/// (`tests.rs`, `*_tests.rs`, `tests/` folders) aside.
fn is_product(path: &str) -> bool {
    let in_src = ["domain/src/", "ports/src/", "proto/src/"]
        .iter()
        .any(|dir| path.starts_with(dir))
        || (path.starts_with("infra/") && path.split('/').nth(2) == Some("src"));
    let file = path.rsplit('/').next().unwrap_or(path);
    let test = file == "tests.rs" || file.ends_with("_tests.rs") || path.contains("/tests/");
    in_src && !test
}

/// Every file of `sources` over its limit ([`MAX_PRODUCT_FILE_LINES`] for product code,
/// [`MAX_FILE_LINES`] for the rest), with its length.
fn long_files(sources: &[(String, String)]) -> Vec<String> {
    sources
        .iter()
        .map(|(path, text)| {
            let limit = if is_product(path) {
                MAX_PRODUCT_FILE_LINES
            } else {
                MAX_FILE_LINES
            };
            (path, text.lines().count(), limit)
        })
        .filter(|(_, lines, limit)| lines > limit)
        .map(|(path, lines, limit)| format!("{path}: {lines} lines (limit {limit}: split it)"))
        .collect()
}

/// The length of every function of `sources`, by `<path>::<name>` (the longest when a file
/// has two of one name).
fn function_lengths(sources: &[(String, String)]) -> BTreeMap<String, usize> {
    let mut all: BTreeMap<String, usize> = BTreeMap::new();
    for (path, text) in sources {
        for (name, lines) in functions(text) {
            let longest = all.entry(format!("{path}::{name}")).or_default();
            *longest = (*longest).max(lines);
        }
    }
    all
}

/// What is wrong with one entry of the allowlist, against the lengths measured.
fn entry_problem(
    all: &BTreeMap<String, usize>,
    (key, recorded, reason): (&str, usize, &str),
) -> Option<String> {
    let path = key.split("::").next().unwrap_or(key);
    if reason.trim().is_empty() {
        return Some(format!(
            "{key} is listed in LONG_FUNCTIONS without a reason"
        ));
    }
    if is_product(path) {
        return Some(format!(
            "{key} is product code: split it rather than list it in LONG_FUNCTIONS"
        ));
    }
    match all.get(key).copied() {
        None => Some(format!(
            "{key} is listed in LONG_FUNCTIONS but no longer exists: remove the entry"
        )),
        Some(lines) if lines <= MAX_FUNCTION_LINES => Some(format!(
            "{key} is {lines} code lines now: remove it from LONG_FUNCTIONS"
        )),
        Some(lines) if lines > recorded => Some(format!(
            "{key} grew from {recorded} to {lines} code lines: split it (LONG_FUNCTIONS \
             records how long it may be)"
        )),
        Some(lines) if lines < recorded => Some(format!(
            "{key} shrank from {recorded} to {lines} code lines: lower its entry in \
             LONG_FUNCTIONS to {lines}"
        )),
        Some(_) => None,
    }
}

/// Every problem with the function lengths of `sources` against `allowed`: a long function
/// not listed, and a listed one that grew, shrank, is gone, is no longer long, is product
/// code, is listed twice or has no reason.
fn function_problems(sources: &[(String, String)], allowed: &[(&str, usize, &str)]) -> Vec<String> {
    let all = function_lengths(sources);
    let mut problems = Vec::new();
    let mut listed = BTreeSet::new();
    for &entry in allowed {
        if !listed.insert(entry.0) {
            problems.push(format!("{} is listed twice in LONG_FUNCTIONS", entry.0));
        }
        problems.extend(entry_problem(&all, entry));
    }
    for (key, lines) in &all {
        if *lines > MAX_FUNCTION_LINES && !listed.contains(key.as_str()) {
            let path = key.split("::").next().unwrap_or(key);
            let fix = if is_product(path) {
                "split it (product functions are never listed)"
            } else {
                "split it, or list it in LONG_FUNCTIONS (tests/tests/tidy/length.rs) with its \
                 length and the reason it stays long"
            };
            problems.push(format!(
                "{key} is {lines} code lines (limit {MAX_FUNCTION_LINES}): {fix}"
            ));
        }
    }
    problems
}

#[test]
fn no_rust_file_exceeds_its_line_limit() {
    let sources = rust_sources();
    assert!(
        sources.len() > 100,
        "found only {} .rs files",
        sources.len()
    );
    let long = long_files(&sources);
    assert!(
        long.is_empty(),
        "files over the limit:\n{}",
        long.join("\n")
    );
}

#[test]
fn every_function_over_70_lines_is_split_or_listed_with_a_reason() {
    let problems = function_problems(&rust_sources(), LONG_FUNCTIONS);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_length_checks_catch_what_they_should() {
    let body = |lines: usize| "    let x = 1;\n".repeat(lines);
    let function = |name: &str, lines: usize| format!("fn {name}() {{\n{}}}\n", body(lines - 2));
    // Literals and comments with braces, a lifetime, a char literal, an array type in the
    // signature, a declaration without a body and a nested function are measured right.
    let tricky = concat!(
        "trait T { fn declared(&self); }\n",
        "fn outer<'a>(x: &'a [u8; 4]) -> char {\n",
        "    let s = \"{ \\\" {\"; let r = r#\"}\"# ; let b = br\"{\";\n",
        "    // a comment with {\n",
        "    /* a block /* nested { */ comment */\n",
        "    fn inner() { let c = '{'; let e = '\\''; }\n",
        "    '}'\n",
        "}\n",
    );
    // (`outer`'s two comment-only lines do not count.)
    assert_eq!(
        functions(tricky),
        vec![("outer".to_owned(), 5), ("inner".to_owned(), 1)]
    );
    assert_eq!(functions(&function("f", 71)), vec![("f".to_owned(), 71)]);

    let file = |text: String| vec![("a/b.rs".to_owned(), text)];
    // A long function must be listed with its length; a short one must not be; a listed
    // one must exist, appear once, carry a reason, not be product code, and keep its
    // recorded length (growing or shrinking both fail).
    let problems = |text: String, allowed: &[(&str, usize, &str)]| {
        let found = function_problems(&file(text), allowed);
        println!("{allowed:?}: {found:?}");
        found.len()
    };
    assert_eq!(problems(function("f", 70), &[]), 0);
    assert_eq!(problems(function("f", 71), &[]), 1);
    assert_eq!(
        problems(function("f", 71), &[("a/b.rs::f", 71, "a table")]),
        0
    );
    assert_eq!(
        problems(function("f", 72), &[("a/b.rs::f", 71, "a table")]),
        1
    );
    assert_eq!(
        problems(function("f", 80), &[("a/b.rs::f", 81, "a table")]),
        1
    );
    assert_eq!(
        problems(function("f", 70), &[("a/b.rs::f", 71, "a table")]),
        1
    );
    assert_eq!(problems(function("f", 71), &[("a/b.rs::g", 71, "gone")]), 2);
    assert_eq!(problems(function("f", 71), &[("a/b.rs::f", 71, " ")]), 1);
    let twice = [("a/b.rs::f", 71, "a table"), ("a/b.rs::f", 71, "a table")];
    assert_eq!(problems(function("f", 71), &twice), 1);
    let product = |text: String, allowed: &[(&str, usize, &str)]| {
        function_problems(&[("ports/src/p.rs".to_owned(), text)], allowed).len()
    };
    assert_eq!(product(function("f", 71), &[]), 1);
    assert_eq!(
        product(function("f", 71), &[("ports/src/p.rs::f", 71, "a table")]),
        1
    );
}

#[test]
fn the_file_limits_catch_what_they_should() {
    let file = |text: String| vec![("a/b.rs".to_owned(), text)];
    // A file of 801 lines is caught, one of 800 is not; product files stop at 600, their
    // unit tests at 800.
    assert_eq!(long_files(&file("\n".repeat(801))).len(), 1);
    assert!(long_files(&file("\n".repeat(800))).is_empty());
    let at = |path: &str, lines: usize| long_files(&[(path.to_owned(), "\n".repeat(lines))]);
    assert_eq!(at("infra/app/src/serve.rs", 601).len(), 1);
    assert!(at("infra/app/src/serve.rs", 600).is_empty());
    assert_eq!(at("domain/src/core.rs", 601).len(), 1);
    assert!(at("infra/grpc/src/identity_tests.rs", 700).is_empty());
    assert!(at("infra/libvirt/src/tests/reconcile.rs", 700).is_empty());
    assert!(at("infra/app/benches/b.rs", 700).is_empty());
    assert!(at("sim/src/server.rs", 700).is_empty());
}

#[test]
fn only_code_lines_count_toward_a_functions_length() {
    let body = |lines: usize| "    let x = 1;\n".repeat(lines);
    let why = "    // Why the next line is so: a comment as long as it needs to be.\n".repeat(30);
    let block = "    /* a block comment\n       over three lines\n     */\n";
    let doc = "    /// a doc comment on a nested item\n    const N: u8 = 1;\n";
    let file = |text: &str| vec![("a/b.rs".to_owned(), text.to_owned())];
    // At the limit: 67 code lines of body, one constant, the `fn` line and the closing brace.
    // Thirty comment lines, a block comment, a doc comment and blank lines add nothing.
    let at_limit = format!("fn f() {{\n{why}{}\n\n{block}{doc}\n}}\n", body(67));
    assert_eq!(functions(&at_limit), vec![("f".to_owned(), 70)]);
    assert!(function_problems(&file(&at_limit), &[]).is_empty());
    // One more code line is over it.
    let over = format!("fn f() {{\n{why}{}}}\n", body(69));
    assert_eq!(function_problems(&file(&over), &[]).len(), 1);
    // A listed function keeps its recorded length whether a comment is added or deleted, so
    // deleting a "why" comment buys no room and adding one costs none.
    let listed = [("a/b.rs::g", 80, "a table")];
    let with_why = format!("fn g() {{\n{}{why}}}\n", body(78));
    let without = format!("fn g() {{\n{}}}\n", body(78));
    assert!(function_problems(&file(&with_why), &listed).is_empty());
    assert!(function_problems(&file(&without), &listed).is_empty());
    // A line with code and a trailing comment counts, and so do the non-blank lines of a
    // multi-line string literal (even one that looks like a comment); `//` in a string
    // starts no comment.
    let mixed = concat!(
        "fn h() {\n",
        "    let a = 1; // trailing\n",
        "    let s = \"one\n",
        "// not a comment: inside the string\n",
        "\n",
        "three\";\n",
        "    let u = \"http://example\"; let v = 2;\n",
        "}\n",
    );
    assert_eq!(functions(mixed), vec![("h".to_owned(), 7)]);
}
