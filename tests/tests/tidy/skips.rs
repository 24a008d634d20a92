//! No silent skips: a test that returns early goes through the one documented skip helper,
//! `skip::needs` (`tests/tests/harness/skip.rs`), which fails the test unless its skip variable
//! is set; and no CI script sets a skip variable, so CI proves every test ran.
//!
//! How early returns are found (a heuristic over the source text, like `length`): comments and
//! literals are blanked first; a test is a function whose attribute path is `test` or ends in
//! `::test` (`#[test]`, `#[tokio::test(…)]`), in every `.rs` file of the repository. Inside its
//! body, at any depth (so also inside an `async` block it hands to a helper), a `return` with
//! nothing after it (`return;`, `return }`, `=> return,`) or `return Ok(…)` ends the test with a
//! pass. Two are allowed: the `else` of a `let … else { return }` whose statement calls
//! `skip::needs(`, and one inside a `loop`, `for` or `while` body, where it ends a poll that
//! found what it waited for (the test then fails after the loop if it never did). A `return`
//! with a value leaves a closure or a nested function, not the test, and is not counted.

use std::path::Path;

use super::length::{body, code_only, is_ident, rust_sources};
use super::workspace_root;
use crate::harness::skip;

/// The call that may precede a test's early return.
const HELPER: &str = "skip::needs(";

fn text(code: &[char], from: usize, to: usize) -> String {
    code[from..to].iter().collect()
}

/// Whether the word `word` starts at `at` (not inside a longer identifier).
fn word_at(code: &[char], at: usize, word: &str) -> bool {
    let len = word.chars().count();
    at + len <= code.len()
        && text(code, at, at + len) == word
        && (at == 0 || !is_ident(code[at - 1]))
        && code.get(at + len).is_none_or(|c| !is_ident(*c))
}

/// The next character at or after `at` that is not whitespace, and where it is.
fn next_code(code: &[char], mut at: usize) -> Option<(usize, char)> {
    while at < code.len() && code[at].is_whitespace() {
        at += 1;
    }
    code.get(at).map(|c| (at, *c))
}

/// The last character before `at` that is not whitespace, and where it is.
fn previous_code(code: &[char], at: usize) -> Option<(usize, char)> {
    (0..at)
        .rev()
        .find(|&k| !code[k].is_whitespace())
        .map(|k| (k, code[k]))
}

/// Every test function of `code`: its name and the indices of its body's braces.
fn tests_in(code: &[char]) -> Vec<(String, usize, usize)> {
    let mut found = Vec::new();
    let mut at = 0;
    while at + 1 < code.len() {
        if code[at] != '#' || next_code(code, at + 1).is_none_or(|(_, c)| c != '[') {
            at += 1;
            continue;
        }
        let (open, _) = next_code(code, at + 1).unwrap();
        let Some(close) = (open..code.len()).find(|&k| code[k] == ']') else {
            break;
        };
        let attribute = text(code, open + 1, close);
        let path: String = attribute
            .split('(')
            .next()
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        at = close + 1;
        if path != "test" && !path.ends_with("::test") {
            continue;
        }
        let Some(keyword) = (at..code.len()).find(|&k| word_at(code, k, "fn")) else {
            break;
        };
        let Some((start, _)) = next_code(code, keyword + 2) else {
            break;
        };
        let name: String = code[start..].iter().take_while(|c| is_ident(**c)).collect();
        if let Some((open, close)) = body(code, start + name.chars().count()) {
            found.push((name, open, close));
            at = open;
        }
    }
    found
}

/// Whether the `return` at `at` is the `else { return }` of a statement that calls the helper.
fn through_the_helper(code: &[char], at: usize) -> bool {
    let Some((brace, '{')) = previous_code(code, at) else {
        return false;
    };
    let Some((end, 'e')) = previous_code(code, brace) else {
        return false;
    };
    let Some(else_at) = end.checked_sub(3).filter(|&k| word_at(code, k, "else")) else {
        return false;
    };
    let after = next_code(code, at + "return".len()).map(|(k, c)| match c {
        ';' => next_code(code, k + 1).map(|(_, c)| c),
        c => Some(c),
    });
    if after != Some(Some('}')) {
        return false;
    }
    let statement = statement_before(code, else_at);
    statement.trim_start().starts_with("let ") && statement.contains(HELPER)
}

/// The statement text before index `end` (exclusive): back to the `;` or brace that ends the
/// statement before it, parentheses and brackets skipped.
fn statement_before(code: &[char], end: usize) -> String {
    let mut depth = 0i32;
    let mut start = end;
    while start > 0 {
        match code[start - 1] {
            ')' | ']' => depth += 1,
            '(' | '[' => depth -= 1,
            '}' if depth == 0 => break,
            '}' => depth += 1,
            '{' if depth == 0 => break,
            '{' => depth -= 1,
            ';' if depth == 0 => break,
            _ => {}
        }
        start -= 1;
    }
    text(code, start, end)
}

/// Whether the `return` at `at` sits inside a `loop`, `for` or `while` body that is itself
/// inside the test body opening at `open`.
fn inside_a_loop(code: &[char], open: usize, at: usize) -> bool {
    let mut depth = 0usize;
    for k in (open + 1..at).rev() {
        match code[k] {
            '}' => depth += 1,
            '{' if depth > 0 => depth -= 1,
            '{' => {
                let header = statement_before(code, k);
                let header = header.trim();
                let unlabelled = match header.strip_prefix('\'') {
                    Some(rest) => rest.split_once(':').map_or(header, |(_, r)| r.trim_start()),
                    None => header,
                };
                let ends_in_loop = header.ends_with("loop")
                    && !header[..header.len() - 4].ends_with(|c: char| is_ident(c));
                if ends_in_loop
                    || unlabelled.starts_with("for ")
                    || unlabelled.starts_with("while ")
                {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

/// Every early return from a test in `text` (the contents of `path`) that does not go
/// through the helper.
fn silent_skips(path: &str, text: &str) -> Vec<String> {
    let code = code_only(text);
    let line_of = |at: usize| 1 + code[..at].iter().filter(|c| **c == '\n').count();
    let mut problems = Vec::new();
    for (name, open, close) in tests_in(&code) {
        for at in open..close {
            if !word_at(&code, at, "return") {
                continue;
            }
            let ends_the_test = match next_code(&code, at + "return".len()) {
                Some((_, ';' | '}' | ',')) => true,
                Some((k, 'O')) => word_at(&code, k, "Ok"),
                _ => false,
            };
            if ends_the_test && !through_the_helper(&code, at) && !inside_a_loop(&code, open, at) {
                problems.push(format!(
                    "{path}:{}: test `{name}` returns early without `skip::needs` \
                     (tests/tests/harness/skip.rs): a test that cannot run here must fail \
                     unless its skip variable is set",
                    line_of(at)
                ));
            }
        }
    }
    problems
}

#[test]
fn every_early_return_from_a_test_goes_through_the_skip_helper() {
    let sources = rust_sources();
    let problems: Vec<String> = sources
        .iter()
        .flat_map(|(path, text)| silent_skips(path, text))
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The scan sees the tests it must: the helper's users are among them.
    let guarded = sources
        .iter()
        .filter(|(_, text)| text.contains("skip::needs(skip::ROOT"))
        .count();
    assert!(
        guarded >= 3,
        "only {guarded} files call skip::needs(skip::ROOT, …)"
    );
}

/// Every file of `dir` (recursively), as (path from the root, text), skipping binary files.
fn script_files(root: &Path, dir: &Path, files: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            script_files(root, &path, files);
        } else if let Ok(text) = std::fs::read_to_string(&path) {
            let relative = path.strip_prefix(root).unwrap().display().to_string();
            files.push((relative, text));
        }
    }
}

#[test]
fn ci_sets_no_skip_variable() {
    let root = workspace_root();
    let mut files = Vec::new();
    script_files(&root, &root.join(".ci"), &mut files);
    script_files(&root, &root.join("scripts"), &mut files);
    assert!(
        files.iter().any(|(path, _)| path == ".ci/run"),
        "no .ci/run among {} files",
        files.len()
    );
    let setting: Vec<String> = files
        .iter()
        .flat_map(|(path, text)| {
            skip::ALL
                .iter()
                .filter(|variable| text.contains(*variable))
                .map(move |variable| format!("{path} names {variable}"))
        })
        .collect();
    assert!(
        setting.is_empty(),
        "CI must run every test, so no CI script may set a skip variable:\n{}",
        setting.join("\n")
    );
}

/// How many silent skips the check finds in `source`, printed with what it found.
fn count(source: &str) -> usize {
    let found = silent_skips("a.rs", source);
    println!("{source:?}: {found:?}");
    found.len()
}

/// A test body that goes through the helper.
const GUARDED: &str =
    "let Some(t) = skip::needs(skip::ROOT, Tmpfs::mount(\"3m\")) else { return };";

#[test]
fn the_skip_check_lets_the_helper_and_finished_polls_through() {
    // Through the helper, in either layout rustfmt gives it; returns that leave a closure or a
    // helper; a return in a non-test function, a comment or a string.
    assert_eq!(count(&format!("#[test]\nfn a() {{ {GUARDED} }}")), 0);
    let wrapped = "let Some(t) = skip::needs(skip::ROOT, f()) else {\n        return;\n    };";
    assert_eq!(
        count(&format!(
            "#[tokio::test]\nasync fn a() {{\n    {wrapped}\n}}"
        )),
        0
    );
    assert_eq!(
        count(
            "#[test]\nfn a() { let v: Vec<_> = xs.iter().map(|x| { return x + 1; }).collect(); }"
        ),
        0
    );
    assert_eq!(
        count("fn helper() -> Option<u8> { if x { return None; } return; }"),
        0
    );
    // A poll that found what it waited for: inside `for`, `while`, `loop` (also labelled,
    // also in an async block), a return ends the wait, and the test fails after the loop.
    for poll in [
        "for _ in 0..5 { if done() { return; } }",
        "while busy() { if done() { return; } }",
        "'poll: loop { match s() { Done => return, _ => {} } }",
        "within(async { loop { if done() { return; } } })",
    ] {
        assert_eq!(count(&format!("#[test]\nfn a() {{ {poll} panic!(); }}")), 0);
    }
    assert_eq!(
        count("#[test]\nfn a() { // return;\n let s = \"return;\"; check(s); }"),
        0
    );
}

#[test]
fn the_skip_check_catches_silent_skips() {
    // Early returns: a bare one, a let-else on anything but the helper, one that prints
    // first, one inside an async block, a match arm, `return Ok(())`, and an attribute with
    // arguments.
    assert_eq!(count("#[test]\nfn a() { if !root() { return; } }"), 1);
    assert_eq!(
        count("#[test]\nfn a() { let Some(t) = f() else { return }; }"),
        1
    );
    assert_eq!(
        count(
            "#[test]\nfn a() { let Some(t) = skip::needs(V, f()) else { eprintln!(); return }; }"
        ),
        1
    );
    assert_eq!(
        count("#[test]\nfn a() { within(async { if done { return; } }); }"),
        1
    );
    assert_eq!(
        count("#[test]\nfn a() { match s { A => return, _ => {} } }"),
        1
    );
    assert_eq!(
        count("#[test]\nfn a() { let x = reloop { if y { return; } }; }"),
        1
    );
    assert_eq!(count("#[test]\nfn a() { if fortune() { return; } }"), 1);
    assert_eq!(
        count("#[test]\nfn a() -> Result<(), E> { return Ok(()); }"),
        1
    );
    assert_eq!(
        count("#[tokio::test(flavor = \"multi_thread\")]\n#[ignore]\nasync fn a() { return }"),
        1
    );
    // Two tests, one guarded and one not: the line of the bad one.
    let two = format!("#[test]\nfn a() {{ {GUARDED} }}\n#[test]\nfn b() {{\n    return;\n}}");
    assert_eq!(
        silent_skips("a.rs", &two),
        vec![
            "a.rs:5: test `b` returns early without `skip::needs` (tests/tests/harness/skip.rs): \
             a test that cannot run here must fail unless its skip variable is set"
                .to_owned()
        ]
    );
}

#[test]
fn the_skip_helper_fails_unless_its_variable_is_set() {
    // A variable no one sets: what every test sees on CI.
    let unset = "BIGFLEET_SKIP_NOTHING_EVER";
    assert!(std::env::var_os(unset).is_none(), "{unset} is set");
    assert_eq!(skip::needs(unset, Ok::<u8, String>(7)), Some(7));
    let refused = std::panic::catch_unwind(|| {
        skip::needs::<u8>(unset, Err("needs root to mount a tmpfs".to_owned()))
    });
    let message = refused.expect_err("a test that cannot run fails when not asked to skip");
    let message = message
        .downcast_ref::<String>()
        .expect("a formatted panic message");
    assert!(
        message.contains("needs root to mount a tmpfs") && message.contains(unset),
        "the failure says why and how to skip: {message}"
    );
}
