//! The rule book: a versioned set of rules, changed by atomic batches with optional optimistic
//! preconditions, and resolved per counter in O(1): at most 8 hash probes, in rank order, into an
//! index of the enabled rules of that level.

use std::collections::BTreeMap;
use std::num::{NonZeroU32, NonZeroU64};
use std::sync::Arc;

use hashbrown::{Equivalent, HashMap};
use serde::{Deserialize, Serialize};

use super::pattern::{Level, RulePattern};
use super::quota::{Budget, BurstBudget, Quota};
use super::rate::RateLimit;

mod debounce;
mod on_full;
mod policy;
mod weights;

pub use debounce::{Debounce, DebounceError, Keep, MAX_DEBOUNCE_MS};
pub use on_full::{OnFull, OnFullError};
pub use policy::{CounterRef, Decision, RulePolicy};
pub use weights::{MAX_WEIGHT_OVERRIDES, WeightChange};

/// Most rules a book may hold.
pub const MAX_RULES: usize = 10_000;

/// What a rule allows at its counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Limit {
    /// At most this many invocations running at once.
    Concurrency(NonZeroU32),
    /// No bound.
    Unlimited,
}

impl Limit {
    /// The bound as a number, `None` when unlimited.
    pub fn concurrency(self) -> Option<u32> {
        match self {
            Limit::Concurrency(n) => Some(n.get()),
            Limit::Unlimited => None,
        }
    }

    /// Whether one more may run when `usage` are running.
    pub fn admits(self, usage: u32) -> bool {
        match self {
            Limit::Concurrency(n) => usage < n.get(),
            Limit::Unlimited => true,
        }
    }

    /// Free slots at `usage`, `u32::MAX` when unlimited.
    pub fn available(self, usage: u32) -> u32 {
        match self {
            Limit::Concurrency(n) => n.get().saturating_sub(usage),
            Limit::Unlimited => u32::MAX,
        }
    }
}

/// An adaptive limit's bounds (`adaptive = { min, max }`): the counter's limit moves between
/// them with the latency the deployment shows (`limiter/adaptive.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AdaptiveLimit {
    /// The lowest it goes, and where it starts.
    pub min: NonZeroU32,
    /// The highest it goes.
    pub max: NonZeroU32,
}

/// A rule as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// Which counters it applies to.
    pub pattern: RulePattern,
    /// The bound on invocations running at once.
    pub limit: Limit,
    /// The bound on admissions per unit of time (none: not rate limited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateLimit>,
    /// Most invocations that may wait at the counter; a new one beyond is refused (429).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued: Option<NonZeroU32>,
    /// Share of its counter under contention, relative to its siblings (none: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<NonZeroU32>,
    /// Longest a new invocation may wait at the counter, ms; past it, it is dropped with
    /// FLO0003 without ever starting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<NonZeroU64>,
    /// A limit that moves with the deployment's latency; a static `concurrency` on the rule
    /// wins (the rollback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveLimit>,
    /// A burstable limit (`concurrency = { min, max }`): the slots always guaranteed to the
    /// counter, which may borrow up to `limit` while its parent has idle capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guaranteed: Option<NonZeroU32>,
    /// Admissions per calendar window at each counter, kept durably.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<Quota>,
    /// What calls may spend per calendar window at each counter, as handlers report it, kept
    /// durably.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// The budget's unit, for operators (`tokens`, `credits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_unit: Option<String>,
    /// Its concurrency may rise by a factor for a budget of time per calendar window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_budget: Option<BurstBudget>,
    /// What a new call meets at a full counter (none: it waits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_full: Option<OnFull>,
    /// Calls of one target at a counter within its wait make one delayed run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<Debounce>,
    /// Evaluated and counted, never enforced (`mode = "shadow"`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
    /// Free text for operators.
    pub description: Option<String>,
    /// Kept but invisible to the runtime.
    pub disabled: bool,
    /// Bumps when the limit, rate, queue bound, weight, mode or `disabled` change.
    pub version: u32,
    /// Milliseconds since the epoch of the last change.
    pub last_modified_ms: u64,
}

impl Rule {
    /// Its one `on_exceed`, as its rate, quota and budget share it: whether a new call past
    /// them is refused (429) rather than held; `None` when it has none of the three.
    pub fn rejects(&self) -> Option<bool> {
        self.rate
            .map(|r| r.reject)
            .or(self.quota.map(|q| q.reject))
            .or(self.budget.map(|b| b.limit.reject))
    }
}

/// An optimistic check made before an upsert or delete applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Precondition {
    /// Always applies.
    None,
    /// Only if no rule has this pattern.
    DoesNotExist,
    /// Only if the rule exists at this version.
    Matches(u32),
}

/// One upsert of a batch: the full new state of the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upsert {
    /// The rule's pattern.
    pub pattern: RulePattern,
    /// Its limit.
    pub limit: Limit,
    /// Its rate limit.
    pub rate: Option<RateLimit>,
    /// Its bound on waiting invocations.
    pub max_queued: Option<NonZeroU32>,
    /// Its share under contention.
    pub weight: Option<NonZeroU32>,
    /// Its bound on how long a new invocation waits, ms.
    pub max_wait_ms: Option<NonZeroU64>,
    /// Its adaptive limit's bounds.
    pub adaptive: Option<AdaptiveLimit>,
    /// Its guaranteed slots under a burstable limit.
    pub guaranteed: Option<NonZeroU32>,
    /// Its long-window quota.
    pub quota: Option<Quota>,
    /// Its budget of reported cost.
    pub budget: Option<Budget>,
    /// The budget's unit.
    pub budget_unit: Option<String>,
    /// Its burst budget.
    pub burst_budget: Option<BurstBudget>,
    /// What a new call meets at a full counter.
    pub on_full: Option<OnFull>,
    /// Its debounce.
    pub debounce: Option<Debounce>,
    /// Counted, never enforced.
    pub shadow: bool,
    /// Its description.
    pub description: Option<String>,
    /// Whether it is disabled.
    pub disabled: bool,
    /// Checked before it applies.
    pub precondition: Precondition,
}

impl Upsert {
    /// An enabled rule without rate, description or precondition.
    pub fn new(pattern: RulePattern, limit: Limit) -> Self {
        Self {
            pattern,
            limit,
            rate: None,
            max_queued: None,
            weight: None,
            max_wait_ms: None,
            adaptive: None,
            guaranteed: None,
            quota: None,
            budget: None,
            budget_unit: None,
            burst_budget: None,
            on_full: None,
            debounce: None,
            shadow: false,
            description: None,
            disabled: false,
            precondition: Precondition::None,
        }
    }
}

/// One delete of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    /// The pattern to remove.
    pub pattern: RulePattern,
    /// When set, the rule must exist at this version.
    pub expected_version: Option<u32>,
}

/// Why a batch was refused; nothing of it applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// A precondition did not hold (HTTP 409).
    #[error("rule precondition {precondition} for pattern '{pattern}' failed ({})", actual_text(*actual))]
    PreconditionFailed {
        /// The pattern.
        pattern: String,
        /// The precondition as text.
        precondition: String,
        /// The rule's version, `None` when it does not exist.
        actual: Option<u32>,
    },
    /// The batch would exceed [`MAX_RULES`] (HTTP 422).
    #[error("rule book is full ({MAX_RULES} rules)")]
    BookFull,
    /// A weight override named a pattern with a `*` (HTTP 422).
    #[error(
        "'{pattern}' is not a counter: a weight override names one counter (scope, scope/l1 or scope/l1/l2), without *"
    )]
    NotACounter {
        /// The pattern as given.
        pattern: String,
    },
    /// The batch would exceed [`MAX_WEIGHT_OVERRIDES`] (HTTP 422).
    #[error(
        "the rule book holds {MAX_WEIGHT_OVERRIDES} weight overrides already: remove some first"
    )]
    WeightsFull,
}

fn actual_text(actual: Option<u32>) -> String {
    match actual {
        Some(v) => format!("actual version: {v}"),
        None => "the rule does not exist".to_owned(),
    }
}

/// The winning rule of a counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The limit in force.
    pub limit: Limit,
    /// The rate in force.
    pub rate: Option<RateLimit>,
    /// The bound on waiting invocations in force.
    pub max_queued: Option<NonZeroU32>,
    /// The counter's share under contention among its siblings (1 without a rule).
    pub weight: NonZeroU32,
    /// The longest a new invocation may wait here, ms.
    pub max_wait_ms: Option<NonZeroU64>,
    /// Set when the limit adapts (the rule has `adaptive` and no static `concurrency`).
    pub adaptive: Option<AdaptiveLimit>,
    /// Set when the limit is burstable: the slots guaranteed (below `limit`); the rest are
    /// borrowed from the parent level while it has idle capacity.
    pub guaranteed: Option<NonZeroU32>,
    /// The quota in force.
    pub quota: Option<Quota>,
    /// The budget in force.
    pub budget: Option<Budget>,
    /// The burst budget in force (only over a static concurrency).
    pub burst_budget: Option<BurstBudget>,
    /// What a new call meets when the counter is full (only under a concurrency).
    pub on_full: Option<OnFull>,
    /// The debounce in force.
    pub debounce: Option<Debounce>,
    /// The rule that set them; `None` means no rule matched (unlimited).
    pub pattern: Option<Arc<RulePattern>>,
    /// The most specific shadow rule matching the counter: counted, never enforced.
    pub shadow: Option<Arc<ShadowRule>>,
}

/// A shadow rule as a counter evaluates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowRule {
    /// The limit it would enforce.
    pub limit: Limit,
    /// The rate it would enforce.
    pub rate: Option<RateLimit>,
    /// The queue bound it would enforce.
    pub max_queued: Option<NonZeroU32>,
    /// The rule.
    pub pattern: Arc<RulePattern>,
}

impl Resolved {
    /// No rule: unlimited.
    pub const UNLIMITED: Resolved = Resolved {
        limit: Limit::Unlimited,
        rate: None,
        max_queued: None,
        weight: NonZeroU32::MIN,
        max_wait_ms: None,
        adaptive: None,
        guaranteed: None,
        quota: None,
        budget: None,
        burst_budget: None,
        on_full: None,
        debounce: None,
        pattern: None,
        shadow: None,
    };

    /// The adaptive bounds in force: a static limit (or a policy's) wins over an adaptive one.
    pub fn adaptive_in_force(&self) -> Option<AdaptiveLimit> {
        self.adaptive.filter(|_| self.limit == Limit::Unlimited)
    }
}

/// Index key of an enabled rule at its level: each component exact (`Some`) or `*` (`None`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ProbeKey([Option<Box<str>>; 3]);

/// The borrowed form used to probe; hashes exactly like [`ProbeKey`].
#[derive(Hash)]
struct ProbeRef<'a>([Option<&'a str>; 3]);

impl Equivalent<ProbeKey> for ProbeRef<'_> {
    fn equivalent(&self, key: &ProbeKey) -> bool {
        self.0.iter().zip(&key.0).all(|(a, b)| *a == b.as_deref())
    }
}

/// The enabled rules of one level.
#[derive(Debug, Clone, Default)]
struct LevelIndex {
    rules: HashMap<ProbeKey, Indexed>,
    /// Bit `r` set when some rule of rank `r` exists, so absent shapes cost no probe.
    ranks: u8,
}

/// An enabled rule as the index holds it.
#[derive(Debug, Clone)]
struct Indexed {
    limit: Limit,
    rate: Option<RateLimit>,
    max_queued: Option<NonZeroU32>,
    weight: Option<NonZeroU32>,
    max_wait_ms: Option<NonZeroU64>,
    adaptive: Option<AdaptiveLimit>,
    guaranteed: Option<NonZeroU32>,
    quota: Option<Quota>,
    budget: Option<Budget>,
    burst_budget: Option<BurstBudget>,
    on_full: Option<OnFull>,
    debounce: Option<Debounce>,
    pattern: Arc<RulePattern>,
    /// Set for a shadow rule: what a counter evaluates.
    shadow: Option<Arc<ShadowRule>>,
}

/// Ranks that exist at each level, most specific first.
const RANKS: [&[u8]; 3] = [&[4, 0], &[6, 4, 2, 0], &[7, 6, 5, 4, 3, 2, 1, 0]];

/// The cluster-wide rule book.
#[derive(Debug, Clone, Default)]
pub struct RuleBook {
    version: u32,
    rules: BTreeMap<String, Rule>,
    index: [LevelIndex; 3],
    /// The enabled shadow rules, indexed the same way.
    shadow_index: [LevelIndex; 3],
    /// Some enabled rule has a `max-queued`, a rejecting rate or a quota: only then may a
    /// new invocation be refused.
    refuses: bool,
    /// Some enabled rule has a `max_wait`: only then is a new invocation's wait bounded by
    /// the rules it passes.
    max_waits: bool,
    /// Some enabled rule has an `on_full`.
    crowds: bool,
    /// Some enabled rule has a `debounce`.
    debounces: bool,
    policy: Option<Arc<dyn RulePolicy>>,
    /// Weight overrides by counter name (`weights.rs`).
    weights: BTreeMap<String, NonZeroU32>,
}

impl RuleBook {
    /// An empty book at version 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bumps once per batch that changed something.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Number of rules, enabled or not.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether the book has no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Every rule, sorted by pattern text.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.values()
    }

    /// The rule with this pattern.
    pub fn get(&self, pattern: &RulePattern) -> Option<&Rule> {
        self.rules.get(&pattern.to_string())
    }

    /// A book holding `rules` at `version` (as stored).
    pub fn restore(rules: impl IntoIterator<Item = Rule>, version: u32) -> Self {
        let mut book = Self::new();
        let rules = rules
            .into_iter()
            .map(|r| (r.pattern.to_string(), r))
            .collect();
        book.commit(rules, version);
        book
    }

    /// Applies every upsert or none; answers the resulting rule of each, in order.
    pub fn apply_batch(&mut self, upserts: &[Upsert], now_ms: u64) -> Result<Vec<Rule>, RuleError> {
        let next_version = self.version + 1;
        let mut rules = self.rules.clone();
        let mut changed = false;
        let mut results = Vec::with_capacity(upserts.len());
        for upsert in upserts {
            let key = upsert.pattern.to_string();
            let existing = rules.get(&key);
            check(upsert.precondition, &key, existing.map(|r| r.version))?;
            let rule = match existing {
                None => {
                    if rules.len() >= MAX_RULES {
                        return Err(RuleError::BookFull);
                    }
                    changed = true;
                    Rule {
                        pattern: upsert.pattern.clone(),
                        limit: upsert.limit,
                        rate: upsert.rate,
                        max_queued: upsert.max_queued,
                        weight: upsert.weight,
                        max_wait_ms: upsert.max_wait_ms,
                        adaptive: upsert.adaptive,
                        guaranteed: upsert.guaranteed,
                        quota: upsert.quota,
                        budget: upsert.budget,
                        budget_unit: upsert.budget_unit.clone(),
                        burst_budget: upsert.burst_budget,
                        on_full: upsert.on_full,
                        debounce: upsert.debounce,
                        shadow: upsert.shadow,
                        description: upsert.description.clone(),
                        disabled: upsert.disabled,
                        version: next_version,
                        last_modified_ms: now_ms,
                    }
                }
                Some(old) => {
                    let runtime = old.limit != upsert.limit
                        || old.rate != upsert.rate
                        || old.max_queued != upsert.max_queued
                        || old.weight != upsert.weight
                        || old.max_wait_ms != upsert.max_wait_ms
                        || old.adaptive != upsert.adaptive
                        || old.guaranteed != upsert.guaranteed
                        || old.quota != upsert.quota
                        || old.budget != upsert.budget
                        || old.burst_budget != upsert.burst_budget
                        || old.on_full != upsert.on_full
                        || old.debounce != upsert.debounce
                        || old.shadow != upsert.shadow
                        || old.disabled != upsert.disabled;
                    let text = old.description != upsert.description
                        || old.budget_unit != upsert.budget_unit;
                    changed |= runtime || text;
                    Rule {
                        limit: upsert.limit,
                        rate: upsert.rate,
                        max_queued: upsert.max_queued,
                        weight: upsert.weight,
                        max_wait_ms: upsert.max_wait_ms,
                        adaptive: upsert.adaptive,
                        guaranteed: upsert.guaranteed,
                        quota: upsert.quota,
                        budget: upsert.budget,
                        budget_unit: upsert.budget_unit.clone(),
                        burst_budget: upsert.burst_budget,
                        on_full: upsert.on_full,
                        debounce: upsert.debounce,
                        shadow: upsert.shadow,
                        description: upsert.description.clone(),
                        disabled: upsert.disabled,
                        version: old.version + u32::from(runtime),
                        last_modified_ms: if runtime || text {
                            now_ms
                        } else {
                            old.last_modified_ms
                        },
                        ..old.clone()
                    }
                }
            };
            results.push(rule.clone());
            rules.insert(key, rule);
        }
        if changed {
            self.commit(rules, next_version);
        }
        Ok(results)
    }

    /// Removes every listed rule or none; answers the patterns that were actually removed.
    pub fn delete_batch(&mut self, deletes: &[Delete]) -> Result<Vec<RulePattern>, RuleError> {
        let mut rules = self.rules.clone();
        let mut removed = Vec::new();
        for delete in deletes {
            let key = delete.pattern.to_string();
            if let Some(expected) = delete.expected_version {
                check(
                    Precondition::Matches(expected),
                    &key,
                    rules.get(&key).map(|r| r.version),
                )?;
            }
            if let Some(rule) = rules.remove(&key) {
                removed.push(rule.pattern);
            }
        }
        if !removed.is_empty() {
            self.commit(rules, self.version + 1);
        }
        Ok(removed)
    }

    fn commit(&mut self, rules: BTreeMap<String, Rule>, version: u32) {
        let mut index: [LevelIndex; 3] = Default::default();
        let mut shadow_index: [LevelIndex; 3] = Default::default();
        let mut refuses = false;
        let mut max_waits = false;
        let mut crowds = false;
        let mut debounces = false;
        for rule in rules.values().filter(|r| !r.disabled) {
            let pattern = Arc::new(rule.pattern.clone());
            let shadow = rule.shadow.then(|| {
                Arc::new(ShadowRule {
                    limit: rule.limit,
                    rate: rule.rate,
                    max_queued: rule.max_queued,
                    pattern: Arc::clone(&pattern),
                })
            });
            refuses |= !rule.shadow
                && (rule.max_queued.is_some()
                    || rule.rate.is_some_and(|r| r.reject)
                    // Any quota or budget: a fresh key may find no room to keep its count.
                    || rule.quota.is_some()
                    || rule.budget.is_some());
            max_waits |= !rule.shadow && rule.max_wait_ms.is_some();
            crowds |= !rule.shadow && rule.on_full.is_some();
            debounces |= !rule.shadow && rule.debounce.is_some();
            let index = if rule.shadow {
                &mut shadow_index
            } else {
                &mut index
            };
            let level = &mut index[rule.pattern.level().index()];
            let mut key: [Option<Box<str>>; 3] = Default::default();
            for (slot, c) in key.iter_mut().zip(rule.pattern.components()) {
                *slot = c.exact().map(Box::from);
            }
            level.ranks |= 1 << rule.pattern.rank();
            level.rules.insert(
                ProbeKey(key),
                Indexed {
                    limit: rule.limit,
                    rate: rule.rate,
                    max_queued: rule.max_queued,
                    weight: rule.weight,
                    max_wait_ms: rule.max_wait_ms,
                    // A static concurrency wins: adaptive only where the rule has none.
                    adaptive: rule
                        .adaptive
                        .filter(|_| matches!(rule.limit, Limit::Unlimited)),
                    // Guaranteed slots mean something only below a bound.
                    guaranteed: rule
                        .guaranteed
                        .filter(|g| matches!(rule.limit, Limit::Concurrency(max) if *g < max)),
                    quota: rule.quota,
                    budget: rule.budget,
                    // A burst raises a bound: over a static concurrency only.
                    burst_budget: rule
                        .burst_budget
                        .filter(|_| matches!(rule.limit, Limit::Concurrency(_))),
                    // Full means something only under a concurrency.
                    on_full: rule.on_full.filter(|_| {
                        matches!(rule.limit, Limit::Concurrency(_)) || rule.adaptive.is_some()
                    }),
                    debounce: rule.debounce,
                    pattern,
                    shadow,
                },
            );
        }
        self.rules = rules;
        self.index = index;
        self.shadow_index = shadow_index;
        self.refuses = refuses;
        self.max_waits = max_waits;
        self.crowds = crowds;
        self.debounces = debounces;
        self.version = version;
    }

    /// Whether some enabled rule may refuse a new invocation (`max-queued`, a rate with
    /// `on_exceed = reject`, a quota or a budget).
    pub fn may_refuse(&self) -> bool {
        self.refuses
    }

    /// Whether some enabled rule bounds how long a new invocation may wait (`max_wait`).
    pub fn bounds_waits(&self) -> bool {
        self.max_waits
    }

    /// Whether some enabled rule has an `on_full`: new calls are judged as they join a queue.
    pub fn crowds(&self) -> bool {
        self.crowds
    }

    /// Whether some enabled rule has a `debounce`: new calls look for a burst to join.
    pub fn debounces(&self) -> bool {
        self.debounces
    }

    /// This book with `policy` deciding how rules match (`None`: the most specific wins).
    pub fn with_policy(&self, policy: Option<Arc<dyn RulePolicy>>) -> Self {
        Self {
            policy,
            ..self.clone()
        }
    }

    /// The policy in use, if any.
    pub fn policy(&self) -> Option<&Arc<dyn RulePolicy>> {
        self.policy.as_ref()
    }

    /// The limit of counter `(scope, l1, l2)` at `level`: the most specific enabled rule, or
    /// what the policy decides; unlimited when nothing matches or when the counter does not
    /// exist (an L1 level without `l1`). A weight override of the counter beats the rule's
    /// weight.
    pub fn resolve(
        &self,
        level: Level,
        scope: &str,
        l1: Option<&str>,
        l2: Option<&str>,
    ) -> Resolved {
        let resolved = self.by_rules(level, scope, l1, l2);
        self.overridden(level, scope, l1, l2, resolved)
    }

    /// [`RuleBook::resolve`] before weight overrides.
    fn by_rules(&self, level: Level, scope: &str, l1: Option<&str>, l2: Option<&str>) -> Resolved {
        let Some(policy) = &self.policy else {
            return self.most_specific(level, scope, l1, l2);
        };
        let names = [Some(scope), l1, l2];
        if names[..=level.index()].iter().any(Option::is_none) {
            return Resolved::UNLIMITED;
        }
        let candidates = self.candidates(level, [scope, l1.unwrap_or(""), l2.unwrap_or("")]);
        let counter = CounterRef {
            level,
            scope,
            l1,
            l2,
        };
        let chosen = candidates.first();
        let pattern = chosen.map(|(_, p)| Arc::clone(p));
        match policy.decide(counter, &candidates, chosen) {
            Decision::Default => self.most_specific(level, scope, l1, l2),
            // A policy decides concurrency; an unlimited counter has no rate either, and a
            // bound keeps the rate of the rule the book would pick.
            Decision::Unlimited => Resolved {
                limit: Limit::Unlimited,
                rate: None,
                max_queued: None,
                adaptive: None,
                guaranteed: None,
                burst_budget: None,
                on_full: None,
                pattern,
                ..self.most_specific(level, scope, l1, l2)
            },
            // A policy's bound is a plain bound: no burst above it.
            Decision::Concurrency(n) => Resolved {
                limit: Limit::Concurrency(n),
                guaranteed: None,
                burst_budget: None,
                pattern,
                ..self.most_specific(level, scope, l1, l2)
            },
        }
    }

    /// Every enabled rule matching the counter, most specific first.
    fn candidates(&self, level: Level, names: [&str; 3]) -> Vec<(Limit, Arc<RulePattern>)> {
        let index = &self.index[level.index()];
        RANKS[level.index()]
            .iter()
            .filter(|&&rank| index.ranks & (1 << rank) != 0)
            .filter_map(|&rank| index.rules.get(&probe(level, rank, names)))
            .map(|rule| (rule.limit, Arc::clone(&rule.pattern)))
            .collect()
    }

    fn most_specific(
        &self,
        level: Level,
        scope: &str,
        l1: Option<&str>,
        l2: Option<&str>,
    ) -> Resolved {
        let names = [Some(scope), l1, l2];
        if names[..=level.index()].iter().any(Option::is_none) {
            return Resolved::UNLIMITED;
        }
        let names = [scope, l1.unwrap_or(""), l2.unwrap_or("")];
        let shadow = first_match(&self.shadow_index, level, names).and_then(|r| r.shadow.clone());
        first_match(&self.index, level, names).map_or(
            Resolved {
                shadow: shadow.clone(),
                ..Resolved::UNLIMITED
            },
            |rule| Resolved {
                limit: rule.limit,
                rate: rule.rate,
                max_queued: rule.max_queued,
                weight: rule.weight.unwrap_or(NonZeroU32::MIN),
                max_wait_ms: rule.max_wait_ms,
                adaptive: rule.adaptive,
                guaranteed: rule.guaranteed,
                quota: rule.quota,
                budget: rule.budget,
                burst_budget: rule.burst_budget,
                on_full: rule.on_full,
                debounce: rule.debounce,
                pattern: Some(Arc::clone(&rule.pattern)),
                shadow,
            },
        )
    }
}

/// The most specific rule of `index` matching the counter `names` at `level`.
fn first_match<'a>(
    index: &'a [LevelIndex; 3],
    level: Level,
    names: [&str; 3],
) -> Option<&'a Indexed> {
    let index = &index[level.index()];
    RANKS[level.index()]
        .iter()
        .filter(|&&rank| index.ranks & (1 << rank) != 0)
        .find_map(|&rank| index.rules.get(&probe(level, rank, names)))
}

/// The index key a rule of `rank` at `level` would have for the counter `names`: each
/// component exact where the rank's bit is set, `*` otherwise.
fn probe(level: Level, rank: u8, names: [&str; 3]) -> ProbeRef<'_> {
    let pick =
        |i: usize, weight: u8| (i <= level.index() && rank & weight != 0).then_some(names[i]);
    ProbeRef([pick(0, 4), pick(1, 2), pick(2, 1)])
}

fn check(precondition: Precondition, pattern: &str, actual: Option<u32>) -> Result<(), RuleError> {
    let holds = match precondition {
        Precondition::None => true,
        Precondition::DoesNotExist => actual.is_none(),
        Precondition::Matches(v) => actual == Some(v),
    };
    if holds {
        return Ok(());
    }
    let precondition = match precondition {
        Precondition::None => "none".to_owned(),
        Precondition::DoesNotExist => "does_not_exist".to_owned(),
        Precondition::Matches(v) => format!("matches(version {v})"),
    };
    Err(RuleError::PreconditionFailed {
        pattern: pattern.to_owned(),
        precondition,
        actual,
    })
}

#[cfg(test)]
mod tests;
