//! The flow charts' history (`GET /limits/history`, drawn by the dashboard): every
//! `flow.history-interval` a sample of each rule's counters (admitted/s, refused/s, running,
//! waiting, p99 wait, the adaptive limit, a shadow rule's tallies) and of the busiest queues,
//! kept for `flow.history`. It reads what a `/metrics` scrape reads; it keeps at most
//! [`MAX_RULE_SERIES`] rule series and [`MAX_QUEUE_SERIES`] queue series, so its memory is
//! bounded whatever the rule book and the traffic.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_api::limits::{FlowHistoryResponse, QueueSeries, RuleSeries};

use sluice_flow::RulePattern;
use sluice_flow::limiter::{FlowSums, RuleAdmissions, WaitHistogram};
use sluice_runtime::partition::Runtime;

/// Most rule series kept: the busiest at each sample.
pub const MAX_RULE_SERIES: usize = 200;
/// Most queue series a sample adds to: the 100 holding the most.
pub const MAX_QUEUE_SERIES: usize = 100;

/// A rule pattern (`none` without one) and a level's lower-case name.
type RuleKey = (String, &'static str);

/// One rule's values at one sample.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct RulePoint {
    admitted_per_second: Option<f64>,
    refused_per_second: Option<f64>,
    running: u64,
    waiting: u64,
    p99_wait_ms: Option<u64>,
    adaptive_limit: Option<f64>,
    would_wait: Option<u64>,
    would_reject: Option<u64>,
    /// What its live counters spent of their budgets in the window (rules with `budget`).
    budget_spent: Option<u64>,
}

impl RulePoint {
    /// How much it says is going on, to keep the busiest series.
    fn weight(&self) -> f64 {
        self.admitted_per_second.unwrap_or(0.0)
            + self.refused_per_second.unwrap_or(0.0)
            + (self.running + self.waiting) as f64
            + self.would_wait.unwrap_or(0) as f64
    }
}

/// A rule's totals since start, summed over the partitions.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    admitted: u64,
    refused: u64,
    waits: WaitHistogram,
}

/// A queue as a series names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    /// Its scope.
    pub scope: Option<String>,
    /// Its limit key.
    pub limit_key: Option<String>,
    /// Its service.
    pub service: String,
}

#[derive(Debug, Default)]
struct Samples {
    at: VecDeque<u64>,
    rules: BTreeMap<RuleKey, VecDeque<Option<RulePoint>>>,
    queues: BTreeMap<String, (QueueInfo, VecDeque<Option<u64>>)>,
    /// The totals at the last sample, for rates and the interval's waits.
    last: HashMap<RuleKey, Totals>,
}

/// The sampled history.
#[derive(Debug)]
pub struct FlowHistory {
    interval: Duration,
    points: usize,
    samples: Mutex<Samples>,
}

impl FlowHistory {
    /// A history sampled every `interval`, keeping `points` samples.
    pub fn new(interval: Duration, points: usize) -> Self {
        Self {
            interval,
            points: points.max(1),
            samples: Mutex::default(),
        }
    }

    /// Samples `runtime` every interval, forever.
    pub async fn run(self: Arc<Self>, runtime: Runtime) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // Only the queues a sample may keep: the busiest, however many live.
            let busiest = sluice_flow::ReadView {
                scope: None,
                limit: Some(MAX_QUEUE_SERIES),
            };
            let (sums, partitions, queues) = match tokio::try_join!(
                runtime.flow_sums(),
                runtime.metrics(),
                runtime.queue_page(busiest)
            ) {
                Ok((sums, metrics, (_, queues))) => (sums, metrics, queues),
                // The partitions are stopping or failed: health says so; skip the sample.
                Err(e) => {
                    tracing::debug!(error = %e, "flow history sample skipped");
                    continue;
                }
            };
            let admissions: Vec<RuleAdmissions> =
                partitions.into_iter().flat_map(|p| p.admissions).collect();
            let queues = queues
                .into_iter()
                .map(|(partition, q)| {
                    let id = sluice_core::ids::VQueueId {
                        partition,
                        queue: q.id.index(),
                    }
                    .to_string();
                    let info = QueueInfo {
                        scope: q.key.scope.as_ref().map(|s| s.as_str().to_owned()),
                        limit_key: q.key.limit_key.as_ref().map(|k| k.as_str().to_owned()),
                        service: q.key.service.to_string(),
                    };
                    (id, info, q.queued as u64)
                })
                .collect();
            self.sample(sluice_core::clock::now_ms(), &sums, &admissions, queues);
        }
    }

    /// Takes one sample at `now_ms`.
    pub fn sample(
        &self,
        now_ms: u64,
        sums: &FlowSums,
        admissions: &[RuleAdmissions],
        queues: Vec<(String, QueueInfo, u64)>,
    ) {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed_s = samples
            .at
            .back()
            .map(|last| now_ms.saturating_sub(*last).max(1) as f64 / 1000.0);
        let mut points = points_of(sums);
        let mut totals: HashMap<RuleKey, Totals> = HashMap::new();
        for a in admissions {
            let t = totals
                .entry((
                    RulePattern::label_of(a.rule.as_deref()),
                    a.level.lower_name(),
                ))
                .or_default();
            t.admitted = t.admitted.saturating_add(a.admitted);
            t.refused = t.refused.saturating_add(a.refused);
            t.waits.merge(&a.waits);
        }
        for (key, now) in &totals {
            let before = samples.last.get(key).copied().unwrap_or_default();
            let admitted = now.admitted.saturating_sub(before.admitted);
            let refused = now.refused.saturating_sub(before.refused);
            let live = points.contains_key(key);
            if !live && admitted == 0 && refused == 0 {
                continue;
            }
            let point = points.entry(key.clone()).or_default();
            if let Some(secs) = elapsed_s {
                point.admitted_per_second = Some(admitted as f64 / secs);
                point.refused_per_second = Some(refused as f64 / secs);
            }
            point.p99_wait_ms = now.waits.since(&before.waits).quantile(0.99);
        }
        samples.last = totals;

        // The busiest rule series, then the queues holding the most.
        let mut ranked: Vec<(RuleKey, RulePoint)> = points.into_iter().collect();
        ranked.sort_by(|a, b| b.1.weight().total_cmp(&a.1.weight()).then(a.0.cmp(&b.0)));
        ranked.truncate(MAX_RULE_SERIES);
        let mut busy: Vec<(String, QueueInfo, u64)> =
            queues.into_iter().filter(|(.., held)| *held > 0).collect();
        busy.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
        busy.truncate(MAX_QUEUE_SERIES);

        let len = samples.at.len();
        samples.at.push_back(now_ms);
        let mut fresh: HashMap<RuleKey, RulePoint> = ranked.into_iter().collect();
        for (key, series) in &mut samples.rules {
            series.push_back(fresh.remove(key));
        }
        for (key, point) in fresh {
            let mut series: VecDeque<Option<RulePoint>> = std::iter::repeat_n(None, len).collect();
            series.push_back(Some(point));
            samples.rules.insert(key, series);
        }
        let mut held: HashMap<String, (QueueInfo, u64)> = busy
            .into_iter()
            .map(|(id, info, n)| (id, (info, n)))
            .collect();
        for (id, (_, series)) in &mut samples.queues {
            series.push_back(held.remove(id).map(|(_, n)| n));
        }
        for (id, (info, n)) in held {
            let mut series: VecDeque<Option<u64>> = std::iter::repeat_n(None, len).collect();
            series.push_back(Some(n));
            samples.queues.insert(id, (info, series));
        }
        while samples.at.len() > self.points {
            samples.at.pop_front();
            for series in samples.rules.values_mut() {
                series.pop_front();
            }
            for (_, series) in samples.queues.values_mut() {
                series.pop_front();
            }
        }
        // A series with nothing left in the window goes.
        samples.rules.retain(|_, s| s.iter().any(Option::is_some));
        samples
            .queues
            .retain(|_, (_, s)| s.iter().any(Option::is_some));
        // Never more series than the bounds, whatever came and went in the window.
        trim(&mut samples.rules, MAX_RULE_SERIES * 2);
        trim(&mut samples.queues, MAX_QUEUE_SERIES * 2);
    }

    /// The history as the API answers it.
    pub fn response(&self) -> FlowHistoryResponse {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let series = |s: &VecDeque<Option<RulePoint>>, f: &dyn Fn(&RulePoint) -> Option<f64>| {
            s.iter().map(|p| p.as_ref().and_then(f)).collect::<Vec<_>>()
        };
        let whole = |s: &VecDeque<Option<RulePoint>>, f: &dyn Fn(&RulePoint) -> Option<u64>| {
            s.iter().map(|p| p.as_ref().and_then(f)).collect::<Vec<_>>()
        };
        FlowHistoryResponse {
            interval_ms: u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX),
            at: samples.at.iter().copied().collect(),
            rules: samples
                .rules
                .iter()
                .map(|((rule, level), s)| RuleSeries {
                    rule: rule.clone(),
                    level: (*level).to_owned(),
                    admitted_per_second: series(s, &|p| p.admitted_per_second),
                    refused_per_second: series(s, &|p| p.refused_per_second),
                    running: whole(s, &|p| Some(p.running)),
                    waiting: whole(s, &|p| Some(p.waiting)),
                    p99_wait_ms: whole(s, &|p| p.p99_wait_ms),
                    adaptive_limit: series(s, &|p| p.adaptive_limit),
                    shadow_would_wait: whole(s, &|p| p.would_wait),
                    shadow_would_reject: whole(s, &|p| p.would_reject),
                    budget_spent: whole(s, &|p| p.budget_spent),
                })
                .collect(),
            queues: samples
                .queues
                .iter()
                .map(|(id, (info, s))| QueueSeries {
                    id: id.clone(),
                    scope: info.scope.clone(),
                    limit_key: info.limit_key.clone(),
                    service: info.service.clone(),
                    held: s.iter().copied().collect(),
                })
                .collect(),
        }
    }
}

/// Drops the series with the fewest points in the window until at most `max` are left.
fn trim<K: Ord + Clone, V>(map: &mut BTreeMap<K, V>, max: usize)
where
    V: SeriesLen,
{
    if map.len() <= max {
        return;
    }
    let mut by_points: Vec<(usize, K)> = map.iter().map(|(k, v)| (v.points(), k.clone())).collect();
    by_points.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    for (_, key) in by_points.into_iter().take(map.len() - max) {
        map.remove(&key);
    }
}

/// Points a series has in the window.
trait SeriesLen {
    fn points(&self) -> usize;
}

impl SeriesLen for VecDeque<Option<RulePoint>> {
    fn points(&self) -> usize {
        self.iter().filter(|p| p.is_some()).count()
    }
}

impl SeriesLen for (QueueInfo, VecDeque<Option<u64>>) {
    fn points(&self) -> usize {
        self.1.iter().filter(|p| p.is_some()).count()
    }
}

/// Each rule series' point of `sums`: what its counters hold, spend and would have done.
fn points_of(sums: &FlowSums) -> HashMap<RuleKey, RulePoint> {
    let mut points: HashMap<RuleKey, RulePoint> = HashMap::new();
    for rule in &sums.rules {
        let key = (
            RulePattern::label_of(rule.rule.as_deref()),
            rule.level.lower_name(),
        );
        let point = points.entry(key).or_default();
        point.running += rule.running;
        point.waiting += rule.waiting;
        if let Some((spent, _)) = rule.budget {
            point.budget_spent = Some(point.budget_spent.unwrap_or(0).saturating_add(spent));
        }
        if rule.adaptive > 0 {
            point.adaptive_limit = Some(rule.adaptive_limits as f64 / rule.adaptive as f64);
        }
    }
    for shadow in &sums.shadows {
        let point = points
            .entry((shadow.rule.to_string(), shadow.level.lower_name()))
            .or_default();
        point.would_wait = Some(
            point
                .would_wait
                .unwrap_or(0)
                .saturating_add(shadow.would_wait),
        );
        point.would_reject = Some(
            point
                .would_reject
                .unwrap_or(0)
                .saturating_add(shadow.would_reject),
        );
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_flow::Level;

    fn admissions(rule: &str, admitted: u64, refused: u64, waits: &[u64]) -> RuleAdmissions {
        let mut histogram = WaitHistogram::default();
        for w in waits {
            histogram.record(*w);
        }
        RuleAdmissions {
            charged: 0,
            overrun: 0,
            rule: Some(Arc::new(rule.parse().unwrap())),
            level: Level::Scope,
            admitted,
            refused,
            waits: histogram,
        }
    }

    #[test]
    fn rates_and_the_interval_p99_come_from_the_difference_of_two_totals() {
        let history = FlowHistory::new(Duration::from_secs(1), 3);
        history.sample(
            1_000,
            &FlowSums::default(),
            &[admissions("a", 10, 0, &[5; 10])],
            Vec::new(),
        );
        history.sample(
            3_000,
            &FlowSums::default(),
            &[admissions(
                "a",
                30,
                4,
                &[5; 10]
                    .iter()
                    .chain(&[900; 20])
                    .copied()
                    .collect::<Vec<_>>(),
            )],
            vec![(
                "vq_0_1".into(),
                QueueInfo {
                    scope: Some("a".into()),
                    limit_key: None,
                    service: "S".into(),
                },
                7,
            )],
        );
        let r = history.response();
        assert_eq!(r.at, vec![1_000, 3_000]);
        let a = &r.rules[0];
        assert_eq!(a.rule, "a");
        assert_eq!(a.admitted_per_second, vec![None, Some(10.0)], "20 in 2 s");
        assert_eq!(a.refused_per_second, vec![None, Some(2.0)]);
        assert_eq!(
            a.p99_wait_ms,
            vec![Some(7), Some(1023)],
            "the interval's waits only"
        );
        assert_eq!(r.queues[0].held, vec![None, Some(7)]);
        // The window keeps 3 points; a quiet rule's series leaves once it is all gaps.
        for at in [4_000, 5_000, 6_000] {
            history.sample(
                at,
                &FlowSums::default(),
                &[admissions("a", 30, 4, &[])],
                Vec::new(),
            );
        }
        let r = history.response();
        assert_eq!(r.at, vec![4_000, 5_000, 6_000]);
        assert!(r.rules.is_empty() && r.queues.is_empty(), "{r:?}");
    }

    #[test]
    fn series_are_bounded_whatever_the_rule_book() {
        let history = FlowHistory::new(Duration::from_secs(1), 10);
        for round in 0..3u64 {
            let many: Vec<RuleAdmissions> = (0..1_000)
                .map(|i| admissions(&format!("r{round}-{i}"), i + 1, 0, &[]))
                .collect();
            history.sample(1_000 * (round + 1), &FlowSums::default(), &many, Vec::new());
            history.sample(
                1_000 * (round + 1) + 500,
                &FlowSums::default(),
                &many,
                Vec::new(),
            );
        }
        assert!(history.response().rules.len() <= MAX_RULE_SERIES * 2);
    }
}
