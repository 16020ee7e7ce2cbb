//! `GET /metrics`: the Prometheus recorder every crate records into (through the `metrics`
//! facade), and what is read only when scraped: flow-control counters summed per rule and
//! level, held invocations, paused queues and Kafka partitions, and the process (RSS, fds,
//! CPU). Names and labels are in `sluice_core::metrics`.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use sluice_core::metrics as names;

use sluice_core::errors::{Code, CodedError};
use sluice_flow::RulePattern;
use sluice_flow::scheduler::DeadlineCause;
use sluice_runtime::partition::Runtime;

/// How often histograms are drained into their buckets between scrapes.
const UPKEEP: Duration = Duration::from_secs(5);

/// The installed recorder and what a scrape reads besides it.
pub struct Metrics {
    handle: PrometheusHandle,
    process: metrics_process::Collector,
    top_scopes: usize,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("top_scopes", &self.top_scopes)
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// Installs the process-wide recorder; a second server in the same process shares it.
    pub fn install(config: &sluice_config::MetricsConfig) -> Result<Arc<Self>, CodedError> {
        static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
        let handle = match HANDLE.get() {
            Some(handle) => handle.clone(),
            None => {
                let handle = recorder()?;
                names::describe();
                HANDLE.get_or_init(|| handle).clone()
            }
        };
        let process = metrics_process::Collector::default();
        process.describe();
        Ok(Arc::new(Self {
            handle,
            process,
            top_scopes: usize::from(config.top_scopes),
        }))
    }

    /// Drains histograms now and then, so samples recorded between scrapes stay bounded.
    pub async fn upkeep(self: Arc<Self>) {
        let mut tick = tokio::time::interval(UPKEEP);
        loop {
            tick.tick().await;
            self.handle.run_upkeep();
        }
    }

    /// The exposition: what was recorded, and what is read now.
    pub async fn render(
        &self,
        runtime: &Runtime,
        kafka: &sluice_kafka::Kafka,
        registry: &sluice_runtime::registry::Registry,
    ) -> Result<String, CodedError> {
        let sums = runtime.flow_sums().await?;
        let partitions = runtime.metrics().await?;
        flow_gauges(&sums, self.top_scopes);
        let mut admitted: HashMap<(String, &'static str), u64> = HashMap::new();
        let mut charged: HashMap<(String, &'static str), u64> = HashMap::new();
        let mut overrun: HashMap<(String, &'static str), u64> = HashMap::new();
        let mut expired: HashMap<(String, &'static str), u64> = HashMap::new();
        let (mut paused, mut held, mut held_bytes) = (0, 0, 0);
        let mut states: std::collections::BTreeMap<&'static str, (usize, u64)> =
            std::collections::BTreeMap::new();
        for partition in &partitions {
            for state in &partition.states {
                let (n, bytes) = states.entry(state.state).or_default();
                *n += state.invocations;
                *bytes += state.bytes;
            }
            for e in &partition.expired {
                let (rule, level) = match &e.cause {
                    DeadlineCause::Request => ("request".to_owned(), "request"),
                    DeadlineCause::Rule { level, rule } => {
                        (RulePattern::label_of(rule.as_deref()), level.lower_name())
                    }
                };
                *expired.entry((rule, level)).or_default() += e.expired;
            }
            for a in &partition.admissions {
                let key = (
                    RulePattern::label_of(a.rule.as_deref()),
                    a.level.lower_name(),
                );
                if a.charged > 0 {
                    *charged.entry(key.clone()).or_default() += a.charged;
                }
                if a.overrun > 0 {
                    *overrun.entry(key.clone()).or_default() += a.overrun;
                }
                *admitted.entry(key).or_default() += a.admitted;
            }
            paused += partition.paused_queues;
            // Shared by every partition: the same in each.
            held = partition.held_invocations;
            held_bytes = partition.held_bytes;
        }
        for ((rule, level), n) in admitted {
            metrics::counter!(names::FLOW_ADMISSIONS, "rule" => rule, "level" => level).absolute(n);
        }
        for ((rule, level), n) in charged {
            metrics::counter!(names::FLOW_COST_CHARGED, "rule" => rule, "level" => level)
                .absolute(n);
        }
        for ((rule, level), n) in overrun {
            metrics::counter!(names::FLOW_COST_OVERRUN, "rule" => rule, "level" => level)
                .absolute(n);
        }
        for ((rule, level), n) in expired {
            metrics::counter!(names::FLOW_EXPIRED, "rule" => rule, "level" => level).absolute(n);
        }
        metrics::gauge!(names::QUEUES_PAUSED).set(paused as f64);
        for gate in registry.gates().snapshot(sluice_core::clock::now_ms()) {
            metrics::gauge!(names::DEPLOYMENT_RUNNING, "deployment" => gate.name.clone())
                .set(f64::from(gate.used));
            metrics::gauge!(names::DEPLOYMENT_CLOSED, "deployment" => gate.name.clone()).set(
                if gate.closed_until_ms.is_some() {
                    1.0
                } else {
                    0.0
                },
            );
            if let Some(limit) = gate.limit {
                metrics::gauge!(names::DEPLOYMENT_LIMIT, "deployment" => gate.name)
                    .set(f64::from(limit));
            }
        }
        metrics::gauge!(names::HELD_INVOCATIONS).set(held as f64);
        metrics::gauge!(names::HELD_MEMORY).set(held_bytes as f64);
        for (state, (n, bytes)) in states {
            metrics::gauge!(names::INVOCATIONS_IN_MEMORY, "state" => state).set(n as f64);
            metrics::gauge!(names::INVOCATION_MEMORY, "state" => state).set(bytes as f64);
        }
        for (subscription, partitions, lag) in kafka.consumer_metrics() {
            if let Some(lag) = lag {
                metrics::gauge!(names::KAFKA_LAG, "subscription" => subscription.clone())
                    .set(lag as f64);
            }
            metrics::gauge!(names::KAFKA_PAUSED_PARTITIONS, "subscription" => subscription)
                .set(partitions as f64);
        }
        self.process.collect();
        Ok(self.handle.render())
    }
}

fn recorder() -> Result<PrometheusHandle, CodedError> {
    let failed = |e: &dyn std::fmt::Display| {
        CodedError::new(
            Code::RT0002,
            format!("cannot start the metrics recorder: {e}"),
        )
    };
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), names::SECONDS_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(names::STORE_COMMIT_GROUP.into()),
                names::GROUP_BUCKETS,
            )
        })
        .map_err(|e| failed(&e))?
        // Every gauge is set when scraped; one a scrape no longer sets (a deleted rule, a
        // scope that left the top N) is gone from the next one.
        .idle_timeout(MetricKindMask::GAUGE, Some(Duration::from_secs(1)))
        .install_recorder()
        .map_err(|e| failed(&e))
}

/// Sets the counters' gauges per rule and level (never per scope), and the top scopes by
/// waiters when asked for.
fn flow_gauges(sums: &sluice_flow::limiter::FlowSums, top_scopes: usize) {
    // One entry per pattern and level: `FlowSums::merge` joined the partitions' by pattern.
    for sum in &sums.rules {
        let (rule, level) = (
            RulePattern::label_of(sum.rule.as_deref()),
            sum.level.lower_name(),
        );
        let labels = [("rule", rule), ("level", level.to_owned())];
        metrics::gauge!(names::FLOW_COUNTERS, &labels).set(sum.counters as f64);
        metrics::gauge!(names::FLOW_RUNNING, &labels).set(sum.running as f64);
        metrics::gauge!(names::FLOW_HELD, &labels).set(sum.waiting as f64);
        metrics::gauge!(names::FLOW_RATE_LIMITED, &labels).set(sum.rate_limited as f64);
        if let Some((spent, reserved)) = sum.budget {
            metrics::gauge!(names::FLOW_BUDGET_SPENT, &labels).set(spent as f64);
            metrics::gauge!(names::FLOW_BUDGET_RESERVED, &labels).set(reserved as f64);
        }
        if sum.adaptive > 0 {
            metrics::gauge!(names::FLOW_ADAPTIVE_LIMIT, &labels)
                .set(sum.adaptive_limits as f64 / sum.adaptive as f64);
        }
    }
    for shadow in &sums.shadows {
        let labels = [
            ("rule", shadow.rule.to_string()),
            ("level", shadow.level.lower_name().to_owned()),
        ];
        metrics::gauge!(names::FLOW_SHADOW_WOULD_WAIT, &labels).set(shadow.would_wait as f64);
        metrics::gauge!(names::FLOW_SHADOW_WOULD_REJECT, &labels).set(shadow.would_reject as f64);
    }
    if top_scopes > 0 {
        let mut busiest: Vec<&(String, u64)> = sums.scopes.iter().filter(|(_, n)| *n > 0).collect();
        busiest.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        for (scope, held) in busiest.into_iter().take(top_scopes) {
            metrics::gauge!(names::FLOW_TOP_SCOPE_HELD, "scope" => scope.clone()).set(*held as f64);
        }
    }
}
