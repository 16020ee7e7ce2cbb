//! The Debian package an operator installs (`scripts/package-deb`, `deploy/debian/`): built from
//! the suite's binary, it holds the server and CLI, the systemd unit, the default config as a
//! conffile (0640) and maintainer scripts; the unit passes `systemd-analyze verify` and rates
//! at most 4 in `systemd-analyze security`; the packaged script makes an admin token once; and
//! the binary, unpacked with its files, starts on the packaged config, refuses the admin API
//! without the token and serves a call registered with it.
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
    // The unit is hardened: systemd's own review rates its exposure at most 4 (of 10).
    let review = run_ok(
        "systemd-analyze",
        &["security", "--offline=yes", checked.to_str().unwrap()],
    );
    let exposure: f64 = review
        .lines()
        .find_map(|line| {
            line.split("Overall exposure level for sluice.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|level| level.parse().ok())
        .unwrap_or_else(|| panic!("no overall exposure in:\n{review}"));
    assert!(exposure <= 4.0, "exposure {exposure}:\n{review}");

    // The config is not world-readable; the admin token the postinst makes is 0640, made once.
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("-rw-r----- root/root")
                && l.ends_with("./etc/sluice/sluice.toml")),
        "{listed}"
    );
    let postinst = std::fs::read_to_string(control.join("postinst")).unwrap();
    assert!(
        postinst.contains("make-admin-token /etc/sluice/admin-tokens sluice")
            && postinst.contains("chown root:sluice /etc/sluice/sluice.toml"),
        "{postinst}"
    );
    let tokens = scratch.path().join("admin-tokens");
    let make_token = root.join("usr/lib/sluice/make-admin-token");
    run_ok(make_token.to_str().unwrap(), &[tokens.to_str().unwrap()]);
    let made = std::fs::read_to_string(&tokens).unwrap();
    let token = made
        .lines()
        .find_map(|l| l.strip_prefix("admin:"))
        .expect("an admin token")
        .to_owned();
    assert!(
        token.len() == 48 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "{made}"
    );
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&tokens).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    run_ok(make_token.to_str().unwrap(), &[tokens.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&tokens).unwrap(), made, "made once");
    // The packaged config names the token file: the test's stands in for /etc's.
    let packaged = std::fs::read_to_string(&config).unwrap();
    assert!(
        packaged.contains("auth-tokens-file = \"/etc/sluice/admin-tokens\""),
        "{packaged}"
    );
    let config = scratch.path().join("sluice.toml");
    std::fs::write(
        &config,
        packaged.replace("/etc/sluice/admin-tokens", tokens.to_str().unwrap()),
    )
    .unwrap();

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
    // The admin API wants the token made at install.
    let open = reqwest::get(format!("{admin_url}/deployments"))
        .await
        .unwrap();
    assert_eq!(open.status(), 401);
    let registered = Command::new(&server)
        .args(["deployments", "register", &dep.uri])
        .env("SLUICE_ADMIN_URL", &admin_url)
        .env("SLUICE_ADMIN_TOKEN", &token)
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
