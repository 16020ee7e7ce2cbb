//! How a `match-rule` plugin decides a counter's bound: what it sees of a counter and of the
//! rules matching it, and what it answers.

use std::num::NonZeroU32;
use std::sync::Arc;

use super::Limit;
use crate::pattern::{Level, RulePattern};

/// A counter as a policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterRef<'a> {
    /// Its level.
    pub level: Level,
    /// Its scope.
    pub scope: &'a str,
    /// Its L1 key (L1 and L2 counters).
    pub l1: Option<&'a str>,
    /// Its L2 key (L2 counters).
    pub l2: Option<&'a str>,
}

/// What a policy decides for a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Keep the rule book's choice.
    Default,
    /// No bound.
    Unlimited,
    /// This bound.
    Concurrency(NonZeroU32),
}

/// Decides how rules match a counter (a `match-rule` plugin). Called once per counter and
/// rule-book change, never per request: the limiter caches the answer.
pub trait RulePolicy: Send + Sync + std::fmt::Debug {
    /// `candidates` are the enabled rules matching `counter`, most specific first; `chosen`
    /// is the book's own pick (the first candidate, `None` when nothing matches).
    fn decide(
        &self,
        counter: CounterRef<'_>,
        candidates: &[(Limit, Arc<RulePattern>)],
        chosen: Option<&(Limit, Arc<RulePattern>)>,
    ) -> Decision;
}
