//! A deployment written with the real Restate Rust SDK, for black-box tests.
//!
//! `sluice-test-deployment <addr:port> [flavor]` serves over HTTP/2. Flavors change the manifest
//! the way an operator's redeploy would:
//! - `v1` (default): Greeter (service), Counter (virtual object), Signup (workflow), Meter
//!   (execution counters for exactly-once checks, and a handler that fails retryably);
//! - `v2`: Greeter gains a `farewell` handler;
//! - `fewer`: Greeter loses its `fail` handler;
//! - `object`: Greeter becomes a virtual object.
//!
//! Two settings (served by the default server only) make it look like a real fleet:
//! - `SLUICE_TEST_LIMITS`: limits its discovery manifest declares, `deployment=N` and
//!   `<Service>=N`, comma separated;
//! - `SLUICE_TEST_CAPACITY=N`: past N attempts at once it answers 503, like an overloaded
//!   deployment behind a load balancer. `GET /stats` answers what it saw:
//!   `{"refused": …, "peak": …}` (peak: attempts in flight at once, refused ones included);
//! - `SLUICE_TEST_HTTP_500=<path>`: attempts of that handler (`/invoke/<Service>/<handler>`)
//!   are answered HTTP 500 before the SDK sees them, like a gateway in front of a handler that
//!   crashes; `GET /stats` counts them as `failed`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use restate_sdk::prelude::*;

struct Greeter;

#[service]
impl Greeter {
    #[handler]
    async fn greet(&self, _ctx: Context<'_>, name: String) -> Result<String, HandlerError> {
        Ok(format!("Hello, {name}!"))
    }

    /// Sleeps durably for `millis`, then answers them.
    #[handler]
    async fn slow(&self, ctx: Context<'_>, millis: u64) -> Result<u64, HandlerError> {
        ctx.sleep(Duration::from_millis(millis)).await?;
        Ok(millis)
    }

    /// Fails terminally with the given message; `"<code>:<message>"` picks the code.
    #[handler]
    async fn fail(&self, _ctx: Context<'_>, message: String) -> Result<(), HandlerError> {
        match message.split_once(':').map(|(c, m)| (c.parse::<u16>(), m)) {
            Some((Ok(code), message)) => Err(TerminalError::new_with_code(code, message).into()),
            _ => Err(TerminalError::new(message).into()),
        }
    }

    /// Runs a side effect once and journals its result.
    #[handler]
    async fn stamp(&self, ctx: Context<'_>) -> Result<String, HandlerError> {
        let stamp = ctx
            .run(|| async { Ok(format!("{:?}", std::time::SystemTime::now())) })
            .await?;
        Ok(stamp)
    }

    /// Calls `Counter/<key>/add` and answers its result.
    #[handler(name = "addVia")]
    async fn add_via(&self, ctx: Context<'_>, key: String) -> Result<u64, HandlerError> {
        Ok(ctx
            .object_client::<CounterClient>(key)
            .add(1)
            .call()
            .await?)
    }
}

/// Side-effect executions seen by this process, for exactly-once checks across Sluice crashes.
static RUNS: AtomicU64 = AtomicU64::new(0);
/// `Meter/hold` calls running now, and the most seen at once.
static HOLDING: AtomicU64 = AtomicU64::new(0);
/// What `spend` paid for, as the handler counts it (each report once it ran), and the most
/// it had running at once.
static SPENT: AtomicU64 = AtomicU64::new(0);
static SPENDING: AtomicU64 = AtomicU64::new(0);
static SPENDING_PEAK: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
/// The awakeable `Meter/awaitAwakeable` waits on.
static AWAKEABLE: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());
/// Completions of `Meter/work`, counted inside a second side effect.
static DONE: AtomicU64 = AtomicU64::new(0);
/// When each `Meter/tick` started, ms since the epoch, in order.
static TICKS: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());
/// The labels `Meter/mark` was called with, in the order the calls started.
static MARKS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
/// What `Meter/timed` saw: label, start and end, ms since the epoch, in the order calls ended.
static TIMINGS: std::sync::Mutex<Vec<(String, u64, u64)>> = std::sync::Mutex::new(Vec::new());
/// `Meter/loaded`'s knee: past this many running at once its latency grows in proportion
/// (0: it never grows).
static KNEE: AtomicU64 = AtomicU64::new(0);
/// Calls of `Meter/flaky`.
static FLAKY: AtomicU64 = AtomicU64::new(0);

struct Meter;

/// Now, ms since the epoch.
fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One `Meter/hold` running: counted while it lives, also when the SDK drops the handler
/// because its connection was cut (a Sluice node killed mid-call).
struct Holding;

impl Holding {
    fn enter() -> Self {
        let now = HOLDING.fetch_add(1, Ordering::SeqCst) + 1;
        PEAK.fetch_max(now, Ordering::SeqCst);
        Self
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        HOLDING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Appends `<what> <id>` to the file `SLUICE_TEST_EFFECTS` names, if set (one short write with
/// O_APPEND: lines from concurrent handlers do not interleave).
fn log_effect(what: &str, id: &str) {
    use std::io::Write as _;
    let Some(path) = std::env::var_os("SLUICE_TEST_EFFECTS") else {
        return;
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("the effects log opens");
    file.write_all(format!("{what} {id}\n").as_bytes())
        .expect("the effects log takes a line");
}

#[service]
impl Meter {
    /// The headers the handler was started with, `name: value` sorted (what reached it of the
    /// caller's request).
    #[handler]
    async fn headers(&self, ctx: Context<'_>) -> Result<Json<Vec<String>>, HandlerError> {
        let mut headers: Vec<String> = ctx
            .headers()
            .iter()
            .map(|(name, value)| format!("{name}: {}", value))
            .collect();
        headers.sort();
        Ok(Json(headers))
    }

    /// Sends `Counter/<key>/add(1)` to run in one second; answers at once.
    #[handler(name = "addLater")]
    async fn add_later(&self, ctx: Context<'_>, key: String) -> Result<String, HandlerError> {
        ctx.object_client::<CounterClient>(key)
            .add(1)
            .send_after(Duration::from_secs(1));
        Ok("sent".to_owned())
    }

    /// Calls a service nobody registered (the runtime refuses the call: RT0018).
    #[handler(name = "callMissing")]
    async fn call_missing(&self, ctx: Context<'_>) -> Result<String, HandlerError> {
        let target = restate_sdk::context::RequestTarget::service("Missing", "nothing");
        Ok(ctx
            .request::<String, String>(target, "x".to_owned())
            .call()
            .await?)
    }

    /// Calls `Counter/<key>/add(1)` twice with one idempotency key: the second call gets the
    /// first one's result, so both answers are equal.
    #[handler(name = "addOnce")]
    async fn add_once(&self, ctx: Context<'_>, key: String) -> Result<String, HandlerError> {
        let first = ctx
            .object_client::<CounterClient>(key.clone())
            .add(1)
            .idempotency_key("once")
            .call()
            .await?;
        let second = ctx
            .object_client::<CounterClient>(key)
            .add(1)
            .idempotency_key("once")
            .call()
            .await?;
        Ok(format!("{first}/{second}"))
    }

    /// Runs for `millis` without suspending (a plain timer, not a durable sleep), recording
    /// how many `hold`s run at once in this process.
    #[handler]
    async fn hold(&self, _ctx: Context<'_>, millis: u64) -> Result<(), HandlerError> {
        let _holding = Holding::enter();
        tokio::time::sleep(Duration::from_millis(millis)).await;
        Ok(())
    }

    /// Records when it started (for rate limits measured in the handler).
    #[handler]
    async fn tick(&self, _ctx: Context<'_>) -> Result<(), HandlerError> {
        let now = epoch_ms();
        TICKS.lock().unwrap_or_else(|e| e.into_inner()).push(now);
        Ok(())
    }

    /// Runs `"<label> <millis>"`: holds for `millis` like `hold` (counted in the peak) and
    /// records its label with when it started and ended, for effects measured in the handler
    /// (admission order, waits, ETAs).
    #[handler]
    async fn timed(&self, _ctx: Context<'_>, spec: String) -> Result<(), HandlerError> {
        let (label, millis) = spec.rsplit_once(' ').unwrap_or((&spec, "0"));
        let started = epoch_ms();
        {
            let _holding = Holding::enter();
            tokio::time::sleep(Duration::from_millis(millis.parse().unwrap_or(0))).await;
        }
        TIMINGS.lock().unwrap_or_else(|e| e.into_inner()).push((
            label.to_owned(),
            started,
            epoch_ms(),
        ));
        Ok(())
    }

    /// Runs for `base` ms, or longer in proportion to how many `loaded`/`hold`/`timed` run
    /// at once past the knee (`Meter/knee`): a deployment that slows down under load.
    #[handler]
    async fn loaded(&self, _ctx: Context<'_>, base: u64) -> Result<(), HandlerError> {
        let holding = Holding::enter();
        let running = HOLDING.load(Ordering::SeqCst);
        let knee = KNEE.load(Ordering::SeqCst);
        let millis = if knee > 0 && running > knee {
            base.saturating_mul(running) / knee
        } else {
            base
        };
        tokio::time::sleep(Duration::from_millis(millis)).await;
        drop(holding);
        Ok(())
    }

    /// Sets `loaded`'s knee (0: its latency no longer grows with load).
    #[handler]
    async fn knee(&self, _ctx: Context<'_>, knee: u64) -> Result<(), HandlerError> {
        KNEE.store(knee, Ordering::SeqCst);
        Ok(())
    }

    /// What `timed` recorded since the last call, `[label, start, end]` in the order the calls
    /// ended; resets it.
    #[handler]
    async fn timings(
        &self,
        _ctx: Context<'_>,
    ) -> Result<Json<Vec<(String, u64, u64)>>, HandlerError> {
        Ok(Json(std::mem::take(
            &mut *TIMINGS.lock().unwrap_or_else(|e| e.into_inner()),
        )))
    }

    /// Records its label (for admission order measured in the handler).
    #[handler]
    async fn mark(&self, _ctx: Context<'_>, label: String) -> Result<(), HandlerError> {
        MARKS.lock().unwrap_or_else(|e| e.into_inner()).push(label);
        Ok(())
    }

    /// The labels `mark` recorded since the last call, in order; resets them.
    #[handler]
    async fn marks(&self, _ctx: Context<'_>) -> Result<Json<Vec<String>>, HandlerError> {
        Ok(Json(std::mem::take(
            &mut *MARKS.lock().unwrap_or_else(|e| e.into_inner()),
        )))
    }

    /// The start times `tick` recorded since the last call, ms since the epoch; resets them.
    #[handler]
    async fn ticks(&self, _ctx: Context<'_>) -> Result<Json<Vec<u64>>, HandlerError> {
        Ok(Json(std::mem::take(
            &mut *TICKS.lock().unwrap_or_else(|e| e.into_inner()),
        )))
    }

    /// The most `hold`s that ran at once since the last call; resets it.
    #[handler]
    async fn peak(&self, _ctx: Context<'_>) -> Result<u64, HandlerError> {
        Ok(PEAK.swap(0, Ordering::SeqCst))
    }

    /// Sleeps durably for a minute, then answers the length of `payload`: a large input in a
    /// journal that suspends (with a short inactivity timeout).
    #[handler(name = "sleepOn")]
    async fn sleep_on(&self, ctx: Context<'_>, payload: String) -> Result<u64, HandlerError> {
        ctx.sleep(Duration::from_secs(60)).await?;
        Ok(payload.len() as u64)
    }

    /// Answers a string of `bytes` characters: a large output from a small input.
    #[handler]
    async fn inflate(&self, _ctx: Context<'_>, bytes: u64) -> Result<String, HandlerError> {
        Ok("x".repeat(usize::try_from(bytes).unwrap_or(0)))
    }

    /// Journals `steps` run steps of 1 MiB each within one attempt: a journal that grows
    /// without bound unless Sluice bounds it.
    #[handler]
    async fn bloat(&self, ctx: Context<'_>, steps: u64) -> Result<u64, HandlerError> {
        for _ in 0..steps {
            ctx.run(|| async { Ok("x".repeat(1 << 20)) }).await?;
        }
        Ok(steps)
    }

    /// Calls `Meter/inflate(bytes)`: a large result for a small call.
    #[handler(name = "inflateVia")]
    async fn inflate_via(&self, ctx: Context<'_>, bytes: u64) -> Result<String, HandlerError> {
        Ok(ctx
            .service_client::<MeterClient>()
            .inflate(bytes)
            .call()
            .await?
            .len()
            .to_string())
    }

    /// Calls `Greeter/greet` with a name of `bytes` characters: a large call.
    #[handler(name = "callInflated")]
    async fn call_inflated(&self, ctx: Context<'_>, bytes: u64) -> Result<String, HandlerError> {
        let name = "x".repeat(usize::try_from(bytes).unwrap_or(0));
        let greeting = ctx
            .service_client::<GreeterClient>()
            .greet(name)
            .call()
            .await?;
        Ok(greeting.len().to_string())
    }

    /// Calls `Greeter/slow(millis)` and answers its result.
    #[handler(name = "callSlow")]
    async fn call_slow(&self, ctx: Context<'_>, millis: u64) -> Result<u64, HandlerError> {
        Ok(ctx
            .service_client::<GreeterClient>()
            .slow(millis)
            .call()
            .await?)
    }

    /// Calls `Greeter/fail` with `message` and reports the failure it propagates.
    #[handler(name = "failVia")]
    async fn fail_via(&self, ctx: Context<'_>, message: String) -> Result<String, HandlerError> {
        ctx.service_client::<GreeterClient>()
            .fail(message)
            .call()
            .await?;
        Ok("unreachable".to_owned())
    }

    /// Waits on an awakeable (its id is published for `lastAwakeable`) and answers its value.
    #[handler(name = "awaitAwakeable")]
    async fn await_awakeable(&self, ctx: Context<'_>) -> Result<String, HandlerError> {
        let (id, value) = ctx.awakeable::<String>();
        *AWAKEABLE.lock().unwrap() = id;
        Ok(value.await?)
    }

    /// The id of the newest awakeable `awaitAwakeable` waits on ("" before the first).
    #[handler(name = "lastAwakeable")]
    async fn last_awakeable(&self, _ctx: Context<'_>) -> Result<String, HandlerError> {
        Ok(AWAKEABLE.lock().unwrap().clone())
    }

    /// Resolves the awakeable `id` from a handler (CompleteAwakeable).
    #[handler(name = "resolveAwakeable")]
    async fn resolve_awakeable(&self, ctx: Context<'_>, id: String) -> Result<(), HandlerError> {
        ctx.resolve_awakeable(&id, "from a handler".to_owned());
        Ok(())
    }

    /// Counts a side effect, sleeps `millis` durably, then counts its completion. With
    /// `SLUICE_TEST_EFFECTS` set, each side effect also appends `run <id>` / `done <id>` to that
    /// file: a record per invocation that survives Sluice's crashes and bypasses it.
    #[handler]
    async fn work(&self, ctx: Context<'_>, millis: u64) -> Result<(), HandlerError> {
        let id = ctx.invocation_id().to_owned();
        ctx.run(|| async {
            RUNS.fetch_add(1, Ordering::SeqCst);
            log_effect("run", &id);
            Ok(())
        })
        .await?;
        ctx.sleep(Duration::from_millis(millis)).await?;
        ctx.run(|| async {
            DONE.fetch_add(1, Ordering::SeqCst);
            log_effect("done", &id);
            Ok(())
        })
        .await?;
        Ok(())
    }

    /// Reports `amount` as what it spent (`ctx.run` steps named `sluice:cost`), in two steps
    /// around a durable sleep, like a handler that pays for two model calls; answers `amount`.
    #[handler]
    async fn spend(&self, ctx: Context<'_>, amount: u64) -> Result<u64, HandlerError> {
        let first = amount / 2;
        ctx.run(|| async move {
            SPENT.fetch_add(first, Ordering::SeqCst);
            let now = SPENDING.fetch_add(1, Ordering::SeqCst) + 1;
            SPENDING_PEAK.fetch_max(now, Ordering::SeqCst);
            Ok(first)
        })
        .name("sluice:cost")
        .await?;
        ctx.sleep(Duration::from_millis(20)).await?;
        ctx.run(|| async move {
            SPENT.fetch_add(amount - first, Ordering::SeqCst);
            SPENDING.fetch_sub(1, Ordering::SeqCst);
            Ok(amount - first)
        })
        .name("sluice:cost")
        .await?;
        Ok(amount)
    }

    /// What `spend` paid for since the last call and the most spends in flight at once, as
    /// `[spent, peak]`; resets both.
    #[handler]
    async fn spent(&self, _ctx: Context<'_>) -> Result<Json<(u64, u64)>, HandlerError> {
        Ok(Json((
            SPENT.swap(0, Ordering::SeqCst),
            SPENDING_PEAK.swap(SPENDING.load(Ordering::SeqCst), Ordering::SeqCst),
        )))
    }

    /// `runs/done` so far.
    #[handler]
    async fn counts(&self, _ctx: Context<'_>) -> Result<String, HandlerError> {
        Ok(format!(
            "{}/{}",
            RUNS.load(Ordering::SeqCst),
            DONE.load(Ordering::SeqCst)
        ))
    }

    /// Fails retryably on its first `failures` calls in this process, then answers the call count.
    #[handler]
    async fn flaky(&self, _ctx: Context<'_>, failures: u64) -> Result<u64, HandlerError> {
        let seen = FLAKY.fetch_add(1, Ordering::SeqCst);
        if seen < failures {
            return Err(std::io::Error::other(format!("flaky failure {}", seen + 1)).into());
        }
        Ok(seen + 1)
    }
}

struct GreeterV2;

#[service(name = "Greeter")]
impl GreeterV2 {
    #[handler]
    async fn greet(&self, _ctx: Context<'_>, name: String) -> Result<String, HandlerError> {
        Ok(format!("Hello again, {name}!"))
    }

    #[handler]
    async fn slow(&self, _ctx: Context<'_>, millis: u64) -> Result<u64, HandlerError> {
        Ok(millis)
    }

    #[handler]
    async fn fail(&self, _ctx: Context<'_>, message: String) -> Result<(), HandlerError> {
        Err(TerminalError::new(message).into())
    }

    #[handler]
    async fn stamp(&self, _ctx: Context<'_>) -> Result<String, HandlerError> {
        Ok("v2".to_owned())
    }

    #[handler(name = "addVia")]
    async fn add_via(&self, _ctx: Context<'_>, _key: String) -> Result<u64, HandlerError> {
        Ok(0)
    }

    #[handler]
    async fn farewell(&self, _ctx: Context<'_>, name: String) -> Result<String, HandlerError> {
        Ok(format!("Bye, {name}!"))
    }
}

struct GreeterFewer;

#[service(name = "Greeter")]
impl GreeterFewer {
    #[handler]
    async fn greet(&self, _ctx: Context<'_>, name: String) -> Result<String, HandlerError> {
        Ok(format!("Hello, {name}!"))
    }
}

struct GreeterObject;

#[object(name = "Greeter")]
impl GreeterObject {
    #[handler]
    async fn greet(&self, _ctx: ObjectContext<'_>, name: String) -> Result<String, HandlerError> {
        Ok(format!("Hello, {name}!"))
    }
}

struct Counter;

/// Exclusive Counter handlers running right now in this process, and how often one started
/// while another was running (must stay 0: Sluice runs one exclusive handler per object).
static EXCLUSIVE_ACTIVE: AtomicU64 = AtomicU64::new(0);
static OVERLAPS: AtomicU64 = AtomicU64::new(0);

/// Marks an exclusive handler as running until dropped (also when a suspension drops it).
struct Exclusive;

impl Exclusive {
    fn enter() -> Self {
        if EXCLUSIVE_ACTIVE.fetch_add(1, Ordering::SeqCst) > 0 {
            OVERLAPS.fetch_add(1, Ordering::SeqCst);
        }
        Exclusive
    }
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        EXCLUSIVE_ACTIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

#[object]
impl Counter {
    #[handler]
    async fn add(&self, ctx: ObjectContext<'_>, by: u64) -> Result<u64, HandlerError> {
        let _running = Exclusive::enter();
        let next = ctx.get::<u64>("count").await?.unwrap_or(0) + by;
        ctx.set("count", next);
        Ok(next)
    }

    /// Adds 10 after sleeping `millis` durably (the lock is held throughout).
    #[handler(name = "addSlowly")]
    async fn add_slowly(&self, ctx: ObjectContext<'_>, millis: u64) -> Result<u64, HandlerError> {
        let _running = Exclusive::enter();
        ctx.sleep(Duration::from_millis(millis)).await?;
        let next = ctx.get::<u64>("count").await?.unwrap_or(0) + 10;
        ctx.set("count", next);
        Ok(next)
    }

    /// How often two exclusive handlers overlapped in this process.
    #[handler]
    async fn overlaps(&self, _ctx: SharedObjectContext<'_>) -> Result<u64, HandlerError> {
        Ok(OVERLAPS.load(Ordering::SeqCst))
    }

    #[handler]
    async fn get(&self, ctx: SharedObjectContext<'_>) -> Result<u64, HandlerError> {
        Ok(ctx.get::<u64>("count").await?.unwrap_or(0))
    }
}

struct Signup;

#[workflow]
impl Signup {
    /// Waits for the `approval` promise (an empty email skips it), then records the decision.
    #[handler]
    async fn run(&self, ctx: WorkflowContext<'_>, email: String) -> Result<String, HandlerError> {
        if email.is_empty() {
            ctx.set("status", "done".to_owned());
            return Ok("signed up".to_owned());
        }
        ctx.set("status", "waiting".to_owned());
        let decision = ctx.promise::<String>("approval").await?;
        ctx.set("status", decision.clone());
        Ok(format!("signed up {email}: {decision}"))
    }

    #[handler]
    async fn status(&self, ctx: SharedWorkflowContext<'_>) -> Result<String, HandlerError> {
        Ok(ctx.get::<String>("status").await?.unwrap_or_default())
    }

    /// Completes the `approval` promise.
    #[handler]
    async fn approve(
        &self,
        ctx: SharedWorkflowContext<'_>,
        decision: String,
    ) -> Result<(), HandlerError> {
        ctx.resolve_promise("approval", decision);
        Ok(())
    }

    /// The `approval` promise's value, or "open".
    #[handler]
    async fn peek(&self, ctx: SharedWorkflowContext<'_>) -> Result<String, HandlerError> {
        Ok(ctx
            .peek_promise::<String>("approval")
            .await?
            .unwrap_or_else(|| "open".to_owned()))
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args
        .next()
        .expect("usage: sluice-test-deployment <addr:port> [v1|v2|fewer|object]")
        .parse()
        .expect("an addr:port");
    let flavor = args.next().unwrap_or_else(|| "v1".to_owned());
    let builder = Endpoint::builder();
    let endpoint = match flavor.as_str() {
        "v1" => builder.bind(Greeter).bind(Counter).bind(Signup).bind(Meter),
        "v2" => builder.bind(GreeterV2).bind(Counter).bind(Signup),
        "fewer" => builder.bind(GreeterFewer).bind(Counter).bind(Signup),
        "object" => builder.bind(GreeterObject),
        other => panic!("unknown flavor {other}"),
    };
    // `SLUICE_TEST_DEPLOYMENT_SERVER=sdk` serves through the SDK's own `HttpServer`, Nagle's
    // algorithm left on as most users' deployments run: the benchmarks' `NAGLE=1` mode.
    if std::env::var("SLUICE_TEST_DEPLOYMENT_SERVER").as_deref() == Ok("sdk") {
        restate_sdk::http_server::HttpServer::new(endpoint.build())
            .listen_and_serve(addr)
            .await;
    } else {
        serve(endpoint.build(), addr).await;
    }
}

/// Serves HTTP/2 like the SDK's own `HttpServer`, but with TCP_NODELAY on every connection:
/// with Nagle's algorithm on, the response frame written right after the headers waits for
/// Sluice's delayed ACK (~40 ms), and benchmarks would measure that instead of Sluice.
async fn serve(endpoint: restate_sdk::endpoint::Endpoint, addr: std::net::SocketAddr) {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .expect("the deployment's address is free");
    let fleet = std::sync::Arc::new(Fleet::from_env());
    let service = restate_sdk::hyper::HyperEndpoint::new(endpoint);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (service, fleet) = (service.clone(), std::sync::Arc::clone(&fleet));
        let served = hyper::service::service_fn(move |req| {
            let (service, fleet) = (service.clone(), std::sync::Arc::clone(&fleet));
            async move { Ok::<_, std::convert::Infallible>(fleet.answer(&service, req).await) }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(stream), served)
                .await;
        });
    }
}

type Body = http_body_util::combinators::UnsyncBoxBody<
    bytes::Bytes,
    Box<dyn std::error::Error + Send + Sync>,
>;

/// What `SLUICE_TEST_LIMITS` and `SLUICE_TEST_CAPACITY` ask for, and what it saw.
struct Fleet {
    /// `(None, N)`: the deployment's limit; `(Some(service), N)`: a service's.
    limits: Vec<(Option<String>, u32)>,
    capacity: Option<u64>,
    failing: Option<String>,
    in_flight: std::sync::Arc<AtomicU64>,
    peak: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
}

/// One attempt in flight until its response body is dropped (sent or cut).
struct InFlight(std::sync::Arc<AtomicU64>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Fleet {
    fn from_env() -> Self {
        let limits = std::env::var("SLUICE_TEST_LIMITS")
            .unwrap_or_default()
            .split(',')
            .filter_map(|part| {
                let (what, n) = part.split_once('=')?;
                let n = n.trim().parse().ok()?;
                Some((
                    (what.trim() != "deployment").then(|| what.trim().to_owned()),
                    n,
                ))
            })
            .collect();
        let capacity = std::env::var("SLUICE_TEST_CAPACITY")
            .ok()
            .and_then(|c| c.parse().ok());
        Self {
            limits,
            capacity,
            failing: std::env::var("SLUICE_TEST_HTTP_500").ok(),
            in_flight: std::sync::Arc::new(AtomicU64::new(0)),
            peak: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    async fn answer(
        &self,
        service: &restate_sdk::hyper::HyperEndpoint,
        req: http::Request<hyper::body::Incoming>,
    ) -> http::Response<Body> {
        use http_body_util::BodyExt;
        use hyper::service::Service;
        let path = req.uri().path().to_owned();
        if path == "/stats" {
            let stats = serde_json::json!({
                "refused": self.refused.load(Ordering::SeqCst),
                "peak": self.peak.load(Ordering::SeqCst),
                "failed": self.failed.load(Ordering::SeqCst),
            });
            return full(http::StatusCode::OK, stats.to_string());
        }
        if self.failing.as_deref() == Some(path.as_str()) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return full(
                http::StatusCode::INTERNAL_SERVER_ERROR,
                "the handler crashed".into(),
            );
        }
        let capacity = self.capacity.filter(|_| path.starts_with("/invoke/"));
        let guard = match capacity {
            Some(capacity) => {
                let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                self.peak.fetch_max(now, Ordering::SeqCst);
                let guard = InFlight(std::sync::Arc::clone(&self.in_flight));
                if now > capacity {
                    self.refused.fetch_add(1, Ordering::SeqCst);
                    return full(
                        http::StatusCode::SERVICE_UNAVAILABLE,
                        "over capacity".into(),
                    );
                }
                Some(guard)
            }
            None => None,
        };
        let Ok(response) = service.call(req).await;
        let (parts, body) = response.into_parts();
        if path == "/discover" && !self.limits.is_empty() {
            let bytes = body
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            let mut manifest: serde_json::Value =
                serde_json::from_slice(&bytes).expect("the SDK's manifest is JSON");
            for (service, n) in &self.limits {
                let limits = serde_json::json!({ "concurrency": n });
                match service {
                    None => manifest["limits"] = limits,
                    Some(name) => {
                        for s in manifest["services"].as_array_mut().into_iter().flatten() {
                            if s["name"] == name.as_str() {
                                s["limits"] = limits.clone();
                            }
                        }
                    }
                }
            }
            let mut parts = parts;
            parts.headers.remove(http::header::CONTENT_LENGTH);
            let body = http_body_util::Full::new(bytes::Bytes::from(manifest.to_string()))
                .map_err(|e| match e {})
                .boxed_unsync();
            return http::Response::from_parts(parts, body);
        }
        let body = body
            .map_frame(move |frame| {
                // Holds the attempt in flight until the body is done.
                let _ = &guard;
                frame
            })
            .map_err(Into::into)
            .boxed_unsync();
        http::Response::from_parts(parts, body)
    }
}

fn full(status: http::StatusCode, text: String) -> http::Response<Body> {
    use http_body_util::BodyExt;
    let mut response = http::Response::new(
        http_body_util::Full::new(bytes::Bytes::from(text))
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response
}
