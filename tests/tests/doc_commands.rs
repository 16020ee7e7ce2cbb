//! Every `cargo test -p …` command the docs and doc comments tell people to run selects at least
//! one test: a command that runs zero tests (a crate that moved, a renamed test) passes
//! silently and teaches nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Markdown and Rust files under `dir` (no build output, no dependencies).
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(
                name.as_str(),
                "target" | "node_modules" | ".venv" | ".git" | "fuzz"
            ) {
                files(&path, out);
            }
        } else if name.ends_with(".md") || name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// The `cargo test -p …` commands quoted in `text` (in backticks on one line), as the
/// arguments after `cargo test` up to a `--` (what goes to the test binary). Commands with a
/// placeholder argument (`<name>`) are left out.
fn commands(text: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split('`').collect();
        // Odd parts are quoted; the last one only if its backtick closes on this line.
        let closed = parts.len().saturating_sub(1);
        for quoted in parts[..closed].iter().skip(1).step_by(2) {
            let Some(at) = quoted.find("cargo test -p ") else {
                continue;
            };
            let args: Vec<String> = quoted[at + "cargo test".len()..]
                .split_whitespace()
                .take_while(|arg| *arg != "--")
                .map(str::to_owned)
                .collect();
            if args.iter().any(|a| a.contains('<') || a == "--no-run") {
                continue;
            }
            found.push(args);
        }
    }
    found
}

#[test]
fn every_documented_test_command_runs_a_test() {
    let root = sluice_tests::workspace_root();
    let mut paths = vec![root.join("README.md")];
    for dir in ["docs", "crates", "proxy", "tests"] {
        files(&root.join(dir), &mut paths);
    }
    let mut seen = std::collections::BTreeSet::new();
    for path in paths {
        // This file quotes commands to test the reading itself.
        if path.ends_with("tests/doc_commands.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for args in commands(&text) {
            if !seen.insert(args.clone()) {
                continue;
            }
            let out = Command::new(env!("CARGO"))
                .args(["test", "--quiet"])
                .args(&args)
                .args(["--", "--list", "--format", "terse"])
                .current_dir(&root)
                .output()
                .expect("cargo runs");
            let listed = String::from_utf8_lossy(&out.stdout);
            let tests = listed.lines().filter(|l| l.ends_with(": test")).count();
            assert!(
                out.status.success() && tests > 0,
                "{}: `cargo test {}` selects {tests} tests\n{}",
                path.display(),
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert!(
        seen.len() >= 3,
        "found only {} documented commands",
        seen.len()
    );
}

#[test]
fn commands_are_read_from_backticks_up_to_their_binary_arguments() {
    let text = "run `SLUICE_SIM_SEED=<seed> cargo test -p sluice-runtime --lib partition::sim -- --nocapture` or `cargo test -p x\n--lib` and `cargo test -p y <name>`";
    assert_eq!(
        commands(text),
        [vec!["-p", "sluice-runtime", "--lib", "partition::sim"]]
    );
}
