//! Where the binaries under test are, and free loopback ports to run them on.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Result;

/// How long a start-up may take before the test gives up.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The workspace's root directory (the `tests` crate sits in it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace")
        .to_path_buf()
}

/// Runs `program` with `args` and asserts it succeeded; its standard output.
pub fn run_ok(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `sluice` binary: `$SLUICE_BIN`, else the one cargo built beside this test executable.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> → target/<profile>/sluice
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let bin = dir.join("sluice");
    assert!(
        bin.exists(),
        "{} not found: run the suite with `cargo test --workspace` (which builds the binary) or set SLUICE_BIN",
        bin.display()
    );
    bin
}

/// A binary built beside `sluice` in the same target dir.
pub fn sibling_binary(name: &str) -> PathBuf {
    let bin = binary().with_file_name(name);
    assert!(
        bin.exists(),
        "{} not found: run `cargo test --workspace`",
        bin.display()
    );
    bin
}

/// The target dir the binaries under test were built in (`target/<profile>/sluice` → `target`),
/// where the plugins are built too.
fn target_dir() -> Result<PathBuf, String> {
    binary()
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| "no target dir".to_owned())
}

/// The `.wasm` component of plugin crate `name` (under `plugins/`), built for wasm32-wasip2
/// once per test process into the target dir's `plugins/` folder.
pub fn plugin_wasm(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let target = target_dir()?.join("plugins");
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/Cargo.toml");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--release", "--locked", "--target", "wasm32-wasip2"])
            .arg("--manifest-path")
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target)
            .status()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        if !status.success() {
            return Err(format!(
                "building the plugins failed ({status}); is the wasm32-wasip2 target installed (rustup target add wasm32-wasip2)?"
            ));
        }
        Ok(target.join("wasm32-wasip2/release"))
    });
    let dir = dir.as_ref().unwrap_or_else(|e| panic!("{e}"));
    dir.join(format!("{}.wasm", name.replace('-', "_")))
}

/// The `.wasm` component of Python plugin `module` (`plugins/python/<module>.py`), built with
/// componentize-py by `plugins/python/build` once per test process into the target dir's
/// `plugins/python/` folder.
pub fn python_plugin_wasm(module: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let out = target_dir()?.join("plugins/python");
        let script = workspace_root().join("plugins/python/build");
        let status = Command::new(&script)
            .arg(&out)
            .status()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        if !status.success() {
            return Err(format!(
                "building the Python plugins failed ({status}); is componentize-py installed (scripts/setup)?"
            ));
        }
        Ok(out)
    });
    let dir = dir.as_ref().unwrap_or_else(|e| panic!("{e}"));
    dir.join(format!("{module}.wasm"))
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}
