//! The flow-control core: scopes and limit keys, the rule book, the limiter's counters and the
//! fair scheduler. Pure and synchronous: no I/O, time is an argument, everything is driven by
//! explicit events, so it can be tested exhaustively and simulated.

pub mod gates;
pub mod limiter;
#[cfg(test)]
mod model;
pub mod pacing;
pub mod pattern;
pub mod priority;
pub mod quota;
pub mod rate;
mod read_view;
pub mod rules;
pub mod scheduler;
pub mod scope;
pub mod slots;

pub use pattern::{Level, PatternError, RulePattern};
pub use priority::{PRIORITY_HEADER, Priority, PriorityError};
pub use quota::{
    Budget, BurstBudget, MAX_BURST_FACTOR_PCT, Measure, Quota, QuotaError, QuotaUse, QuotaWindow,
};
pub use rate::{Bucket, Rate, RateError, RateLimit};
pub use read_view::ReadView;
pub use rules::{
    AdaptiveLimit, CounterRef, Debounce, DebounceError, Decision, Delete, Keep, Limit, OnFull,
    OnFullError, Precondition, Resolved, Rule, RuleBook, RuleError, RulePolicy, ShadowRule, Upsert,
    WeightChange,
};
pub use scope::{LIMIT_KEY_HEADER, LimitKey, SCOPE_HEADER, Scope};
