//! The counters summed by rule and level, for gauges and the flow history: taken in one walk
//! of the arena without a snapshot (and its owned names) per counter, so a sample costs the
//! same few allocations with a million keys live as with ten.

use std::collections::HashMap;
use std::sync::Arc;

use super::{CounterId, Limiter};
use crate::Level;
use crate::RulePattern;
use crate::rules::RuleBook;

/// What the counters of one rule at one level add up to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSums {
    /// The rule (none: counters no rule limits).
    pub rule: Option<Arc<RulePattern>>,
    /// The level.
    pub level: Level,
    /// Counters live (or kept idle for their quota, budget or burst use).
    pub counters: u64,
    /// Calls running under them.
    pub running: u64,
    /// Calls waiting under them.
    pub waiting: u64,
    /// Calls waiting under those of them out of tokens.
    pub rate_limited: u64,
    /// How many of them adapt their limit.
    pub adaptive: u64,
    /// The adaptive limits where they are now, added up.
    pub adaptive_limits: u64,
    /// Spent and reserved of their budgets in the current windows, when the rule has one.
    pub budget: Option<(u64, u64)>,
}

/// What a shadow rule's counters at one level would have done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowSums {
    /// The shadow rule.
    pub rule: Arc<RulePattern>,
    /// The level.
    pub level: Level,
    /// Admissions it would have held back.
    pub would_wait: u64,
    /// Arrivals it would have refused.
    pub would_reject: u64,
}

/// The counters of one partition (or several, merged), summed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowSums {
    /// By rule and level.
    pub rules: Vec<RuleSums>,
    /// By shadow rule and level.
    pub shadows: Vec<ShadowSums>,
    /// Calls waiting per scope, at the scopes' own counters.
    pub scopes: Vec<(String, u64)>,
}

impl RuleSums {
    fn new(rule: Option<&Arc<RulePattern>>, level: Level) -> Self {
        Self {
            rule: rule.cloned(),
            level,
            counters: 0,
            running: 0,
            waiting: 0,
            rate_limited: 0,
            adaptive: 0,
            adaptive_limits: 0,
            budget: None,
        }
    }

    fn add(&mut self, other: &RuleSums) {
        self.counters += other.counters;
        self.running += other.running;
        self.waiting += other.waiting;
        self.rate_limited += other.rate_limited;
        self.adaptive += other.adaptive;
        self.adaptive_limits += other.adaptive_limits;
        if let Some((spent, reserved)) = other.budget {
            self.add_budget(spent, reserved);
        }
    }

    fn add_budget(&mut self, spent: u64, reserved: u64) {
        let sum = self.budget.get_or_insert_default();
        sum.0 = sum.0.saturating_add(spent);
        sum.1 = sum.1.saturating_add(reserved);
    }
}

impl FlowSums {
    /// The sums of several partitions as one: equal rules (by pattern) and scopes add up.
    pub fn merge(parts: impl IntoIterator<Item = FlowSums>) -> Self {
        let mut rules: Vec<RuleSums> = Vec::new();
        let mut shadows: Vec<ShadowSums> = Vec::new();
        let mut scopes: HashMap<String, u64> = HashMap::new();
        for part in parts {
            for sums in part.rules {
                match rules
                    .iter_mut()
                    .find(|r| r.level == sums.level && r.rule == sums.rule)
                {
                    Some(into) => into.add(&sums),
                    None => rules.push(sums),
                }
            }
            for sums in part.shadows {
                match shadows
                    .iter_mut()
                    .find(|s| s.level == sums.level && s.rule == sums.rule)
                {
                    Some(into) => {
                        into.would_wait = into.would_wait.saturating_add(sums.would_wait);
                        into.would_reject = into.would_reject.saturating_add(sums.would_reject);
                    }
                    None => shadows.push(sums),
                }
            }
            for (scope, waiting) in part.scopes {
                *scopes.entry(scope).or_default() += waiting;
            }
        }
        let mut scopes: Vec<(String, u64)> = scopes.into_iter().collect();
        scopes.sort();
        FlowSums {
            rules,
            shadows,
            scopes,
        }
    }
}

/// A rule's identity while summing one partition: the book hands every counter of a rule the
/// same `Arc`, so its address groups them without hashing the pattern.
fn rule_slot(rule: Option<&Arc<RulePattern>>) -> usize {
    rule.map_or(0, |r| Arc::as_ptr(r) as usize)
}

impl Limiter {
    /// Every counter (live, or idle and kept for its quota, budget or burst use) summed by rule
    /// and level, resolved against `book`.
    pub fn sums(&mut self, book: &RuleBook, now_ms: u64) -> FlowSums {
        self.now_ms = self.now_ms.max(now_ms);
        let now = self.now_ms;
        let mut rules: HashMap<(usize, Level), RuleSums> = HashMap::new();
        let mut shadows: HashMap<(usize, Level), ShadowSums> = HashMap::new();
        let mut scopes = Vec::new();
        let ids: Vec<CounterId> = self.live_ids().collect();
        for id in ids {
            self.resolve(id, book);
            if self.bursts(id) {
                self.burst_tick(id, now);
            }
            let node = self.node(id);
            let sums = rules
                .entry((rule_slot(node.rule.as_ref()), node.level))
                .or_insert_with(|| RuleSums::new(node.rule.as_ref(), node.level));
            sums.counters += 1;
            sums.running += u64::from(node.usage);
            sums.waiting += u64::from(node.queued);
            if let Some(rate) = node.rate
                && node.bucket.tokens(rate, now) == 0
            {
                sums.rate_limited += u64::from(node.queued);
            }
            let bounds = node.bounds.as_deref();
            if bounds.is_some_and(|b| b.adaptive.is_some()) {
                sums.adaptive += 1;
                sums.adaptive_limits += u64::from(node.limit.concurrency().unwrap_or(0));
            }
            if let Some((_, used, reserved)) = node.budget(now) {
                sums.add_budget(used.used, reserved);
            }
            if let Some(shadow) = bounds.and_then(|b| b.shadow.as_ref()) {
                let pattern = &shadow.rule.pattern;
                let tally = shadows
                    .entry((Arc::as_ptr(pattern) as usize, node.level))
                    .or_insert_with(|| ShadowSums {
                        rule: Arc::clone(pattern),
                        level: node.level,
                        would_wait: 0,
                        would_reject: 0,
                    });
                tally.would_wait = tally.would_wait.saturating_add(shadow.counts.would_wait);
                tally.would_reject = tally
                    .would_reject
                    .saturating_add(shadow.counts.would_reject);
            }
            if node.level == Level::Scope && node.queued > 0 {
                let queued = u64::from(node.queued);
                if let Some(scope) = self.names(id)[0] {
                    scopes.push((scope.to_owned(), queued));
                }
            }
        }
        // Idle counters kept for their windows are few next to the live ones: snapshot them.
        let mut idle = Vec::new();
        self.idle_quota_counters(book, &mut idle);
        for c in idle {
            let sums = rules
                .entry((rule_slot(c.rule.as_ref()), c.level))
                .or_insert_with(|| RuleSums::new(c.rule.as_ref(), c.level));
            sums.counters += 1;
            if let Some((_, used, reserved)) = c.controls().budget {
                sums.add_budget(used.used, reserved);
            }
        }
        // Each scope has one scope-level counter here: no two entries to join.
        scopes.sort();
        FlowSums {
            rules: rules.into_values().collect(),
            shadows: shadows.into_values().collect(),
            scopes,
        }
    }
}
