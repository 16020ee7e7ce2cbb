//! Call and send, in phases: route → bind key → classify → parse → plan → admit here (store
//! durably; a call waits for its outcome) or hand over to the node leading its partition →
//! reply.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use pingora::protocols::http::ServerSession;

use super::IngressState;
use super::api_keys::Binding;
use super::body::read_body;
use super::classify::classify;
use super::error::IngressError;
use super::path::{InvokePath, Mode};
use super::{input, reply, target};
use sluice_core::clock::{now_ms, rfc3339};
use sluice_core::errors::{Code, ErrorSource, IngressErrorBody};
use sluice_core::ids::InvocationId;
use sluice_core::trace::{TraceParent, new_span_id, new_trace_id};
use sluice_flow::scope::parse_request;
use sluice_flow::{LimitKey, PRIORITY_HEADER, Priority, Scope};
use sluice_protocol::{Message, proto};
use sluice_runtime::discovery::HandlerType;
use sluice_runtime::discovery::manifest::OutputRules;
use sluice_runtime::partition::placement::Route;
use sluice_store::invocation::new::{Identity, NewInvocation};
use sluice_store::invocation::{InvocationRecord, Outcome, Target};

/// Headers never forwarded into the input entry.
const NOT_FORWARDED: [&str; 12] = [
    "connection",
    "host",
    "idempotency-key",
    "idempotency-expires",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// The query parameter `name` (matched ignoring case), decoded.
fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    url::form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.into_owned())
}

fn limit_key(session: &ServerSession, query: Option<&str>) -> Option<String> {
    let headers = &session.req_header().headers;
    let from_header = ["x-service-limit-key", "x-restate-limit-key"]
        .iter()
        .find_map(|name| headers.get(*name))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    from_header.or_else(|| query_param(query, "limit-key"))
}

/// The call's priority: the `x-service-priority` header, else the `priority` query parameter
/// (`0..9`, `low`, `normal` or `high`; RT0024 otherwise).
fn priority(
    session: &ServerSession,
    query: Option<&str>,
) -> Result<Option<Priority>, IngressError> {
    let headers = &session.req_header().headers;
    let from_header = match headers.get(PRIORITY_HEADER) {
        Some(value) => Some(value.to_str().map_err(|_| {
            IngressError::coded(
                Code::RT0024,
                "the 'x-service-priority' header must be ASCII text",
            )
        })?),
        None => None,
    };
    let text = from_header
        .map(str::to_owned)
        .or_else(|| query_param(query, "priority"));
    text.map(|t| t.parse::<Priority>())
        .transpose()
        .map_err(|e| IngressError::coded(Code::RT0024, e.to_string()))
}

/// Whether a request header is one of the names the edge keeps for itself (`x-restate-…`,
/// `x-service-…`, `x-sluice-…`): the edge reads the ones it uses (limit key, priority, the API
/// key), and none reaches a handler as the client sent it — a client's
/// `x-restate-ingress-path` would otherwise sit beside the real one, and an API key would be
/// written into the journal on disk (and, in cluster mode, into the Kafka log). Names are lower
/// case here (HTTP/2, and `http`'s parsing of HTTP/1.1).
fn internal(name: &str) -> bool {
    name.starts_with("x-restate-")
        || name.starts_with("x-service-")
        || name.starts_with("x-sluice-")
}

fn input_frame(session: &ServerSession, body: Bytes) -> sluice_protocol::Frame {
    let req = session.req_header();
    let path_and_query = req
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut headers = vec![proto::Header {
        key: "x-restate-ingress-path".into(),
        value: path_and_query,
    }];
    for (name, value) in &req.headers {
        if NOT_FORWARDED.contains(&name.as_str()) || internal(name.as_str()) {
            continue;
        }
        if let Ok(value) = value.to_str() {
            headers.push(proto::Header {
                key: name.as_str().to_owned(),
                value: value.to_owned(),
            });
        }
    }
    Message::Input(proto::InputCommandMessage {
        headers,
        value: Some(proto::Value { content: body }),
        name: String::new(),
    })
    .to_frame(false)
}

pub(super) fn with_ids(mut resp: Response<Vec<u8>>, id: InvocationId) -> Response<Vec<u8>> {
    if let Ok(value) = HeaderValue::try_from(id.to_string()) {
        resp.headers_mut().insert("x-service-id", value.clone());
        resp.headers_mut().insert("x-restate-id", value);
    }
    resp
}

/// The `idempotency-key` header, if any (empty is refused, and so is one over `max_len` bytes:
/// a retained key stays in memory and in the store for the retention).
fn idempotency_key(
    session: &ServerSession,
    max_len: usize,
) -> Result<Option<String>, IngressError> {
    let Some(value) = session.req_header().headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value.to_str().map_err(|_| {
        IngressError::bad_request("the 'idempotency-key' header must be visible ASCII text")
    })?;
    if key.is_empty() {
        return Err(IngressError::bad_request(
            "the 'idempotency-key' header is empty: send a non-empty key, or leave the header out",
        ));
    }
    if key.len() > max_len {
        return Err(IngressError::coded(
            Code::SEC0004,
            format!(
                "the 'idempotency-key' header is {} bytes long, over the cap of {max_len} (ingress.idempotency-key-max-length)",
                key.len()
            ),
        ));
    }
    Ok(Some(key.to_owned()))
}

/// What a request asks for, parsed and checked, before anything is stored.
struct Request {
    target: target::Target,
    delay: Option<std::time::Duration>,
    idempotency_key: Option<String>,
    priority: Option<Priority>,
    /// Its deadline, ms since the epoch (`x-request-deadline`, `grpc-timeout`).
    deadline_ms: Option<u64>,
    frame: sluice_protocol::Frame,
    /// The body as it came (what a forwarded request carries).
    body: Bytes,
}

/// Handles one call or send, in phases: parse the request → classify it → plan the invocation
/// → submit it durably → reply (at once for a send, with the outcome for a call).
pub async fn invoke(
    state: &IngressState,
    session: &mut ServerSession,
    path: InvokePath,
) -> Result<Response<Vec<u8>>, IngressError> {
    let started = std::time::SystemTime::now();
    let trace = Trace::of(session);
    let answered = invoke_traced(state, session, path, trace.stored()).await;
    trace.emit(&answered, started);
    answered
}

/// A request's place in its caller's trace: the caller's span (from `traceparent`) and, while
/// spans are exported and the caller samples, the ingress span between it and the invocation.
struct Trace {
    caller: Option<TraceParent>,
    ingress: Option<TraceParent>,
}

impl Trace {
    fn of(session: &ServerSession) -> Self {
        let caller = session
            .req_header()
            .headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .and_then(TraceParent::parse);
        let ingress = (sluice_runtime::spans::enabled() && caller.is_none_or(TraceParent::sampled))
            .then(|| TraceParent {
                trace_id: caller.map_or_else(new_trace_id, |c| c.trace_id),
                span_id: new_span_id(),
                flags: 1,
            });
        Self { caller, ingress }
    }

    /// What the invocation stores: the ingress span, else the caller's.
    fn stored(&self) -> Option<TraceParent> {
        self.ingress.or(self.caller)
    }

    /// Emits the ingress span, if there is one.
    fn emit(
        &self,
        answered: &Result<Response<Vec<u8>>, IngressError>,
        started: std::time::SystemTime,
    ) {
        let Some(ingress) = self.ingress else {
            return;
        };
        let (status, error) = match answered {
            Ok(resp) => (resp.status().as_u16(), None),
            Err(e) => (e.status.as_u16(), Some(e.message.clone())),
        };
        let mut attributes = vec![opentelemetry::KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        )];
        if let Some(id) = answered
            .as_ref()
            .ok()
            .and_then(|r| r.headers().get("x-service-id"))
            .and_then(|v| v.to_str().ok())
        {
            attributes.push(opentelemetry::KeyValue::new(
                "restate.invocation.id",
                id.to_owned(),
            ));
        }
        sluice_runtime::spans::emit(sluice_runtime::spans::Finished {
            name: "ingress".into(),
            kind: opentelemetry::trace::SpanKind::Server,
            trace_id: ingress.trace_id,
            span_id: ingress.span_id,
            parent: self.caller.map(|c| c.span_id),
            start: started,
            end: std::time::SystemTime::now(),
            attributes,
            error,
        });
    }
}

/// A call or send as its phases fill it in, in order: route (the path, `path.rs`) → bind key
/// ([`bind_key`]) → classify ([`classify_call`]) → parse ([`parse`]) → plan ([`plan`]) → admit
/// here or hand over to the node leading its partition ([`admit_or_hand_over`]). Each phase
/// takes what the phases before it decided and adds its own; none rewrites an earlier decision.
async fn invoke_traced(
    state: &IngressState,
    session: &mut ServerSession,
    path: InvokePath,
    trace: Option<TraceParent>,
) -> Result<Response<Vec<u8>>, IngressError> {
    let query = session.req_header().uri.query().map(str::to_owned);
    let query = query.as_deref();
    let bound = bind_key(state, session, &path)?;
    let scoped = classify_call(state, session, &path, query, &bound).await?;
    let request = parse(state, session, &path, query).await?;
    if let Some(key) = &bound.key {
        key.check_priority(request.priority)?;
    }
    let planned = plan(state, &request, scoped, trace);
    admit_or_hand_over(state, session, path.mode, request, planned).await
}

/// The bind-key phase's decision: the caller's API key (its binding, if any) and the scope the
/// request asks for once the key had its say.
struct Bound {
    key: Option<Binding>,
    scope: Option<String>,
}

/// The bind-key phase: an API key decides the scope before anything else looks at it (the
/// plugins may still change it).
fn bind_key(
    state: &IngressState,
    session: &ServerSession,
    path: &InvokePath,
) -> Result<Bound, IngressError> {
    let key = state.api_keys.bind(&session.req_header().headers)?.cloned();
    let scope = match &key {
        Some(key) => Some(key.scope_for(path.scope.as_deref())?),
        None => path.scope.clone(),
    };
    Ok(Bound { key, scope })
}

/// The classify phase's decision: the scope and limit key the call runs under, validated.
struct Scoped {
    scope: Option<Scope>,
    limit_key: Option<LimitKey>,
}

/// The classify phase: the plugins' turn, then the scope and limit key validated (RT0024) in
/// order: scope, limit key, a limit key without a scope, the flags; what comes out is
/// normalised. A key that binds a limit key's first level holds every call under it, so a
/// fresh key per call cannot escape a per-key quota or concurrency.
async fn classify_call(
    state: &IngressState,
    session: &ServerSession,
    path: &InvokePath,
    query: Option<&str>,
    bound: &Bound,
) -> Result<Scoped, IngressError> {
    let key = limit_key(session, query);
    let (scope, key) = classify(state, session, path, bound.scope.clone(), key).await?;
    // A key's scope holds whatever the plugins answered: a plugin (say, one that reads a
    // tenant header) cannot move the key's calls into another tenant's scope.
    let scope = match &bound.key {
        Some(bound) => Some(bound.scope_for(scope.as_deref()).map_err(|mut e| {
            e.message = format!("a plugin classified the call: {}", e.message);
            e
        })?),
        None => scope,
    };
    let (scope, limit_key) = parse_request(scope.as_deref(), key.as_deref())
        .map_err(|e| IngressError::coded(Code::RT0024, e.message))?;
    let limit_key = match &bound.key {
        Some(bound) => bound.limit_key_for(limit_key)?,
        None => limit_key,
    };
    Ok(Scoped { scope, limit_key })
}

/// The plan phase's decision: the invocation to store, and how long its result is kept.
struct Planned {
    record: InvocationRecord,
    retention: Option<std::time::Duration>,
}

/// The admit-or-hand-over phase: the planned invocation is submitted here when its partition
/// runs here, else the request goes on to the node leading it (`forward.rs`); a call waits
/// for its outcome, a send is answered once stored.
async fn admit_or_hand_over(
    state: &IngressState,
    session: &mut ServerSession,
    mode: Mode,
    request: Request,
    planned: Planned,
) -> Result<Response<Vec<u8>>, IngressError> {
    let Planned { record, retention } = planned;
    let id = record.id;
    let route = state.runtime.route(id);
    if route != Route::Here {
        return super::forward::forward(state, session, request.body, route).await;
    }
    let execution_time = record.run_at_ms;
    // A call registers for its outcome as it is handed over; a send is answered once stored.
    let (created, outcome) = match mode {
        Mode::Call => {
            let (created, outcome) = submit(state.runtime.call(record, request.frame)).await?;
            (created, Some(outcome))
        }
        Mode::Send => (
            submit(state.runtime.submit(record, request.frame)).await?,
            None,
        ),
    };
    let target = &request.target;
    if is_workflow_run(target) && !created {
        return Err(IngressError::coded(
            Code::ING0005,
            format!(
                "the workflow '{}' with key '{}' was already invoked; attach to it with /service/workflow/{}/{}/attach",
                target.service,
                target.key.as_deref().unwrap_or_default(),
                target.service,
                target.key.as_deref().unwrap_or_default()
            ),
        ));
    }
    let Some(outcome) = outcome else {
        let status = if created {
            "Accepted"
        } else {
            "PreviouslyAccepted"
        };
        let mut body = serde_json::json!({"invocationId": id.to_string(), "status": status});
        if let Some(at) = execution_time.and_then(rfc3339) {
            body["executionTime"] = at.into();
        }
        return Ok(with_ids(reply::json(StatusCode::ACCEPTED, &body), id));
    };
    // The invocation goes on if the client leaves; only the wait for its answer ends.
    let outcome = super::wait::while_connected(session, None, outcome)
        .await
        .map_err(|_| super::wait::gone())?
        .map_err(|_| {
            IngressError::coded(
                Code::ING0006,
                format!("invocation {id} is unknown or its partition stopped"),
            )
        })?;
    let mut resp = with_ids(answer(target.output.as_ref(), outcome), id);
    // When the retained result (and with it the idempotency key) expires, counted from now:
    // the call has just completed, or it is a repeat of one completed earlier.
    if let Some(expires) = retention
        .and_then(|r| rfc3339(now_ms().saturating_add(u64::try_from(r.as_millis()).ok()?)))
        .and_then(|at| HeaderValue::try_from(at).ok())
    {
        resp.headers_mut().insert("idempotency-expires", expires);
    }
    Ok(resp)
}

fn is_workflow_run(target: &target::Target) -> bool {
    target.handler_type == Some(HandlerType::Workflow)
}

/// The parse phase: the target, the delay, the idempotency key and the body, each checked.
async fn parse(
    state: &IngressState,
    session: &mut ServerSession,
    path: &InvokePath,
    query: Option<&str>,
) -> Result<Request, IngressError> {
    let target = target::resolve(path, &state.registry)?;
    let delay = input::delay(query, path.mode)?;
    let priority = priority(session, query)?;
    let deadline_ms =
        super::deadline::of(&session.req_header().headers, sluice_core::clock::now_ms())?;
    let idempotency_key =
        idempotency_key(session, state.config.ingress.idempotency_key_max_length)?;
    let body = read_body(state, session).await?;
    let content_type = session
        .req_header()
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    input::check(target.input.as_ref(), content_type.as_deref(), &body)?;
    if is_workflow_run(&target) && idempotency_key.is_some() {
        return Err(IngressError::bad_request(
            "a workflow's run handler takes no idempotency key: the workflow key already makes it run once",
        ));
    }
    let frame = input_frame(session, body.clone());
    Ok(Request {
        target,
        delay,
        idempotency_key,
        priority,
        deadline_ms,
        frame,
        body,
    })
}

/// The plan phase: which invocation the request stands for (its identity, scope, delay and how
/// long its result is kept), and the partition it lives on: a fresh unkeyed invocation may
/// live anywhere, so in cluster mode it lives on a partition led here.
fn plan(
    state: &IngressState,
    request: &Request,
    scoped: Scoped,
    trace: Option<TraceParent>,
) -> Planned {
    // One clock reading: the record's creation and a delayed send's run time agree.
    let now = now_ms();
    let target = &request.target;
    let (identity, retention) = if is_workflow_run(target) {
        (
            Identity::WorkflowRun,
            Some(state.registry.workflow_retention(&target.service)),
        )
    } else if let Some(key) = &request.idempotency_key {
        (
            Identity::Idempotent(key.clone()),
            Some(
                state
                    .registry
                    .idempotency_retention(&target.service, &target.handler),
            ),
        )
    } else {
        (Identity::Fresh, None)
    };
    let mut new = NewInvocation::new(
        Target {
            service: target.service.clone(),
            handler: target.handler.clone(),
            key: target.key.clone(),
        },
        identity,
    )
    .in_scope(scoped.scope, scoped.limit_key)
    .with_priority(request.priority)
    .with_deadline(request.deadline_ms);
    new.retention = retention;
    new.run_at_ms = request
        .delay
        .map(|d| now.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
    let new = new.with_trace(trace);
    Planned {
        retention: new.retention,
        record: new.into_record_on(now, state.runtime.place_new()),
    }
}

/// The submit phase: the record and its input handed to the partition (`handed_over`),
/// answered once taken: true when created now, false when it existed already.
async fn submit<T>(
    handed_over: impl std::future::Future<Output = Result<T, sluice_core::errors::CodedError>>,
) -> Result<T, IngressError> {
    handed_over.await.map_err(|e| match e.code {
        // Too many held, a rule's full queue, rejecting rate or spent budget, or too many idle
        // quota keys: 429 with Retry-After.
        Some(Code::FLO0001 | Code::FLO0002 | Code::FLO0004 | Code::FLO0005 | Code::SEC0008) => {
            IngressError::from(e)
        }
        // The log did not confirm the record in time, or the leader stepped down: the record
        // may still land, so only a try with the same idempotency key is safe.
        Some(Code::CLU0001) => IngressError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: e.code,
            message: format!(
                "{}; the call may or may not have been stored: send it again with the same idempotency-key, and it runs at most once",
                e.message
            ),
            retry_after_s: Some(1),
        },
        _ => IngressError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: e.code,
            message: format!(
                "internal routing error: {}; the request was not accepted, so it can be retried",
                e.message
            ),
            retry_after_s: None,
        },
    })
}

/// The catalogue code of a failure the runtime decided itself (a call dropped at its deadline is
/// `[FLO0003] …` with that code's status): a coded refusal is answered with its code in the body
/// and the header, whoever decided it. A handler's own failure names none (one whose message
/// happens to start so names a code whose status it also answers, nothing more).
fn runtime_code(failure: &sluice_store::invocation::Failure) -> Option<Code> {
    let rest = failure.message.strip_prefix('[')?;
    let (name, _) = rest.split_once("] ")?;
    let code: Code = name.parse().ok()?;
    (code.info().status == Some(failure.code)).then_some(code)
}

/// A call's answer: the output with the handler's content type, or the failure with its code.
pub(super) fn answer(output: Option<&OutputRules>, outcome: Outcome) -> Response<Vec<u8>> {
    match outcome {
        Outcome::Value(bytes) => {
            let output = output.cloned().unwrap_or_default();
            let content_type = output
                .content_type
                .unwrap_or_else(|| "application/json".into());
            let send_type = !bytes.is_empty() || output.set_content_type_if_empty.unwrap_or(false);
            let mut resp = reply::bytes_with_type(
                StatusCode::OK,
                bytes,
                HeaderValue::try_from(content_type)
                    .unwrap_or(HeaderValue::from_static("application/octet-stream")),
            );
            if !send_type {
                resp.headers_mut().remove(header::CONTENT_TYPE);
            }
            resp
        }
        Outcome::Failure(failure) => {
            let status = StatusCode::from_u16(failure.code)
                .ok()
                .filter(|s| s.is_client_error() || s.is_server_error())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let error_code = runtime_code(&failure);
            let body = IngressErrorBody {
                code: failure.code,
                message: &failure.message,
                error_code,
                source: ErrorSource::Invocation,
            };
            let mut resp = reply::json(status, &body);
            resp.headers_mut().insert(
                reply::ERROR_SOURCE_HEADER,
                HeaderValue::from_static("invocation"),
            );
            if let Some(code) = error_code {
                resp.headers_mut().insert(
                    reply::ERROR_CODE_HEADER,
                    HeaderValue::from_static(code.as_str()),
                );
                // A refusal the runtime decided (a write the brokers did not take in time, a
                // partition that moved) passes: say when to try again.
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    resp.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                }
            }
            resp
        }
    }
}
