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
    fake_deployment_declaring(max_protocol, serde_json::json!({}), invoke).await
}

/// Like [`fake_deployment`], its handler `Bad/go` declaring `options` (manifest v4 fields such
/// as `retryPolicyMaxAttempts`) beside its name.
pub async fn fake_deployment_declaring(
    max_protocol: u32,
    options: serde_json::Value,
    invoke: fn() -> axum::response::Response,
) -> std::net::SocketAddr {
    use axum::routing::{get, post};
    let mut handler = serde_json::json!({"name": "go"});
    if let (Some(handler), Some(options)) = (handler.as_object_mut(), options.as_object()) {
        handler.extend(options.clone());
    }
    let manifest = serde_json::json!({
        "protocolMode": "BIDI_STREAM", "minProtocolVersion": 5, "maxProtocolVersion": max_protocol,
        "services": [{"name": "Bad", "ty": "SERVICE", "handlers": [handler]}]
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
                            "application/vnd.restate.endpointmanifest.v4+json",
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
        Self::spawn_on_free_port(|port| rust_sdk_deployment(port, flavor)).await
    }

    /// Starts it with `Meter/work` logging each side effect to `effects` (see
    /// [`effects_per_invocation`]).
    pub async fn start_logging(flavor: &str, effects: &Path) -> Result<Self> {
        Self::spawn_on_free_port(|port| {
            let mut cmd = rust_sdk_deployment(port, flavor);
            cmd.env("SLUICE_TEST_EFFECTS", effects);
            cmd
        })
        .await
    }

    /// Starts it on `port` with environment variables (`SLUICE_TEST_LIMITS`,
    /// `SLUICE_TEST_CAPACITY`: see the binary's docs).
    pub async fn start_with(port: u16, flavor: &str, env: &[(&str, &str)]) -> Result<Self> {
        let mut cmd = rust_sdk_deployment(port, flavor);
        cmd.envs(env.iter().copied());
        Self::spawn(cmd, port).await
    }

    /// Starts it on `port`.
    pub async fn start_on(port: u16, flavor: &str) -> Result<Self> {
        Self::spawn(rust_sdk_deployment(port, flavor), port).await
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
        Self::spawn_on_free_port(|port| {
            let mut cmd = Command::new("node");
            cmd.arg(dir.join("deployment.js"))
                .arg(port.to_string())
                .arg(mode);
            cmd
        })
        .await
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
        Self::spawn_on_free_port(|port| {
            let mut cmd = Command::new(&python);
            cmd.arg(dir.join("deployment.py")).arg(port.to_string());
            cmd
        })
        .await
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
        Self::spawn_on_free_port(|port| {
            let mut cmd = Command::new(&binary);
            cmd.arg(port.to_string());
            cmd
        })
        .await
    }

    /// Starts the Java SDK deployment (`tests/java-deployment`, `dev.sluice.tests.Main` served
    /// over HTTP/2 by Vert.x on loopback; `scripts/setup` builds it with Maven).
    pub async fn java() -> Result<Self> {
        Self::jvm("java-deployment", "dev.sluice.tests.Main").await
    }

    /// Starts the Kotlin SDK deployment (`tests/kotlin-deployment`, `dev.sluice.tests.MainKt`
    /// served like the Java one; `scripts/setup` builds it with Maven).
    pub async fn kotlin() -> Result<Self> {
        Self::jvm("kotlin-deployment", "dev.sluice.tests.MainKt").await
    }

    /// Runs `main` of `tests/<dir>`'s jar (`<dir>-1.jar`) with the dependencies Maven copied
    /// into its `target/lib`.
    async fn jvm(dir: &str, main: &'static str) -> Result<Self> {
        let target = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(dir)
            .join("target");
        let jar = target.join(format!("{dir}-1.jar"));
        if !jar.exists() {
            bail!(
                "{} is missing: run scripts/setup (it builds it with mvn package)",
                jar.display()
            );
        }
        let classpath = format!("{}:{}/*", jar.display(), target.join("lib").display());
        Self::spawn_on_free_port(|port| {
            let mut cmd = Command::new("java");
            cmd.arg("-cp")
                .arg(&classpath)
                .arg(main)
                .arg(port.to_string());
            cmd
        })
        .await
    }

    /// Starts `command(port)` on a port picked here. A free port can be taken by a parallel
    /// test before the deployment binds it; then the deployment exits, and it starts again on
    /// another port.
    async fn spawn_on_free_port(command: impl Fn(u16) -> Command) -> Result<Self> {
        let mut tries = 0;
        loop {
            tries += 1;
            let port = free_port();
            match Self::spawn(command(port), port).await {
                Err(e) if tries < 4 && e.to_string().contains(EXITED_EARLY) => {}
                started => return started,
            }
        }
    }

    async fn spawn(mut cmd: Command, port: u16) -> Result<Self> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("spawn {cmd:?}"))?;
        let deadline = Instant::now() + READY_TIMEOUT;
        // Ready is our child holding a socket that listens on the port. A connection that
        // succeeds proves less: it may reach another process that took the port, or, on
        // loopback, the connecting socket itself (a TCP self-connect when the kernel picks the
        // port as its source port), while our child is still starting or has lost the port.
        while !listens_on(child.id(), port) {
            if let Some(status) = child.try_wait()? {
                bail!("{EXITED_EARLY} {port}: {status}");
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

/// The Rust-SDK test deployment serving `flavor` on loopback `port`.
fn rust_sdk_deployment(port: u16, flavor: &str) -> Command {
    let mut cmd = Command::new(sibling_binary("sluice-test-deployment"));
    cmd.arg(format!("127.0.0.1:{port}")).arg(flavor);
    cmd
}

const EXITED_EARLY: &str = "test deployment exited before it listened on";

/// Whether process `pid` holds a TCP socket listening on `port` (IPv4 or IPv6): a listening
/// entry of `/proc/net/tcp{,6}` whose socket inode is one of the process's descriptors.
fn listens_on(pid: u32, port: u16) -> bool {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        inodes.extend(
            text.lines()
                .skip(1)
                .filter_map(|line| listening_inode(line, port)),
        );
    }
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            let target = target.to_string_lossy();
            target
                .strip_prefix("socket:[")
                .and_then(|rest| rest.strip_suffix(']'))
                .and_then(|inode| inode.parse::<u64>().ok())
                .is_some_and(|inode| inodes.contains(&inode))
        })
    })
}

/// The socket inode of one `/proc/net/tcp` row when it listens (state `0A`) on `port`.
fn listening_inode(row: &str, port: u16) -> Option<u64> {
    let fields: Vec<&str> = row.split_whitespace().collect();
    let (_, local_port) = fields.get(1)?.rsplit_once(':')?;
    let listening = *fields.get(3)? == "0A";
    (listening && u16::from_str_radix(local_port, 16).ok()? == port)
        .then(|| fields.get(9)?.parse().ok())
        .flatten()
}

impl Drop for TestDeployment {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listening_row_on_the_port_gives_its_inode_and_other_rows_none() {
        let listening = "   3: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 43117 1 0000000000000000 100 0 0 10 0";
        assert_eq!(listening_inode(listening, 8080), Some(43117));
        assert_eq!(listening_inode(listening, 8081), None);
        let established = listening.replace(" 0A ", " 01 ");
        assert_eq!(listening_inode(&established, 8080), None);
        assert_eq!(listening_inode("garbage", 8080), None);
    }

    #[test]
    fn a_socket_this_process_listens_on_is_found_and_a_closed_one_is_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(listens_on(std::process::id(), port));
        drop(listener);
        assert!(!listens_on(std::process::id(), port));
    }
}
