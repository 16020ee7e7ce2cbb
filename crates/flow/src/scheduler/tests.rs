use std::num::NonZeroU32;

use proptest::prelude::*;

use super::*;
use crate::model::{Event, KEYS, Model, PATTERNS};
use crate::pattern::{Level, RulePattern};
use crate::rules::{Limit, Upsert};

fn key(scope: Option<&str>, limit_key: Option<&str>, object: Option<&str>) -> QueueKey {
    QueueKey {
        scope: scope.map(|s| Scope::parse(s).unwrap()),
        limit_key: limit_key.map(|k| LimitKey::parse(k).unwrap()),
        service: "S".into(),
        object_key: object.map(Into::into),
        priority: Default::default(),
    }
}

fn book(rules: &[(&str, u32)]) -> Arc<RuleBook> {
    let mut book = RuleBook::new();
    let upserts: Vec<Upsert> = rules
        .iter()
        .map(|(p, n)| {
            Upsert::new(
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
fn round_robin_across_queues_and_fifo_inside() {
    let mut s = Scheduler::new(book(&[]), 100);
    let (a, b) = (key(Some("a"), None, None), key(Some("b"), None, None));
    for id in 1..=3 {
        s.enqueue(&a, id, EntryKind::New, None, 0);
    }
    for id in 11..=13 {
        s.enqueue(&b, id, EntryKind::New, None, 0);
    }
    let out = s.poll_runnable(0);
    assert_eq!(ids(&out), vec![1, 11, 2, 12, 3, 13]);
}

#[test]
fn a_hot_key_cannot_starve_another() {
    let mut s = Scheduler::new(book(&[]), 100);
    let hot = key(Some("a"), Some("hot"), None);
    let cold = key(Some("a"), Some("cold"), None);
    for id in 1..=50 {
        s.enqueue(&hot, id, EntryKind::New, None, 0);
    }
    s.enqueue(&cold, 100, EntryKind::New, None, 0);
    let out = ids(&s.poll_runnable(0));
    let at = out.iter().position(|e| *e == 100).unwrap();
    assert!(at <= 2, "cold entry dispatched at position {at}");
}

#[test]
fn resumed_work_is_favoured_over_new_work() {
    let mut s = Scheduler::new(book(&[]), 100);
    let fresh = key(Some("a"), Some("new"), None);
    let back = key(Some("a"), Some("back"), None);
    for id in 1..=4 {
        s.enqueue(&fresh, id, EntryKind::New, None, 0);
        s.enqueue(&back, 10 + id, EntryKind::Resumed, None, 0);
    }
    let out = ids(&s.poll_runnable(0));
    let first_half: Vec<_> = out[..4].to_vec();
    let resumed = first_half.iter().filter(|e| **e > 10).count();
    assert!(resumed >= 3, "resumed entries run twice as often: {out:?}");
}

#[test]
fn limits_hold_entries_until_a_slot_frees() {
    let mut s = Scheduler::new(book(&[("a", 1)]), 100);
    let k = key(Some("a"), None, None);
    for id in 1..=3 {
        s.enqueue(&k, id, EntryKind::New, None, 0);
    }
    let mut out = s.poll_runnable(0);
    assert_eq!(ids(&out), vec![1]);
    let snap = s.queues();
    assert_eq!(snap[0].status.name(), "blocked");
    assert!(matches!(
        &snap[0].blocked_on,
        Some(BlockedOn::LimitKeyConcurrency {
            level: Level::Scope,
            ..
        })
    ));
    s.release(out.remove(0).permit, 1);
    let out = s.poll_runnable(1);
    assert_eq!(ids(&out), vec![2]);
}

#[test]
fn unscoped_work_ignores_user_limits() {
    let mut s = Scheduler::new(book(&[("*", 1)]), 100);
    let k = key(None, None, None);
    for id in 1..=3 {
        s.enqueue(&k, id, EntryKind::New, None, 0);
    }
    assert_eq!(s.poll_runnable(0).len(), 3);
    assert!(s.counters(0).is_empty());
}

#[test]
fn the_invoker_limit_is_global() {
    let mut s = Scheduler::new(book(&[]), 2);
    for id in 1..=3 {
        s.enqueue(&key(Some("a"), None, None), id, EntryKind::New, None, 0);
    }
    let mut out = s.poll_runnable(0);
    assert_eq!(out.len(), 2);
    assert_eq!(
        s.queues()[0].blocked_on,
        Some(BlockedOn::InvokerConcurrency)
    );
    s.release(out.pop().unwrap().permit, 1);
    assert_eq!(ids(&s.poll_runnable(1)), vec![3]);
}

#[test]
fn exclusive_handlers_of_one_object_run_one_at_a_time_across_suspension() {
    let mut s = Scheduler::new(book(&[]), 100);
    let k = key(Some("a"), None, Some("obj"));
    s.enqueue(&k, 1, EntryKind::New, None, 0);
    s.enqueue(&k, 2, EntryKind::New, None, 0);
    let mut out = s.poll_runnable(0);
    assert_eq!(ids(&out), vec![1]);
    let first = out.remove(0);
    // Suspension frees the slot but not the lock.
    s.release(first.permit, 1);
    assert!(s.poll_runnable(1).is_empty());
    assert_eq!(s.queues()[0].blocked_on, Some(BlockedOn::Lock));
    // It resumes ahead of entry 2, still holding the lock.
    s.enqueue(&k, 1, EntryKind::Resumed, None, 2);
    let mut out = s.poll_runnable(2);
    assert_eq!(ids(&out), vec![1]);
    let again = out.remove(0);
    s.release(again.permit, 3);
    s.unlock(again.lock.unwrap(), 1, 3);
    assert_eq!(ids(&s.poll_runnable(3)), vec![2]);
}

#[test]
fn a_lock_held_across_a_restart_blocks_new_work_until_its_holder_completes() {
    let mut s = Scheduler::new(book(&[]), 100);
    let k = key(None, None, Some("obj"));
    // Entry 1 was suspended when the process restarted: it holds the lock, queued nowhere.
    let lock = s.hold(&k, 1, 0).expect("exclusive queues have a lock");
    assert_eq!(s.hold(&key(None, None, None), 9, 0), None);
    assert_eq!(s.held_locks()[0].1, 1);
    s.enqueue(&k, 2, EntryKind::New, None, 0);
    assert!(s.poll_runnable(0).is_empty());
    s.unlock(lock, 1, 1);
    assert_eq!(ids(&s.poll_runnable(1)), vec![2]);
}

#[test]
fn another_limit_key_on_the_same_object_shares_its_lock() {
    let mut s = Scheduler::new(book(&[]), 100);
    s.enqueue(
        &key(Some("a"), Some("x"), Some("obj")),
        1,
        EntryKind::New,
        None,
        0,
    );
    s.enqueue(
        &key(Some("a"), Some("y"), Some("obj")),
        2,
        EntryKind::New,
        None,
        0,
    );
    s.enqueue(
        &key(Some("b"), Some("y"), Some("obj")),
        3,
        EntryKind::New,
        None,
        0,
    );
    let out = ids(&s.poll_runnable(0));
    assert_eq!(
        out,
        vec![1, 3],
        "same object under scope b is another object"
    );
}

#[test]
fn delayed_entries_wait_for_their_time() {
    let mut s = Scheduler::new(book(&[]), 100);
    let k = key(Some("a"), None, None);
    s.enqueue(&k, 1, EntryKind::New, Some(50), 0);
    assert_eq!(s.next_timer(), Some(50));
    assert!(s.poll_runnable(10).is_empty());
    assert_eq!(s.queues()[0].status.name(), "scheduled");
    assert_eq!(ids(&s.poll_runnable(50)), vec![1]);
    assert_eq!(s.next_timer(), None);
}

#[test]
fn removing_a_queued_entry() {
    let mut s = Scheduler::new(book(&[("a", 1)]), 100);
    let k = key(Some("a"), None, None);
    let q = s.enqueue(&k, 1, EntryKind::New, None, 0);
    s.enqueue(&k, 2, EntryKind::New, None, 0);
    s.enqueue(&k, 3, EntryKind::New, None, 0);
    let mut out = s.poll_runnable(0);
    assert!(s.remove(q, 2, 1));
    assert!(!s.remove(q, 2, 1));
    s.release(out.remove(0).permit, 2);
    assert_eq!(ids(&s.poll_runnable(2)), vec![3]);
}

#[test]
fn raising_a_rule_wakes_held_queues() {
    let mut s = Scheduler::new(book(&[("a", 1)]), 100);
    let k = key(Some("a"), None, None);
    for id in 1..=3 {
        s.enqueue(&k, id, EntryKind::New, None, 0);
    }
    assert_eq!(s.poll_runnable(0).len(), 1);
    s.on_rules_changed(book(&[("a", 3)]), 1);
    assert_eq!(ids(&s.poll_runnable(1)), vec![2, 3]);
    let counters = s.counters(0);
    assert_eq!((counters[0].usage, counters[0].available), (3, 0));
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0..KEYS.len()).prop_map(Event::Arrive),
        1 => (0..KEYS.len(), 0u64..30).prop_map(|(key, within)| Event::ArriveBy(key, within)),
        2 => any::<usize>().prop_map(Event::Complete),
        1 => (any::<usize>(), 0u64..30).prop_map(|(i, cost)| Event::CompleteSpending(i, cost)),
        2 => any::<usize>().prop_map(Event::Suspend),
        2 => any::<usize>().prop_map(Event::Resume),
        1 => (0..PATTERNS.len(), 0u32..4, prop::bool::weighted(0.2), prop::bool::weighted(0.2), 0u32..4, 0u32..4, prop_oneof![3 => Just(0u64), 1 => 1u64..40], prop::option::weighted(0.3, (1u32..4, 1u32..8)), (prop_oneof![2 => Just(0u32), 1 => 1u32..3], prop_oneof![3 => Just(0u64), 1 => 1u64..20], prop::option::weighted(0.2, (1u64..60, 0u64..20))))
            .prop_map(|(pattern, limit, disabled, shadow, weight, max_queued, max_wait, adaptive, (guaranteed, quota, budget))| Event::Rule {
                pattern, limit, disabled, shadow, weight, max_queued, max_wait, adaptive, guaranteed, quota, budget,
            }),
        1 => (0..PATTERNS.len()).prop_map(Event::DeleteRule),
        1 => (0..KEYS.len()).prop_map(Event::PauseQueue),
        1 => (0..KEYS.len()).prop_map(Event::ResumeQueue),
        1 => prop_oneof![2 => Just(0u32), 1 => 1u32..6].prop_map(Event::Deployment),
        1 => (any::<usize>(), 0u8..3, 1u64..30).prop_map(|(i, kind, after)| Event::Fail(i, kind, after)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn scheduler_agrees_with_the_reference_model(
        invoker_limit in 1u32..8,
        events in prop::collection::vec(event(), 1..200),
    ) {
        let mut model = Model::new(invoker_limit);
        for e in &events {
            model.step(e);
        }
        model.drain();
    }
}

/// Events of a simulator run printed when it fails.
const RECENT: usize = 200;

/// Runs ≥ 1 M events through the scheduler against the model. Reproduce a failure with
/// `SLUICE_SIM_SEED=<seed> cargo test -p sluice-flow simulator`.
#[test]
fn simulator_one_million_events() {
    let seed = sluice_core::simulation::seed();
    println!("simulator seed: {seed} (SLUICE_SIM_SEED={seed} replays it)");
    let mut rng = sluice_core::simulation::Rng(seed);
    let mut total = 0u64;
    let mut runs = 0;
    let mut worst = 0;
    let mut refused = 0;
    let mut expired = 0;
    let mut borrowed = 0;
    let mut quota_held = 0;
    let mut budget_held = 0;
    let mut gate_held = 0;
    let wanted = sluice_core::simulation::events(1_000_000);
    let started = std::time::Instant::now();
    while total < wanted {
        let invoker_limit = 1 + rng.index(12) as u32;
        let mut model = Model::new(invoker_limit);
        let events = 20_000;
        // The run's last events, printed with a failure: a seed replays it, they explain it.
        let mut recent = std::collections::VecDeque::with_capacity(RECENT);
        for _ in 0..events {
            let e = match rng.index(100) {
                0..=34 => Event::Arrive(rng.index(KEYS.len())),
                35..=39 => Event::ArriveBy(rng.index(KEYS.len()), rng.index(200) as u64),
                40..=52 => Event::Complete(rng.index(64)),
                53..=62 => Event::CompleteSpending(rng.index(64), rng.index(40) as u64),
                63 => Event::Fail(rng.index(64), rng.index(3) as u8, 1 + rng.index(30) as u64),
                64 if rng.index(4) == 0 => Event::Deployment(if rng.index(2) == 0 {
                    0
                } else {
                    1 + rng.index(6) as u32
                }),
                64 => Event::Complete(rng.index(64)),
                65..=79 => Event::Suspend(rng.index(64)),
                80..=94 => Event::Resume(rng.index(64)),
                95..=97 => Event::Rule {
                    pattern: rng.index(PATTERNS.len()),
                    limit: rng.index(5) as u32,
                    disabled: rng.index(5) == 0,
                    shadow: rng.index(5) == 0,
                    weight: rng.index(4) as u32,
                    // Mostly unbounded: a bound refuses most arrivals while it is low.
                    max_queued: if rng.index(4) == 0 {
                        1 + rng.index(8) as u32
                    } else {
                        0
                    },
                    max_wait: if rng.index(4) == 0 {
                        1 + rng.index(300) as u64
                    } else {
                        0
                    },
                    adaptive: (rng.index(3) == 0)
                        .then(|| (1 + rng.index(3) as u32, 1 + rng.index(10) as u32)),
                    // Burstable now and then (applies below a limit of 2 or more).
                    guaranteed: if rng.index(3) == 0 {
                        1 + rng.index(2) as u32
                    } else {
                        0
                    },
                    // Now and then a quota, mostly generous: a small one holds its counter's
                    // new entries until the rule changes.
                    quota: if rng.index(5) == 0 {
                        1 + rng.index(200) as u64
                    } else {
                        0
                    },
                    // Now and then a budget, with a reservation or without one.
                    budget: (rng.index(5) == 0).then(|| {
                        (
                            1 + rng.index(400) as u64,
                            rng.index(3) as u64 * rng.index(30) as u64,
                        )
                    }),
                },
                98 => Event::DeleteRule(rng.index(PATTERNS.len())),
                _ if rng.index(2) == 0 => Event::PauseQueue(rng.index(KEYS.len())),
                _ => Event::ResumeQueue(rng.index(KEYS.len())),
            };
            if recent.len() == RECENT {
                recent.pop_front();
            }
            recent.push_back(e.clone());
            let replay = std::panic::AssertUnwindSafe(|| model.step(&e));
            if let Err(panic) = std::panic::catch_unwind(replay) {
                for (ago, r) in recent.iter().rev().enumerate().rev() {
                    eprintln!("  event -{ago}: {r:?}");
                }
                eprintln!(
                    "simulator failed with seed {seed} (run {runs}, event {e:?}, invoker {invoker_limit})"
                );
                std::panic::resume_unwind(panic);
            }
        }
        model.drain();
        worst = worst.max(model.worst_wait);
        refused += model.refused;
        expired += model.expired;
        borrowed += model.borrowed;
        quota_held += model.quota_held;
        budget_held += model.budget_held;
        gate_held += model.gate_held;
        total += events;
        runs += 1;
    }
    println!(
        "simulator: {total} events in {runs} runs ({:?}), worst fairness wait {worst} dispatches, \
         {refused} arrivals refused by a full queue, {expired} dropped past their deadline, \
         {borrowed} started on borrowed slots, {quota_held} head-polls held by a used-up quota, \
         {budget_held} by a spent budget, {gate_held} by the deployment gate alone",
        started.elapsed()
    );
    assert!(expired > 0, "no entry ever passed its deadline");
    assert!(borrowed > 0, "no key ever borrowed beyond its guarantee");
    assert!(quota_held > 0, "no quota was ever used up");
    assert!(budget_held > 0, "no budget was ever spent");
    assert!(gate_held > 0, "the deployment gate never held anything");
}

#[test]
fn a_waiting_entry_knows_its_place_and_when_its_turn_should_come() {
    let mut s = Scheduler::new(book(&[("a", 1)]), 100);
    let a = key(Some("a"), None, None);
    let q = s.enqueue(&a, 1, EntryKind::New, None, 1_000);
    for id in 2..=5 {
        s.enqueue(&a, id, EntryKind::New, None, 1_000);
    }
    let first = s.poll_runnable(1_000).pop().unwrap();
    let place = s.position(q, 4, 1_000).unwrap();
    assert_eq!(place.position, 3, "entries 2 and 3 are ahead of 4");
    assert_eq!(place.eta_ms, None, "one dispatch gives no rate yet");
    assert_eq!(
        s.position(q, 1, 1_000),
        None,
        "a running entry does not wait"
    );
    // The queue drains one every 100 ms.
    s.release(first.permit, 1_100);
    let second = s.poll_runnable(1_100).pop().unwrap();
    let place = s.position(q, 4, 1_100).unwrap();
    assert_eq!(place.position, 2);
    assert_eq!(place.eta_ms, Some(200));
    assert_eq!(s.position(q, 4, 1_150).unwrap().eta_ms, Some(150));
    assert_eq!(place.drain_per_second, Some(10.0));
    // A resumed entry goes ahead of new ones.
    s.enqueue(&a, 9, EntryKind::Resumed, None, 1_100);
    assert_eq!(s.position(q, 4, 1_100).unwrap().position, 3);
    assert_eq!(s.position(q, 9, 1_100).unwrap().position, 1);
    s.release(second.permit, 1_200);
}
