//! The flow-control rule book and its live counters.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A rule's limits; empty means unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Invocations running at once, at least 1: a number, or `{ "min": 2, "max": 8 }` for a
    /// burstable limit (each key is guaranteed `min` and borrows up to `max` while the level
    /// above has idle capacity; borrowed slots go back first). A burstable limit needs a key
    /// level (`scope/l1`, `scope/l1/l2`), whose parent lends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Concurrency>,
    /// Admissions per unit of time: `100/s`, `6000/min`, `10/h`, `5/10s`. New invocations
    /// beyond it wait in their queue for a token; retries take none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// Tokens the rate's bucket holds when full: admitted at once after a quiet spell
    /// (default 1; only with `rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// What a new invocation that finds no token (or its `quota` used up, or its `budget`
    /// spent) gets: `throttle` (default: it waits in its queue) or `reject` (429 `FLO0002`, or
    /// `FLO0005` for a budget, with `Retry-After`; only with `rate`, `quota` or `budget`, and
    /// for each of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exceed: Option<String>,
    /// Most invocations that may wait at the counter; a new one beyond answers 429 `FLO0002`
    /// with `Retry-After` (Kafka subscriptions pause instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued: Option<u32>,
    /// The share this rule's keys get under contention relative to their siblings, 1-1000
    /// (default 1): `acme/gold` at 3 beside `acme/free` at 1 gets 3 admissions for each of its.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Longest a new invocation may wait at the counter (`500ms`, `30s`, `5m`); past it, it
    /// is dropped without ever starting: its caller gets 504 `FLO0003`, a send's status says
    /// it. Counted from its arrival (or the end of its delay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<String>,
    /// A concurrency limit that moves with the deployment's latency between `min` (where it
    /// starts) and `max`; a static `concurrency` on the same rule wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveBounds>,
    /// New admissions per calendar window of UTC at each counter: `10000/day`, `500/h`,
    /// `1000000/month`. Kept durably (restarts and leader changes keep what was used); past
    /// it, new invocations wait for the next window (or get 429 with `on_exceed: reject`).
    /// `sluice rules reset-quota` starts a window's count again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<String>,
    /// What calls may spend per calendar window of UTC at each counter, in the unit their
    /// handlers report (a `sluice:cost` step): `1000000/day`, `5000/min`, `/h`, `/month`. Each
    /// call's cost is charged when it ends, to its scope, L1 and L2 counters, and kept durably;
    /// a new call is admitted while the budget is not spent (or waits for the next window, or
    /// gets 429 `FLO0005` with `on_exceed: reject`). `sluice rules reset-budget` starts a
    /// window's spend again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
    /// Charged to the budget when a call is admitted and settled when it ends: a call that
    /// spends at most this never takes the budget past its amount (only with `budget`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve: Option<u64>,
    /// The budget's unit, for people: `tokens`, `credits` (only with `budget`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_unit: Option<String>,
    /// Lets the `concurrency` (a fixed one) rise by a factor for a budget of time above it per
    /// calendar window of UTC: `2x 10m/day` runs up to twice the concurrency until ten
    /// minutes above it were spent that day, then the concurrency again until the next day.
    /// Every other counter's limit still holds; the time spent is kept durably.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_budget: Option<String>,
    /// What a new call meets when the counter is full (under a `concurrency`): `queue` (the
    /// default: it waits); `drop_new` (one active run per key at `concurrency = 1`: what comes
    /// meanwhile completes 409 `FLO0007`, never run); `keep_oldest` or `keep_newest` (at most
    /// `max_queued`, 1 by default, wait; one more drops the newest, or replaces the oldest
    /// with 409 `FLO0008`); `cancel_running` (a new call cancels what runs and replaces what
    /// waits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_full: Option<String>,
    /// Calls of one target arriving at the counter within `wait` of each other make one
    /// delayed run: `<wait>[ first|last][ max <time>]` (`2s`, `500ms first`, `2s max 30s`).
    /// With `last` (the default) the newest call runs, each earlier one completing 409
    /// `FLO0009`; with `first` the first call runs and the later ones complete 409 `FLO0009`.
    /// The run starts `wait` after the latest call, at most `max` after the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<String>,
}

/// A rule's `concurrency`: a bound, or a burstable one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Concurrency {
    /// At most this many at once.
    Fixed(u32),
    /// `min` guaranteed, up to `max` while the parent level has idle capacity.
    Burstable(BurstableBounds),
}

impl Concurrency {
    /// The most that may run at once.
    pub fn max(self) -> u32 {
        match self {
            Concurrency::Fixed(n) => n,
            Concurrency::Burstable(b) => b.max,
        }
    }

    /// The guaranteed slots of a burstable limit.
    pub fn min(self) -> Option<u32> {
        match self {
            Concurrency::Fixed(_) => None,
            Concurrency::Burstable(b) => Some(b.min),
        }
    }
}

impl From<u32> for Concurrency {
    fn from(n: u32) -> Self {
        Concurrency::Fixed(n)
    }
}

impl std::fmt::Display for Concurrency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Concurrency::Fixed(n) => write!(f, "{n}"),
            Concurrency::Burstable(b) => write!(f, "{}..{}", b.min, b.max),
        }
    }
}

/// A burstable `concurrency`'s bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BurstableBounds {
    /// Always guaranteed to each key (at least 1).
    pub min: u32,
    /// The most a key may run, borrowing beyond `min` from its parent's idle capacity.
    pub max: u32,
}

/// `adaptive`'s bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveBounds {
    /// The lowest the limit goes, and where it starts (at least 1).
    pub min: u32,
    /// The highest it goes (at least `min`).
    pub max: u32,
}

/// `enforce` (the default) or `shadow`: evaluated and counted at its counters, never holding
/// or refusing anything.
pub const MODES: [&str; 2] = ["enforce", "shadow"];

fn enforce() -> String {
    MODES[0].to_owned()
}

/// When an upsert applies.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum PreconditionRequest {
    /// Always.
    None,
    /// Only if no rule has the pattern.
    DoesNotExist,
    /// Only if the rule is at this version.
    Matches {
        /// The expected version.
        version: u32,
    },
}

/// One rule to create or replace.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpsertRuleRequest {
    /// `*`, `scope`, `scope/l1`, `*/l1/l2`, …
    pub pattern: String,
    /// Its limits (`{}` = unlimited).
    #[serde(default)]
    pub limits: Limits,
    /// Free text.
    pub description: Option<String>,
    /// Kept but not applied.
    #[serde(default)]
    pub disabled: bool,
    /// `enforce` (default) or `shadow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Checked before it applies.
    pub precondition: Option<PreconditionRequest>,
}

/// A rule as stored.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RuleResponse {
    /// Its pattern.
    pub pattern: String,
    /// Its limits.
    pub limits: Limits,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Kept but not applied.
    pub disabled: bool,
    /// `enforce` or `shadow`.
    #[serde(default = "enforce")]
    pub mode: String,
    /// Bumps when limits, mode or `disabled` change.
    pub version: u32,
    /// Last change, ms since the epoch.
    pub last_modified_millis_since_epoch: u64,
}

/// One rule to delete.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteRuleRequest {
    /// Its pattern.
    pub pattern: String,
    /// When set, the rule must be at this version.
    pub expected_version: Option<u32>,
}

/// `POST /limits/rules/apply`: upserts then deletes, as one change.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApplyRulesRequest {
    /// Rules to create or replace.
    #[serde(default)]
    pub upserts: Vec<UpsertRuleRequest>,
    /// Rules to delete.
    #[serde(default)]
    pub deletes: Vec<DeleteRuleRequest>,
}

/// What an apply changed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ApplyRulesResponse {
    /// The upserted rules as stored, in order.
    pub rules: Vec<RuleResponse>,
    /// The patterns deleted.
    pub deleted: Vec<String>,
}

/// `GET /limits/rules`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListRulesResponse {
    /// Every rule, by pattern.
    pub rules: Vec<RuleResponse>,
}

/// One weight override: a counter's share under contention, set by an operator, beating the
/// weight its rule gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WeightOverride {
    /// The counter: `scope`, `scope/l1` or `scope/l1/l2`, names only (no `*`).
    pub counter: String,
    /// Its weight, 1-1000.
    pub weight: u32,
}

/// One change of `PUT /limits/weights`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetWeightRequest {
    /// The counter: `scope`, `scope/l1` or `scope/l1/l2`, names only (no `*`).
    pub counter: String,
    /// Its weight from now on, 1-1000; `null` (or absent) removes the override, giving the
    /// counter back its rule's weight.
    #[serde(default)]
    pub weight: Option<u32>,
}

/// `GET /limits/weights`, and what `PUT /limits/weights` answers: every override after.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListWeightsResponse {
    /// Every override, by counter name.
    pub overrides: Vec<WeightOverride>,
}

/// One flow-control counter.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CounterResponse {
    /// `scope`, `level1` or `level2`: the same words as the `level` label in `/metrics` and
    /// the CLI (`sys_user_limits` spells them as the reference server does: `Scope`, `Level1`,
    /// `Level2`).
    pub level: String,
    /// The scope.
    pub scope: String,
    /// L1 key (L1 and L2 counters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l1: Option<String>,
    /// L2 key (L2 counters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2: Option<String>,
    /// Invocations running under it.
    pub usage: u32,
    /// Its limit; absent when unlimited. For an adaptive counter, where it is now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Set when its limit adapts: the bounds it moves within.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveBounds>,
    /// Set when its limit is burstable: the slots guaranteed (`limit` is the most it may
    /// borrow up to; `usage` beyond this is borrowed from the level above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guaranteed: Option<u32>,
    /// Its rule's quota (`10000/day`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<String>,
    /// New admissions counted in the quota's current window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_used: Option<u64>,
    /// When the quota's next window starts (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_resets_at: Option<String>,
    /// Its rule's budget (`1000000/day`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
    /// What its calls spent in the budget's current window, as their handlers reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_spent: Option<u64>,
    /// What the calls running under it hold reserved of the budget (`reserve` each).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_reserved: Option<u64>,
    /// When the budget's next window starts (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_resets_at: Option<String>,
    /// Its rule's burst budget (`2x 10m/day`); `limit` is raised while some is left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_budget: Option<String>,
    /// Ms it ran above its concurrency in the burst budget's current window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_spent_ms: Option<u64>,
    /// Ms of the burst budget left in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_left_ms: Option<u64>,
    /// Free slots; absent when unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<u32>,
    /// Queues waiting on it (for a slot or a token).
    pub waiters: usize,
    /// Its rate, when rate limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// Its rate's burst.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// Tokens there now (rate limited counters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u32>,
    /// When the next token is there, RFC 3339 (rate limited counters out of tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_token_at: Option<String>,
    /// Invocations waiting in queues under it.
    #[serde(default)]
    pub queued: u32,
    /// Its rule's `max_queued`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued: Option<u32>,
    /// The rule that set the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Its share among its siblings under contention.
    #[serde(default = "one")]
    pub weight: u32,
    /// The shadow rule evaluated here and what it would have done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowResponse>,
}

fn one() -> u32 {
    1
}

/// What a shadow rule would have done at a counter since the counter came to be.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ShadowResponse {
    /// The shadow rule.
    pub rule: String,
    /// Admissions it would have held back (no free slot, or no token).
    pub would_wait: u64,
    /// Arrivals it would have refused (full queue, or a rejecting rate).
    pub would_reject: u64,
    /// How long the held-back admissions would have waited for tokens, ms in total.
    pub would_wait_ms: u64,
}

/// `GET /limits/counters`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListCountersResponse {
    /// The live counters asked for (the busiest, of the scope asked for), by scope, L1, L2.
    pub counters: Vec<CounterResponse>,
    /// How many counters matched the scope asked for, before the limit.
    #[serde(default)]
    pub total: usize,
}

/// One deployment gate on this node (`GET /limits/deployments`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeploymentGateResponse {
    /// The deployment id, or `id/Service` for a service's own limit.
    pub deployment: String,
    /// The concurrency its manifest declares (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<u32>,
    /// The window of its paced drain while it recovers from an outage (absent: not paced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_window: Option<u32>,
    /// Attempts running through it now.
    pub running: u32,
    /// Nothing new starts on it before then (a `Retry-After` it answered, or the next round of
    /// probes while it is unreachable), RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_until: Option<String>,
}

/// `GET /limits/deployments`.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct ListDeploymentGatesResponse {
    /// Every deployment gate, by name.
    pub gates: Vec<DeploymentGateResponse>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_precondition_is_tagged_by_its_type() {
        let sent = serde_json::to_value(PreconditionRequest::Matches { version: 3 }).unwrap();
        assert_eq!(sent, serde_json::json!({"type": "matches", "version": 3}));
        let read: PreconditionRequest =
            serde_json::from_value(serde_json::json!({"type": "does_not_exist"})).unwrap();
        assert!(matches!(read, PreconditionRequest::DoesNotExist));
    }

    #[test]
    fn an_unlimited_rule_has_empty_limits() {
        let rule = RuleResponse {
            pattern: "acme".into(),
            limits: Limits::default(),
            description: None,
            disabled: false,
            mode: enforce(),
            version: 1,
            last_modified_millis_since_epoch: 0,
        };
        let json = serde_json::to_value(&rule).unwrap();
        assert_eq!(json["limits"], serde_json::json!({}));
        assert!(json.get("description").is_none());
    }
}

/// `POST /limits/rules/reset-quota` (and `reset-budget`): start the quota count (or the budget's
/// spend) of every counter a pattern matches again from 0, in the current window.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResetQuotaRequest {
    /// The pattern (`acme`, `acme/*`, …): counters it matches at its level.
    pub pattern: String,
}

/// What a quota reset did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ResetQuotaResponse {
    /// Counters whose count started again.
    pub reset: u64,
    /// How many of them each partition reset, by partition: every partition, whichever node
    /// was asked (in cluster mode each by the node leading it).
    #[serde(default)]
    pub partitions: std::collections::BTreeMap<u32, u64>,
}

/// `GET /limits/history`: the flow charts' data, one point per sample (`flow.history-interval`)
/// over the last `flow.history`, oldest first. Every series has one value per entry of `at`;
/// `null` where the rule or queue had no live counter or queue at that sample.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct FlowHistoryResponse {
    /// Time between samples, ms (0: sampling is off).
    pub interval_ms: u64,
    /// When each sample was taken, ms since the epoch.
    pub at: Vec<u64>,
    /// Per rule and level (`rule` `none`: counters no rule matched).
    pub rules: Vec<RuleSeries>,
    /// Per queue that held something in the window (the busiest 100 at each sample).
    pub queues: Vec<QueueSeries>,
}

/// One rule's series at one level.
#[derive(Debug, Default, Clone, Serialize, Deserialize, ToSchema)]
pub struct RuleSeries {
    /// The rule's pattern.
    pub rule: String,
    /// `scope`, `level1` or `level2`.
    pub level: String,
    /// Admissions per second over the interval before each sample.
    pub admitted_per_second: Vec<Option<f64>>,
    /// New invocations refused per second (`max_queued` full, or a rejecting rate).
    pub refused_per_second: Vec<Option<f64>>,
    /// Running at the sample.
    pub running: Vec<Option<u64>>,
    /// Waiting at the sample.
    pub waiting: Vec<Option<u64>>,
    /// The 99th percentile of how long new invocations admitted in the interval waited, ms
    /// (the upper bound of its power-of-two bucket).
    pub p99_wait_ms: Vec<Option<u64>>,
    /// The mean adaptive limit of its counters (rules with `adaptive`).
    pub adaptive_limit: Vec<Option<f64>>,
    /// A shadow rule's tally of admissions it would have held back.
    pub shadow_would_wait: Vec<Option<u64>>,
    /// A shadow rule's tally of arrivals it would have refused.
    pub shadow_would_reject: Vec<Option<u64>>,
    /// What the rule's live counters spent of their budgets in the current window (rules with
    /// `budget`).
    #[serde(default)]
    pub budget_spent: Vec<Option<u64>>,
}

/// One queue's series.
#[derive(Debug, Default, Clone, Serialize, Deserialize, ToSchema)]
pub struct QueueSeries {
    /// The queue's id (`vq_<partition>_<index>`).
    pub id: String,
    /// Its scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Its limit key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_key: Option<String>,
    /// Its service.
    pub service: String,
    /// What it held (ready entries) at each sample.
    pub held: Vec<Option<u64>>,
}
