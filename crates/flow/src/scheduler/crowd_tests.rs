use std::num::NonZeroU32;
use std::sync::Arc;

use super::*;
use crate::pattern::{Level, RulePattern};
use crate::rules::{Limit, OnFull, RuleBook, Upsert};

fn key(scope: &str, limit_key: Option<&str>) -> QueueKey {
    QueueKey {
        scope: Some(Scope::parse(scope).unwrap()),
        limit_key: limit_key.map(|k| LimitKey::parse(k).unwrap()),
        service: "S".into(),
        object_key: None,
        priority: Default::default(),
    }
}

/// `(pattern, concurrency, on_full, max_queued)`.
fn book(rules: &[(&str, u32, OnFull, Option<u32>)]) -> Arc<RuleBook> {
    let mut book = RuleBook::new();
    let upserts: Vec<Upsert> = rules
        .iter()
        .map(|(p, n, on_full, max_queued)| Upsert {
            on_full: Some(*on_full),
            max_queued: max_queued.and_then(NonZeroU32::new),
            ..Upsert::new(
                RulePattern::parse(p).unwrap(),
                Limit::Concurrency(NonZeroU32::new(*n).unwrap()),
            )
        })
        .collect();
    book.apply_batch(&upserts, 0).unwrap();
    Arc::new(book)
}

/// Queues new entry `entry` of `k` arriving at `at`; whether it was queued.
fn arrive(s: &mut Scheduler, k: &QueueKey, entry: EntryId, at: u64) -> bool {
    s.enqueue_with_deadline(k, entry, None, None, at, at)
        .is_some()
}

fn fates(s: &mut Scheduler) -> Vec<(EntryId, Fate)> {
    s.take_crowded()
        .into_iter()
        .map(|c| (c.entry, c.fate))
        .collect()
}

fn ids(dispatches: &[Dispatch]) -> Vec<EntryId> {
    dispatches.iter().map(|d| d.entry).collect()
}

#[test]
fn drop_new_keeps_one_active_run_per_key_and_drops_what_comes_meanwhile() {
    let mut s = Scheduler::new(book(&[("t/*", 1, OnFull::DropNew, None)]), 100);
    let (a, b) = (key("t", Some("a")), key("t", Some("b")));
    assert!(arrive(&mut s, &a, 1, 0));
    let running = s.poll_runnable(0);
    assert_eq!(ids(&running), vec![1]);
    assert!(!arrive(&mut s, &a, 2, 1), "key a is active");
    let dropped = s.take_crowded();
    assert_eq!(dropped.len(), 1);
    assert_eq!((dropped[0].entry, dropped[0].fate), (2, Fate::Dropped));
    assert_eq!(dropped[0].why.level, Level::L1);
    assert_eq!(dropped[0].why.by, 2);
    assert!(arrive(&mut s, &b, 3, 1), "another key is not");
    assert_eq!(ids(&s.poll_runnable(1)), vec![3]);
    assert!(s.queues().is_empty(), "the dropped entry's queue is gone");
    for d in running {
        s.release(d.permit, 2);
    }
    assert!(arrive(&mut s, &a, 4, 3), "free again once it ended");
    assert!(fates(&mut s).is_empty());
}

#[test]
fn keep_newest_replaces_the_oldest_waiting_and_keep_oldest_drops_the_newest() {
    let mut s = Scheduler::new(
        book(&[
            ("n", 1, OnFull::KeepNewest, None),
            ("o", 1, OnFull::KeepOldest, Some(2)),
        ]),
        100,
    );
    let (n, o) = (key("n", None), key("o", None));
    assert!(arrive(&mut s, &n, 1, 0));
    assert_eq!(ids(&s.poll_runnable(0)), vec![1]);
    assert!(arrive(&mut s, &n, 2, 1));
    assert!(arrive(&mut s, &n, 3, 2));
    assert_eq!(fates(&mut s), vec![(2, Fate::Replaced)]);
    assert!(arrive(&mut s, &n, 4, 3));
    assert_eq!(fates(&mut s), vec![(3, Fate::Replaced)]);
    // A restart may queue an older entry after a newer one: arrival time decides.
    assert!(!arrive(&mut s, &n, 5, 2), "older than the one waiting");
    assert_eq!(fates(&mut s), vec![(5, Fate::Dropped)]);

    assert!(arrive(&mut s, &o, 10, 0));
    assert_eq!(ids(&s.poll_runnable(0)), vec![10]);
    assert!(arrive(&mut s, &o, 11, 1));
    assert!(arrive(&mut s, &o, 12, 2));
    assert!(!arrive(&mut s, &o, 13, 3), "two wait already");
    assert_eq!(fates(&mut s), vec![(13, Fate::Dropped)]);
    assert!(arrive(&mut s, &o, 14, 1), "older than one waiting");
    assert_eq!(fates(&mut s), vec![(12, Fate::Dropped)]);
    let waiting: Vec<_> = s.queues().into_iter().map(|q| q.queued).collect();
    assert_eq!(
        waiting.iter().sum::<usize>(),
        3,
        "4 waits at n, 11 and 14 at o"
    );
}

#[test]
fn keep_newest_bounds_waiting_by_max_queued_without_refusing() {
    let mut s = Scheduler::new(book(&[("n", 1, OnFull::KeepNewest, Some(2))]), 100);
    let n = key("n", None);
    assert!(arrive(&mut s, &n, 1, 0));
    assert_eq!(ids(&s.poll_runnable(0)), vec![1]);
    for (entry, at) in [(2, 1), (3, 2)] {
        assert!(s.refusal(&n, at).is_none());
        assert!(arrive(&mut s, &n, entry, at));
    }
    assert!(
        s.refusal(&n, 3).is_none(),
        "max_queued makes room, not a 429"
    );
    assert!(arrive(&mut s, &n, 4, 3));
    assert_eq!(fates(&mut s), vec![(2, Fate::Replaced)]);
}

#[test]
fn cancel_running_tells_what_runs_once_and_replaces_what_waits() {
    let mut s = Scheduler::new(book(&[("c/*", 1, OnFull::CancelRunning, None)]), 100);
    let c = key("c", Some("k"));
    assert!(arrive(&mut s, &c, 1, 0));
    let running = s.poll_runnable(0);
    assert_eq!(ids(&running), vec![1]);
    assert!(arrive(&mut s, &c, 2, 1));
    assert_eq!(fates(&mut s), vec![(1, Fate::Cancel)]);
    assert!(arrive(&mut s, &c, 3, 2));
    assert_eq!(
        fates(&mut s),
        vec![(2, Fate::Replaced)],
        "1 was told already; 2 is replaced"
    );
    assert!(s.poll_runnable(2).is_empty(), "1 still runs");
    for d in running {
        s.release(d.permit, 3);
    }
    let next = s.poll_runnable(3);
    assert_eq!(ids(&next), vec![3]);
    assert!(arrive(&mut s, &c, 4, 4));
    assert_eq!(fates(&mut s), vec![(3, Fate::Cancel)]);
}

#[test]
fn a_newcomer_dropped_at_one_counter_replaces_nothing_at_another() {
    let mut s = Scheduler::new(
        book(&[
            ("p", 1, OnFull::DropNew, None),
            ("p/*", 1, OnFull::KeepNewest, None),
        ]),
        100,
    );
    let (x, y) = (key("p", Some("x")), key("p", Some("y")));
    assert!(arrive(&mut s, &x, 1, 0));
    assert_eq!(ids(&s.poll_runnable(0)), vec![1]);
    assert!(!arrive(&mut s, &y, 2, 1), "the scope is full");
    assert!(!arrive(&mut s, &x, 3, 2));
    assert_eq!(fates(&mut s), vec![(2, Fate::Dropped), (3, Fate::Dropped)]);
}

#[test]
fn entries_queued_before_on_full_took_effect_count_but_are_never_named() {
    let mut plain = RuleBook::new();
    plain
        .apply_batch(
            &[Upsert::new(
                RulePattern::parse("k").unwrap(),
                Limit::Concurrency(NonZeroU32::MIN),
            )],
            0,
        )
        .unwrap();
    let mut s = Scheduler::new(Arc::new(plain), 100);
    let k = key("k", None);
    assert!(arrive(&mut s, &k, 1, 0));
    assert_eq!(ids(&s.poll_runnable(0)), vec![1]);
    assert!(arrive(&mut s, &k, 2, 1));
    s.on_rules_changed(book(&[("k", 1, OnFull::KeepNewest, None)]), 2);
    assert!(arrive(&mut s, &k, 3, 2));
    assert!(fates(&mut s).is_empty(), "2 is not listed");
    assert!(arrive(&mut s, &k, 4, 3));
    assert_eq!(fates(&mut s), vec![(3, Fate::Replaced)]);
}
