//! The `sluice` command line, run as a process.

use std::process::Command;

fn sluice(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice")
}

#[test]
fn explain_prints_a_code() {
    let out = sluice(&["explain", "rt0024"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("RT0024: invalid flow-control usage"),
        "{text}"
    );
    assert!(text.contains("HTTP 400"), "{text}");
    assert!(text.contains("[a-zA-Z0-9_.-]"), "{text}");
}

#[test]
fn explain_rejects_an_unknown_code() {
    let out = sluice(&["explain", "RT9999"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        err.trim(),
        "error: unknown error code 'RT9999': codes look like RT0024 or META0009 (`sluice explain --list` shows them all)"
    );
}

#[test]
fn explain_lists_every_code() {
    let out = sluice(&["explain", "--list"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for code in ["META0003", "META0017", "RT0001", "RT0024"] {
        assert!(text.contains(code), "{code} missing:\n{text}");
    }
}
