//! The code catalogue: every documented error code, where it surfaces, its HTTP status and a short
//! doc text. `sluice explain <CODE>` prints an entry; both listeners build their error bodies from
//! here so a code is spelled and mapped in exactly one place.

use std::fmt;
use std::str::FromStr;

use http::StatusCode;
use serde::Serialize;

/// Where an error with a given code is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// Answered on the admin listener.
    Admin,
    /// Answered on the ingress listener.
    Ingress,
    /// Recorded on an invocation (its last failure); the invocation is retried or fails.
    Invocation,
    /// Start-up fails: one line on stderr and a non-zero exit.
    Startup,
    /// Reported as a warning in the `info` list of a deployment or service.
    Warning,
}

impl Surface {
    fn describe(self) -> &'static str {
        match self {
            Surface::Admin => "admin API error",
            Surface::Ingress => "ingress error",
            Surface::Invocation => "invocation failure (recorded on the invocation)",
            Surface::Startup => "start-up failure (exit non-zero)",
            Surface::Warning => "warning in deployment/service info",
        }
    }
}

/// One catalogue entry.
#[derive(Debug)]
pub struct CodeInfo {
    /// The code as written everywhere, e.g. `RT0024`.
    pub name: &'static str,
    /// Where the code surfaces.
    pub surface: Surface,
    /// The HTTP status a listener answers with; `None` for codes that never reach HTTP directly.
    pub status: Option<u16>,
    /// One line: the condition.
    pub summary: &'static str,
    /// What to do about it.
    pub doc: &'static str,
}

macro_rules! catalogue {
    ($( $code:ident => $surface:ident, $status:expr, $summary:literal, $doc:literal; )*) => {
        /// A documented error code.
        #[allow(clippy::upper_case_acronyms)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Code { $( $code, )* }

        impl Code {
            /// Every code, in catalogue order.
            pub const ALL: &'static [Code] = &[ $( Code::$code, )* ];

            /// The catalogue entry of this code.
            pub fn info(self) -> &'static CodeInfo {
                match self {
                    $( Code::$code => &CodeInfo {
                        name: stringify!($code),
                        surface: Surface::$surface,
                        status: $status,
                        summary: $summary,
                        doc: $doc,
                    }, )*
                }
            }
        }
    };
}

catalogue! {
    META0003 => Admin, Some(500),
        "discovery cannot reach the endpoint",
        "The deployment could not be reached for discovery: wrong URI or ARN, the deployment is down, a network problem, missing `additional_headers`, or a 404 on `/discover`. Check that the endpoint serves `GET /discover` from this machine; transient statuses are retried a few times first.";
    META0004 => Admin, Some(409),
        "the URI/ARN conflicts with an existing deployment",
        "A deployment with this URI or ARN is already registered. Register with `force: true` to overwrite it, or use a different address.";
    META0005 => Admin, Some(400),
        "metadata cannot be stored or propagated; reserved service name",
        "Service names starting with `restate` or `sluice`, and `openapi`, are reserved: rename the service. Otherwise the metadata could not be written to the store; check the server logs.";
    META0006 => Admin, Some(409),
        "a new service revision changes the service type",
        "A service keeps its type (Service, VirtualObject, Workflow) across revisions. Register the new type under a new service name, or pass `force: true` to accept the breaking change.";
    META0009 => Admin, Some(400),
        "invalid subscription",
        "`source` must be `kafka://<cluster>/<topic>` with a configured cluster and `sink` must be `service://<service>/<handler>` naming a registered handler.";
    META0010 => Startup, None,
        "the store was written by an incompatible (newer) version",
        "The data dir holds a store format newer than this build understands. Run the newer Sluice, or point `data-dir` at another directory.";
    META0011 => Startup, None,
        "non-empty store without its version record",
        "The store file has data but no format version record, so it was not written by Sluice or is damaged. Point `data-dir` at a fresh directory or restore a backup.";
    META0012 => Admin, Some(500),
        "the endpoint's protocol range is incompatible",
        "Sluice speaks service protocol versions 5 to 7. Upgrade the SDK of the deployment so its supported range overlaps 5..=7.";
    META0013 => Admin, Some(500),
        "bad discovery response",
        "The `/discover` answer had a wrong content type, an invalid manifest or no protocol mode. Check the SDK version and that the URI points at the SDK endpoint, not at a proxy in front of it.";
    META0014 => Admin, Some(500),
        "discovery failed and the endpoint may be HTTP/1.1 only",
        "Discovery over HTTP/2 (prior knowledge) failed. If the endpoint only speaks HTTP/1.1, register it with `use_http_11: true` (CLI `--use-http1.1`).";
    META0015 => Admin, Some(500),
        "bidi mode announced over a transport that cannot carry it",
        "The endpoint announced bidirectional streaming but is reached over HTTP/1.1 or Lambda, which cannot carry it. Configure the SDK for request/response mode or serve it over HTTP/2.";
    META0016 => Admin, Some(400),
        "in-place update rejected: types, handlers, services or protocol range differ",
        "Updating a deployment in place requires the same service types, all previous services and handlers, and the same protocol range. Register a new deployment instead.";
    META0017 => Admin, Some(409),
        "force-add rejected: several deployments share the URI/ARN",
        "More than one deployment has this URI/ARN, so `force` cannot tell which one to replace. Remove the extra deployments first.";
    RT0001 => Invocation, None,
        "abort timeout: no message from the deployment for `abort-timeout`",
        "The deployment sent nothing for `worker.invoker.abort-timeout`; the attempt was aborted and is retried. Raise the timeout for slow handlers or look for a hung deployment.";
    RT0002 => Startup, None,
        "the configuration cannot be parsed",
        "A key in the config file, a `SERVICE_`/`RESTATE_` environment variable or a flag is unknown or has a bad value. The message names the key path, and the file line where it came from the file.";
    RT0003 => Invocation, Some(500),
        "a message exceeded `message-size-limit`",
        "A protocol message was larger than `worker.invoker.message-size-limit`. Keep handler inputs, outputs and state values smaller, or raise the limit.";
    RT0004 => Startup, None,
        "cannot bind a listener",
        "The ingress or admin address could not be bound: another process uses the port, or the address is not on this machine. Change `ingress.bind` / `admin.bind` (`--ingress-bind`, `--admin-bind`).";
    RT0005 => Startup, None,
        "the store is locked by another process",
        "Another Sluice process has this `data-dir` open. Stop it, or give this process its own `--data-dir`.";
    RT0006 => Invocation, None,
        "generic error while invoking",
        "An unexpected error happened while running an attempt (for example reading the journal or state); the invocation is retried. See the message and server logs.";
    RT0007 => Invocation, None,
        "retryable error from the handler",
        "The handler failed with a retryable error; the invocation is retried with its journal replayed. Throw a terminal error from the handler to stop retrying.";
    RT0009 => Startup, None,
        "the store has no format version",
        "The store file cannot be opened as a Sluice store or lacks its format version record. Point `data-dir` at a fresh directory or restore a backup.";
    RT0010 => Invocation, None,
        "network error to the deployment (also 502/504)",
        "The deployment could not be reached or a gateway in front of it answered 502/504; the invocation is retried. Check that the deployment is up and reachable.";
    RT0011 => Invocation, None,
        "no deployment for the service",
        "No registered deployment serves this service (or the pinned deployment is gone); the invocation is retried. Register a deployment that exposes the service.";
    RT0012 => Invocation, None,
        "protocol violation",
        "The deployment sent something the service protocol does not allow; the invocation is retried. Usually an SDK bug or a non-SDK endpoint.";
    RT0013 => Invocation, None,
        "the endpoint supports none of our protocol versions",
        "At invoke time the deployment's protocol range does not overlap 5..=7; the invocation is retried. Upgrade the SDK or re-register the deployment.";
    RT0014 => Invocation, None,
        "the pinned protocol version can no longer be resumed",
        "The invocation is pinned to a protocol version the current deployment does not support, so it is paused. Resume it on a compatible deployment.";
    RT0015 => Invocation, None,
        "the SDK rejected the negotiated protocol version (415)",
        "The deployment answered 415 for the negotiated protocol version; the invocation is retried. Check that the registered deployment matches the running SDK.";
    RT0016 => Invocation, None,
        "journal mismatch on replay",
        "The handler code took a different path on replay than recorded in its journal; the invocation is retried. Handler code must be deterministic; deploy changed code as a new deployment.";
    RT0017 => Invocation, Some(400),
        "command precondition failed",
        "A command is not allowed here (for example state writes from a shared handler, promises outside workflows); the entry and later entries are discarded and the invocation is retried.";
    RT0018 => Ingress, Some(404),
        "the handler does not exist",
        "The called service or handler is not registered (it may still be propagating). Register the deployment that serves it, or fix the name.";
    RT0019 => Invocation, None,
        "the deployment replied 413",
        "The deployment rejected the request as too large; the invocation is retried. Raise the body limit in front of the deployment.";
    RT0020 => Ingress, Some(400),
        "the service is on a deployment with a deprecated protocol version",
        "The service's deployment only speaks protocol versions outside 5..=7, so new invocations are refused. Register a deployment with a current SDK.";
    RT0021 => Warning, None,
        "`inactivity_timeout` is ignored in request-response mode",
        "Request/response deployments cannot be kept waiting, so the inactivity timeout does not apply to them.";
    RT0022 => Warning, None,
        "`journal_retention` clamped to the server maximum",
        "The requested journal retention is longer than the server allows and was lowered to the maximum.";
    RT0023 => Invocation, None,
        "the deployment answered 429/503",
        "The deployment is overloaded; the invocation is retried after its `Retry-After`.";
    RT0024 => Ingress, Some(400),
        "invalid flow-control usage",
        "The scope or limit key is invalid: a scope is 1-36 bytes of [a-zA-Z0-9_.-]; a limit key is `l1` or `l1/l2`, each level the same; a limit key needs a scope. A priority (`x-service-priority`, `?priority=`, a subscription's `priority` option) is `0`-`9`, `low`, `normal` or `high`.";
    RT0025 => Invocation, None,
        "maximum awaited future depth reached",
        "A handler awaited a combinator tree deeper than the limit (1000); the invocation is paused. Flatten the awaited futures.";
    JNL0001 => Invocation, None,
        "the invocation's journal is too large",
        "The handler's journal would go past `worker.max-journal-bytes` (default 256 MiB) or `worker.max-journal-entries` (default 100,000), or the journals of all running attempts past `worker.running-journals-budget` (default 1 GiB): the attempt fails and is retried under the retry policy (a journal over its own bound fails again, until the policy's attempts run out). Keep less in the journal: smaller `run` results, fewer steps per invocation (split the work into several invocations), or raise the bound.";
    AWK0001 => Ingress, Some(409),
        "the awakeable cannot be completed",
        "The awakeable was already completed (an awakeable completes once), its index is not one a handler can create (indexes below 17 are the runtime's own signals), or its invocation has completed or has taken `ingress.max-awakeable-completions` completions. Check the id the handler handed out.";
    STO0001 => Ingress, Some(503),
        "the store cannot be written: sluice stopped accepting work",
        "A write to the store failed (a full disk, an I/O error, a read-only filesystem), or a partition stopped. Nothing of the failed write was acknowledged. From that moment `/health` and `/ready` answer 503, new work is refused with this code, and the process shuts down and exits with status 74 so its supervisor restarts it; recovery rebuilds everything from what was committed. Free disk space or fix the data dir's filesystem.";
    STO0002 => Startup, None,
        "a row in the store is corrupt",
        "A row read back from the store cannot be decoded; the message names its table and key. Recovery stops rather than guess. Restore the data dir from a backup, or remove the named row with the store offline.";
    STO0003 => Startup, None,
        "the local log is damaged before its end",
        "A record of the local log (`<data-dir>/log/`) is bad while a good one follows it, or a segment is missing, or the log starts after the record the store (`sluice.redb`) needs next. A crash only ever tears the last record, so acknowledged records were damaged or lost on disk; the message names the segment file, the byte offset and the records. Restore the data dir from a backup; or, accepting the loss of every record from the damage on, start once with `worker.truncate-damaged-log = true`.";
    FLO0001 => Ingress, Some(429),
        "too many invocations are held",
        "The invocations waiting in flow-control queues or for their delay reached `worker.max-held-invocations` (in total) or `worker.max-held-per-scope` (in one scope). Retry after the `Retry-After` the answer carries, raise the limits, or raise the scope's concurrency so its queue drains.";
    FLO0002 => Ingress, Some(429),
        "a flow-control rule refused the invocation",
        "The rule's queue already holds `max-queued` waiting invocations, or the rule has `on-exceed = \"reject\"` and its rate has no token left or its quota is used up for the current window. The answer's `Retry-After` says when a place, a token or the next window is expected (from how fast the queue has been draining, when the next token is due, or when the quota's window ends). Retry then, slow down, or raise the rule's `max-queued`, rate or quota (`sluice rules reset-quota` starts a quota's count again). A handler's call refused this way fails with this code; its one-way sends are never refused.";
    FLO0003 => Ingress, Some(504),
        "the invocation waited past its deadline and was dropped without starting",
        "A new invocation may wait in its flow-control queue only until its deadline: the request's `x-request-deadline` (RFC 3339, or ms since the epoch) or `grpc-timeout`, or the `max_wait` of a rule on its path, counted from its arrival (or the end of its delay), whichever comes first. It was still waiting then, so it was dropped, never started: a call answers 504 with this code, a send's invocation completes with it (its status says so), a handler's call fails with it. Retry with a later deadline, raise the rule's `max_wait` or concurrency so the queue drains sooner, or send with a higher priority.";
    FLO0004 => Ingress, Some(429),
        "too many idle limit keys hold quota use on this partition",
        "A counter (a scope, or an L1 or L2 limit key) whose rule has a `quota` keeps what it used until its window ends, even after its calls are done, so a fresh key cannot reset a quota. The partition keeps at most `flow.max-idle-quota-counters` such idle counters (100,000 by default), and one scope at most `flow.max-idle-quota-counters-per-scope` of them (10,000); while a bound is met, a new call on a counter that has used nothing of its quota in the current window is refused (calls on keys already counting go on). `Retry-After` says when the earliest kept window ends. Bind API keys to limit keys (`limit-key`) so a client cannot mint fresh keys, or raise the bound.";
    FLO0005 => Ingress, Some(429),
        "a flow-control budget is spent for its window",
        "The rule on a counter of the call (its scope, or its L1 or L2 limit key) has a `budget` with `on-exceed = \"reject\"`, and what the counter's calls spent in the current window (as their handlers reported it with `sluice:cost` steps), plus what the calls running there hold reserved (`reserve`), leaves no room for one more call. `Retry-After` says when the window ends; a running call that ends and gives back its reservation may make room sooner. Wait for the next window, raise the budget, or start it again with `sluice rules reset-budget`.";
    FLO0006 => Ingress, Some(409),
        "an operator's bulk cancel canceled the invocation before it started",
        "An operator canceled waiting work by filter (`POST /invocations/bulk-cancel`, `sluice invocations bulk-cancel`): the invocation was queued, behind its object's lock, or a delayed send waiting for its time, and completed with 409 and this code without its handler running. Its caller, an attach or an idempotent repeat reads that outcome. `sys_bulk_cancels` lists each bulk cancel with its filter and counts; send the call again if it should still run.";
    FLO0007 => Ingress, Some(409),
        "a rule's on_full dropped the call: its key was full",
        "The rule on a counter of the call (its scope, or its L1 or L2 limit key) has `on_full = \"drop_new\"` and the calls running and waiting there already reached its `concurrency` (with `concurrency = 1`: one active run per key), or `on_full = \"keep_oldest\"` and `max_queued` calls (1 by default) already waited there and this one was the newest. It completed with 409 and this code without its handler running; its caller, an attach or an idempotent repeat reads that outcome. The message names the rule and the counter. Send it again once the key is free, or set `on_full = \"queue\"` (the default) on the rule to make calls wait.";
    FLO0008 => Ingress, Some(409),
        "a newer call replaced the call in its key's queue (on_full)",
        "The rule on a counter of the call has `on_full = \"keep_newest\"` (at most `max_queued` calls, 1 by default, wait there, and the newest win) or `on_full = \"cancel_running\"` (a new call cancels what runs and replaces what waits): a newer call for the same key arrived while this one waited, never started. It completed with 409 and this code; its caller, an attach or an idempotent repeat reads that outcome. The message names the invocation that took its place: attach to it for the result the newest input gives.";
    FLO0009 => Ingress, Some(409),
        "a rule's debounce made this call part of another call's run",
        "The rule on a counter of the call has a `debounce`: calls of one target arriving at that counter within its wait of each other make one run. With `last` (the default) the newest call of the burst runs and each earlier one completes with 409 and this code when a newer one arrives; with `first`, the burst's first call runs (pushed back by each arrival, up to `max` after the first) and each later one completes at once with this code. Neither ran its handler; its caller, an attach or an idempotent repeat reads that outcome. The message names the invocation that runs for the burst: attach to it for the result.";
    CLU0001 => Ingress, Some(503),
        "this node does not lead the invocation's partition (cluster mode)",
        "In cluster mode each partition is led by one node. The partition was led by another node, or moved while the request was in flight (a failover or rebalance): what it was about may or may not have happened, like a timeout. Retry (with an idempotency key if it must not run twice); `GET /cluster-health` shows who leads what.";
    CLU0002 => Startup, None,
        "the node cannot join the cluster",
        "The Kafka cluster in `cluster.bootstrap-servers` cannot be reached, or its topics do not match this node: the log and leaders topics must have exactly `worker.partitions` partitions (the count is fixed when the cluster is created). Or a topic keeps records for a limited time or size (its `retention.ms`, `retention.bytes` or `cleanup.policy`): the log is the cluster's only truth, so every topic must keep every record (`retention.ms=-1`, `retention.bytes=-1`, `cleanup.policy=delete`). Start the node with the cluster's partition count, point `cluster.topic-prefix` at a new cluster, or change the topic's settings as the message says.";
    CLU0003 => Startup, None,
        "a partition log record cannot be read",
        "A record of the partition log is damaged, larger than `cluster.max-record-bytes`, or written by a Sluice version with another record format. The node stops following that partition rather than guess (it never leads it, and `/health` answers 503 with this code); run the same Sluice version on every node and give every node the same `cluster.max-record-bytes`.";
    CLU0004 => Startup, None,
        "this node's replica of a partition missed log records (cluster mode)",
        "The partition's log does not continue where this node's store left off, and no snapshot in the snapshot topic reaches where it goes on: the brokers deleted records no snapshot covers (topic retention or a manual delete), or the log or its snapshots were replaced. (Records a snapshot covers are caught up from it, without this error.) The node stops following that partition, never leads it, and answers 503 with this code on `/health` and `/ready` (other partitions go on). Nothing is skipped silently. Set `retention.ms=-1` and `retention.bytes=-1` on the cluster's topics (Sluice refuses to join when it can read another setting), and rebuild this node's data dir from a copy of a healthy node's store taken while it was stopped.";
    CLU0005 => Invocation, None,
        "a value is larger than one partition log record can hold (cluster mode)",
        "In cluster mode every write of a partition goes into one log record of at most `cluster.max-record-bytes`, so one value (an output, a state value, a run result, a call's parameter) may be at most a quarter of it, less 64 KiB. The handler sent a larger one: the invocation fails with this code instead of the partition being unable to write. Send smaller values (keep large data outside and pass a reference), or raise `cluster.max-record-bytes` on every node and the brokers' `message.max.bytes`.";
    ADM0001 => Admin, Some(422),
        "the request body is not what the route takes",
        "The body is not JSON, lacks `content-type: application/json` (415), or does not have the route's shape: a field is missing, has the wrong type, or is not one the route knows (a typo such as `concurency`). The message names the field and its path; `docs/admin-api.md` and `GET /openapi` give each route's shape.";
    ADM0002 => Admin, Some(400),
        "a path or query parameter the route cannot use",
        "A value in the request's path or query string is not valid for the route: an invocation, deployment or subscription id that does not parse, a query parameter of the wrong type (`force=maybe`), or a combination the route refuses. The message names the parameter and what it takes; `docs/admin-api.md` and `GET /openapi` list each route's parameters.";
    ADM0003 => Admin, Some(404),
        "the named resource or route does not exist",
        "No deployment, service, handler, invocation, subscription, Kafka cluster, queue or plugin has the name or id in the path, or no admin route has that path. List what exists (`GET /deployments`, `GET /services`, `sluice invocations list`, …) and check the spelling; ids are case-sensitive.";
    ADM0004 => Admin, Some(409),
        "the resource's state does not allow this",
        "The request is valid but conflicts with what the resource is now: a completed invocation cannot be cancelled or killed (purge it instead), a deployment still serving services cannot be removed without `force=true`, a subscription or Kafka cluster already exists or is still in use. The message says what stands in the way.";
    ADM0005 => Admin, Some(405),
        "the route does not take this method",
        "The path exists but not with this HTTP method (for example `PUT /deployments/{id}`, which the reference server deprecated: use `PATCH`). `GET /openapi` lists each route's methods.";
    ADM0006 => Admin, Some(400),
        "the admin API version in the path is not supported",
        "The path starts with an admin API version (`/v1/...`) this server does not serve. `GET /version` answers the supported range (`min_admin_api_version` to `max_admin_api_version`); use one of those, or no version prefix.";
    ADM0007 => Admin, Some(500),
        "the admin request failed inside the server",
        "A task answering the request stopped unexpectedly (a panic or a shutdown while it ran). Nothing was half-applied: admin changes commit whole or not at all. Retry; if it repeats, the server's log has the cause at the same time.";
    ADM0008 => Admin, Some(410),
        "what the request needs was purged",
        "The invocation's journal, and the input in it, was removed once its retention was up, so it cannot be restarted as new. Raise the handler's journal retention (`journal_retention` on the service) to keep journals for longer.";
    ADM0009 => Admin, Some(422),
        "the invocation cannot be restarted as new",
        "Restart-as-new does not apply to this invocation: a workflow run cannot be restarted (start a new workflow with another key), or the journal prefix to keep (`from`) is past what the journal holds or is not allowed for its deployment. The message says which.";
    ADM0010 => Admin, Some(503),
        "this node cannot answer the admin request now",
        "The node is starting (its partitions are still recovering from the store), or in cluster mode the request belongs to a partition whose leader cannot be reached from here. Retry in a moment; `GET /health` and `GET /cluster-health` say what the node waits for.";
    SQL0001 => Admin, Some(400),
        "the SQL query cannot be run",
        "The query does not parse, names a table or column the system tables do not have, or uses a function or type they do not support. The message is the SQL engine's, with the line and column; `docs/sql.md` lists the tables and their columns (or `SELECT * FROM information_schema.columns`).";
    SQL0002 => Admin, Some(400),
        "the SQL query ran past its time limit",
        "The query ran longer than `admin.query-timeout` and was stopped. Narrow it with `WHERE` (by id, status or service) or `LIMIT`, or raise the timeout.";
    SQL0003 => Admin, Some(400),
        "the SQL query answered too many rows",
        "The query returned more rows than `admin.query-row-limit`. Add a `LIMIT` or a `WHERE`, or page through with `ORDER BY ... LIMIT ... OFFSET`.";
    SQL0004 => Admin, Some(400),
        "the SQL query needs too much memory",
        "The query's answer or its working memory (sorts, joins, aggregates) grew past `admin.query-memory-limit`. Narrow it with `WHERE` or `LIMIT`, select fewer columns, or raise the limit.";
    SQL0005 => Admin, Some(500),
        "the SQL answer cannot be encoded as Arrow IPC",
        "The query ran but its answer could not be written as an Arrow IPC stream. Ask for JSON instead (`accept: application/json`), and report the query: it is a bug.";
    RUL0001 => Admin, Some(422),
        "the rule book change is invalid",
        "A rule's pattern, limits, rate, burst, `on_exceed`, `max_queued`, weight or mode is not valid; the message names the rule and the value. Nothing of the change was applied.";
    RUL0002 => Admin, Some(409),
        "a rule's precondition failed",
        "The change carried a precondition (`does_not_exist`, or `matches` a version, or a delete's `expected_version`) that the rule book no longer meets: someone changed the rule meanwhile. Nothing was applied; read the rules again and retry.";
    ING0001 => Ingress, Some(400),
        "the request cannot be read",
        "A path, invocation or awakeable id, query parameter, header or body is not what the route takes (the message names which and how it is read): a malformed id, a target body of an unknown form, a body that is not the handler's declared input, a delay or idempotency key that does not parse, an unreadable body. Fix the request as the message says; `docs/ingress.md` lists every route's forms.";
    ING0002 => Ingress, Some(404),
        "no invocation matches",
        "The invocation id, workflow run, idempotency target or awakeable names nothing this server holds: it never existed, or its result was purged after its retention (`idempotency_retention`, `workflow_completion_retention`, `worker.completion-retention`). A target's scope and key are part of what it names: check them.";
    ING0003 => Ingress, Some(470),
        "the invocation has not completed yet",
        "`/output` of an invocation that is still running, or an attach that waited `ingress.attach-max-wait` without an outcome. Attach (again) to wait for it, or ask its status.";
    ING0004 => Ingress, Some(405),
        "the route does not take this method",
        "Calls, sends, awakeable completions and target lookups are `POST`; output, attach by id, status and health are `GET`. Use the method the message names.";
    ING0005 => Ingress, Some(409),
        "the workflow was already invoked",
        "A workflow's `run` handler runs once per workflow key. Attach to the run (`/restate/workflow/{name}/{key}/attach`), or ask its output, instead of calling it again.";
    ING0006 => Ingress, Some(503),
        "the call's answer cannot be awaited",
        "The call was accepted, but its partition stopped (a shutdown, a store failure or, in cluster mode, a move) before it answered. The invocation is stored and goes on: attach to it by the `x-restate-id` the answer carries, or retry with the same idempotency key.";
    ING0007 => Ingress, Some(499),
        "the client left before the answer",
        "The client closed its connection (or stream) while the call or attach waited; the invocation goes on. Seen only in metrics and logs: nobody is left to read it.";
    ING0008 => Ingress, Some(408),
        "the request body stopped arriving",
        "No bytes of the request's body came within `ingress.connections.header-read-timeout` of the last ones (or of the headers). Over HTTP/1.1 the connection is closed; over HTTP/2 the stream is answered and, once no other stream is open on it, the connection closes after the same timeout instead of the idle timeout. Send the body as fast as the headers.";
    ING0009 => Ingress, None,
        "a Kafka record cannot become an invocation",
        "A Kafka subscription skipped a record: nothing is invoked for it and its offset moves on. Its scope, limit key or priority (header or subscription option) breaks the RT0024 rules, its key is not UTF-8, or it has no key while its service is a virtual object (the key is the object key). The log line names the subscription, partition and offset; fix the producer or the subscription's options.";
    ING0010 => Ingress, Some(503),
        "the connection holds too many unsent answers",
        "An HTTP/2 connection's streams hold more answer bytes its client has not taken than `ingress.connections.max-unsent-bytes` (default 8 MiB), so this stream's answer was refused (the invocation itself is not affected: attach to it or read its output again). Read the answers of the connection's other streams, or open another connection. A client that stops reading altogether has its answers' streams, and then its connection, closed after `ingress.connections.write-timeout`.";
    ING0011 => Ingress, Some(431),
        "the request's headers are too large",
        "The request line and headers (HTTP/1.1), or the header list (HTTP/2), are over `ingress.connections.max-header-bytes` (default 64 KiB; the admin listener has its own `admin.connections.max-header-bytes`). Over HTTP/1.1 the connection is answered and closed; over HTTP/2 the stream is reset. Send large values in the body instead.";
    ING0012 => Ingress, Some(429),
        "the client's address holds too many connections to the leading node",
        "Cluster mode: a request another node forwarded to the node leading its partition was refused there, because its client's address already holds `ingress.connections.max-per-ip` connections to that node, counting each client connection to another node whose requests are being forwarded there as one. Wait for some of the address's calls to end (the answer carries `Retry-After`), or spread them over fewer connections (HTTP/2 carries many calls on one).";
    PLG0001 => Admin, Some(400),
        "the plugin cannot be loaded",
        "The bytes are not a wasm component, it does not export the function of its hook (`extract` or `match-rule` of the `sluice:policy` world), its imports are not those of `sluice:policy`, or its settings are invalid. Build it with `sluice-guest` for `wasm32-wasip2`. The previously loaded version, if any, stays.";
    PLG0002 => Ingress, Some(503),
        "the plugin trapped",
        "The plugin panicked, hit `unreachable`, or called an import it is not given (plugins get no WASI). The request was refused because the plugin is configured `on-error = \"fail\"`; the instance is rebuilt for the next request. Fix the plugin, or set `on-error = \"skip\"` to pass requests through unchanged when it fails.";
    PLG0003 => Ingress, Some(503),
        "the plugin ran past its deadline or fuel",
        "A single call of the plugin ran longer than its `deadline` (default 10ms) or burned its `fuel`; it was stopped. Make the plugin cheaper, raise the limit, or set `on-error = \"skip\"`.";
    PLG0004 => Ingress, Some(503),
        "the plugin answered an invalid result",
        "The plugin set a scope or limit key that is not valid (the same rules as RT0024), or rejected with a status outside 400-599. Fix the plugin's output, or set `on-error = \"skip\"`.";
    PLG0005 => Ingress, Some(503),
        "the plugin exceeded its memory cap",
        "The plugin tried to grow its linear memory beyond `memory-limit` (default 16 MiB) and was stopped. Raise the cap or make the plugin use less memory.";
    PLG0006 => Admin, Some(404),
        "plugin not found",
        "No plugin with this name is loaded. `GET /plugins` (or `sluice plugins list`) lists them.";
    PLG0007 => Admin, Some(409),
        "the plugin cannot be changed this way",
        "Plugins from the config file's `[[plugins]]` are changed by editing the file and restarting; only one `match-rule` plugin may be loaded at a time (replace it by name, or unload it first).";
    PLG0008 => Ingress, None,
        "a policy plugin refused the request",
        "An `extract` plugin rejected the request with a status of its choosing (400-599) and a message: the answer carries both. What it checks (a token, a tenant, a header) is the plugin's own policy: see its documentation.";
    PLG0009 => Admin, Some(413),
        "the plugin is too large to load",
        "`PUT /plugins/{name}` takes a `.wasm` component of at most `plugin-limits.max-size` (default 64 MiB). A plugin that carries a language's runtime (Python through componentize-py) is about 20 MiB; raise the cap if yours is larger.";
    PLG0010 => Ingress, Some(503),
        "the plugin's breaker is open",
        "The plugin failed `plugin-limits.breaker-failures` calls in a row (default 5), so it is not called for `plugin-limits.breaker-cooldown` (default 10s): its `on-error` applies at once, and with `fail` requests get this answer, with `Retry-After` saying when it will be tried again. Look at the plugin's earlier errors (PLG0002-PLG0005) in the log or `GET /plugins/{name}`, and fix or unload it.";
    PLG0011 => Ingress, Some(503),
        "too many plugin calls are waiting",
        "Plugin calls run on `plugin-limits.threads` threads of their own (default 2) behind a queue of `plugin-limits.call-queue` calls (default 1024); the queue was full, so the request was refused at once. Retry after the `Retry-After`; a plugin that runs close to its deadline on every call fills the queue: make it cheaper, lower its `deadline`, or raise the threads.";
    SEC0001 => Admin, Some(401),
        "no valid admin token",
        "The admin listener has tokens configured (`admin.auth-tokens` or `admin.auth-tokens-file`) and the request carried none, or one that matches none of them. Send `Authorization: Bearer <token>`; the CLI reads `SLUICE_ADMIN_TOKEN` (or `RESTATE_AUTH_TOKEN`). Only `GET /health` is open without one.";
    SEC0002 => Admin, Some(403),
        "the token's role may not do this",
        "A `read` token may call GET routes and `POST /query`; everything else (registering deployments, loading plugins, changing rules, state or invocations) needs an `admin` token.";
    SEC0003 => Admin, Some(421),
        "the Host header names another server",
        "The admin listener answers only requests whose `Host` is an IP address, `localhost`, or a name listed in `admin.allowed-hosts`; anything else may be a DNS-rebinding attack from a browser. Add the name you reach the admin port by to `admin.allowed-hosts`.";
    SEC0004 => Ingress, Some(400),
        "a request value is over its size cap",
        "An idempotency key, an awakeable's payload or another value of the request is longer than its cap (see docs/security.md for every cap and its config key). Send a shorter value or raise the cap.";
    SEC0005 => Admin, Some(400),
        "the deployment address is refused by the address policy",
        "Discovery refuses link-local and cloud metadata addresses (169.254.0.0/16, fe80::/10, fd00:ec2::254, …) always, and private or loopback addresses when `admin.deployment-address-policy = \"public-only\"`. Register a deployment on an allowed address or change the policy.";
    SEC0006 => Admin, Some(400),
        "the SQL statement is not a read-only query",
        "`POST /query` runs one `SELECT`, `EXPLAIN` or `SHOW` statement at most `admin.query-max-length` bytes long; anything else (DDL, DML, `COPY`, `SET`/`RESET`, transactions, `PREPARE`/`EXECUTE`, several statements) is refused with \"Statement not supported\", as the reference server words it.";
    SEC0007 => Admin, Some(400),
        "the Kafka client property is not allowed",
        "Only client settings on the allow-list (bootstrap, security, SASL, SSL, timeouts, fetch and session sizes, client id; see docs/security.md) may be set on a Kafka cluster. Settings that load code or files chosen by the request (e.g. `plugin.library.paths`) are refused.";
    SEC0008 => Ingress, Some(429),
        "too many requests wait for one invocation",
        "`worker.max-waiters-per-invocation` requests (calls and attaches) already wait for this invocation's outcome. Requests whose client left are not counted. Retry after the `Retry-After`, or raise the limit.";
    SEC0009 => Ingress, Some(401),
        "the request needs a known API key",
        "`ingress.require-api-key` is on and the request (a call, a send, or a read of an invocation's status, output or attachment, a lookup, an awakeable's completion) carries no `x-sluice-api-key` header, or one whose SHA-256 matches none of `[[ingress.api-keys]]`. Send the key you were given.";
    SEC0010 => Ingress, Some(403),
        "the API key does not allow this scope, invocation or priority",
        "The request's API key binds it to one scope and a highest priority (`[[ingress.api-keys]]`): the path or target named another scope, the invocation or awakeable it names runs in another scope (or in none), or the call asked for a priority above the key's `max-priority`. Leave the scope out (the key's is used), name only your scope's invocations, or ask for a lower priority.";
}

impl Code {
    /// The code as written, e.g. `"RT0024"`.
    pub fn as_str(self) -> &'static str {
        self.info().name
    }

    /// The HTTP status this code answers with, `500` for codes that have none of their own.
    pub fn http_status(self) -> StatusCode {
        self.info()
            .status
            .and_then(|s| StatusCode::from_u16(s).ok())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The multi-line text `sluice explain` prints.
    pub fn explain(self) -> String {
        let info = self.info();
        let status = info
            .status
            .map(|s| format!("HTTP {s}"))
            .unwrap_or_else(|| "no HTTP status".to_owned());
        format!(
            "{}: {}\nsurfaces as: {} ({})\n\n{}\n",
            info.name,
            info.summary,
            info.surface.describe(),
            status,
            info.doc
        )
    }

    /// The code an old number of Sluice's own now has, when `text` is one.
    pub fn renumbered(text: &str) -> Option<Code> {
        let wanted = text.trim().to_ascii_uppercase();
        RENUMBERED
            .iter()
            .find(|(old, _)| *old == wanted)
            .map(|(_, code)| *code)
    }

    /// The catalogue as a Markdown table; `docs/errors.md` is this text.
    pub fn markdown_table() -> String {
        let mut out = String::from(
            "# Error codes\n\nGenerated by `sluice explain --markdown`; `sluice explain <CODE>` prints one entry.\n\n| code | condition | surfaced as | HTTP |\n|---|---|---|---|\n",
        );
        for code in Code::ALL {
            let info = code.info();
            let status = info.status.map(|s| s.to_string()).unwrap_or_default();
            out.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                info.name,
                info.summary.replace('|', "\\|"),
                info.surface.describe(),
                status
            ));
        }
        out.push_str(RENUMBERED_HEADING);
        for (old, code) in RENUMBERED {
            out.push_str(&format!("| {old} | {code} | {} |\n", code.info().summary));
        }
        out
    }
}

/// Sluice's own codes once numbered after the reference's `RT` codes, which the reference keeps
/// allocating in order (it took RT0025 in 1.8): each moved to a prefix of its own, as SEC and
/// CLU were. `sluice explain` still answers the old number, pointing at the new one.
pub const RENUMBERED: &[(&str, Code)] = &[
    ("RT0026", Code::AWK0001),
    ("RT0027", Code::STO0001),
    ("RT0028", Code::STO0002),
    ("RT0029", Code::FLO0001),
    ("RT0030", Code::FLO0002),
    ("RT0031", Code::CLU0005),
];

const RENUMBERED_HEADING: &str = "\n## Renumbered codes\n\nSluice's own codes were numbered after the reference server's `RT` codes until the reference\nstarted using those numbers; each now has a prefix of its own. `sluice explain` answers the old\nnumber with the new one.\n\n| old | now | condition |\n|---|---|---|\n";

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Code {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A string that is not a catalogue code.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown error code '{0}': codes look like RT0024 or META0009 (`sluice explain --list` shows them all)"
)]
pub struct UnknownCode(String);

impl FromStr for Code {
    type Err = UnknownCode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_uppercase();
        Code::ALL
            .iter()
            .copied()
            .find(|c| c.as_str() == wanted)
            .ok_or_else(|| UnknownCode(s.to_owned()))
    }
}

/// An error that carries an optional catalogue code and a message for the person who has to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodedError {
    /// The catalogue code, when one applies.
    pub code: Option<Code>,
    /// What went wrong and what to do, without the code prefix.
    pub message: String,
    /// For a refusal that passes: when to try again, seconds (an HTTP `Retry-After`).
    pub retry_after_s: Option<u64>,
}

impl CodedError {
    /// An error with a catalogue code.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code: Some(code),
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// An error no catalogue code describes.
    pub fn uncoded(message: impl Into<String>) -> Self {
        Self {
            code: None,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// This error, saying to try again after `secs` seconds (an HTTP `Retry-After`).
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after_s = Some(secs);
        self
    }
}

impl fmt::Display for CodedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.code {
            Some(code) => write!(f, "[{code}] {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for CodedError {}

/// Who produced an ingress error: the proxy itself, or the invocation (handler/runtime).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorSource {
    /// Rejected by Sluice before or instead of running the handler.
    Ingress,
    /// The invocation itself failed.
    Invocation,
}

impl ErrorSource {
    /// The value of the `x-service-error-source` header.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorSource::Ingress => "ingress",
            ErrorSource::Invocation => "invocation",
        }
    }
}

/// The ingress error body: `{"code", "message", "error_code", "source"}`.
#[derive(Debug, Serialize)]
pub struct IngressErrorBody<'a> {
    /// The HTTP status as a number.
    pub code: u16,
    /// What went wrong.
    pub message: &'a str,
    /// The catalogue code, or null.
    pub error_code: Option<Code>,
    /// `ingress` or `invocation`.
    pub source: ErrorSource,
}

/// The admin error body: `{"message": "[CODE] …", "restate_code": "CODE" | null}`.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct AdminErrorBody {
    /// The message, prefixed with `[CODE] ` when coded.
    pub message: String,
    /// The catalogue code, or null.
    #[serde(default)]
    pub restate_code: Option<Code>,
}

impl From<&CodedError> for AdminErrorBody {
    fn from(err: &CodedError) -> Self {
        Self {
            message: err.to_string(),
            restate_code: err.code,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_through_its_name() {
        for code in Code::ALL {
            assert_eq!(code.as_str().parse::<Code>().unwrap(), *code);
            assert!(!code.info().doc.is_empty());
        }
        assert_eq!("rt0024".parse::<Code>().unwrap(), Code::RT0024);
    }

    #[test]
    fn unknown_code_says_what_codes_look_like() {
        let err = "XX1".parse::<Code>().unwrap_err().to_string();
        assert!(err.contains("'XX1'") && err.contains("RT0024"), "{err}");
    }

    #[test]
    fn statuses_follow_the_catalogue() {
        assert_eq!(Code::RT0024.http_status(), StatusCode::BAD_REQUEST);
        assert_eq!(Code::RT0018.http_status(), StatusCode::NOT_FOUND);
        assert_eq!(Code::META0004.http_status(), StatusCode::CONFLICT);
        assert_eq!(
            Code::META0003.http_status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(Code::META0009.http_status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn admin_body_prefixes_the_code() {
        let err = CodedError::new(Code::META0009, "bad sink");
        let body = serde_json::to_value(AdminErrorBody::from(&err)).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"message": "[META0009] bad sink", "restate_code": "META0009"})
        );
        let plain = serde_json::to_value(AdminErrorBody::from(&CodedError::uncoded("x"))).unwrap();
        assert_eq!(
            plain,
            serde_json::json!({"message": "x", "restate_code": null})
        );
    }

    #[test]
    fn ingress_body_shape() {
        let body = IngressErrorBody {
            code: 400,
            message: "bad scope",
            error_code: Some(Code::RT0024),
            source: ErrorSource::Ingress,
        };
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({"code": 400, "message": "bad scope", "error_code": "RT0024", "source": "ingress"})
        );
    }

    #[test]
    fn old_numbers_point_at_their_new_codes_and_none_is_the_references() {
        for (old, code) in RENUMBERED {
            assert_eq!(Code::renumbered(&old.to_lowercase()), Some(*code));
            assert!(old.parse::<Code>().is_err(), "{old} is no code any more");
            assert!(!code.as_str().starts_with("RT"), "{code}");
        }
        // The reference's RT codes stop at RT0025; every RT code here is one of them.
        for code in Code::ALL {
            if let Some(n) = code.as_str().strip_prefix("RT") {
                assert!(
                    n.parse::<u32>().unwrap() <= 25,
                    "{code} is not the reference's"
                );
            }
        }
        assert_eq!(Code::renumbered("RT0024"), None);
    }

    #[test]
    fn docs_errors_md_matches_the_catalogue() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/errors.md");
        let on_disk = std::fs::read_to_string(path).expect("docs/errors.md exists");
        assert_eq!(
            on_disk,
            Code::markdown_table(),
            "docs/errors.md is stale: regenerate with `sluice explain --markdown > docs/errors.md`"
        );
    }
}
