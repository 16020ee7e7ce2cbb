//! Handler deployments the tests start: the Rust-SDK test deployment and a fake one that
//! answers discovery with a given manifest.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::binaries::{READY_TIMEOUT, free_port, sibling_binary};

/// A deployment that discovers fine (one service `Bad` with handler `go`, protocol versions 5
/// to `max_protocol`) and answers every invocation with `invoke`: for misbehaving deployments.
pub async fn fake_deployment(
    max_protocol: u32,
    invoke: fn() -> axum::response::Response,
) -> std::net::SocketAddr {
    use axum::routing::{get, post};
    let manifest = serde_json::json!({
        "protocolMode": "BIDI_STREAM", "minProtocolVersion": 5, "maxProtocolVersion": max_protocol,
        "services": [{"name": "Bad", "ty": "SERVICE", "handlers": [{"name": "go"}]}]
    });
    let router = axum::Router::new()
        .route(
            "/discover",
            get(move || {
                let body = manifest.to_string();
                async move {
                    (
                        [(
                            "content-type",
                            "application/vnd.restate.endpointmanifest.v2+json",
                        )],
                        body,
                    )
                }
            }),
        )
        .route("/invoke/Bad/go", post(move || async move { invoke() }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("a bound address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    addr
}

/// A deployment written with the real Restate Rust SDK (`sluice-test-deployment`).
#[derive(Debug)]
pub struct TestDeployment {
    child: Child,
    /// `http://127.0.0.1:<port>/`
    pub uri: String,
    /// The port it listens on.
    pub port: u16,
}

impl TestDeployment {
    /// Starts the deployment with a manifest flavor (`v1`, `v2`, `fewer`, `object`) on a free port.
    pub async fn start(flavor: &str) -> Result<Self> {
        Self::start_on(free_port(), flavor).await
    }

    /// Starts it with `Meter/work` logging each side effect to `effects` (see
    /// [`effects_per_invocation`]).
    pub async fn start_logging(flavor: &str, effects: &Path) -> Result<Self> {
        let port = free_port();
        let mut cmd = Command::new(sibling_binary("sluice-test-deployment"));
        cmd.arg(format!("127.0.0.1:{port}"))
            .arg(flavor)
            .env("SLUICE_TEST_EFFECTS", effects);
        Self::spawn(cmd, port).await
    }

    /// Starts it on `port` with environment variables (`SLUICE_TEST_LIMITS`,
    /// `SLUICE_TEST_CAPACITY`: see the binary's docs).
    pub async fn start_with(port: u16, flavor: &str, env: &[(&str, &str)]) -> Result<Self> {
        let mut cmd = Command::new(sibling_binary("sluice-test-deployment"));
        cmd.arg(format!("127.0.0.1:{port}")).arg(flavor);
        for (key, value) in env {
            cmd.env(key, value);
        }
        Self::spawn(cmd, port).await
    }

    /// Starts it on `port`.
    pub async fn start_on(port: u16, flavor: &str) -> Result<Self> {
        let mut cmd = Command::new(sibling_binary("sluice-test-deployment"));
        cmd.arg(format!("127.0.0.1:{port}")).arg(flavor);
        Self::spawn(cmd, port).await
    }

    /// Starts the TypeScript SDK deployment (`tests/ts-deployment`, installed by `scripts/setup`):
    /// `h2` serves HTTP/2 bidi, `h1` HTTP/1.1 request/response.
    pub async fn typescript(mode: &str) -> Result<Self> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("ts-deployment");
        if !dir.join("node_modules/@restatedev/restate-sdk").exists() {
            bail!(
                "{}/node_modules is missing: run scripts/setup (it runs npm ci there)",
                dir.display()
            );
        }
        let port = free_port();
        let mut cmd = Command::new("node");
        cmd.arg(dir.join("deployment.js"))
            .arg(port.to_string())
            .arg(mode);
        Self::spawn(cmd, port).await
    }

    /// Starts the Python SDK deployment (`tests/py-deployment`, served by hypercorn over HTTP/2
    /// with prior knowledge, in the virtual environment `scripts/setup` makes).
    pub async fn python() -> Result<Self> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("py-deployment");
        let python = dir.join(".venv/bin/python");
        if !python.exists() {
            bail!(
                "{} is missing: run scripts/setup (it makes the virtual environment)",
                python.display()
            );
        }
        let port = free_port();
        let mut cmd = Command::new(python);
        cmd.arg(dir.join("deployment.py")).arg(port.to_string());
        Self::spawn(cmd, port).await
    }

    /// Starts the Go SDK deployment (`tests/go-deployment`, served over HTTP/2 with prior
    /// knowledge by the SDK's own server; `scripts/setup` builds it).
    pub async fn go() -> Result<Self> {
        let binary = Path::new(env!("CARGO_MANIFEST_DIR")).join("go-deployment/go-deployment");
        if !binary.exists() {
            bail!(
                "{} is missing: run scripts/setup (it builds it with go build)",
                binary.display()
            );
        }
        let port = free_port();
        let mut cmd = Command::new(binary);
        cmd.arg(port.to_string());
        Self::spawn(cmd, port).await
    }

    /// Starts the Java SDK deployment (`tests/java-deployment`, `dev.sluice.tests.Main` served
    /// over HTTP/2 by Vert.x on loopback; `scripts/setup` builds it with Maven).
    pub async fn java() -> Result<Self> {
        let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("java-deployment/target");
        let jar = target.join("java-deployment-1.jar");
        if !jar.exists() {
            bail!(
                "{} is missing: run scripts/setup (it builds it with mvn package)",
                jar.display()
            );
        }
        let port = free_port();
        let mut cmd = Command::new("java");
        cmd.arg("-cp")
            .arg(format!(
                "{}:{}/*",
                jar.display(),
                target.join("lib").display()
            ))
            .arg("dev.sluice.tests.Main")
            .arg(port.to_string());
        Self::spawn(cmd, port).await
    }

    async fn spawn(mut cmd: Command, port: u16) -> Result<Self> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("spawn {cmd:?}"))?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            // Ready is our child listening: a connection alone may reach another process that
            // took the port while ours died.
            if let Some(status) = child.try_wait()? {
                bail!("test deployment exited before it listened on {port}: {status}");
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                if let Some(status) = child.try_wait()? {
                    bail!("test deployment exited, and port {port} belongs to another: {status}");
                }
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("test deployment not listening on {port}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Self {
            child,
            uri: format!("http://127.0.0.1:{port}/"),
            port,
        })
    }
}

impl Drop for TestDeployment {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
