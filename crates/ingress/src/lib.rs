//! The ingress listener, served by pingora. Requests go through phases, each a function with one
//! job: route, then (in later stages) extract, validate, admit, invoke and reply.

pub mod api_keys;
mod attach;
mod awakeable;
mod body;
mod classify;
mod connections;
mod deadline;
mod error;
pub mod forward;
mod head_cap;
pub mod in_flight;
pub mod input;
mod invoke;
mod lookup;
pub mod path;
pub mod reply;
mod status;
pub mod target;
pub mod tls;
mod wait;

use std::os::fd::{IntoRawFd, OwnedFd};
use std::sync::Arc;

use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::protocols::http::ServerSession;
use pingora::server::{ListenFds, ShutdownWatch};
use pingora::services::Service;
use pingora::services::listening::Service as ListeningService;

use crate::in_flight::InFlight;
use sluice_config::Config;
use sluice_runtime::partition::Runtime;
use sluice_runtime::registry::Registry;

/// What ingress phases share.
#[derive(Debug)]
pub struct IngressState {
    /// Requests being served; shutdown waits for them.
    pub in_flight: Arc<InFlight>,
    /// Failed once a store write failed: new work is refused (STO0001).
    pub health: Arc<sluice_store::health::Health>,
    /// Services and deployments.
    pub registry: Arc<Registry>,
    /// The partitions.
    pub runtime: Runtime,
    /// The effective configuration.
    pub config: Arc<Config>,
    /// Policy plugins (`extract` runs before validation).
    pub plugins: Arc<sluice_plugins::Plugins>,
    /// Forwards requests for partitions another node leads (cluster mode).
    pub forwarder: sluice_runtime::replication::relay::Peers,
    /// API keys that bind calls to a scope (`[[ingress.api-keys]]`).
    pub api_keys: api_keys::ApiKeys,
    /// Client connections whose requests other nodes forward here, counted under the clients'
    /// addresses beside the listener's own connections ([`forward::relayed_clients`]).
    pub relayed: Arc<sluice_listeners::per_ip::Relayed>,
}

/// The ingress application: [`IngressApp::respond`] answers one request whose headers are
/// read; the connections (`connections`) read them and write the answer on pingora's sessions.
pub struct IngressApp {
    state: Arc<IngressState>,
}

impl IngressApp {
    /// An app over shared state.
    pub fn new(state: Arc<IngressState>) -> Self {
        Self { state }
    }
}

impl IngressApp {
    /// The answer to one request whose headers are read, counted and timed by kind.
    async fn respond(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let started = std::time::Instant::now();
        let counted = forward::count_relayed(&self.state, &session.req_header().headers);
        let (kind, resp) = match counted {
            // Held until the answer is ready.
            Ok(_counted) => self.answer(session).await,
            Err(refused) => ("refused", refused.into_response()),
        };
        record_request(kind, &resp, started);
        resp
    }

    /// `POST /service/status`: one target body (answered, or forwarded, as `GET …/status`
    /// is) or a list.
    async fn status_of(
        &self,
        session: &mut ServerSession,
        caller: Option<&api_keys::Binding>,
    ) -> Result<Response<Vec<u8>>, error::IngressError> {
        let body = read_target_body(&self.state, session).await?;
        let max = self.state.config.ingress.max_status_targets;
        match status::read_request(&body, max, caller)? {
            status::StatusRequest::List(ids) => {
                let mut asked = http::HeaderMap::new();
                if let Some(key) = session.req_header().headers.get(api_keys::HEADER) {
                    asked.insert(api_keys::HEADER, key.clone());
                }
                forward::name_client(&mut asked, &self.state, session);
                status::of_list(&self.state, ids, &asked, caller).await
            }
            status::StatusRequest::One(id) => match self.state.runtime.route(id) {
                sluice_runtime::partition::placement::Route::Here => {
                    status::of_id(&self.state, id, caller).await
                }
                route => forward::forward(&self.state, session, body, route).await,
            },
        }
    }

    /// The answer to one request, with its kind for the metrics.
    async fn answer(&self, session: &mut ServerSession) -> (&'static str, Response<Vec<u8>>) {
        if let Some(refused) = ambiguous_framing(session) {
            return ("invalid", refused);
        }
        if let Some(failure) = self.state.health.failure() {
            session.set_keepalive(None);
            return (
                "unavailable",
                error::IngressError::from(failure.clone()).into_response(),
            );
        }
        let req = session.req_header();
        let operation = path::parse(&req.method, req.uri.path());
        let kind = kind_of(&operation);
        // Every route that reaches an invocation is held to the caller's API key, as a call
        // is (a call binds its own, after the policy plugins); health names none.
        let caller = match &operation {
            Ok(path::Operation::Health | path::Operation::Invoke(_)) | Err(_) => None,
            Ok(_) => match self.state.api_keys.bind(&req.headers) {
                Ok(binding) => binding.cloned(),
                Err(refused) => return (kind, refused.into_response()),
            },
        };
        let caller = caller.as_ref();
        let result = match operation {
            Ok(path::Operation::Health) => {
                let services = target::public_services(&self.state.registry);
                Ok(reply::json(
                    StatusCode::OK,
                    &serde_json::json!({"services": services}),
                ))
            }
            Ok(path::Operation::Invoke(target)) => {
                invoke::invoke(&self.state, session, target).await
            }
            Ok(path::Operation::ById { id, attach }) => {
                let parsed = id.parse::<sluice_core::ids::InvocationId>();
                match parsed {
                    Ok(parsed) => match forward::if_elsewhere(&self.state, session, parsed).await {
                        Some(answer) => answer,
                        None => attach::by_id(&self.state, session, &id, attach, caller).await,
                    },
                    Err(_) => attach::by_id(&self.state, session, &id, attach, caller).await,
                }
            }
            Ok(path::Operation::ByTarget { action }) => {
                match read_target_body(&self.state, session).await {
                    Ok(body) => {
                        attach::by_target(&self.state, session, &body, action, caller).await
                    }
                    Err(e) => Err(e),
                }
            }
            Ok(path::Operation::Workflow { name, key, attach }) => {
                let run = attach::workflow_run(&name, &key, caller);
                match forward::if_elsewhere(&self.state, session, run).await {
                    Some(answer) => answer,
                    None => {
                        attach::by_workflow(&self.state, session, &name, &key, attach, caller).await
                    }
                }
            }
            Ok(path::Operation::Status(query)) => match status::query_id(&query, caller) {
                Ok(id) => match forward::if_elsewhere(&self.state, session, id).await {
                    Some(answer) => answer,
                    None => status::of_id(&self.state, id, caller).await,
                },
                Err(e) => Err(e),
            },
            Ok(path::Operation::StatusOf) => self.status_of(session, caller).await,
            Ok(path::Operation::Awakeable { id, resolve }) => {
                let target = id.parse::<sluice_core::ids::AwakeableId>().ok();
                let elsewhere = match target {
                    Some(target) => {
                        forward::if_elsewhere(&self.state, session, target.invocation).await
                    }
                    None => None,
                };
                match elsewhere {
                    Some(answer) => answer,
                    None => awakeable::complete(&self.state, session, &id, resolve, caller).await,
                }
            }
            Err(e) => Err(e),
        };
        (
            kind,
            result.unwrap_or_else(error::IngressError::into_response),
        )
    }
}

/// A request's kind in the metrics (`sluice_ingress_requests_total`).
fn kind_of(operation: &Result<path::Operation, error::IngressError>) -> &'static str {
    match operation {
        Ok(path::Operation::Health) => "health",
        Ok(path::Operation::Invoke(p)) if p.mode == path::Mode::Send => "send",
        Ok(path::Operation::Invoke(_)) => "call",
        Ok(path::Operation::ById { attach: true, .. }) => "attach",
        Ok(path::Operation::ById { .. }) => "output",
        Ok(path::Operation::ByTarget { .. }) => "lookup",
        Ok(path::Operation::Workflow { .. }) => "workflow",
        Ok(path::Operation::Awakeable { .. }) => "awakeable",
        Ok(path::Operation::Status(_) | path::Operation::StatusOf) => "status",
        Err(_) => "invalid",
    }
}

/// The body of a request that names invocations by target (`…/status`, `…/attach`,
/// `…/output`, `…/lookup`), read no further than `ingress.target-body-limit` before parsing.
async fn read_target_body(
    state: &IngressState,
    session: &mut ServerSession,
) -> Result<bytes::Bytes, error::IngressError> {
    let limit = state.config.ingress.target_body_limit;
    body::read_body_up_to(session, limit.as_usize(), "ingress.target-body-limit").await
}

/// Counts one answered request by kind, status and error code, and times it.
fn record_request(kind: &'static str, resp: &Response<Vec<u8>>, started: std::time::Instant) {
    let code = resp
        .headers()
        .get(reply::ERROR_CODE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let (counter, duration) = request_metrics(kind, resp.status().as_u16(), code);
    counter.increment(1);
    duration.record(started.elapsed());
}

/// Most label sets one thread keeps handles for; past it the cache starts over.
const MOST_REQUEST_LABELS: usize = 1024;

/// What one thread resolved: the request counter by kind, status and code, and the
/// duration by kind.
#[derive(Default)]
struct RequestMetrics {
    counters: std::collections::HashMap<
        (&'static str, u16),
        std::collections::HashMap<String, metrics::Counter>,
    >,
    durations: std::collections::HashMap<&'static str, metrics::Histogram>,
    labels: usize,
}

thread_local! {
    /// A shard is one thread: resolving a handle (hashing its labels, a registry lookup, the
    /// labels' allocations) is paid once per label set, not per request. Counters and
    /// histograms never leave the registry, so a kept handle stays the exported one.
    static REQUEST_METRICS: std::cell::RefCell<RequestMetrics> = std::cell::RefCell::default();
}

fn request_metrics(
    kind: &'static str,
    status: u16,
    code: &str,
) -> (metrics::Counter, metrics::Histogram) {
    use sluice_core::metrics as names;
    REQUEST_METRICS.with(|cache| {
        let mut cache = cache.borrow_mut();
        if cache.labels >= MOST_REQUEST_LABELS {
            *cache = RequestMetrics::default();
        }
        let found = cache.counters.get(&(kind, status)).and_then(|codes| codes.get(code)).cloned();
        let counter = match found {
            Some(counter) => counter,
            None => {
                let counter = metrics::counter!(names::INGRESS_REQUESTS, "kind" => kind, "status" => status.to_string(), "code" => code.to_owned());
                cache.labels += 1;
                cache.counters.entry((kind, status)).or_default().insert(code.to_owned(), counter.clone());
                counter
            }
        };
        let duration = cache
            .durations
            .entry(kind)
            .or_insert_with(|| metrics::histogram!(names::INGRESS_DURATION, "kind" => kind))
            .clone();
        (counter, duration)
    })
}

/// A request with both `Content-Length` and `Transfer-Encoding` (or several lengths) can be
/// read two ways; a proxy in front that reads it the other way smuggles a second request
/// through. It is refused, and the connection closed.
fn ambiguous_framing(session: &mut ServerSession) -> Option<Response<Vec<u8>>> {
    let headers = &session.req_header().headers;
    let lengths = headers.get_all(http::header::CONTENT_LENGTH).iter().count();
    // Pingora drops Content-Length when Transfer-Encoding is there too (and closes the
    // connection afterwards); the raw header still shows both.
    let both = headers.contains_key(http::header::TRANSFER_ENCODING)
        && session.as_http1().is_some_and(|h1| {
            h1.get_headers_raw_bytes()
                .split(|b| *b == b'\n')
                .any(|line| line.len() >= 15 && line[..15].eq_ignore_ascii_case(b"content-length:"))
        });
    if lengths <= 1 && !both {
        return None;
    }
    session.set_keepalive(None);
    Some(
        error::IngressError::bad_request(
            "the request has both Content-Length and Transfer-Encoding (or several Content-Length headers): send exactly one of them",
        )
        .into_response(),
    )
}

/// The ingress as a pingora service, on a socket bound before start-up, its connections served
/// on the shards (`sluice_runtime::shards`).
///
/// Each shard runs pingora's accept loop and HTTP server (`ListeningService`) on a listening
/// socket of its own (`SO_REUSEPORT`: the kernel spreads new connections over them by their
/// addresses), so a connection is served, call after call, on the shard that accepted it,
/// beside the partitions that shard runs: a fresh call's hand-over to its partition wakes no
/// other thread. (One socket shared by every shard left the choice to whichever woke first:
/// all 32 connections of a benchmark once landed on one shard.)
///
/// Pingora binds its own sockets when it starts its services, too late to report a busy port
/// cleanly. It first looks for an already-open socket in its fd table under the same address, so
/// this wrapper puts each shard's in that shard's table.
pub struct IngressService {
    app: connections::GuardedHttp,
    address: String,
    /// One listening socket per shard, in shard order.
    sockets: Vec<std::net::TcpListener>,
    shards: Arc<sluice_runtime::shards::Shards>,
    tls: Option<Arc<tls::IngressTls>>,
}

impl IngressService {
    /// Serves `app` on `listeners` (one per shard, bound to one address) on `shards`, its
    /// connections bounded by `limits`; accepts HTTP/1.1 and h2c, or with `tls` HTTPS (HTTP/2
    /// or HTTP/1.1 by ALPN).
    pub fn new(
        app: IngressApp,
        listeners: Vec<std::net::TcpListener>,
        shards: Arc<sluice_runtime::shards::Shards>,
        limits: sluice_config::ConnectionLimits,
        tls: Option<Arc<tls::IngressTls>>,
    ) -> std::io::Result<Self> {
        let first = listeners
            .first()
            .ok_or_else(|| std::io::Error::other("no ingress listener"))?;
        let address = first.local_addr()?.to_string();
        for listener in &listeners {
            listener.set_nonblocking(true)?;
        }
        Ok(Self {
            app: connections::GuardedHttp::new(app, limits, tls.clone()),
            address,
            sockets: listeners,
            shards,
            tls,
        })
    }
}

#[async_trait]
impl Service for IngressService {
    async fn start_service(
        &mut self,
        _fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        _listeners_per_fd: usize,
    ) {
        if let Some(tls) = &self.tls {
            tokio::spawn(Arc::clone(tls).watch(shutdown.clone()));
        }
        let sockets = std::mem::take(&mut self.sockets);
        let mut serving = Vec::with_capacity(sockets.len());
        for (socket, shard) in sockets.into_iter().zip(self.shards.handles()) {
            let fds: ListenFds = Arc::new(pingora::server::Fds::new().into());
            fds.lock()
                .add(self.address.clone(), OwnedFd::from(socket).into_raw_fd());
            let mut listening = ListeningService::new("ingress".to_owned(), self.app.clone());
            listening.add_tcp(&self.address);
            let shutdown = shutdown.clone();
            serving.push(shard.spawn(async move {
                listening.start_service(Some(fds), shutdown, 1).await;
            }));
        }
        for shard in serving {
            let _ = shard.await;
        }
    }

    fn name(&self) -> &str {
        "ingress"
    }

    fn threads(&self) -> Option<usize> {
        // Only starts the shards' listeners and waits for them.
        Some(1)
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        Some(vec![self.address.clone()])
    }
}
