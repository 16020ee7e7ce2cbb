use proptest::prelude::*;

use super::*;

fn pat(s: &str) -> RulePattern {
    RulePattern::parse(s).unwrap()
}

fn n(v: u32) -> Limit {
    Limit::Concurrency(NonZeroU32::new(v).unwrap())
}

fn book(rules: &[(&str, Limit)]) -> RuleBook {
    let mut book = RuleBook::new();
    let upserts: Vec<Upsert> = rules.iter().map(|(p, l)| Upsert::new(pat(p), *l)).collect();
    book.apply_batch(&upserts, 1).unwrap();
    book
}

fn limit(
    book: &RuleBook,
    level: Level,
    s: &str,
    l1: Option<&str>,
    l2: Option<&str>,
) -> Option<u32> {
    book.resolve(level, s, l1, l2).limit.concurrency()
}

fn winner(book: &RuleBook, level: Level, s: &str, l1: Option<&str>, l2: Option<&str>) -> String {
    book.resolve(level, s, l1, l2)
        .pattern
        .map(|p| p.to_string())
        .unwrap_or_default()
}

#[test]
fn star_is_a_default_per_scope() {
    let b = book(&[("*", n(10))]);
    assert_eq!(limit(&b, Level::Scope, "acme", None, None), Some(10));
    assert_eq!(limit(&b, Level::Scope, "globex", None, None), Some(10));
    // A scope rule says nothing about L1 counters.
    assert_eq!(limit(&b, Level::L1, "acme", Some("gold"), None), None);
}

#[test]
fn exact_scope_beats_star() {
    let b = book(&[("*", n(10)), ("acme", n(3))]);
    assert_eq!(limit(&b, Level::Scope, "acme", None, None), Some(3));
    assert_eq!(limit(&b, Level::Scope, "globex", None, None), Some(10));
}

#[test]
fn l1_rules_by_rank() {
    let b = book(&[
        ("acme/gold", n(1)),
        ("acme/*", n(2)),
        ("*/gold", n(3)),
        ("*/*", n(4)),
    ]);
    assert_eq!(
        winner(&b, Level::L1, "acme", Some("gold"), None),
        "acme/gold"
    );
    assert_eq!(
        winner(&b, Level::L1, "acme", Some("silver"), None),
        "acme/*"
    );
    assert_eq!(
        winner(&b, Level::L1, "globex", Some("gold"), None),
        "*/gold"
    );
    assert_eq!(winner(&b, Level::L1, "globex", Some("silver"), None), "*/*");
    // Only at its depth: no L1 rule applies to the scope or L2 counter.
    assert_eq!(limit(&b, Level::Scope, "acme", None, None), None);
    assert_eq!(limit(&b, Level::L2, "acme", Some("gold"), Some("eu")), None);
}

#[test]
fn l2_rules_by_rank() {
    let b = book(&[
        ("acme/gold/*", n(5)),
        ("acme/*/eu", n(6)),
        ("*/gold/eu", n(7)),
        ("acme/gold/eu", n(8)),
    ]);
    assert_eq!(
        limit(&b, Level::L2, "acme", Some("gold"), Some("eu")),
        Some(8)
    );
    assert_eq!(
        limit(&b, Level::L2, "acme", Some("gold"), Some("us")),
        Some(5)
    );
    assert_eq!(
        limit(&b, Level::L2, "acme", Some("silver"), Some("eu")),
        Some(6)
    );
    assert_eq!(
        limit(&b, Level::L2, "globex", Some("gold"), Some("eu")),
        Some(7)
    );
    assert_eq!(
        limit(&b, Level::L2, "globex", Some("gold"), Some("us")),
        None
    );
    assert_eq!(
        limit(&b, Level::L2, "acme", Some("gold"), None),
        None,
        "no L2 counter without l2"
    );
}

#[test]
fn unlimited_overrules_a_less_specific_number_at_its_level_only() {
    let b = book(&[
        ("*/*", n(2)),
        ("acme/gold", Limit::Unlimited),
        ("acme", n(5)),
    ]);
    assert_eq!(limit(&b, Level::L1, "acme", Some("gold"), None), None);
    assert_eq!(
        winner(&b, Level::L1, "acme", Some("gold"), None),
        "acme/gold"
    );
    assert_eq!(limit(&b, Level::L1, "acme", Some("silver"), None), Some(2));
    // The scope level still applies.
    assert_eq!(limit(&b, Level::Scope, "acme", None, None), Some(5));
}

#[test]
fn disabled_rules_are_invisible_but_kept() {
    let mut b = book(&[("*", n(10)), ("acme", n(3))]);
    let mut disable = Upsert::new(pat("acme"), n(3));
    disable.disabled = true;
    let out = b.apply_batch(&[disable.clone()], 2).unwrap();
    assert!(out[0].disabled);
    assert_eq!(limit(&b, Level::Scope, "acme", None, None), Some(10));
    assert_eq!(b.len(), 2);
    disable.disabled = false;
    b.apply_batch(&[disable], 3).unwrap();
    assert_eq!(limit(&b, Level::Scope, "acme", None, None), Some(3));
}

#[test]
fn versions_follow_the_api() {
    let mut b = RuleBook::new();
    assert_eq!(b.version(), 0);
    let r = b.apply_batch(&[Upsert::new(pat("a"), n(1))], 10).unwrap();
    assert_eq!((b.version(), r[0].version), (1, 1));
    let r = b.apply_batch(&[Upsert::new(pat("b"), n(1))], 11).unwrap();
    assert_eq!(
        (b.version(), r[0].version),
        (2, 2),
        "a new rule takes the book version"
    );
    // Same content: not effective, nothing bumps.
    let r = b.apply_batch(&[Upsert::new(pat("a"), n(1))], 12).unwrap();
    assert_eq!(
        (b.version(), r[0].version, r[0].last_modified_ms),
        (2, 1, 10)
    );
    // Description only: the book bumps, the rule does not.
    let mut d = Upsert::new(pat("a"), n(1));
    d.description = Some("docs".into());
    let r = b.apply_batch(&[d], 13).unwrap();
    assert_eq!(
        (b.version(), r[0].version, r[0].last_modified_ms),
        (3, 1, 13)
    );
    // Limit change: both bump, the rule by one.
    let r = b.apply_batch(&[Upsert::new(pat("a"), n(2))], 14).unwrap();
    assert_eq!((b.version(), r[0].version), (4, 2));
    assert_eq!(r[0].description, None, "an upsert replaces the whole rule");
}

#[test]
fn batches_are_atomic_with_preconditions() {
    let mut b = book(&[("a", n(1))]);
    let before = b.version();
    let mut ok = Upsert::new(pat("b"), n(1));
    ok.precondition = Precondition::DoesNotExist;
    let mut bad = Upsert::new(pat("a"), n(9));
    bad.precondition = Precondition::Matches(7);
    let err = b.apply_batch(&[ok.clone(), bad], 5).unwrap_err();
    assert_eq!(
        err.to_string(),
        "rule precondition matches(version 7) for pattern 'a' failed (actual version: 1)"
    );
    assert_eq!(b.version(), before);
    assert!(
        b.get(&pat("b")).is_none(),
        "nothing of a failed batch applies"
    );

    let mut exists = Upsert::new(pat("a"), n(1));
    exists.precondition = Precondition::DoesNotExist;
    assert!(matches!(
        b.apply_batch(&[exists], 5),
        Err(RuleError::PreconditionFailed {
            actual: Some(1),
            ..
        })
    ));
    let mut matches = Upsert::new(pat("a"), n(4));
    matches.precondition = Precondition::Matches(1);
    assert_eq!(b.apply_batch(&[matches], 5).unwrap()[0].version, 2);
}

#[test]
fn deletes() {
    let mut b = book(&[("a", n(1)), ("b", n(1))]);
    let v = b.version();
    let removed = b
        .delete_batch(&[
            Delete {
                pattern: pat("a"),
                expected_version: None,
            },
            Delete {
                pattern: pat("zzz"),
                expected_version: None,
            },
        ])
        .unwrap();
    assert_eq!(removed, vec![pat("a")]);
    assert_eq!(b.version(), v + 1);
    assert_eq!(limit(&b, Level::Scope, "a", None, None), None);
    // Unconditional delete of a missing rule: idempotent, no bump.
    assert!(
        b.delete_batch(&[Delete {
            pattern: pat("a"),
            expected_version: None
        }])
        .unwrap()
        .is_empty()
    );
    assert_eq!(b.version(), v + 1);
    let err = b
        .delete_batch(&[Delete {
            pattern: pat("b"),
            expected_version: Some(9),
        }])
        .unwrap_err();
    assert!(matches!(
        err,
        RuleError::PreconditionFailed {
            actual: Some(1),
            ..
        }
    ));
    assert!(b.get(&pat("b")).is_some());
}

#[test]
fn the_book_holds_at_most_10000_rules() {
    let mut b = RuleBook::new();
    let upserts: Vec<Upsert> = (0..MAX_RULES)
        .map(|i| Upsert::new(pat(&format!("s{i}")), n(1)))
        .collect();
    b.apply_batch(&upserts, 1).unwrap();
    assert_eq!(b.len(), MAX_RULES);
    let err = b
        .apply_batch(&[Upsert::new(pat("one-more"), n(1))], 2)
        .unwrap_err();
    assert_eq!(err.to_string(), "rule book is full (10000 rules)");
    // Updating an existing rule still works on a full book.
    b.apply_batch(&[Upsert::new(pat("s1"), n(2))], 3).unwrap();
}

/// The reference: scan every rule.
fn brute_force(
    rules: &[Rule],
    level: Level,
    names: [Option<&str>; 3],
) -> (Option<u32>, Option<String>) {
    if names[..=level.index()].iter().any(Option::is_none) {
        return (None, None);
    }
    rules
        .iter()
        .filter(|r| !r.disabled && r.pattern.level() == level)
        .filter(|r| r.pattern.matches(names[0].unwrap(), names[1], names[2]))
        .max_by_key(|r| r.pattern.rank())
        .map_or((None, None), |r| {
            (r.limit.concurrency(), Some(r.pattern.to_string()))
        })
}

fn arb_pattern() -> impl Strategy<Value = String> {
    let comp = prop_oneof!["\\*", "[ab]"];
    prop::collection::vec(comp, 1..=3).prop_map(|c| c.join("/"))
}

proptest! {
    #[test]
    fn resolve_agrees_with_brute_force(
        rules in prop::collection::vec((arb_pattern(), prop::option::of(1u32..5), any::<bool>()), 0..24),
        queries in prop::collection::vec(("[abc]", prop::option::of("[abc]"), prop::option::of("[abc]")), 1..24),
    ) {
        let mut b = RuleBook::new();
        let upserts: Vec<Upsert> = rules.iter().map(|(p, l, disabled)| {
            let limit = l.map_or(Limit::Unlimited, n);
            Upsert { disabled: *disabled, ..Upsert::new(pat(p), limit) }
        }).collect();
        b.apply_batch(&upserts, 1).unwrap();
        let all: Vec<Rule> = b.rules().cloned().collect();
        for (s, l1, l2) in &queries {
            for level in Level::ALL {
                let names = [Some(s.as_str()), l1.as_deref(), l2.as_deref()];
                let got = b.resolve(level, s, l1.as_deref(), l2.as_deref());
                let want = brute_force(&all, level, names);
                prop_assert_eq!((got.limit.concurrency(), got.pattern.map(|p| p.to_string())), want);
            }
        }
    }
}

/// A policy's question: the counter's scope, the candidates' patterns, the chosen one.
type Asked = (String, Vec<String>, Option<String>);

/// Records what it was asked; doubles the limits of scope `vip`, lifts `free`'s.
#[derive(Debug, Default)]
struct Doubler {
    seen: std::sync::Mutex<Vec<Asked>>,
}

impl RulePolicy for Doubler {
    fn decide(
        &self,
        counter: CounterRef<'_>,
        candidates: &[(Limit, Arc<RulePattern>)],
        chosen: Option<&(Limit, Arc<RulePattern>)>,
    ) -> Decision {
        self.seen.lock().unwrap().push((
            counter.scope.to_owned(),
            candidates.iter().map(|(_, p)| p.to_string()).collect(),
            chosen.map(|(_, p)| p.to_string()),
        ));
        match (counter.scope, chosen) {
            ("vip", Some((Limit::Concurrency(n), _))) => {
                Decision::Concurrency(n.saturating_mul(NonZeroU32::new(2).unwrap()))
            }
            ("free", _) => Decision::Unlimited,
            _ => Decision::Default,
        }
    }
}

#[test]
fn a_policy_sees_every_matching_rule_and_decides_the_limit() {
    let doubler = Arc::new(Doubler::default());
    let b = book(&[
        ("*", n(3)),
        ("vip", n(5)),
        ("vip/*", n(1)),
        ("*/gold", n(2)),
    ])
    .with_policy(Some(Arc::clone(&doubler) as Arc<dyn RulePolicy>));
    assert_eq!(limit(&b, Level::Scope, "vip", None, None), Some(10));
    assert_eq!(winner(&b, Level::Scope, "vip", None, None), "vip");
    assert_eq!(limit(&b, Level::L1, "vip", Some("gold"), None), Some(2));
    assert_eq!(limit(&b, Level::Scope, "free", None, None), None);
    assert_eq!(limit(&b, Level::Scope, "other", None, None), Some(3));
    // A counter that does not exist is not offered to the policy.
    assert_eq!(limit(&b, Level::L1, "vip", None, None), None);
    let seen = doubler.seen.lock().unwrap();
    assert_eq!(
        seen[0],
        (
            "vip".into(),
            vec!["vip".into(), "*".into()],
            Some("vip".into())
        )
    );
    assert_eq!(
        seen[2],
        (
            "vip".into(),
            vec!["vip/*".into(), "*/gold".into()],
            Some("vip/*".into())
        )
    );
    assert_eq!(seen.len(), 5);
    // Without the policy the most specific rule wins again.
    let plain = b.with_policy(None);
    assert_eq!(limit(&plain, Level::Scope, "vip", None, None), Some(5));
}
