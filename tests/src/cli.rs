//! Running the `sluice` CLI against a server under test.

use std::process::Command;

use crate::binaries::binary;
use crate::server::Sluice;

/// Runs `sluice <command> <args…> --admin-url <sluice's>`: whether it succeeded, and its
/// stdout followed by its stderr.
pub fn cli(sluice: &Sluice, command: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(binary())
        .arg(command)
        .args(args)
        .args(["--admin-url", &sluice.admin_url])
        .output()
        .expect("the sluice binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}
