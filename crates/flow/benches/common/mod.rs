//! Fixtures shared by the flow benches: a 1,000-rule book and a key space of
//! 10,000 scopes × 10 L1 × 10 L2 keys, walked in a scattered but repeatable order.

#![allow(dead_code)]

use std::num::NonZeroU32;

use sluice_flow::scheduler::QueueKey;
use sluice_flow::{Level, Limit, LimitKey, RuleBook, RulePattern, Scope, Upsert};

/// Scopes in the key space.
pub const SCOPES: usize = 10_000;
/// L1 keys per scope.
pub const L1S: usize = 10;
/// L2 keys per L1 key.
pub const L2S: usize = 10;
/// All (scope, l1, l2) combinations.
pub const KEYS: usize = SCOPES * L1S * L2S;

/// The `i`-th key of a scattered walk over the whole key space (a multiplicative permutation).
pub fn scattered(i: usize) -> (usize, usize, usize) {
    let k = (i.wrapping_mul(2_654_435_761)) % KEYS;
    (k / (L1S * L2S), (k / L2S) % L1S, k % L2S)
}

/// Names of a key.
pub fn names(key: (usize, usize, usize)) -> (String, String, String) {
    (
        format!("tenant-{}", key.0),
        format!("tier-{}", key.1),
        format!("region-{}", key.2),
    )
}

/// Parsed scope and limit key of a key.
pub fn parsed(key: (usize, usize, usize)) -> (Scope, LimitKey) {
    let (s, a, b) = names(key);
    (
        Scope::parse(&s).unwrap(),
        LimitKey::parse(&format!("{a}/{b}")).unwrap(),
    )
}

/// 1,000 rules of every shape, with limits high enough that admissions succeed.
pub fn book() -> RuleBook {
    book_with_rate(None)
}

/// [`book`] with `rate` on every rule.
pub fn book_with_rate(rate: Option<sluice_flow::RateLimit>) -> RuleBook {
    book_with(|pattern| Upsert {
        rate,
        ..Upsert::new(
            pattern,
            Limit::Concurrency(NonZeroU32::new(1_000_000).unwrap()),
        )
    })
}

/// [`book`] with every control on every rule, bounds high enough that admissions succeed: an
/// adaptive limit at scope level (pinned at a million, so its controller runs on every
/// release) and a burstable one at key level, a rate, a queue bound, a weight and a
/// `max_wait`.
pub fn book_with_every_control() -> RuleBook {
    let million = NonZeroU32::new(1_000_000).unwrap();
    let half = NonZeroU32::new(500_000).unwrap();
    book_with(|pattern| Upsert {
        rate: Some(sluice_flow::RateLimit {
            rate: "1000000/s".parse().unwrap(),
            burst: million,
            reject: false,
        }),
        max_queued: Some(million),
        weight: NonZeroU32::new(3),
        max_wait_ms: std::num::NonZeroU64::new(60_000),
        // A scope adapts; a key is burstable under it (the two exclude each other on one
        // rule: a burstable limit is a static one), so every admission path meets both.
        adaptive: (pattern.level() == Level::Scope).then_some(sluice_flow::AdaptiveLimit {
            min: million,
            max: million,
        }),
        guaranteed: (pattern.level() != Level::Scope).then_some(half),
        ..Upsert::new(
            pattern.clone(),
            if pattern.level() == Level::Scope {
                Limit::Unlimited
            } else {
                Limit::Concurrency(million)
            },
        )
    })
}

/// The 1,000 patterns, each made a rule by `rule`.
fn book_with(rule: impl Fn(RulePattern) -> Upsert) -> RuleBook {
    let mut patterns = vec!["*".to_owned(), "*/*".to_owned(), "*/*/*".to_owned()];
    patterns.extend((0..400).map(|i| format!("tenant-{}", i * 7)));
    patterns.extend((0..300).map(|i| format!("tenant-{}/tier-{}", i * 11, i % L1S)));
    patterns.extend((0..200).map(|i| format!("tenant-{}/*/region-{}", i * 13, i % L2S)));
    patterns.extend((0..97).map(|i| format!("*/tier-{}/region-{}", i % L1S, i / L1S)));
    patterns.sort();
    patterns.dedup();
    let upserts: Vec<Upsert> = patterns
        .iter()
        .map(|p| rule(RulePattern::parse(p).unwrap()))
        .collect();
    let mut book = RuleBook::new();
    book.apply_batch(&upserts, 0).unwrap();
    assert!(book.len() >= 990, "fixture has {} rules", book.len());
    book
}

/// Queue keys of the first `n` keys of the walk: one service, scoped, with a 2-level limit key.
pub fn queue_keys(n: usize) -> Vec<QueueKey> {
    (0..n)
        .map(|i| {
            let (scope, key) = parsed(scattered(i));
            QueueKey {
                scope: Some(scope),
                limit_key: Some(key),
                service: "Greeter".into(),
                object_key: None,
                priority: Default::default(),
            }
        })
        .collect()
}
