//! Harness for black-box tests: starts the real `sluice` binary on free loopback ports with its
//! own temp data dir, waits until both listeners answer, and stops it (SIGKILL) when dropped.

use std::ffi::OsString;
use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

/// How long a start-up may take before the test gives up.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

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

/// A Kafka-protocol cluster in a process of its own (`sluice-test-kafka`: librdkafka's mock
/// brokers), stopped when dropped.
pub struct KafkaBroker {
    child: std::process::Child,
    bootstrap: String,
}

impl KafkaBroker {
    /// `brokers` brokers with `topics` (name, partitions) created.
    pub fn start(brokers: u32, topics: &[(&str, u32)]) -> Self {
        use std::io::BufRead as _;
        let mut child = Command::new(sibling_binary("sluice-test-kafka"))
            .arg(brokers.to_string())
            .args(topics.iter().map(|(name, n)| format!("{name}:{n}")))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("sluice-test-kafka starts");
        let stdout = child.stdout.take().expect("its stdout");
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("it prints its address");
        let bootstrap = line
            .trim()
            .strip_prefix("bootstrap.servers=")
            .unwrap_or_else(|| panic!("no address from sluice-test-kafka: {line:?}"))
            .to_owned();
        Self { child, bootstrap }
    }

    /// Its `bootstrap.servers`.
    pub fn bootstrap_servers(&self) -> String {
        self.bootstrap.clone()
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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

/// Side effects of `Meter/work` per invocation id, from a deployment started with
/// [`TestDeployment::start_logging`]: `(runs, dones)`.
pub fn effects_per_invocation(effects: &Path) -> std::collections::BTreeMap<String, (u32, u32)> {
    let text = std::fs::read_to_string(effects).unwrap_or_default();
    let mut counts = std::collections::BTreeMap::<String, (u32, u32)>::new();
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("run", id)) => counts.entry(id.to_owned()).or_default().0 += 1,
            Some(("done", id)) => counts.entry(id.to_owned()).or_default().1 += 1,
            _ => panic!("unexpected effects line {line:?}"),
        }
    }
    counts
}

/// Side effects per invocation as a kill -9 test expects them after the restart: every one of
/// `ids` ran each side effect once, or twice when it had run before the kill (its result was not
/// journaled yet: one re-run of what was under way). What the design promises is checked: a
/// `ctx.run` whose result was journaled never runs again. `Meter/work` runs its `done` effect
/// only after the `run` effect's result came back journaled, so an invocation whose `done` ran
/// before the kill must not run `run` again. Answers how many ran again.
pub fn assert_once_but_in_flight<'a>(
    ids: impl IntoIterator<Item = &'a String>,
    before: &std::collections::BTreeMap<String, (u32, u32)>,
    after: &std::collections::BTreeMap<String, (u32, u32)>,
) -> u32 {
    let mut reruns = 0;
    for id in ids {
        let (runs, dones) = after.get(id).copied().unwrap_or_default();
        let (runs_before, dones_before) = before.get(id).copied().unwrap_or_default();
        assert!(
            dones_before == 0 || runs == runs_before,
            "{id}: its journaled `run` ran again ({runs_before} before the kill, {runs} in all) though `done` had run after it"
        );
        for (what, total, before_kill) in
            [("run", runs, runs_before), ("done", dones, dones_before)]
        {
            assert!(total >= 1, "{id}: its {what} side effect never ran");
            assert!(
                total <= 1 + before_kill.min(1),
                "{id}: its {what} side effect ran {total} times ({before_kill} before the kill)"
            );
            reruns += total - 1;
        }
    }
    reruns
}

/// Waits until `Meter/work` completed its side effects for at least `count` invocations (at
/// most 60 s; `what` names the wait): how a kill -9 test lands mid-stream.
pub async fn until_done(effects: &Path, count: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while effects_per_invocation(effects)
        .values()
        .filter(|(_, done)| *done > 0)
        .count()
        < count
    {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every one of `ids` completed its `Meter/work` side effects, at most `within`;
/// on time-out, how many had.
pub async fn all_done(effects: &Path, ids: &[String], within: Duration) -> Result<(), usize> {
    let deadline = Instant::now() + within;
    loop {
        let seen = effects_per_invocation(effects);
        let finished = ids
            .iter()
            .filter(|id| seen.get(*id).is_some_and(|(_, done)| *done > 0))
            .count();
        if finished == ids.len() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(finished);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// [`effects_per_invocation`] once the log has stopped growing for `quiet` (at most 30 s): after
/// a kill, handlers of the dead connections may still be running their side effects.
pub async fn effects_once_quiet(
    effects: &Path,
    quiet: Duration,
) -> std::collections::BTreeMap<String, (u32, u32)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut len = std::fs::metadata(effects).map_or(0, |m| m.len());
    let mut since = Instant::now();
    while since.elapsed() < quiet && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = std::fs::metadata(effects).map_or(0, |m| m.len());
        if now != len {
            len = now;
            since = Instant::now();
        }
    }
    effects_per_invocation(effects)
}

/// Runs `calls` concurrently (each a `Meter/hold` path of 400 ms, with its extra headers) and
/// answers the peak concurrency the handler itself saw.
pub async fn peak_of_calls(sluice: &Sluice, calls: &[(String, Vec<(&str, &str)>)]) -> u64 {
    let client = reqwest::Client::new();
    let running: Vec<_> = calls
        .iter()
        .map(|(path, headers)| {
            let mut request = client
                .post(format!("{}{path}", sluice.ingress_url))
                .header("content-type", "application/json")
                .body("400");
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            tokio::spawn(request.send())
        })
        .collect();
    for call in running {
        let resp = call
            .await
            .expect("the call task")
            .expect("the call answers");
        let status = resp.status();
        assert_eq!(status, 200, "{}", resp.text().await.unwrap_or_default());
    }
    peak(&sluice.ingress_url).await
}

/// The most `Meter/hold`s that ran at once in the deployment since the last ask (it resets),
/// asked through the ingress at `ingress_url`.
pub async fn peak(ingress_url: &str) -> u64 {
    reqwest::Client::new()
        .post(format!("{ingress_url}/service/call/Meter/peak"))
        .send()
        .await
        .expect("Meter/peak answers")
        .text()
        .await
        .expect("a text answer")
        .parse()
        .expect("a number")
}

/// [`peak_of_calls`] without extra headers.
pub async fn peak_of(sluice: &Sluice, paths: &[String]) -> u64 {
    let calls: Vec<_> = paths.iter().map(|p| (p.clone(), Vec::new())).collect();
    peak_of_calls(sluice, &calls).await
}

/// POSTs `body` as JSON to `url`: the status, and the answer as JSON (as a string when it is
/// not JSON).
pub async fn post_json(url: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let resp = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .expect("server reachable");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

/// GETs `url`: the status and the JSON answer (null when it is not JSON).
pub async fn get_json(url: &str) -> (u16, serde_json::Value) {
    let resp = reqwest::get(url).await.expect("server reachable");
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or_default(),
    )
}

/// Calls the handler at `path` (e.g. `Meter/ticks`) without a body; asserts the 200 and
/// answers its JSON.
pub async fn call_json<T: serde::de::DeserializeOwned>(sluice: &Sluice, path: &str) -> T {
    let resp = reqwest::Client::new()
        .post(format!("{}/service/call/{path}", sluice.ingress_url))
        .send()
        .await
        .expect("ingress reachable");
    assert_eq!(resp.status(), 200, "{path}");
    resp.json().await.expect("a JSON answer")
}

/// The flow-control counter of `scope` at `level` (`scope`, `level1`, `level2`) from
/// `GET /limits/counters`, if it lives.
pub async fn counter(sluice: &Sluice, scope: &str, level: &str) -> Option<serde_json::Value> {
    let (_, counters) = get_json(&format!("{}/limits/counters", sluice.admin_url)).await;
    counters["counters"]
        .as_array()?
        .iter()
        .find(|c| c["scope"] == scope && c["level"] == level)
        .cloned()
}

/// Calls `{service}/lastAwakeable` until it names an awakeable other than `previous`: the id
/// of the one `{service}/awaitAwakeable` waits on now (at most 15 s).
pub async fn next_awakeable(ingress_url: &str, service: &str, previous: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let id: String = reqwest::Client::new()
            .post(format!(
                "{ingress_url}/service/call/{service}/lastAwakeable"
            ))
            .send()
            .await
            .expect("ingress reachable")
            .json()
            .await
            .unwrap_or_default();
        if !id.is_empty() && id != previous {
            return id;
        }
        assert!(
            Instant::now() < deadline,
            "{service} never waited on a new awakeable"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `.wasm` component of plugin crate `name` (under `plugins/`), built for wasm32-wasip2
/// once per test process into the target dir's `plugins/` folder.
pub fn plugin_wasm(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let target = binary()
            .parent()
            .and_then(Path::parent)
            .map(|t| t.join("plugins"))
            .ok_or("no target dir")?;
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

/// Reads from `stream` until the server closes it (or `within` passes): whether it was closed.
pub async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
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

/// A loopback port that was free a moment ago.
/// The clock offset that makes a server started now read `at_ms` (milliseconds since the
/// epoch): what a test passes to [`Builder::clock_offset_ms`] so its result does not depend on
/// the day or the hour it runs.
pub fn clock_offset_to(at_ms: i64) -> i64 {
    let host = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the host clock is after 1970")
        .as_millis();
    at_ms - i64::try_from(host).expect("milliseconds fit an i64")
}

/// Noon UTC on 2030-01-15 (a Tuesday), in milliseconds: a server whose clock starts here is
/// twelve hours from any day's window, a fortnight from any month's.
pub const MIDDAY_MS: i64 = 1_894_708_800_000;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// What a process printed and how it ended.
#[derive(Debug)]
pub struct Finished {
    /// Exit status.
    pub status: ExitStatus,
    /// Everything on stdout.
    pub stdout: String,
    /// Everything on stderr.
    pub stderr: String,
}

/// How to start a `sluice serve`.
#[derive(Debug, Clone)]
pub struct Builder {
    data_dir: Option<PathBuf>,
    env: Vec<(String, String)>,
    args: Vec<OsString>,
    config: Option<String>,
    ingress_port: Option<u16>,
    admin_port: Option<u16>,
    admin_host: Option<String>,
    wrapper: Vec<OsString>,
    admin_token: Option<String>,
    admin_tls: bool,
    ingress_tls: bool,
}

/// The `admin` token [`Builder::with_tokens`] configures.
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";
/// The `read` token [`Builder::with_tokens`] configures.
pub const READ_TOKEN: &str = "test-read-token-0123456789";

impl Builder {
    /// Configures an `admin` and a `read` token ([`ADMIN_TOKEN`], [`READ_TOKEN`]); the
    /// harness's own admin requests send the admin one.
    pub fn with_tokens(mut self) -> Self {
        self.admin_token = Some(ADMIN_TOKEN.to_owned());
        self.env(
            "SERVICE_ADMIN__AUTH_TOKENS",
            &format!("admin:{ADMIN_TOKEN},read:{READ_TOKEN}"),
        )
    }

    /// Serves the admin listener over TLS with the PEM files `cert` and `key`; start-up then
    /// waits for the ingress only (the harness's probes speak plain HTTP).
    pub fn admin_tls(mut self, cert: &Path, key: &Path) -> Self {
        self.admin_tls = true;
        self.env("SERVICE_ADMIN__TLS_CERT_FILE", &cert.display().to_string())
            .env("SERVICE_ADMIN__TLS_KEY_FILE", &key.display().to_string())
    }

    /// Serves the ingress over TLS with this PEM certificate and key; the harness then waits
    /// for the admin listener only (its plain client cannot speak to the ingress).
    pub fn ingress_tls(mut self, cert: &Path, key: &Path) -> Self {
        self.ingress_tls = true;
        self.env(
            "SERVICE_INGRESS__TLS_CERT_FILE",
            &cert.display().to_string(),
        )
        .env("SERVICE_INGRESS__TLS_KEY_FILE", &key.display().to_string())
    }

    /// Binds the admin listener on `host` (an IP address) instead of 127.0.0.1.
    pub fn admin_host(mut self, host: &str) -> Self {
        self.admin_host = Some(host.to_owned());
        self
    }

    /// Runs the server under `program args…` (e.g. `prlimit --nofile=256:256 --`).
    pub fn wrapper(mut self, program: &str, args: &[&str]) -> Self {
        self.wrapper = std::iter::once(program)
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        self
    }

    /// Uses `dir` as data dir instead of a fresh temp dir.
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// Retries failed attempts after 50 ms, at most 100 ms apart (instead of the defaults'
    /// seconds), so a test that needs a retry does not wait for one.
    pub fn quick_retries(self) -> Self {
        self.env(
            "SERVICE_WORKER__INVOKER__RETRY_POLICY__INITIAL_INTERVAL",
            "50ms",
        )
        .env(
            "SERVICE_WORKER__INVOKER__RETRY_POLICY__MAX_INTERVAL",
            "100ms",
        )
    }

    /// Moves the server's wall clock by `offset_ms` (`SLUICE_CLOCK_OFFSET_MS`). Pass the same
    /// offset to a restart so the server's clock runs on instead of jumping back.
    pub fn clock_offset_ms(self, offset_ms: i64) -> Self {
        self.env("SLUICE_CLOCK_OFFSET_MS", &offset_ms.to_string())
    }

    /// Sets an environment variable for the process.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Adds an argument after `serve`.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Writes `toml` to a config file and passes `--config`.
    pub fn config(mut self, toml: &str) -> Self {
        self.config = Some(toml.to_owned());
        self
    }

    /// Binds the ingress on this port instead of a free one.
    pub fn ingress_port(mut self, port: u16) -> Self {
        self.ingress_port = Some(port);
        self
    }

    /// Binds the admin listener on this port instead of a free one.
    pub fn admin_port(mut self, port: u16) -> Self {
        self.admin_port = Some(port);
        self
    }

    fn spawn(self) -> Result<Sluice> {
        let scratch = tempfile::Builder::new().prefix("sluice-test-").tempdir()?;
        let data_dir = self.data_dir.unwrap_or_else(|| scratch.path().join("data"));
        let ingress_port = self.ingress_port.unwrap_or_else(free_port);
        let admin_port = self.admin_port.unwrap_or_else(free_port);
        let stdout_path = scratch.path().join("stdout.log");
        let stderr_path = scratch.path().join("stderr.log");

        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(binary());
                cmd
            }
            None => Command::new(binary()),
        };
        let admin_host = self.admin_host.as_deref().unwrap_or("127.0.0.1");
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--ingress-bind")
            .arg(format!("127.0.0.1:{ingress_port}"))
            .arg("--admin-bind")
            .arg(format!("{admin_host}:{admin_port}"));
        if let Some(toml) = &self.config {
            let path = scratch.path().join("sluice.toml");
            std::fs::write(&path, toml)?;
            cmd.arg("--config").arg(path);
        }
        cmd.args(&self.args);
        // Only what the test sets: settings leaking in from the outer environment would make
        // results depend on the machine.
        for (key, _) in std::env::vars() {
            if key.starts_with("SERVICE_")
                || key.starts_with("RESTATE_")
                || key.starts_with("SLUICE_")
            {
                cmd.env_remove(key);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd.stdin(Stdio::null())
            .stdout(File::create(&stdout_path)?)
            .stderr(File::create(&stderr_path)?);
        let child = cmd.spawn().context("spawn sluice")?;
        Ok(Sluice {
            admin_token: self.admin_token.clone(),
            admin_tls: self.admin_tls,
            ingress_tls: self.ingress_tls,
            child: Some(child),
            admin_url: format!("http://127.0.0.1:{admin_port}"),
            ingress_url: format!("http://127.0.0.1:{ingress_port}"),
            data_dir,
            stdout_path,
            stderr_path,
            _scratch: scratch,
        })
    }

    /// Starts the server and waits until both listeners answer. A free port picked here can
    /// be taken by a parallel test before the server binds it; then it starts again on other
    /// ports (only when the test did not choose its ports).
    pub async fn start(self) -> Result<Sluice> {
        let own_ports = self.ingress_port.is_some() || self.admin_port.is_some();
        let mut tries = 0;
        loop {
            tries += 1;
            let mut sluice = self.clone().spawn()?;
            match sluice.wait_ready().await {
                Ok(()) => return Ok(sluice),
                Err(e) if !own_ports && tries < 4 && e.to_string().contains("[RT0004]") => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Runs a process that is expected to end by itself (a failing start, `--dump-config`).
    pub fn run_to_exit(self) -> Result<Finished> {
        let mut sluice = self.spawn()?;
        sluice.wait_exit(READY_TIMEOUT)
    }
}

/// A running `sluice serve`.
#[derive(Debug)]
pub struct Sluice {
    child: Option<Child>,
    /// `http://127.0.0.1:<admin port>`.
    pub admin_url: String,
    /// `http://127.0.0.1:<ingress port>`.
    pub ingress_url: String,
    /// The data dir in use.
    pub data_dir: PathBuf,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
    /// The token the harness sends with its admin requests, if tokens are configured.
    pub admin_token: Option<String>,
    admin_tls: bool,
    ingress_tls: bool,
    _scratch: TempDir,
}

impl Sluice {
    /// A request to the admin listener's `path`, with the harness's token when it has one.
    pub fn admin(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let req = reqwest::Client::new().request(method, format!("{}{path}", self.admin_url));
        match &self.admin_token {
            Some(token) => req.bearer_auth(token),
            None => req,
        }
    }

    /// A builder with free ports and a fresh data dir.
    pub fn builder() -> Builder {
        Builder {
            data_dir: None,
            env: Vec::new(),
            args: Vec::new(),
            config: None,
            ingress_port: None,
            admin_port: None,
            admin_host: None,
            wrapper: Vec::new(),
            admin_token: None,
            admin_tls: false,
            ingress_tls: false,
        }
    }

    /// Registers a deployment through the admin API and asserts it was new (201).
    pub async fn register(&self, uri: &str, use_http_11: bool) {
        let resp = self
            .admin(reqwest::Method::POST, "/deployments")
            .json(&serde_json::json!({"uri": uri, "use_http_11": use_http_11}))
            .send()
            .await
            .expect("admin API reachable");
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        assert_eq!(status, 201, "registering {uri}: {body}");
    }

    /// Replaces the rule book (`PUT /limits/rules`), which must succeed: the new rules.
    pub async fn set_rules(&self, rules: serde_json::Value) -> serde_json::Value {
        let (status, body) = self.put_rules(rules).await;
        assert_eq!(status, 200, "PUT /limits/rules: {body}");
        body
    }

    /// Replaces the rule book (`PUT /limits/rules`): status and answer.
    pub async fn put_rules(&self, rules: serde_json::Value) -> (u16, serde_json::Value) {
        let resp = self
            .admin(reqwest::Method::PUT, "/limits/rules")
            .json(&rules)
            .send()
            .await
            .expect("admin API reachable");
        (
            resp.status().as_u16(),
            resp.json().await.unwrap_or_default(),
        )
    }

    /// Every sample `GET /metrics` shows now, `name{labels}` → value (asserts a 200 in the
    /// Prometheus text format).
    pub async fn metrics(&self) -> std::collections::HashMap<String, f64> {
        let resp = self
            .admin(reqwest::Method::GET, "/metrics")
            .send()
            .await
            .expect("admin API reachable");
        assert_eq!(resp.status().as_u16(), 200);
        let content_type = resp.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(content_type.starts_with("text/plain"), "{content_type}");
        let text = resp.text().await.unwrap();
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                let (series, value) = l.rsplit_once(' ').unwrap();
                (series.to_owned(), value.parse::<f64>().unwrap())
            })
            .collect()
    }

    /// Sends a one-way call through the ingress at `path` (e.g. `/Meter/timed/send`) with a
    /// JSON `body`; answers its invocation id.
    pub async fn send(&self, path: &str, body: &impl serde::Serialize) -> String {
        let sent: serde_json::Value = reqwest::Client::new()
            .post(format!("{}{path}", self.ingress_url))
            .json(body)
            .send()
            .await
            .expect("ingress reachable")
            .json()
            .await
            .expect("a JSON answer");
        sent["invocationId"]
            .as_str()
            .unwrap_or_else(|| panic!("no id: {sent}"))
            .to_owned()
    }

    /// Runs `sql` through `POST /query` with a JSON answer: status and answer.
    pub async fn query(&self, sql: &str) -> (u16, serde_json::Value) {
        let resp = self
            .admin(reqwest::Method::POST, "/query")
            .header("accept", "application/json")
            .json(&serde_json::json!({ "query": sql }))
            .send()
            .await
            .expect("admin API reachable");
        (
            resp.status().as_u16(),
            resp.json().await.unwrap_or_default(),
        )
    }

    /// The number column `n` of the one row `sql` answers.
    pub async fn count(&self, sql: &str) -> u64 {
        let (status, answer) = self.query(sql).await;
        assert_eq!(status, 200, "{sql}: {answer}");
        // `count(*)` always answers a row: a missing `n` is a wrong query, not a zero.
        answer["rows"][0]["n"]
            .as_u64()
            .unwrap_or_else(|| panic!("{sql}: no count `n` in {answer}"))
    }

    /// `GET /invocations/{id}`: status and answer.
    pub async fn describe(&self, id: &str) -> (u16, serde_json::Value) {
        let resp = self
            .admin(reqwest::Method::GET, &format!("/invocations/{id}"))
            .send()
            .await
            .expect("admin API reachable");
        (
            resp.status().as_u16(),
            resp.json().await.unwrap_or_default(),
        )
    }

    /// Polls `GET /invocations/{id}` until `want` holds (at most 15 s; `what` names the wait in
    /// the failure), and answers what it saw.
    pub async fn invocation_until(
        &self,
        id: &str,
        what: &str,
        want: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (_, seen) = self.describe(id).await;
            if want(&seen) {
                return seen;
            }
            assert!(Instant::now() < deadline, "never {what}: {seen}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// kill -9, then waits until the process is gone (at most 5 s).
    pub fn kill_9(&mut self) {
        self.signal(Signal::SIGKILL).expect("kill -9");
        self.wait_exit(Duration::from_secs(5))
            .expect("the process exits after kill -9");
    }

    /// Starts `builder` on this instance's data directory (after it was killed or stopped).
    pub async fn restart(&self, builder: Builder) -> Sluice {
        builder
            .data_dir(&self.data_dir)
            .start()
            .await
            .expect("the restarted instance starts")
    }

    /// Everything the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("process still owned")
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut probes = Vec::new();
        if !self.ingress_tls {
            probes.push(format!("{}/service/health", self.ingress_url));
        }
        if !self.admin_tls {
            probes.insert(0, format!("{}/health", self.admin_url));
        }
        for probe in &probes {
            loop {
                if let Some(status) = self.child().try_wait()? {
                    bail!(
                        "sluice exited during start-up ({status}):\n{}",
                        self.stderr()
                    );
                }
                let answered = client.get(probe).send().await;
                if answered.is_ok_and(|resp| resp.status().is_success()) {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "sluice not ready after {READY_TIMEOUT:?}:\n{}",
                        self.stderr()
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// Sends a signal to the process.
    pub fn signal(&mut self, signal: Signal) -> Result<()> {
        let pid = i32::try_from(self.child().id())?;
        kill(Pid::from_raw(pid), signal)?;
        Ok(())
    }

    /// Waits up to `timeout` for the process to exit, then kills it and fails.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Finished> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child().try_wait()? {
                self.child = None;
                return Ok(Finished {
                    status,
                    stdout: std::fs::read_to_string(&self.stdout_path).unwrap_or_default(),
                    stderr: self.stderr(),
                });
            }
            if Instant::now() > deadline {
                let _ = self.child().kill();
                bail!("sluice still running after {timeout:?}:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Asserts a failed start-up: non-zero exit, the code on stderr, no panic or backtrace.
pub fn assert_startup_error(finished: &Finished, code: &str) {
    assert!(
        !finished.status.success(),
        "expected a failed start, got {}",
        finished.status
    );
    let stderr = &finished.stderr;
    assert!(
        stderr.contains(&format!("error: [{code}]")),
        "expected [{code}] on stderr, got:\n{stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "start-up errors must not panic:\n{stderr}"
    );
    let error_lines = stderr.lines().filter(|l| l.starts_with("error:")).count();
    assert_eq!(error_lines, 1, "exactly one error line expected:\n{stderr}");
}

/// A small OTLP/HTTP trace receiver (JSON encoding) on loopback: what Sluice exports with
/// `tracing.protocol = "http/json"` lands in [`OtlpReceiver::spans`].
pub struct OtlpReceiver {
    /// `http://127.0.0.1:<port>/v1/traces`.
    pub endpoint: String,
    spans: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    /// Listens on a free loopback port.
    pub async fn start() -> Self {
        use axum::routing::post;
        let spans: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>> = Default::default();
        let seen = std::sync::Arc::clone(&spans);
        let router = axum::Router::new().route(
            "/v1/traces",
            post(move |body: bytes::Bytes| {
                let seen = std::sync::Arc::clone(&seen);
                async move {
                    let request: serde_json::Value = match serde_json::from_slice(&body) {
                        Ok(request) => request,
                        Err(_) => return (axum::http::StatusCode::BAD_REQUEST, "{}"),
                    };
                    let mut seen = seen.lock().unwrap();
                    for resource in request["resourceSpans"].as_array().into_iter().flatten() {
                        for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                            for span in scope["spans"].as_array().into_iter().flatten() {
                                let mut span = span.clone();
                                span["resource"] = resource["resource"].clone();
                                seen.push(span);
                            }
                        }
                    }
                    (axum::http::StatusCode::OK, "{}")
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self {
            endpoint: format!("http://{addr}/v1/traces"),
            spans,
            task,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<serde_json::Value> {
        self.spans.lock().unwrap().clone()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
