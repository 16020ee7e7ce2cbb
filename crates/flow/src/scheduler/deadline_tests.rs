use std::num::{NonZeroU32, NonZeroU64};
use std::sync::Arc;

use super::*;
use crate::pattern::{Level, RulePattern};
use crate::rules::{Limit, RuleBook, Upsert};

fn key(scope: &str, limit_key: Option<&str>, object: Option<&str>) -> QueueKey {
    QueueKey {
        scope: Some(Scope::parse(scope).unwrap()),
        limit_key: limit_key.map(|k| LimitKey::parse(k).unwrap()),
        service: "S".into(),
        object_key: object.map(Into::into),
        priority: Default::default(),
    }
}

/// `(pattern, concurrency, max_wait ms)`.
fn book(rules: &[(&str, u32, Option<u64>)]) -> Arc<RuleBook> {
    let mut book = RuleBook::new();
    let upserts: Vec<Upsert> = rules
        .iter()
        .map(|(p, n, wait)| Upsert {
            max_wait_ms: wait.and_then(NonZeroU64::new),
            ..Upsert::new(
                RulePattern::parse(p).unwrap(),
                Limit::Concurrency(NonZeroU32::new(*n).unwrap()),
            )
        })
        .collect();
    book.apply_batch(&upserts, 0).unwrap();
    Arc::new(book)
}

fn ids(dispatches: &[Dispatch]) -> Vec<EntryId> {
    dispatches.iter().map(|d| d.entry).collect()
}

#[test]
fn an_entry_past_its_request_deadline_leaves_its_queue_never_started() {
    let mut s = Scheduler::new(book(&[("a", 1, None)]), 100);
    let a = key("a", None, None);
    s.enqueue(&a, 1, EntryKind::New, None, 0);
    let running = s.poll_runnable(0);
    assert_eq!(ids(&running), vec![1]);
    s.enqueue_with_deadline(&a, 2, None, Some(500), 0, 0);
    s.enqueue(&a, 3, EntryKind::New, None, 0);
    assert!(s.poll_runnable(0).is_empty());
    assert_eq!(
        s.next_timer(),
        Some(500),
        "the partition polls at the deadline"
    );
    assert!(s.poll_runnable(499).is_empty());
    assert!(s.take_expired().is_empty(), "not yet");
    assert!(s.poll_runnable(500).is_empty());
    let expired = s.take_expired();
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].entry, 2);
    assert_eq!(expired[0].deadline.cause, DeadlineCause::Request);
    assert_eq!(s.counters(500)[0].queued, 1, "only entry 3 waits");
    for permit in running {
        s.release(permit.permit, 600);
    }
    assert_eq!(ids(&s.poll_runnable(600)), vec![3], "2 never starts");
    assert_eq!(
        s.expired_counts(),
        vec![ExpiredCount {
            cause: DeadlineCause::Request,
            expired: 1
        }]
    );
}

#[test]
fn the_tightest_max_wait_on_the_path_counts_from_when_the_wait_began() {
    let mut s = Scheduler::new(book(&[("a", 1, Some(1_000)), ("a/x", 5, Some(300))]), 100);
    let ax = key("a", Some("x"), None);
    s.enqueue(&ax, 1, EntryKind::New, None, 0);
    let running = s.poll_runnable(0);
    // Its wait began at 100 (its delay ended then, say): due at 400, by `a/x`'s 300 ms.
    s.enqueue_with_deadline(&ax, 2, None, None, 100, 150);
    // A request deadline later than that changes nothing; an earlier one wins.
    s.enqueue_with_deadline(&ax, 3, None, Some(10_000), 100, 150);
    s.enqueue_with_deadline(&ax, 4, None, Some(200), 100, 150);
    s.poll_runnable(399);
    let first: Vec<_> = s.take_expired().into_iter().map(|e| e.entry).collect();
    assert_eq!(first, vec![4]);
    s.poll_runnable(400);
    let expired = s.take_expired();
    let entries: Vec<EntryId> = expired.iter().map(|e| e.entry).collect();
    assert_eq!(entries, vec![2, 3]);
    assert_eq!(
        expired[0].deadline,
        Deadline {
            at: 400,
            cause: DeadlineCause::Rule {
                level: Level::L1,
                rule: Some(Arc::new(RulePattern::parse("a/x").unwrap())),
            }
        }
    );
    drop(running);
}

#[test]
fn among_one_queues_entries_the_earliest_deadline_goes_first() {
    let mut s = Scheduler::new(book(&[("a", 1, None)]), 100);
    let a = key("a", None, None);
    s.enqueue(&a, 1, EntryKind::New, None, 0);
    let first = s.poll_runnable(0).pop().unwrap();
    s.enqueue_with_deadline(&a, 2, None, Some(5_000), 0, 0);
    s.enqueue(&a, 3, EntryKind::New, None, 0);
    s.enqueue_with_deadline(&a, 4, None, Some(3_000), 0, 0);
    s.enqueue_with_deadline(&a, 5, None, Some(3_000), 0, 0);
    s.enqueue_with_deadline(&a, 6, None, Some(2_000), 0, 0);
    let q = s.enqueue(&a, 7, EntryKind::New, None, 0);
    let order: Vec<usize> = (2..=7)
        .map(|e| s.position(q, e, 0).unwrap().position)
        .collect();
    // 6 (2 s), 4 and 5 (3 s, in arrival order), 2 (5 s), then 3 and 7 without deadlines.
    assert_eq!(order, vec![4, 5, 2, 3, 1, 6]);
    let mut started = Vec::new();
    let mut permit = first.permit;
    for t in 1..=6 {
        s.release(permit, t);
        let d = s.poll_runnable(t).pop().unwrap();
        started.push(d.entry);
        permit = d.permit;
    }
    assert_eq!(started, vec![6, 4, 5, 2, 3, 7]);
}

#[test]
fn a_deadline_beyond_the_horizon_waits_in_arrival_order_and_still_expires() {
    let mut s = Scheduler::new(book(&[("a", 1, None)]), 100).with_deadline_horizon(60_000);
    let a = key("a", None, None);
    s.enqueue(&a, 1, EntryKind::New, None, 0);
    let first = s.poll_runnable(0).pop().unwrap();
    s.enqueue(&a, 2, EntryKind::New, None, 0);
    // The year 2286 (ms since the epoch): past the horizon, so no jump.
    let far = 9_999_999_999_999;
    s.enqueue_with_deadline(&a, 3, None, Some(far), 0, 0);
    // Within the horizon: ahead of both.
    let q = s
        .enqueue_with_deadline(&a, 4, None, Some(30_000), 0, 0)
        .expect("no on_full rule");
    let order: Vec<usize> = (2..=4)
        .map(|e| s.position(q, e, 0).unwrap().position)
        .collect();
    assert_eq!(order, vec![2, 3, 1]);
    // A far deadline still expires when it comes.
    s.release(first.permit, 1);
    let running = s.poll_runnable(1).pop().unwrap();
    assert_eq!(running.entry, 4);
    assert!(s.poll_runnable(far).is_empty());
    assert_eq!(ids_expired(&s.take_expired()), vec![3]);
}

fn ids_expired(expired: &[Expired]) -> Vec<EntryId> {
    expired.iter().map(|e| e.entry).collect()
}

#[test]
fn an_objects_queue_keeps_arrival_order_whatever_the_deadlines() {
    let mut s = Scheduler::new(book(&[("a", 1, None)]), 100);
    let obj = key("a", None, Some("k"));
    s.enqueue_with_deadline(&obj, 1, None, Some(9_000), 0, 0);
    s.enqueue_with_deadline(&obj, 2, None, Some(5_000), 0, 0);
    let q = s
        .enqueue_with_deadline(&obj, 3, None, Some(1_000), 0, 0)
        .expect("no on_full rule");
    assert_eq!(s.position(q, 3, 0).unwrap().position, 3);
}

#[test]
fn a_delayed_entry_whose_deadline_passes_during_its_delay_never_queues() {
    let mut s = Scheduler::new(book(&[]), 100);
    let a = key("a", None, None);
    s.enqueue_with_deadline(&a, 1, Some(1_000), Some(500), 0, 0);
    assert!(s.poll_runnable(600).is_empty());
    assert!(
        s.take_expired().is_empty(),
        "it waits for its delay, not in a queue"
    );
    assert!(s.poll_runnable(1_000).is_empty());
    let expired = s.take_expired();
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].entry, 1);
    assert!(s.queues().is_empty(), "its queue is gone");
}

#[test]
fn a_dispatched_or_removed_entry_no_longer_expires() {
    let mut s = Scheduler::new(book(&[("a", 1, None)]), 100);
    let a = key("a", None, None);
    s.enqueue_with_deadline(&a, 1, None, Some(100), 0, 0);
    let q = s
        .enqueue_with_deadline(&a, 2, None, Some(100), 0, 0)
        .expect("no on_full rule");
    let running = s.poll_runnable(0);
    assert_eq!(ids(&running), vec![1]);
    assert!(s.remove(q, 2, 10));
    s.poll_runnable(200);
    assert!(s.take_expired().is_empty());
    assert_eq!(s.next_timer(), None, "stale deadlines were dropped");
}
