//! Every metric Sluice records: its name (Prometheus style, unit last), its labels and what it
//! counts, in one place so `GET /metrics`, the docs and the code agree. Crates record through
//! the `metrics` facade; without a recorder installed (metrics off, unit tests, the
//! simulators) every record is a no-op.
//!
//! Labels are bounded by what the operator configures, never by what a client sends: services
//! (registered), rule patterns (the rule book), error codes (the catalogue), plugins and
//! subscriptions. A scope or limit key is never a label, except in the opt-in top-N gauge.

/// Ingress requests by `kind` (call, send, attach, output, workflow, awakeable, health,
/// invalid), `status` and error `code` (`""` when none).
pub const INGRESS_REQUESTS: &str = "sluice_ingress_requests_total";
/// Ingress request latency by `kind`, until the answer is ready.
pub const INGRESS_DURATION: &str = "sluice_ingress_request_duration_seconds";
/// Invocations stored, by `service`.
pub const INVOCATIONS_CREATED: &str = "sluice_invocations_created_total";
/// Invocations completed, by `service` and `outcome` (`success` or `failure`).
pub const INVOCATIONS_COMPLETED: &str = "sluice_invocations_completed_total";
/// From creation to completion, by `service`.
pub const INVOCATION_DURATION: &str = "sluice_invocation_duration_seconds";
/// Attempts started, by `service`.
pub const ATTEMPTS: &str = "sluice_attempts_total";
/// Attempts that failed and will be retried (or paused), by error `code`.
pub const ATTEMPT_RETRIES: &str = "sluice_attempt_retries_total";
/// Attempt latency (start to end, suspension or failure), by `service`.
pub const ATTEMPT_DURATION: &str = "sluice_attempt_duration_seconds";
/// Latency of one group commit (redb commit with its fsync).
pub const STORE_COMMIT_DURATION: &str = "sluice_store_commit_duration_seconds";
/// Write sets in one group commit.
pub const STORE_COMMIT_GROUP: &str = "sluice_store_commit_group_size";
/// Embedded mode: one durable checkpoint of the store (the view of the local log).
pub const STORE_CHECKPOINT_DURATION: &str = "sluice_store_checkpoint_duration_seconds";
/// Embedded mode: reads that applied answered writes to the view themselves, before the
/// applier thread did (the read rule, `docs/durability.md`).
pub const STORE_READ_CATCH_UPS: &str = "sluice_store_read_catch_ups_total";
/// Group commits that failed (each fails the process's health).
pub const STORE_COMMIT_FAILURES: &str = "sluice_store_commit_failures_total";
/// Plugin calls by `plugin`, `hook` and `outcome` (`ok` or `error`).
pub const PLUGIN_CALLS: &str = "sluice_plugin_calls_total";
/// Plugin call latency by `plugin` and `hook`.
pub const PLUGIN_DURATION: &str = "sluice_plugin_call_duration_seconds";
/// Kafka records handed to partitions, by `subscription`.
pub const KAFKA_RECORDS: &str = "sluice_kafka_records_total";

// Read when scraped.

/// Running invocations counted by flow-control counters, by `rule` pattern (`none` without
/// one) and `level` (`scope`, `level1`, `level2`).
pub const FLOW_RUNNING: &str = "sluice_flow_running";
/// Invocations waiting at flow-control counters (for a slot or a token), by `rule` and `level`.
pub const FLOW_HELD: &str = "sluice_flow_held";
/// Of those, waiting for a rate limit's token, by `rule` and `level`.
pub const FLOW_RATE_LIMITED: &str = "sluice_flow_rate_limited";
/// Live flow-control counters, by `rule` and `level`.
pub const FLOW_COUNTERS: &str = "sluice_flow_counters";
/// Admissions through flow-control counters, by `rule` and `level`.
pub const FLOW_ADMISSIONS: &str = "sluice_flow_admissions_total";
/// Cost calls reported (`sluice:cost` steps) charged to budgets when they ended, by the
/// `rule` of the counter charged and its `level`.
pub const FLOW_COST_CHARGED: &str = "sluice_flow_cost_charged_total";
/// Cost calls reported past what one call may charge to a budget (its `reserve`, else the
/// budget), cut from their charges, by the `rule` of the counter and its `level`.
pub const FLOW_COST_OVERRUN: &str = "sluice_flow_cost_overrun_total";
/// What the live counters of a `rule` and `level` spent of their budgets in the current
/// window.
pub const FLOW_BUDGET_SPENT: &str = "sluice_flow_budget_spent";
/// What the calls running under a `rule` and `level` hold reserved of their budgets.
pub const FLOW_BUDGET_RESERVED: &str = "sluice_flow_budget_reserved";
/// New invocations dropped past their deadline, never started, by the `rule` whose
/// `max_wait` set it and its `level` (`request` for both when it was the request's own).
pub const FLOW_EXPIRED: &str = "sluice_flow_expired_total";
/// Where adaptive limits are now: the mean over the live counters of a `rule` and `level`
/// whose limit adapts.
pub const FLOW_ADAPTIVE_LIMIT: &str = "sluice_flow_adaptive_limit";
/// Admissions shadow rules would have held back, at the live counters they are evaluated
/// at, by the shadow rule's `rule` pattern and `level`.
pub const FLOW_SHADOW_WOULD_WAIT: &str = "sluice_flow_shadow_would_wait";
/// Arrivals shadow rules would have refused, by `rule` and `level`.
pub const FLOW_SHADOW_WOULD_REJECT: &str = "sluice_flow_shadow_would_reject";
/// Attempts running through a deployment's gate on this node, by `deployment`.
pub const DEPLOYMENT_RUNNING: &str = "sluice_deployment_running";
/// What a deployment's gate lets run now (its declared limit, or its paced-drain window), by
/// `deployment`; absent while unlimited.
pub const DEPLOYMENT_LIMIT: &str = "sluice_deployment_limit";
/// 1 while a deployment's paced drain keeps its gate closed (no attempt starts), else 0, by
/// `deployment`.
pub const DEPLOYMENT_CLOSED: &str = "sluice_deployment_closed";
/// Waiting invocations of the `metrics.top-scopes` busiest scopes, by `scope` (opt-in).
pub const FLOW_TOP_SCOPE_HELD: &str = "sluice_flow_scope_held";
/// Scheduler queues paused by an operator.
pub const QUEUES_PAUSED: &str = "sluice_queues_paused";
/// Held invocations resting in compact form (bounded by `worker.max-held-invocations`).
pub const HELD_INVOCATIONS: &str = "sluice_held_invocations";
/// Bytes of held inputs kept in memory (bounded by `worker.held-memory-budget`).
pub const HELD_MEMORY: &str = "sluice_held_memory_bytes";
/// Invocations in the partitions' memory, by `state` (`docs/partition.md`).
pub const INVOCATIONS_IN_MEMORY: &str = "sluice_invocations_in_memory";
/// Bytes the invocations in memory hold (records, journals, waits, attempts), by `state`.
pub const INVOCATION_MEMORY: &str = "sluice_invocation_memory_bytes";
/// Kafka partitions paused by backpressure, by `subscription`.
pub const KAFKA_PAUSED_PARTITIONS: &str = "sluice_kafka_paused_partitions";
/// Records behind the end of the subscription's partitions (librdkafka's consumer lag, every
/// 5 s), by `subscription`.
pub const KAFKA_LAG: &str = "sluice_kafka_lag_records";
/// Cluster mode: partitions this node stopped following (a gap in the log, a damaged record).
pub const CLUSTER_BROKEN: &str = "sluice_cluster_partitions_broken";
/// Cluster mode: posted events Kafka has not taken yet (tried again until it does).
pub const CLUSTER_POSTS_RETRYING: &str = "sluice_cluster_posts_retrying";
/// Cluster mode: partitions no node leads, as this node sees them (a takeover under way, or
/// none possible).
pub const CLUSTER_LEADERLESS: &str = "sluice_cluster_partitions_leaderless";
/// Cluster mode: records this node's replica is behind the log's end, by `partition`.
pub const CLUSTER_LAG: &str = "sluice_cluster_lag_records";
/// Cluster mode: bytes of snapshot records this node wrote, by `kind` (`whole` or
/// `incremental`).
pub const CLUSTER_SNAPSHOT_BYTES: &str = "sluice_cluster_snapshot_bytes_total";
/// Cluster mode: rows in the snapshots this node wrote, by `kind`.
pub const CLUSTER_SNAPSHOT_ROWS: &str = "sluice_cluster_snapshot_rows_total";

/// From a completed invocation's (or journal's) retention expiry to its purge, in seconds; a
/// growing value means cleanup falls behind (`worker.cleanup-max-in-flight`).
pub const CLEANER_PURGE_DELAY: &str = "sluice_cleaner_purge_delay_seconds";

/// Buckets of every latency histogram, in seconds: 100 µs to a minute.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// Buckets of the commit group size.
pub const GROUP_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// Describes every metric to the installed recorder (help text and unit in the exposition).
pub fn describe() {
    describe_requests();
    describe_store();
    describe_flow();
    describe_memory();
    describe_outside();
}

/// Ingress requests, invocations and their attempts.
fn describe_requests() {
    use metrics::{Unit, describe_counter, describe_histogram};
    describe_counter!(
        INGRESS_REQUESTS,
        "Ingress requests by kind, status and error code."
    );
    describe_histogram!(
        INGRESS_DURATION,
        Unit::Seconds,
        "Ingress request latency by kind."
    );
    describe_counter!(INVOCATIONS_CREATED, "Invocations stored, by service.");
    describe_counter!(
        INVOCATIONS_COMPLETED,
        "Invocations completed, by service and outcome."
    );
    describe_histogram!(
        INVOCATION_DURATION,
        Unit::Seconds,
        "Creation to completion, by service."
    );
    describe_counter!(ATTEMPTS, "Attempts started, by service.");
    describe_histogram!(
        CLEANER_PURGE_DELAY,
        Unit::Seconds,
        "Retention expiry to purge of completed invocations and journals."
    );
    describe_counter!(
        ATTEMPT_RETRIES,
        "Failed attempts retried or paused, by error code."
    );
    describe_histogram!(
        ATTEMPT_DURATION,
        Unit::Seconds,
        "Attempt latency, by service."
    );
}

/// The store's commits and checkpoints.
fn describe_store() {
    use metrics::{Unit, describe_counter, describe_histogram};
    describe_histogram!(
        STORE_COMMIT_DURATION,
        Unit::Seconds,
        "Latency of one group commit."
    );
    describe_histogram!(STORE_COMMIT_GROUP, "Write sets per group commit.");
    describe_histogram!(
        STORE_CHECKPOINT_DURATION,
        Unit::Seconds,
        "One durable checkpoint of the store behind the local log."
    );
    describe_counter!(
        STORE_READ_CATCH_UPS,
        "Reads that applied acknowledged writes to the store before the applier did."
    );
    describe_counter!(STORE_COMMIT_FAILURES, "Failed group commits.");
}

/// Flow control: the rules' counters, budgets, shadow rules, queues and deployments' gates.
fn describe_flow() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        FLOW_RUNNING,
        "Running invocations at flow-control counters, by rule and level."
    );
    describe_gauge!(
        FLOW_HELD,
        "Invocations waiting at flow-control counters, by rule and level."
    );
    describe_gauge!(
        FLOW_RATE_LIMITED,
        "Invocations waiting for a rate limit's token, by rule and level."
    );
    describe_gauge!(
        FLOW_COUNTERS,
        "Live flow-control counters, by rule and level."
    );
    describe_counter!(
        FLOW_ADMISSIONS,
        "Admissions through flow-control counters, by rule and level."
    );
    describe_counter!(
        FLOW_COST_CHARGED,
        "Cost handlers reported, charged to budgets as calls ended, by rule and level."
    );
    describe_counter!(
        FLOW_COST_OVERRUN,
        "Cost handlers reported past what one call may charge to a budget, cut, by rule and level."
    );
    describe_gauge!(
        FLOW_BUDGET_SPENT,
        "What live counters spent of their budgets in the current window, by rule and level."
    );
    describe_gauge!(
        FLOW_BUDGET_RESERVED,
        "What running calls hold reserved of their counters' budgets, by rule and level."
    );
    describe_gauge!(
        FLOW_TOP_SCOPE_HELD,
        "Waiting invocations of the busiest scopes (metrics.top-scopes)."
    );
    describe_gauge!(
        FLOW_SHADOW_WOULD_WAIT,
        "Admissions shadow rules would have held back, at live counters, by rule and level."
    );
    describe_gauge!(
        FLOW_SHADOW_WOULD_REJECT,
        "Arrivals shadow rules would have refused, at live counters, by rule and level."
    );
    describe_gauge!(QUEUES_PAUSED, "Scheduler queues paused by an operator.");
    describe_gauge!(
        DEPLOYMENT_RUNNING,
        "Attempts running through a deployment's gate on this node, by deployment."
    );
    describe_gauge!(
        DEPLOYMENT_LIMIT,
        "What a deployment's gate lets run now (declared limit or paced-drain window), by deployment."
    );
    describe_gauge!(
        DEPLOYMENT_CLOSED,
        "1 while a deployment's paced drain keeps its gate closed, by deployment."
    );
}

/// What the partitions hold in memory.
fn describe_memory() {
    use metrics::{Unit, describe_gauge};
    describe_gauge!(
        HELD_INVOCATIONS,
        "Held invocations resting in compact form."
    );
    describe_gauge!(
        HELD_MEMORY,
        Unit::Bytes,
        "Bytes of held inputs kept in memory."
    );
    describe_gauge!(
        INVOCATIONS_IN_MEMORY,
        "Invocations in the partitions' memory, by state."
    );
    describe_gauge!(
        INVOCATION_MEMORY,
        Unit::Bytes,
        "Bytes the invocations in memory hold, by state."
    );
}

/// Plugins, Kafka subscriptions and the cluster.
fn describe_outside() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(PLUGIN_CALLS, "Plugin calls by plugin, hook and outcome.");
    describe_histogram!(
        PLUGIN_DURATION,
        Unit::Seconds,
        "Plugin call latency by plugin and hook."
    );
    describe_counter!(
        KAFKA_RECORDS,
        "Kafka records handed to partitions, by subscription."
    );
    describe_gauge!(
        KAFKA_PAUSED_PARTITIONS,
        "Kafka partitions paused by backpressure, by subscription."
    );
    describe_gauge!(
        CLUSTER_BROKEN,
        "Partitions this node stopped following (a gap in the log, a damaged record)."
    );
    describe_gauge!(
        CLUSTER_POSTS_RETRYING,
        "Posted events Kafka has not taken yet, tried again until it does."
    );
    describe_gauge!(
        CLUSTER_LEADERLESS,
        "Partitions no node leads, as this node sees them."
    );
    describe_gauge!(
        CLUSTER_LAG,
        "Records this node's replica is behind the partition log's end, by partition."
    );
    describe_counter!(
        CLUSTER_SNAPSHOT_BYTES,
        Unit::Bytes,
        "Bytes of snapshot records this node wrote, by kind (whole or incremental)."
    );
    describe_counter!(
        CLUSTER_SNAPSHOT_ROWS,
        "Rows in the snapshots this node wrote, by kind (whole or incremental)."
    );
}
