//! Cost of a policy plugin call: the `tenant-header` example plugin (built for wasm32-wasip2
//! from `plugins/`) classifying a request with 10 headers through [`Plugins::extract`], the
//! same path the ingress takes: handed to a plugin thread and awaited. `cargo bench -p sluice-plugins --bench plugins`; besides criterion's
//! estimate it prints p50/p99 of single calls, and what loading (compiling) and instantiating
//! cost. Its Python twin (`plugins/python/tenant_header.py`, built by `plugins/python/build`)
//! is measured the same way beside it when componentize-py is installed (scripts/setup).

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_plugins::{ExtractRequest, Extracted, Hook, PluginSpec, Plugins, Source};

/// Builds the example plugins into the target dir's `plugins/` folder; answers `name`'s file.
fn plugin_wasm(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("bench executable");
    // target/release/deps/<bench> → target
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the bench lives in target/<profile>/deps")
        .join("plugins");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugins/Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "-q",
            "--release",
            "--locked",
            "--target",
            "wasm32-wasip2",
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("cargo runs");
    assert!(
        status.success(),
        "building the plugins failed (rustup target add wasm32-wasip2?)"
    );
    target.join(format!(
        "wasm32-wasip2/release/{}.wasm",
        name.replace('-', "_")
    ))
}

/// The Python twin's component, or `None` (said why) when componentize-py is missing.
fn python_plugin_wasm(module: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().expect("bench executable");
    let out = exe
        .ancestors()
        .nth(3)
        .expect("the bench lives in target/<profile>/deps")
        .join("plugins/python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugins/python/build");
    match Command::new(&script).arg(&out).status() {
        Ok(status) if status.success() => Some(out.join(format!("{module}.wasm"))),
        _ => {
            println!(
                "the Python plugin is not measured: {} failed",
                script.display()
            );
            None
        }
    }
}

fn request() -> ExtractRequest {
    let mut headers: Vec<(String, String)> = (0..7)
        .map(|i| (format!("x-extra-{i}"), format!("value-{i}")))
        .collect();
    headers.push(("content-type".into(), "application/json".into()));
    headers.push(("x-tenant".into(), "acme".into()));
    headers.push(("x-tier".into(), "gold".into()));
    ExtractRequest {
        method: "POST".into(),
        path: "/service/call/Greeter/greet".into(),
        query: None,
        headers,
        target: Some(("Greeter".into(), "greet".into(), None)),
        scope: None,
        limit_key: None,
    }
}

/// Loads `bytes` as the tenant-header plugin into `plugins`, printing what compiling it and
/// (the bytes compiled already) instantiating it take.
fn load_timed(plugins: &Plugins, label: &str, bytes: &[u8]) {
    let spec = || {
        let mut spec = PluginSpec::new(Hook::Extract);
        spec.config.insert("l1-header".into(), "x-tier".into());
        spec
    };
    let started = Instant::now();
    plugins
        .load("tenants", bytes, spec(), Source::Admin)
        .expect("the plugin loads");
    let compiled = started.elapsed();
    // Loading the same bytes again compiles nothing: what is left is checking, linking and
    // instantiating one warm instance.
    let mut again: Vec<Duration> = (0..20)
        .map(|_| {
            let started = Instant::now();
            plugins
                .load("again", bytes, spec(), Source::Admin)
                .expect("the plugin loads again");
            started.elapsed()
        })
        .collect();
    again.sort();
    plugins.unload("again").expect("unloads");
    println!(
        "plugins/load ({label}, {} KiB): first load (compiling) {compiled:?}, loading it again (instantiating) p50 {:?}",
        bytes.len() >> 10,
        again[again.len() / 2]
    );
}

fn extract(c: &mut Criterion) {
    let plugins = Plugins::new(None, None);
    let bytes = std::fs::read(plugin_wasm("tenant-header")).expect("the plugin file");
    load_timed(&plugins, "Rust tenant-header", &bytes);
    measure(c, &plugins, "tenant-header");
    if let Some(path) = python_plugin_wasm("tenant_header") {
        let python = Plugins::new(None, None);
        let bytes = std::fs::read(path).expect("the Python plugin file");
        load_timed(&python, "Python tenant_header", &bytes);
        measure(c, &python, "Python tenant_header");
    }
    c.bench_function("plugins/extract, none loaded", |b| {
        let empty = Plugins::new(None, None);
        b.iter(|| black_box(empty.extract(|| black_box(request())).is_none()))
    });
}

/// Single-call percentiles and criterion's estimate of one `extract` through `plugins`.
fn measure(c: &mut Criterion, plugins: &Plugins, label: &str) {
    let awaiting = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime to await the plugin thread on");
    let call = || {
        awaiting.block_on(
            plugins
                .extract(|| black_box(request()))
                .expect("a plugin is loaded"),
        )
    };
    assert_eq!(
        call().unwrap(),
        Extracted::Classified {
            scope: Some("acme".into()),
            limit_key: Some("gold".into())
        }
    );

    // Single-call percentiles: what one request pays.
    let mut took: Vec<Duration> = (0..100_000)
        .map(|_| {
            let started = Instant::now();
            black_box(call().unwrap());
            started.elapsed()
        })
        .collect();
    took.sort();
    println!(
        "plugins/extract ({label}, 10 headers): p50 {:?}, p99 {:?} over {} calls",
        took[took.len() / 2],
        took[took.len() * 99 / 100],
        took.len()
    );

    c.bench_function(&format!("plugins/extract ({label}, 10 headers)"), |b| {
        b.iter(|| black_box(call().unwrap()))
    });
}

criterion_group!(benches, extract);
criterion_main!(benches);
