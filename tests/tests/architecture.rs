//! `ARCHITECTURE.md` is the map of the code: its crate table names every crate of the
//! workspace with exactly the Sluice crates its `Cargo.toml` depends on, and every path it
//! names from the workspace's root exists. A crate that gains a dependency, or a file that
//! moves, fails here until the map says so.

use std::collections::BTreeSet;
use std::path::Path;

use sluice_tests::workspace_root;

/// The backticked spans of `text`, in order.
fn quoted(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// One row of the crate table: the crate, its directory and the Sluice crates it depends on.
struct Row {
    name: String,
    dir: String,
    depends_on: BTreeSet<String>,
}

/// The rows of the table under `## Crates`.
fn crate_rows(map: &str) -> Vec<Row> {
    let section = map
        .split("\n## ")
        .find(|s| s.starts_with("Crates"))
        .expect("ARCHITECTURE.md has a `## Crates` section");
    section
        .lines()
        .filter(|line| line.starts_with("| `sluice"))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
            assert_eq!(cells.len(), 3, "a crate row has three cells: {line}");
            let named = quoted(cells[0]);
            assert_eq!(
                named.len(),
                2,
                "a crate row names its crate and directory: {line}"
            );
            Row {
                name: named[0].to_owned(),
                dir: named[1].to_owned(),
                depends_on: quoted(cells[2])
                    .into_iter()
                    .filter(|name| name.starts_with("sluice"))
                    .map(str::to_owned)
                    .collect(),
            }
        })
        .collect()
}

/// The package name and the Sluice crates under `[dependencies]` of the manifest in `dir`.
fn manifest(dir: &Path) -> (String, BTreeSet<String>) {
    let text = std::fs::read_to_string(dir.join("Cargo.toml"))
        .unwrap_or_else(|e| panic!("{}/Cargo.toml: {e}", dir.display()));
    let mut section = "";
    let mut name = None;
    let mut depends_on = BTreeSet::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
            continue;
        }
        let key = line.split(['=', '.', ' ']).next().unwrap_or_default();
        if section == "[package]" && key == "name" {
            name = line.split('"').nth(1).map(str::to_owned);
        }
        if section == "[dependencies]" && key.starts_with("sluice") {
            depends_on.insert(key.to_owned());
        }
    }
    (name.expect("a package name"), depends_on)
}

#[test]
fn every_crate_row_names_exactly_the_sluice_crates_its_manifest_depends_on() {
    let root = workspace_root();
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let rows = crate_rows(&map);
    for row in &rows {
        let (name, depends_on) = manifest(&root.join(&row.dir));
        assert_eq!(name, row.name, "{name} is the package in {}", row.dir);
        assert_eq!(
            depends_on, row.depends_on,
            "{}: its Cargo.toml depends on these Sluice crates; ARCHITECTURE.md's row must say so",
            row.name
        );
    }
    // Every crate of the workspace has its row.
    let mut dirs: Vec<String> = ["proxy/", "guest-sdk/", "tests/"].map(str::to_owned).into();
    for entry in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        if entry.path().join("Cargo.toml").exists() {
            dirs.push(format!("crates/{}/", entry.file_name().to_string_lossy()));
        }
    }
    let mapped: BTreeSet<&str> = rows.iter().map(|row| row.dir.as_str()).collect();
    for dir in &dirs {
        assert!(
            mapped.contains(dir.as_str()),
            "{dir} has no row in ARCHITECTURE.md's crate table"
        );
    }
}

#[test]
fn every_path_the_map_names_from_the_root_exists() {
    let root = workspace_root();
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let tops = [
        "crates/",
        "proxy/",
        "tests/",
        "docs/",
        "scripts/",
        "plugins/",
        "guest-sdk/",
    ];
    let mut missing = Vec::new();
    for path in quoted(&map) {
        // A placeholder (`crates/admin/src/<area>.rs`) or an item (`file.rs::function`).
        let path = path.split("::").next().unwrap_or_default();
        if !tops.iter().any(|top| path.starts_with(top)) || path.contains(['<', '*', ' ']) {
            continue;
        }
        if !root.join(path).exists() {
            missing.push(path);
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

/// The crate-root `use` lines of `lib_rs` that bring a module of another Sluice crate in, so
/// the crate's code could reach it as `crate::<module>`: `use sluice_flow as flow;`,
/// `use sluice_core::{errors, ids};`, `use sluice_store::storage;`. `is_module(krate, name)`
/// says whether `name` is a module of the crate `krate` (`sluice_core`).
fn aliases(lib_rs: &str, is_module: impl Fn(&str, &str) -> bool) -> Vec<&str> {
    lib_rs
        .lines()
        .filter(|line| {
            line.starts_with("use sluice_") || line.starts_with("pub(crate) use sluice_")
        })
        .filter(|line| {
            let path = line.trim_end_matches(';');
            if path.contains(" as ") {
                return true;
            }
            let path = path
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("use ");
            let Some((krate, rest)) = path.split_once("::") else {
                return false;
            };
            match rest.strip_prefix('{') {
                Some(names) => names
                    .trim_end_matches('}')
                    .split(',')
                    .any(|name| is_module(krate, name.trim())),
                None => !rest.contains("::") && is_module(krate, rest),
            }
        })
        .collect()
}

/// Whether `name` is a module at the root of the workspace crate `krate`.
fn is_module(root: &Path, krate: &str, name: &str) -> bool {
    let dir = krate.trim_start_matches("sluice_").replace('_', "-");
    let lib_rs = std::fs::read_to_string(root.join("crates").join(dir).join("src/lib.rs"))
        .unwrap_or_default();
    lib_rs.lines().any(|line| {
        let line = line
            .trim_start_matches("pub ")
            .trim_start_matches("pub(crate) ");
        line == format!("mod {name};") || line == format!("mod {name} {{")
    })
}

#[test]
fn no_crate_reaches_another_through_an_alias_of_its_own() {
    let modules = |_: &str, name: &str| ["errors", "ids", "storage"].contains(&name);
    assert_eq!(
        aliases(
            "use sluice_flow as flow;\nuse sluice_core::{errors, ids};\nuse sluice_core::errors::Code;\nuse sluice_core::clock::now_ms;\nuse sluice_store::storage;\n",
            modules
        ),
        [
            "use sluice_flow as flow;",
            "use sluice_core::{errors, ids};",
            "use sluice_store::storage;"
        ]
    );
    let root = workspace_root();
    let mut roots = vec![
        root.join("proxy/src/lib.rs"),
        root.join("proxy/src/main.rs"),
    ];
    for entry in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        roots.push(entry.path().join("src/lib.rs"));
    }
    let mut found = Vec::new();
    for lib_rs in roots.iter().filter(|path| path.exists()) {
        let text = std::fs::read_to_string(lib_rs).unwrap();
        for line in aliases(&text, |krate, name| is_module(&root, krate, name)) {
            found.push(format!("{}: {line}", lib_rs.display()));
        }
    }
    assert!(
        found.is_empty(),
        "name the crate where it is used (sluice_core::ids::…), not an alias at the crate's root: {found:#?}"
    );
}
