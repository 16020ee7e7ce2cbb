//! The `match-rule` hook as the rule book's [`RulePolicy`]. The limiter caches each counter's
//! answer until the rule book or the plugin changes, so the plugin runs once per counter and
//! change, not per request. A failing plugin leaves the rule book's choice in force: for
//! limits that is the conservative answer whatever `on-error` says.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Instant;

use super::bindings::types;
use super::{Plugin, failure_error};
use sluice_flow::{CounterRef, Decision, Level, Limit, RulePattern, RulePolicy};

/// A loaded `match-rule` plugin.
#[derive(Debug)]
pub struct MatchRule(pub Arc<Plugin>);

fn candidate((limit, pattern): &(Limit, Arc<RulePattern>)) -> types::Candidate {
    types::Candidate {
        pattern: pattern.to_string(),
        limit: match limit {
            Limit::Concurrency(n) => types::Limit::Concurrency(n.get()),
            Limit::Unlimited => types::Limit::Unlimited,
        },
    }
}

impl RulePolicy for MatchRule {
    fn decide(
        &self,
        counter: CounterRef<'_>,
        candidates: &[(Limit, Arc<RulePattern>)],
        chosen: Option<&(Limit, Arc<RulePattern>)>,
    ) -> Decision {
        let plugin = &self.0;
        let counter = types::Counter {
            level: match counter.level {
                Level::Scope => types::Level::Scope,
                Level::L1 => types::Level::L1,
                Level::L2 => types::Level::L2,
            },
            scope: counter.scope.to_owned(),
            l1: counter.l1.map(str::to_owned),
            l2: counter.l2.map(str::to_owned),
        };
        // While its breaker is open the plugin is not called (nor instantiated again).
        if let Err(open) = plugin.breaker.check(&plugin.name) {
            tracing::debug!(plugin = %plugin.name, error = %open.message, "match-rule plugin not called; the rule book's choice applies");
            return Decision::Default;
        }
        let started = Instant::now();
        let answer = plugin.compiled.match_rule(
            counter,
            candidates.iter().map(candidate).collect(),
            chosen.map(candidate),
        );
        let decision = match answer {
            Ok(types::Decision::Default) => Ok(Decision::Default),
            Ok(types::Decision::Unlimited) => Ok(Decision::Unlimited),
            Ok(types::Decision::Concurrency(n)) => NonZeroU32::new(n)
                .map(Decision::Concurrency)
                .ok_or_else(|| "concurrency(0): a limit is at least 1".to_owned()),
            Err(failure) => Err(failure_error(&plugin.name, &failure).message),
        };
        plugin.metrics.record(
            &plugin.name,
            "match_rule",
            started.elapsed(),
            decision.is_err(),
        );
        plugin.breaker.record(decision.is_err());
        if decision.is_err() {
            // The failed instance is gone: the next call finds a warm one made off the shard.
            plugin.refill_later();
        }
        decision.unwrap_or_else(|why| {
            tracing::warn!(plugin = %plugin.name, error = %why, "match-rule plugin failed; the rule book's choice applies");
            Decision::Default
        })
    }
}
