//! The server under test: its builder (config, env, clock), the running process and its
//! listeners, its admin API helpers, and how it finished.

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

use crate::binaries::{READY_TIMEOUT, binary, free_port};

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
        self.post_query(serde_json::json!({ "query": sql })).await
    }

    /// `POST /query` with `body`, answered as JSON.
    async fn post_query(&self, body: serde_json::Value) -> (u16, serde_json::Value) {
        let resp = self
            .admin(reqwest::Method::POST, "/query")
            .header("accept", "application/json")
            .json(&body)
            .send()
            .await
            .expect("admin API reachable");
        (
            resp.status().as_u16(),
            resp.json().await.unwrap_or_default(),
        )
    }

    /// `GET path` of the admin API (with the admin token, if any): status and JSON answered.
    pub async fn get_admin(&self, path: &str) -> (u16, serde_json::Value) {
        let resp = self
            .admin(reqwest::Method::GET, path)
            .send()
            .await
            .expect("admin API reachable");
        (
            resp.status().as_u16(),
            resp.json().await.unwrap_or_default(),
        )
    }

    /// `POST /query` of what this node alone holds (`"local": true`; cluster mode), as JSON.
    pub async fn query_local(&self, sql: &str) -> (u16, serde_json::Value) {
        self.post_query(serde_json::json!({ "query": sql, "local": true }))
            .await
    }

    /// The number column `n` of the one row `sql` answers.
    pub async fn count(&self, sql: &str) -> u64 {
        let (status, answer) = self.query(sql).await;
        count_of(sql, status, &answer)
    }

    /// The number column `n` of the one row `sql` answers of what this node alone holds.
    pub async fn count_local(&self, sql: &str) -> u64 {
        let (status, answer) = self.query_local(sql).await;
        count_of(sql, status, &answer)
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
        self.admin_until(&format!("/invocations/{id}"), what, want)
            .await
    }

    /// Polls the admin API's `GET path` until `want` holds of its JSON (at most 15 s; `what`
    /// names the wait in the failure), and answers what it saw.
    pub async fn admin_until(
        &self,
        path: &str,
        what: &str,
        want: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let seen: serde_json::Value = self
                .admin(reqwest::Method::GET, path)
                .send()
                .await
                .expect("admin API reachable")
                .json()
                .await
                .unwrap_or_default();
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

    /// Waits until the process has said `phrase` on stderr; fails saying `never` (and what it
    /// said) once `deadline` passed.
    pub async fn until_said(&self, phrase: &str, deadline: Instant, never: &str) {
        while !self.stderr().contains(phrase) {
            assert!(Instant::now() < deadline, "{never}: {}", self.stderr());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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
        // A failing test's nodes say what they did, when asked (`SLUICE_TEST_STDERR=<lines>`).
        if std::thread::panicking()
            && let Some(lines) = std::env::var("SLUICE_TEST_STDERR")
                .ok()
                .and_then(|n| n.parse::<usize>().ok())
        {
            let said = self.stderr();
            let tail: Vec<&str> = said.lines().rev().take(lines).collect();
            eprintln!("--- {} said, last {lines} lines:", self.admin_url);
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
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

/// The number column `n` of the one row `sql` answered.
fn count_of(sql: &str, status: u16, answer: &serde_json::Value) -> u64 {
    assert_eq!(status, 200, "{sql}: {answer}");
    // `count(*)` always answers a row: a missing `n` is a wrong query, not a zero.
    answer["rows"][0]["n"]
        .as_u64()
        .unwrap_or_else(|| panic!("{sql}: no count `n` in {answer}"))
}
