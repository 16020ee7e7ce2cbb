//! Rate limits through the scheduler: throttled queues wait for their token without polling,
//! resumed work takes none, and under random load no counter admits more than its rate and
//! burst allow, while everything queued is admitted once time passes.

use std::collections::BTreeMap;
use std::num::NonZeroU32;

use proptest::prelude::*;

use super::*;
use crate::pattern::RulePattern;
use crate::rate::{Rate, RateLimit};
use crate::rules::{Limit, Upsert};

fn key(scope: &str, limit_key: Option<&str>) -> QueueKey {
    QueueKey {
        scope: Some(Scope::parse(scope).unwrap()),
        limit_key: limit_key.map(|k| LimitKey::parse(k).unwrap()),
        service: "S".into(),
        object_key: None,
        priority: Default::default(),
    }
}

/// A book of `(pattern, concurrency or 0 for unlimited, rate, burst)` rules.
fn book(rules: &[(&str, u32, &str, u32)]) -> Arc<RuleBook> {
    let mut book = RuleBook::new();
    let upserts: Vec<Upsert> = rules
        .iter()
        .map(|(pattern, concurrency, rate, burst)| {
            let limit = NonZeroU32::new(*concurrency).map_or(Limit::Unlimited, Limit::Concurrency);
            let mut upsert = Upsert::new(RulePattern::parse(pattern).unwrap(), limit);
            upsert.rate = Some(RateLimit {
                rate: rate.parse::<Rate>().unwrap(),
                burst: NonZeroU32::new(*burst).unwrap(),
                reject: false,
            });
            upsert
        })
        .collect();
    book.apply_batch(&upserts, 0).unwrap();
    Arc::new(book)
}

#[test]
fn a_throttled_queue_waits_for_its_token_and_says_so() {
    let mut s = Scheduler::new(book(&[("acme", 0, "10/s", 2)]), 100);
    let k = key("acme", None);
    for id in 1..=5 {
        s.enqueue(&k, id, EntryKind::New, None, 1_000);
    }
    let first = s.poll_runnable(1_000);
    assert_eq!(first.len(), 2, "the burst runs at once");
    let queues = s.queues();
    let blocked = queues[0].blocked_on.clone().unwrap();
    assert_eq!(blocked.name(), "rate-limit");
    let BlockedOn::RateLimit { next_token_ms, .. } = blocked else {
        unreachable!()
    };
    assert_eq!(next_token_ms, 1_100);
    assert_eq!(
        s.next_timer(),
        Some(1_100),
        "the scheduler says when to poll again"
    );
    assert!(
        s.poll_runnable(1_099).is_empty(),
        "no token before its time"
    );
    assert_eq!(s.poll_runnable(1_100).len(), 1);
    assert_eq!(s.next_timer(), Some(1_200));
    // Permits of running work do not matter to a rate: releasing frees nothing early.
    for d in first {
        s.release(d.permit, 1_150);
    }
    assert!(s.poll_runnable(1_150).is_empty());
    assert_eq!(s.poll_runnable(1_200).len(), 1);
    assert_eq!(s.poll_runnable(1_300).len(), 1);
    assert_eq!(s.next_timer(), None, "nothing waits: no poll is needed");
}

#[test]
fn tokens_go_to_those_waiting_first() {
    let mut s = Scheduler::new(book(&[("acme", 0, "1/s", 1)]), 100);
    let (a, b) = (key("acme", Some("a")), key("acme", Some("b")));
    s.enqueue(&a, 1, EntryKind::New, None, 0);
    s.enqueue(&a, 2, EntryKind::New, None, 0);
    assert_eq!(s.poll_runnable(0).len(), 1);
    // A newcomer arriving when the token is due does not take it from the one waiting.
    s.enqueue(&b, 3, EntryKind::New, None, 1_000);
    let out = s.poll_runnable(1_000);
    assert_eq!(out.iter().map(|d| d.entry).collect::<Vec<_>>(), vec![2]);
    assert_eq!(
        s.poll_runnable(2_000)
            .iter()
            .map(|d| d.entry)
            .collect::<Vec<_>>(),
        vec![3]
    );
}

#[test]
fn resumed_entries_take_no_token() {
    let mut s = Scheduler::new(book(&[("acme", 0, "1/h", 1)]), 100);
    let k = key("acme", None);
    s.enqueue(&k, 1, EntryKind::New, None, 0);
    let d = s.poll_runnable(0).pop().unwrap();
    s.release(d.permit, 10);
    // Its retry comes back as resumed: it runs at once although the hour's token is gone.
    s.enqueue(&k, 1, EntryKind::Resumed, None, 10);
    assert_eq!(s.poll_runnable(10).len(), 1);
    s.enqueue(&k, 2, EntryKind::New, None, 10);
    assert!(
        s.poll_runnable(10).is_empty(),
        "a new one waits for the next token"
    );
}

#[test]
fn removing_the_rate_releases_its_waiters() {
    let mut s = Scheduler::new(book(&[("acme", 0, "1/h", 1)]), 100);
    let k = key("acme", None);
    for id in 1..=3 {
        s.enqueue(&k, id, EntryKind::New, None, 0);
    }
    assert_eq!(s.poll_runnable(0).len(), 1);
    s.on_rules_changed(Arc::new(RuleBook::new()), 5);
    assert_eq!(s.poll_runnable(5).len(), 2);
}

#[test]
fn a_counter_that_comes_and_goes_gets_no_fresh_burst() {
    let mut s = Scheduler::new(book(&[("acme", 0, "1/s", 1)]), 100);
    let k = key("acme", None);
    s.enqueue(&k, 1, EntryKind::New, None, 0);
    let d = s.poll_runnable(0).pop().unwrap();
    s.release(d.permit, 1);
    // The queue and its counters are gone from view, but the bucket is remembered.
    s.enqueue(&k, 2, EntryKind::New, None, 2);
    assert!(s.poll_runnable(2).is_empty());
    assert_eq!(s.poll_runnable(1_000).len(), 1);
}

#[derive(Debug, Clone)]
enum Step {
    Arrive { queue: usize },
    Finish { nth: usize },
    Wait { ms: u64 },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => (0usize..4).prop_map(|queue| Step::Arrive { queue }),
        2 => (0usize..8).prop_map(|nth| Step::Finish { nth }),
        3 => (0u64..300).prop_map(|ms| Step::Wait { ms }),
    ];
    prop::collection::vec(step, 1..300)
}

proptest! {
    /// Random arrivals, completions and waits under rates at the scope and L1 levels (one of
    /// them with a concurrency limit too): in every window each counter admits at most
    /// `burst + window / interval` new entries, and once arrivals stop everything queued is
    /// admitted, polling only when the scheduler says.
    #[test]
    fn rates_hold_in_every_window_and_nothing_waits_forever(steps in steps()) {
        let rules = [("acme", 0, "20/s", 3), ("acme/*", 2, "5/s", 1), ("beta", 0, "2/100ms", 2)];
        let mut s = Scheduler::new(book(&rules), 1_000);
        let keys = [key("acme", Some("a")), key("acme", Some("b")), key("acme", None), key("beta", None)];
        let mut now = 10_000u64;
        let mut next_id = 0u64;
        let mut queued_key: BTreeMap<EntryId, usize> = BTreeMap::new();
        let mut running: Vec<Dispatch> = Vec::new();
        // Admission times per counter name.
        let mut admitted: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        let mut record = |dispatches: Vec<Dispatch>, now: u64, queued_key: &mut BTreeMap<EntryId, usize>, running: &mut Vec<Dispatch>| {
            for d in dispatches {
                let k = queued_key.remove(&d.entry).expect("dispatched once");
                let counters: &[&str] = match k {
                    0 => &["acme", "acme/a"],
                    1 => &["acme", "acme/b"],
                    2 => &["acme"],
                    _ => &["beta"],
                };
                for c in counters {
                    admitted.entry(c).or_default().push(now);
                }
                running.push(d);
            }
        };
        for step in steps {
            match step {
                Step::Arrive { queue } => {
                    next_id += 1;
                    queued_key.insert(next_id, queue);
                    s.enqueue(&keys[queue], next_id, EntryKind::New, None, now);
                }
                Step::Finish { nth } => {
                    if !running.is_empty() {
                        let d = running.remove(nth % running.len());
                        s.release(d.permit, now);
                    }
                }
                Step::Wait { ms } => now += ms,
            }
            let out = s.poll_runnable(now);
            record(out, now, &mut queued_key, &mut running);
        }
        // Drain: finish what runs, and poll when the scheduler asks to.
        let mut rounds = 0;
        while !queued_key.is_empty() {
            rounds += 1;
            prop_assert!(rounds < 100_000, "{} entries never admitted", queued_key.len());
            for d in running.drain(..) {
                s.release(d.permit, now);
            }
            let out = s.poll_runnable(now);
            let progressed = !out.is_empty();
            record(out, now, &mut queued_key, &mut running);
            if !progressed {
                let next = s.next_timer();
                prop_assert!(next.is_some(), "entries wait but no wake-up is due");
                now = now.max(next.unwrap());
            }
        }
        let limits = [("acme", "20/s", 3u64), ("acme/a", "5/s", 1), ("acme/b", "5/s", 1), ("beta", "2/100ms", 2)];
        for (counter, rate, burst) in limits {
            let interval_us = rate.parse::<Rate>().unwrap().interval_us();
            let times = admitted.get(counter).cloned().unwrap_or_default();
            for (i, start) in times.iter().enumerate() {
                for w in [0u64, 99, 100, 1_000, 5_000] {
                    let inside = times[i..].iter().take_while(|t| **t <= start + w).count() as u64;
                    let bound = burst + (w * 1000).div_ceil(interval_us);
                    prop_assert!(inside <= bound, "{counter}: {inside} admissions in {w} ms from {start}, bound {bound}");
                }
            }
        }
    }
}

#[test]
fn a_full_queue_refuses_newcomers_and_takes_them_again_as_it_drains() {
    let mut book = RuleBook::new();
    let mut bounded = Upsert::new(
        RulePattern::parse("acme").unwrap(),
        Limit::Concurrency(NonZeroU32::MIN),
    );
    bounded.max_queued = NonZeroU32::new(2);
    book.apply_batch(&[bounded], 0).unwrap();
    let mut s = Scheduler::new(Arc::new(book), 100);
    let k = key("acme", None);
    let admit = |s: &mut Scheduler, id: u64, now: u64| {
        assert_eq!(s.refusal(&k, now), None, "entry {id} is taken");
        s.enqueue(&k, id, EntryKind::New, None, now);
        s.poll_runnable(now)
    };
    let running = admit(&mut s, 1, 0).pop().unwrap();
    assert!(admit(&mut s, 2, 0).is_empty());
    assert!(admit(&mut s, 3, 0).is_empty());
    // Two wait: the third is refused, naming the bound.
    let refused = s.refusal(&k, 0).unwrap();
    assert_eq!(
        refused.why,
        crate::limiter::RefusalReason::QueueFull { max_queued: 2 }
    );
    assert!(refused.retry_after_ms >= 1);
    assert_eq!(refused.rule.unwrap().to_string(), "acme");
    // Unscoped work is never refused.
    assert_eq!(
        s.refusal(
            &QueueKey {
                scope: None,
                ..key("acme", None)
            },
            0
        ),
        None
    );
    // One is admitted: one more may wait.
    s.release(running.permit, 100);
    assert_eq!(s.poll_runnable(100).len(), 1);
    assert!(admit(&mut s, 4, 100).is_empty());
    assert!(s.refusal(&k, 100).is_some());
}

#[test]
fn a_rejecting_rate_refuses_when_no_token_is_there() {
    let mut book = RuleBook::new();
    let mut rated = Upsert::new(RulePattern::parse("acme").unwrap(), Limit::Unlimited);
    rated.rate = Some(RateLimit {
        rate: "1/s".parse().unwrap(),
        burst: NonZeroU32::new(2).unwrap(),
        reject: true,
    });
    book.apply_batch(&[rated], 0).unwrap();
    let mut s = Scheduler::new(Arc::new(book), 100);
    let k = key("acme", None);
    for id in 1..=2 {
        assert_eq!(s.refusal(&k, 0), None);
        s.enqueue(&k, id, EntryKind::New, None, 0);
        assert_eq!(s.poll_runnable(0).len(), 1);
    }
    let refused = s.refusal(&k, 10).unwrap();
    assert!(matches!(
        refused.why,
        crate::limiter::RefusalReason::RateExceeded { .. }
    ));
    assert_eq!(refused.retry_after_ms, 990, "the next token is due at 1000");
    assert_eq!(s.refusal(&k, 1_000), None);
}
