//! Who goes first under contention: weights share a full counter between sibling keys,
//! priority reorders the waiters of one counter (and ages), shadow rules hold nothing, and a
//! paused queue keeps its entries without running them.

use std::num::NonZeroU32;

use super::*;
use crate::pattern::RulePattern;
use crate::rate::RateLimit;
use crate::rules::{Limit, Upsert};

fn key(scope: &str, limit_key: Option<&str>, priority: Priority) -> QueueKey {
    QueueKey {
        scope: Some(Scope::parse(scope).unwrap()),
        limit_key: limit_key.map(|k| LimitKey::parse(k).unwrap()),
        service: "S".into(),
        object_key: None,
        priority,
    }
}

fn rule(pattern: &str, concurrency: u32) -> Upsert {
    let limit = NonZeroU32::new(concurrency).map_or(Limit::Unlimited, Limit::Concurrency);
    Upsert::new(RulePattern::parse(pattern).unwrap(), limit)
}

fn book(upserts: &[Upsert]) -> Arc<RuleBook> {
    let mut book = RuleBook::new();
    book.apply_batch(upserts, 0).unwrap();
    Arc::new(book)
}

/// Completes the oldest running entry after each poll, so slots free up one at a time (as
/// completions do), until `n` were dispatched; answers the queue of each dispatch, in order.
fn run(s: &mut Scheduler, n: usize, now: u64) -> Vec<QueueId> {
    let mut order = Vec::new();
    let mut running = std::collections::VecDeque::new();
    while order.len() < n {
        for d in s.poll_runnable(now) {
            order.push(d.queue);
            running.push_back(d.permit);
        }
        let oldest = running.pop_front().expect("something runs");
        s.release(oldest, now);
    }
    for permit in running {
        s.release(permit, now);
    }
    order
}

#[test]
fn weights_give_backlogged_siblings_their_share() {
    let mut gold = rule("acme/gold", 0);
    gold.weight = NonZeroU32::new(3);
    let mut s = Scheduler::new(book(&[rule("acme", 2), gold]), 100);
    let (g, f) = (
        key("acme", Some("gold"), Priority::NORMAL),
        key("acme", Some("free"), Priority::NORMAL),
    );
    for id in 0..1_000 {
        s.enqueue(&g, id, EntryKind::New, None, 0);
        s.enqueue(&f, 10_000 + id, EntryKind::New, None, 0);
    }
    let gold_queue = s.queue_index[&g];
    let order = run(&mut s, 800, 0);
    let golds = order.iter().filter(|q| **q == gold_queue).count();
    let ratio = golds as f64 / (order.len() - golds) as f64;
    assert!(
        (2.7..=3.3).contains(&ratio),
        "gold:free = {ratio:.2}, not 3:1 ± 10 %"
    );
}

#[test]
fn high_priority_overtakes_a_low_priority_backlog() {
    let mut s = Scheduler::new(book(&[rule("acme", 1)]), 100);
    let low = key("acme", Some("k"), Priority::LOW);
    let high = key("acme", Some("k"), Priority::HIGH);
    for id in 0..20 {
        s.enqueue(&low, id, EntryKind::New, None, 0);
    }
    let first = s.poll_runnable(0);
    assert_eq!(first.len(), 1);
    assert_eq!(s.poll_runnable(0).len(), 0, "the rest wait at the counter");
    for id in 100..103 {
        s.enqueue(&high, id, EntryKind::New, None, 1);
    }
    assert_eq!(s.poll_runnable(1).len(), 0, "they wait at the counter too");
    for d in first {
        s.release(d.permit, 1);
    }
    let high_queue = s.queue_index[&high];
    let order = run(&mut s, 5, 1);
    assert_eq!(&order[..3], &[high_queue; 3], "high first: {order:?}");
    assert!(order[3..].iter().all(|q| *q != high_queue));
}

#[test]
fn a_shadow_rule_holds_nothing_and_counts_what_it_would_have() {
    let mut shadow = rule("acme", 1);
    shadow.shadow = true;
    shadow.rate = Some(RateLimit::new("1/s".parse().unwrap()));
    let mut s = Scheduler::new(book(&[shadow]), 100);
    let k = key("acme", None, Priority::NORMAL);
    for id in 0..5 {
        s.enqueue(&k, id, EntryKind::New, None, 0);
    }
    let running = s.poll_runnable(0);
    assert_eq!(running.len(), 5, "nothing is held");
    let counters = s.counters(0);
    let (rule, counts) = counters[0].controls().shadow.clone().unwrap();
    assert_eq!(rule.pattern.to_string(), "acme");
    assert_eq!(counts.would_wait, 4);
    // Tokens 1 s, 2 s, 3 s and 4 s late.
    assert_eq!(counts.would_wait_ms, 10_000);
    for d in running {
        s.release(d.permit, 0);
    }
}

#[test]
fn a_paused_queue_keeps_its_entries_until_resumed() {
    let mut s = Scheduler::new(book(&[]), 100);
    let k = key("acme", None, Priority::NORMAL);
    // Paused before it exists: it is listed, empty and paused, so it can be resumed.
    s.pause(&k, 0);
    let queues = s.queues();
    assert_eq!((queues.len(), queues[0].status), (1, QueueStatus::Paused));
    for id in 0..3 {
        s.enqueue(&k, id, EntryKind::New, None, 0);
    }
    assert!(s.poll_runnable(1).is_empty());
    let queues = s.queues();
    assert_eq!(queues[0].status, QueueStatus::Paused);
    assert_eq!(
        queues[0].blocked_on.as_ref().map(BlockedOn::name),
        Some("queue-paused")
    );
    assert_eq!(queues[0].queued, 3);
    s.resume(&k, 2);
    assert!(!s.is_paused(&k));
    let ran = s.poll_runnable(2);
    assert_eq!(ran.len(), 3);
    // Pausing a queue parked at a full counter takes it out of the line.
    let mut s = Scheduler::new(book(&[rule("acme", 1)]), 100);
    for id in 0..3 {
        s.enqueue(&k, id, EntryKind::New, None, 0);
    }
    let first = s.poll_runnable(0);
    s.pause(&k, 1);
    for d in first {
        s.release(d.permit, 1);
    }
    assert!(s.poll_runnable(1).is_empty(), "paused while it waited");
    s.resume(&k, 2);
    assert_eq!(run(&mut s, 2, 2).len(), 2);
}
