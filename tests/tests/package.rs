//! The Debian package an operator installs (`scripts/package-deb`, `deploy/debian/`): built from
//! the suite's binary, it holds the server and CLI, the systemd unit, the default config as a
//! conffile and maintainer scripts; the unit passes `systemd-analyze verify`; and the binary,
//! unpacked with its files, starts on the packaged config and serves a call.
//!
//! The test unpacks the package into a temporary root (`dpkg-deb -x`) rather than installing it
//! with `dpkg -i`: an install would change the machine running the suite (a system user, files
//! under /usr and /etc) and start a service only where systemd runs.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_tests::{TestDeployment, binary, free_port, run_ok, workspace_root};

#[tokio::test]
async fn the_debian_package_holds_a_verified_unit_and_a_server_that_starts_on_its_config() {
    let scratch = tempfile::tempdir().unwrap();
    let out = scratch.path().join("out");
    let built = run_ok(
        workspace_root()
            .join("scripts/package-deb")
            .to_str()
            .unwrap(),
        &[
            "--binary",
            binary().to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--compress",
            "gzip",
        ],
    );
    let deb = built
        .lines()
        .last()
        .expect("the script names the package")
        .to_owned();
    assert!(deb.ends_with(".deb") && Path::new(&deb).exists(), "{built}");

    let fields = run_ok("dpkg-deb", &["-f", &deb, "Package", "Depends"]);
    assert!(fields.contains("Package: sluice"), "{fields}");
    assert!(fields.contains("adduser"), "{fields}");
    let listed = run_ok("dpkg-deb", &["-c", &deb]);
    for file in [
        "./usr/bin/sluice",
        "./lib/systemd/system/sluice.service",
        "./etc/sluice/sluice.toml",
        "./usr/share/doc/sluice/prometheus/sluice.rules.yml",
    ] {
        assert!(listed.contains(file), "{file} missing from {listed}");
    }

    // The maintainer scripts parse, and the config is kept across upgrades (a conffile).
    let control = scratch.path().join("control");
    run_ok("dpkg-deb", &["-e", &deb, control.to_str().unwrap()]);
    for script in ["postinst", "prerm", "postrm"] {
        run_ok("sh", &["-n", control.join(script).to_str().unwrap()]);
    }
    let conffiles = std::fs::read_to_string(control.join("conffiles")).unwrap();
    assert_eq!(conffiles.trim(), "/etc/sluice/sluice.toml");

    let root = scratch.path().join("root");
    run_ok("dpkg-deb", &["-x", &deb, root.to_str().unwrap()]);
    let server = root.join("usr/bin/sluice");
    let config = root.join("etc/sluice/sluice.toml");

    // systemd accepts the unit (its ExecStart pointed at the unpacked binary: the unit names
    // /usr/bin/sluice, which this machine need not have).
    let unit = std::fs::read_to_string(root.join("lib/systemd/system/sluice.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/sluice serve --config /etc/sluice/sluice.toml"),
        "{unit}"
    );
    let checked = scratch.path().join("sluice.service");
    std::fs::write(
        &checked,
        unit.replace("/usr/bin/sluice", server.to_str().unwrap())
            .replace("/etc/sluice/sluice.toml", config.to_str().unwrap()),
    )
    .unwrap();
    run_ok("systemd-analyze", &["verify", checked.to_str().unwrap()]);

    // The packaged binary on the packaged config, as the unit starts it; the data dir and the
    // listeners moved to this test's own.
    let dep = TestDeployment::start("v1").await.unwrap();
    let (ingress, admin) = (free_port(), free_port());
    let mut child = Command::new(&server)
        .args(["serve", "--config", config.to_str().unwrap(), "--data-dir"])
        .arg(scratch.path().join("data"))
        .args(["--ingress-bind", &format!("127.0.0.1:{ingress}")])
        .args(["--admin-bind", &format!("127.0.0.1:{admin}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let admin_url = format!("http://127.0.0.1:{admin}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(resp) = reqwest::get(format!("{admin_url}/health")).await
            && resp.status() == 200
        {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the packaged server exited"
        );
        assert!(
            Instant::now() < deadline,
            "the packaged server never answered /health"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let registered = Command::new(&server)
        .args(["deployments", "register", &dep.uri])
        .env("SLUICE_ADMIN_URL", &admin_url)
        .output()
        .unwrap();
    assert!(
        registered.status.success(),
        "{}",
        String::from_utf8_lossy(&registered.stderr)
    );
    let answer = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{ingress}/Greeter/greet"))
        .json(&"deb")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    // SIGTERM, as systemd stops it: it drains and exits cleanly.
    run_ok("kill", &["-TERM", &child.id().to_string()]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
}
