use std::num::NonZeroU32;

use super::*;
use crate::ReadView;
use crate::pattern::RulePattern;
use crate::quota::Measure;
use crate::rules::Upsert;

use std::collections::HashMap as StdMap;

fn book(rules: &[(&str, u32)]) -> RuleBook {
    let mut book = RuleBook::new();
    set(&mut book, rules);
    book
}

fn set(book: &mut RuleBook, rules: &[(&str, u32)]) {
    let upserts: Vec<Upsert> = rules
        .iter()
        .map(|(p, n)| {
            let limit = NonZeroU32::new(*n).map_or(Limit::Unlimited, Limit::Concurrency);
            Upsert::new(RulePattern::parse(p).unwrap(), limit)
        })
        .collect();
    book.apply_batch(&upserts, 1).unwrap();
}

fn path(l: &mut Limiter, scope: &str, key: Option<&str>) -> CounterPath {
    let key = key.map(|k| LimitKey::parse(k).unwrap());
    l.path(&Scope::parse(scope).unwrap(), key.as_ref())
}

#[test]
fn acquire_counts_every_touched_level_and_release_prunes() {
    let b = book(&[]);
    let mut l = Limiter::new();
    let p = path(&mut l, "acme", Some("gold/eu"));
    assert_eq!(l.len(), 3);
    let permit = l.try_acquire(&p, &b, 0).unwrap();
    for &c in p.counters() {
        assert_eq!(l.usage(c), 1);
    }
    l.drop_path(p);
    assert_eq!(l.len(), 3, "usage keeps counters alive");
    let mut woken = Vec::new();
    l.release(permit, &b, 0, &mut woken);
    assert!(woken.is_empty());
    assert!(l.is_empty(), "idle counters are pruned");
}

#[test]
fn blocked_names_the_deepest_full_level() {
    let b = book(&[("acme", 1), ("acme/gold", 1)]);
    let mut l = Limiter::new();
    let p = path(&mut l, "acme", Some("gold/eu"));
    let _held = l.try_acquire(&p, &b, 0).unwrap();
    let blocked = l.try_acquire(&p, &b, 0).unwrap_err();
    assert_eq!(blocked.level, Level::L1);
    assert_eq!(blocked.rule.unwrap().to_string(), "acme/gold");
    // A sibling key is blocked at the scope only.
    let q = path(&mut l, "acme", Some("silver"));
    let blocked = l.try_acquire(&q, &b, 0).unwrap_err();
    assert_eq!(blocked.level, Level::Scope);
}

#[test]
fn limits_are_per_scope_under_a_star_rule() {
    let b = book(&[("*", 1)]);
    let mut l = Limiter::new();
    let a = path(&mut l, "a", None);
    let c = path(&mut l, "c", None);
    let _pa = l.try_acquire(&a, &b, 0).unwrap();
    let _pc = l.try_acquire(&c, &b, 0).unwrap();
    assert!(l.try_acquire(&a, &b, 0).is_err());
}

#[test]
fn unlimited_rule_overrules_at_its_level_while_others_apply() {
    let b = book(&[("*/*", 1), ("acme/gold", 0), ("acme", 2)]);
    let mut l = Limiter::new();
    let p = path(&mut l, "acme", Some("gold"));
    let _first = l.try_acquire(&p, &b, 0).unwrap();
    let _second = l.try_acquire(&p, &b, 0).unwrap();
    let blocked = l.try_acquire(&p, &b, 0).unwrap_err();
    assert_eq!(blocked.level, Level::Scope, "the scope rule still applies");
}

#[test]
fn release_wakes_one_waiter_per_freed_slot_deepest_first() {
    let b = book(&[("s", 2), ("s/a", 1)]);
    let mut l = Limiter::new();
    let pa = path(&mut l, "s", Some("a"));
    let pb = path(&mut l, "s", Some("b"));
    let held_a = l.try_acquire(&pa, &b, 0).unwrap();
    let _held_b = l.try_acquire(&pb, &b, 0).unwrap();
    // 10 and 11 wait at s/a (deepest blocked), 20 and 21 at s.
    let blocked = l.check(&pa, &b, false, true, 0).unwrap_err();
    assert_eq!(blocked.level, Level::L1);
    l.park(blocked.counter, 10, &pa, Priority::NORMAL, None);
    l.park(blocked.counter, 11, &pa, Priority::NORMAL, None);
    let scope = l.check(&pb, &b, false, true, 0).unwrap_err().counter;
    l.park(scope, 20, &pb, Priority::NORMAL, None);
    l.park(scope, 21, &pb, Priority::NORMAL, None);
    let mut woken = Vec::new();
    l.release(held_a, &b, 0, &mut woken);
    assert_eq!(
        woken,
        vec![10, 20],
        "one per level with a freed slot, deepest first"
    );
}

#[test]
fn woken_slots_are_reserved_and_handed_on() {
    let b = book(&[("s", 1)]);
    let mut l = Limiter::new();
    let p = path(&mut l, "s", None);
    let held = l.try_acquire(&p, &b, 0).unwrap();
    let counter = l.check(&p, &b, false, true, 0).unwrap_err().counter;
    l.park(counter, 1, &p, Priority::NORMAL, None);
    l.park(counter, 2, &p, Priority::NORMAL, None);
    let mut woken = Vec::new();
    l.release(held, &b, 0, &mut woken);
    assert_eq!(woken, vec![1]);
    // A newcomer cannot take the slot offered to waiter 1.
    assert!(l.check(&p, &b, false, true, 0).is_err());
    // Waiter 1 can, and its reservation ends.
    l.check(&p, &b, true, true, 0).unwrap();
    let permit = l.acquire(&p, true, 0);
    woken.clear();
    l.settle(counter, Some(&p), &b, &mut woken);
    assert!(woken.is_empty(), "no slot left for waiter 2");
    l.release(permit, &b, 0, &mut woken);
    assert_eq!(woken, vec![2]);
    // Waiter 2 does not use it (blocked elsewhere): settling hands it to the next one.
    l.park(counter, 3, &p, Priority::NORMAL, None);
    woken.clear();
    l.settle(counter, Some(&p), &b, &mut woken);
    assert_eq!(woken, vec![3]);
}

#[test]
fn raising_a_limit_wakes_waiters_and_lowering_revokes_nothing() {
    let mut b = book(&[("s", 1)]);
    let mut l = Limiter::new();
    let p = path(&mut l, "s", None);
    let first = l.try_acquire(&p, &b, 0).unwrap();
    let counter = l.check(&p, &b, false, true, 0).unwrap_err().counter;
    for w in 1..=3 {
        l.park(counter, w, &p, Priority::NORMAL, None);
    }
    set(&mut b, &[("s", 3)]);
    let mut woken = Vec::new();
    l.on_rules_changed(&b, &mut woken);
    assert_eq!(woken, vec![1, 2], "two new slots, two wake-ups");
    // Lower to 1: the held permit stays, nobody new gets in.
    set(&mut b, &[("s", 1)]);
    assert!(l.check(&p, &b, false, true, 0).is_err());
    assert_eq!(l.usage(counter), 1);
    l.release(first, &b, 0, &mut woken);
}

#[test]
fn unpark_removes_a_waiter() {
    let b = book(&[("s", 1)]);
    let mut l = Limiter::new();
    let p = path(&mut l, "s", None);
    let held = l.try_acquire(&p, &b, 0).unwrap();
    let counter = l.check(&p, &b, false, true, 0).unwrap_err().counter;
    let ticket = l.park(counter, 7, &p, Priority::NORMAL, None);
    let mut woken = Vec::new();
    assert!(l.unpark(counter, ticket, &b, &mut woken));
    assert!(!l.unpark(counter, ticket, &b, &mut woken));
    l.release(held, &b, 0, &mut woken);
    assert!(woken.is_empty());
    l.drop_path(p);
    assert!(l.is_empty());
}

#[test]
fn snapshot_lists_live_counters() {
    let b = book(&[("s/*", 2)]);
    let mut l = Limiter::new();
    let p = path(&mut l, "s", Some("k/x"));
    let _held = l.try_acquire(&p, &b, 0).unwrap();
    let snap = l.snapshot(&b, 0);
    assert_eq!(snap.len(), 3);
    let l1 = snap.iter().find(|c| c.level == Level::L1).unwrap();
    assert_eq!(
        (l1.usage, l1.available, l1.limit.concurrency()),
        (1, 1, Some(2))
    );
    assert_eq!(l1.rule.as_ref().unwrap().to_string(), "s/*");
    let l2 = snap.iter().find(|c| c.level == Level::L2).unwrap();
    assert_eq!(l2.l2.as_deref(), Some("x"));
    assert_eq!(l2.available, u32::MAX);
}

#[test]
fn a_due_token_is_kept_for_the_waiter_woken_for_it() {
    let mut b = RuleBook::new();
    let mut rated = Upsert::new(RulePattern::parse("acme").unwrap(), Limit::Unlimited);
    rated.rate = Some(crate::rate::RateLimit::new("1/s".parse().unwrap()));
    b.apply_batch(&[rated], 1).unwrap();
    let mut l = Limiter::new();
    let p = path(&mut l, "acme", None);
    let first = l.try_acquire(&p, &b, 0).unwrap();
    let blocked = l.check(&p, &b, false, true, 0).unwrap_err();
    assert_eq!(blocked.rate.map(|(_, next)| next), Some(1_000));
    l.park_for_token(blocked.counter, 7, &p, Priority::NORMAL, None);
    assert_eq!(l.next_wake(), Some(1_000));
    let mut woken = Vec::new();
    l.wake_due(999, &b, &mut woken);
    assert!(woken.is_empty(), "not before its token is due");
    l.wake_due(1_000, &b, &mut woken);
    assert_eq!(woken, vec![7]);
    // A newcomer finds the token taken by the one woken for it; that one finds it there.
    assert!(l.check(&p, &b, false, true, 1_000).is_err());
    l.check(&p, &b, true, true, 1_000).unwrap();
    let second = l.acquire(&p, true, 1_000);
    l.settle_token(blocked.counter, &b);
    // Retried work takes no token: the check without one passes although none is left.
    l.check(&p, &b, false, false, 1_000).unwrap();
    l.release(first, &b, 0, &mut woken);
    l.release(second, &b, 0, &mut woken);
}

/// Parks `waiters` at the scope counter of `s` (limit 1, held), each on its own path, then
/// releases and re-acquires the slot `turns` times: answers how often each was admitted.
fn admissions(
    b: &RuleBook,
    waiters: &[(Option<&str>, Priority)],
    turns: usize,
) -> StdMap<WaiterId, usize> {
    let mut l = Limiter::new();
    let paths: Vec<CounterPath> = waiters
        .iter()
        .map(|(key, _)| path(&mut l, "s", *key))
        .collect();
    let mut held = l.try_acquire(&paths[0], b, 0).unwrap();
    let counter = l.check(&paths[0], b, false, true, 0).unwrap_err().counter;
    for (w, (_, priority)) in waiters.iter().enumerate() {
        l.park(counter, w as WaiterId, &paths[w], *priority, None);
    }
    let mut counts = StdMap::new();
    for _ in 0..turns {
        let mut woken = Vec::new();
        l.release(held, b, 0, &mut woken);
        let [w] = woken[..] else {
            panic!("one wake per freed slot: {woken:?}");
        };
        *counts.entry(w).or_default() += 1;
        let p = paths[w as usize];
        l.check(&p, b, true, true, 0).unwrap();
        held = l.acquire(&p, true, 0);
        woken.clear();
        l.settle(counter, Some(&p), b, &mut woken);
        // Still backlogged: it waits again behind its own flow.
        l.park(counter, w, &p, waiters[w as usize].1, None);
    }
    counts
}

#[test]
fn weights_share_a_full_counter_between_sibling_keys() {
    let mut b = book(&[("s", 1)]);
    let mut gold = Upsert::new(RulePattern::parse("s/gold").unwrap(), Limit::Unlimited);
    gold.weight = NonZeroU32::new(3);
    b.apply_batch(&[gold], 1).unwrap();
    let counts = admissions(
        &b,
        &[
            (Some("gold"), Priority::NORMAL),
            (Some("free"), Priority::NORMAL),
        ],
        400,
    );
    assert_eq!((counts[&0], counts[&1]), (300, 100), "3:1 while both wait");
}

#[test]
fn higher_priority_is_admitted_first_and_low_priority_ages_in() {
    let b = book(&[("s", 1)]);
    // Two queues of the same key: one high, one low, both always backlogged.
    let counts = admissions(
        &b,
        &[(Some("k"), Priority::HIGH), (Some("k"), Priority::LOW)],
        1_000,
    );
    // The low one gets a turn once per 9 × PRIORITY_STEP admissions of the high one.
    let step = 9 * PRIORITY_STEP as usize;
    assert!(counts[&0] > counts[&1] * (step - 1), "{counts:?}");
    assert!(
        counts[&1] >= 1_000 / (step + 1),
        "never starved: {counts:?}"
    );
}

#[test]
fn a_shadow_rule_counts_and_holds_nothing() {
    let mut b = RuleBook::new();
    let mut shadow = Upsert::new(
        RulePattern::parse("s").unwrap(),
        Limit::Concurrency(NonZeroU32::MIN),
    );
    shadow.shadow = true;
    shadow.max_queued = NonZeroU32::new(1);
    b.apply_batch(&[shadow], 1).unwrap();
    assert!(!b.may_refuse(), "a shadow bound refuses nothing");
    let mut l = Limiter::new();
    let p = path(&mut l, "s", None);
    let permits: Vec<Permit> = (0..3).map(|_| l.try_acquire(&p, &b, 0).unwrap()).collect();
    l.count_queued(&p, true);
    l.count_queued(&p, true);
    assert!(l.refusal(&p, &b, 0).is_none());
    let snap = l.snapshot(&b, 0);
    let (rule, counts) = snap[0]
        .controls()
        .shadow
        .clone()
        .expect("the shadow rule is evaluated");
    assert_eq!(rule.pattern.to_string(), "s");
    assert_eq!((counts.would_wait, counts.would_reject), (2, 1));
    let mut woken = Vec::new();
    for permit in permits {
        l.release(permit, &b, 0, &mut woken);
    }
}

#[test]
fn admissions_are_totalled_per_rule_and_outlive_their_counters() {
    let b = book(&[("*", 5)]);
    let mut l = Limiter::new();
    let mut woken = Vec::new();
    for scope in ["a", "b", "c"] {
        for _ in 0..2 {
            let p = path(&mut l, scope, Some("k"));
            let permit = l.try_acquire(&p, &b, 0).unwrap();
            l.drop_path(p);
            l.release(permit, &b, 0, &mut woken);
        }
    }
    assert!(l.is_empty(), "every counter went away");
    let held = path(&mut l, "d", None);
    let _permit = l.try_acquire(&held, &b, 0).unwrap();
    let mut totals: Vec<(String, Level, u64)> = l
        .admissions()
        .into_iter()
        .map(|a| {
            (
                a.rule.map_or("none".into(), |r| r.to_string()),
                a.level,
                a.admitted,
            )
        })
        .collect();
    totals.sort();
    assert_eq!(
        totals,
        vec![
            ("*".to_owned(), Level::Scope, 7),
            ("none".to_owned(), Level::L1, 6),
        ]
    );
}

/// `s` allows `parent`; every key under it is burstable `{min, max}`.
fn burstable(parent: u32, min: u32, max: u32) -> RuleBook {
    let mut b = book(&[("s", parent)]);
    let mut key = Upsert::new(
        RulePattern::parse("s/*").unwrap(),
        Limit::Concurrency(NonZeroU32::new(max).unwrap()),
    );
    key.guaranteed = NonZeroU32::new(min);
    b.apply_batch(&[key], 1).unwrap();
    b
}

#[test]
fn a_burstable_key_borrows_idle_capacity_up_to_its_max() {
    let b = burstable(4, 1, 3);
    let mut l = Limiter::new();
    let a = path(&mut l, "s", Some("a"));
    // Alone under an idle parent: up to its max, not beyond.
    let held: Vec<Permit> = (0..3).map(|_| l.try_acquire(&a, &b, 0).unwrap()).collect();
    let blocked = l.try_acquire(&a, &b, 0).unwrap_err();
    assert_eq!(blocked.level, Level::L1, "its own max holds it");
    // The parent still bounds the sum: a sibling gets the last slot, then waits.
    let c = path(&mut l, "s", Some("c"));
    let _last = l.try_acquire(&c, &b, 0).unwrap();
    assert_eq!(l.try_acquire(&c, &b, 0).unwrap_err().level, Level::Scope);
    let snap = l.snapshot(&b, 0);
    let at_a = snap.iter().find(|s| s.l1.as_deref() == Some("a")).unwrap();
    assert_eq!((at_a.usage, at_a.controls().guaranteed), (3, Some(1)));
    assert_eq!(at_a.limit, Limit::Concurrency(NonZeroU32::new(3).unwrap()));
    drop(held);
}

/// Keys `a` and `c` under scope `s`, with `a` holding `n` slots.
fn a_holding(b: &RuleBook, n: usize) -> (Limiter, CounterPath, CounterPath, Vec<Permit>) {
    let mut l = Limiter::new();
    let a = path(&mut l, "s", Some("a"));
    let c = path(&mut l, "s", Some("c"));
    let held = (0..n).map(|_| l.try_acquire(&a, b, 0).unwrap()).collect();
    (l, a, c, held)
}

#[test]
fn borrowed_slots_go_back_first_to_keys_within_their_guarantee() {
    let b = burstable(4, 2, 4);
    // `a` holds the whole parent: 2 guaranteed, 2 borrowed.
    let (mut l, a, c, mut held) = a_holding(&b, 4);
    // `a` is at its max; `c` (within its guarantee) waits twice at the parent.
    assert_eq!(
        l.check(&a, &b, false, true, 0).unwrap_err().level,
        Level::L1
    );
    let scope = l.check(&c, &b, false, true, 0).unwrap_err().counter;
    l.park(scope, 1, &c, Priority::NORMAL, None);
    l.park(scope, 2, &c, Priority::NORMAL, None);
    // `a` gives a borrowed slot back: it goes to `c`, not to `a`'s next entry.
    let mut woken = Vec::new();
    l.release(held.pop().unwrap(), &b, 0, &mut woken);
    assert_eq!(
        woken,
        vec![1],
        "the freed slot goes to the key within its guarantee"
    );
    // Woken at the parent, it re-checks as the scheduler has it do.
    l.check_woken(&c, &b, Woken::At(scope), true, 0).unwrap();
    held.push(l.acquire(&c, true, 0));
    woken.clear();
    l.settle(scope, Some(&c), &b, &mut woken);
    // While 2 waits within its guarantee, a new borrower from `a` may not take a slot the
    // parent frees, even one `a` itself gave back.
    let back = held.remove(0);
    woken.clear();
    l.release(back, &b, 0, &mut woken);
    assert_eq!(woken, vec![2]);
    assert!(
        l.check(&a, &b, false, true, 0).is_err(),
        "the slot is reserved for the woken waiter"
    );
    // Woken at the parent, it re-checks as the scheduler has it do.
    l.check_woken(&c, &b, Woken::At(scope), true, 0).unwrap();
    held.push(l.acquire(&c, true, 0));
    woken.clear();
    l.settle(scope, Some(&c), &b, &mut woken);
    // Now `a` holds 2 (its guarantee) and `c` 2: nobody borrows.
    let at = |l: &mut Limiter, key: &str| {
        l.snapshot(&b, 0)
            .into_iter()
            .find(|s| s.l1.as_deref() == Some(key))
            .unwrap()
            .usage
    };
    assert_eq!((at(&mut l, "a"), at(&mut l, "c")), (2, 2));
}

#[test]
fn a_key_woken_at_the_parent_for_its_last_guaranteed_slot_does_not_take_a_second_before_others_within_theirs()
 {
    // Parent 2, each key 1 guaranteed (at most 2). `z` holds the whole parent (one slot
    // borrowed); `a` (nothing held) waits twice at the parent, ahead in line; `c` (nothing
    // held, low priority) once.
    let b = burstable(2, 1, 2);
    let mut l = Limiter::new();
    let z = path(&mut l, "s", Some("z"));
    let a = path(&mut l, "s", Some("a"));
    let c = path(&mut l, "s", Some("c"));
    let mut held: Vec<Permit> = (0..2).map(|_| l.try_acquire(&z, &b, 0).unwrap()).collect();
    let scope = l.check(&a, &b, false, true, 0).unwrap_err().counter;
    l.park(scope, 1, &a, Priority::NORMAL, None);
    l.park(scope, 2, &a, Priority::NORMAL, None);
    l.park(scope, 3, &c, Priority::LOW, None);
    // `z` gives both slots back before anyone woken has re-checked.
    let mut woken = Vec::new();
    l.release(held.pop().unwrap(), &b, 0, &mut woken);
    l.release(held.pop().unwrap(), &b, 0, &mut woken);
    // The first goes to `a`'s first waiter: it will take `a`'s one guaranteed slot. The second
    // would make `a` borrow, so it goes to `c`, within its guarantee, although `a`'s second
    // waiter is ahead of it in line.
    assert_eq!(woken, vec![1, 3]);
    for (waiter, p) in [(1, &a), (3, &c)] {
        l.check_woken(p, &b, Woken::At(scope), true, 0)
            .unwrap_or_else(|e| panic!("waiter {waiter}: {e:?}"));
        held.push(l.acquire(p, true, 0));
        let mut more = Vec::new();
        l.settle(scope, Some(p), &b, &mut more);
        assert!(more.is_empty(), "the parent is full again: {more:?}");
    }
}

#[test]
fn two_borrowed_slots_back_in_one_turn_both_go_to_the_waiting_guarantee() {
    let b = burstable(4, 2, 4);
    // `a` holds the whole parent (2 guaranteed, 2 borrowed) and has its next call waiting at
    // its own max; `c`, within its guarantee, waits twice at the parent.
    let (mut l, a, c, mut held) = a_holding(&b, 4);
    let own = l.check(&a, &b, false, true, 0).unwrap_err().counter;
    l.park(own, 9, &a, Priority::HIGH, None);
    let scope = l.check(&c, &b, false, true, 0).unwrap_err().counter;
    l.park(scope, 1, &c, Priority::NORMAL, None);
    l.park(scope, 2, &c, Priority::NORMAL, None);
    // Two of `a`'s calls end before anyone woken has started.
    let mut woken = Vec::new();
    l.release(held.pop().unwrap(), &b, 0, &mut woken);
    l.release(held.pop().unwrap(), &b, 0, &mut woken);
    woken.sort_unstable();
    // `a`'s own counter has room again, so its waiter is woken there too; but it would
    // borrow, and the parent's two free slots are reserved for `c`: it re-checks in vain, in
    // whatever order the three re-check.
    assert_eq!(
        woken,
        vec![1, 2, 9],
        "both slots `a` borrowed are offered to `c`"
    );
    let at_own = l.check_woken(&a, &b, Woken::At(own), true, 0).unwrap_err();
    assert_eq!(at_own.counter, scope, "the borrower is held at the parent");
    assert!(at_own.borrows);
    for _ in 0..2 {
        l.check_woken(&c, &b, Woken::At(scope), true, 0).unwrap();
        held.push(l.acquire(&c, true, 0));
    }
    assert!(l.check_woken(&a, &b, Woken::At(own), true, 0).is_err());
    woken.clear();
    l.settle(scope, Some(&c), &b, &mut woken);
    l.settle(scope, Some(&c), &b, &mut woken);
    l.settle(own, Some(&a), &b, &mut woken);
    l.park(scope, 9, &a, Priority::HIGH, None);
    assert!(woken.is_empty(), "the parent is full again: {woken:?}");
    // One of `c`'s ends: `a` is at its guarantee, `c` below it with nobody waiting, so `a`'s
    // waiter may borrow the idle slot.
    let back = held.pop().unwrap();
    l.release(back, &b, 0, &mut woken);
    assert_eq!(woken, vec![9]);
}

#[test]
fn a_borrower_parked_at_the_parent_comes_after_waiters_within_their_guarantee() {
    // Parent 3; `a` holds all 3 (1 guaranteed, 2 borrowed; it may borrow one more).
    let b = burstable(3, 1, 4);
    let (mut l, a, c, mut held) = a_holding(&b, 3);
    // `a` would borrow more (high priority); `c` is within its guarantee (low priority).
    let scope = l.check(&a, &b, false, true, 0).unwrap_err().counter;
    l.park(scope, 8, &a, Priority::HIGH, None);
    assert_eq!(l.check(&c, &b, false, true, 0).unwrap_err().counter, scope);
    l.park(scope, 7, &c, Priority::LOW, None);
    let mut woken = Vec::new();
    l.release(held.pop().unwrap(), &b, 0, &mut woken);
    assert_eq!(
        woken,
        vec![7],
        "the borrowed slot goes back to the guarantee first"
    );
    // Woken at the parent, it re-checks as the scheduler has it do.
    l.check_woken(&c, &b, Woken::At(scope), true, 0).unwrap();
    held.push(l.acquire(&c, true, 0));
    woken.clear();
    l.settle(scope, Some(&c), &b, &mut woken);
    assert!(woken.is_empty(), "the parent is full again");
    l.release(held.remove(0), &b, 0, &mut woken);
    assert_eq!(
        woken,
        vec![8],
        "with nobody within a guarantee waiting, a borrower is next"
    );
}

#[test]
fn refusals_and_waits_are_totalled_per_rule_and_outlive_their_counters() {
    let mut b = book(&[]);
    let mut bounded = Upsert::new(
        RulePattern::parse("q").unwrap(),
        Limit::Concurrency(NonZeroU32::MIN),
    );
    bounded.max_queued = NonZeroU32::new(1);
    b.apply_batch(&[bounded], 1).unwrap();
    let mut l = Limiter::new();
    let p = path(&mut l, "q", Some("k"));
    let permit = l.try_acquire(&p, &b, 0).unwrap();
    l.record_wait(&p, 0);
    l.count_queued(&p, true);
    let refused = l.refusal(&p, &b, 0).expect("one waits already");
    assert_eq!(refused.level, Level::Scope);
    l.count_queued(&p, false);
    let mut woken = Vec::new();
    l.release(permit, &b, 0, &mut woken);
    let second = l.try_acquire(&p, &b, 0).unwrap();
    l.record_wait(&p, 700);
    l.release(second, &b, 0, &mut woken);
    l.drop_path(p);
    assert!(l.is_empty());
    let scope = l
        .admissions()
        .into_iter()
        .find(|a| a.level == Level::Scope)
        .unwrap();
    assert_eq!((scope.admitted, scope.refused), (2, 1));
    assert_eq!(scope.waits.count(), 2);
    assert_eq!(
        scope.waits.quantile(0.99),
        Some(1023),
        "700 ms is in [512, 1024)"
    );
    assert_eq!(scope.waits.quantile(0.5), Some(0));
}

#[test]
fn a_quota_counts_new_admissions_per_window_and_outlives_its_counter() {
    use crate::quota::Quota;
    let hour = 3_600_000;
    let now = 10 * hour + 5;
    let mut b = book(&[]);
    let mut rule = Upsert::new(RulePattern::parse("q/*").unwrap(), Limit::Unlimited);
    rule.quota = Some("2/h".parse().unwrap());
    b.apply_batch(&[rule], 1).unwrap();
    let mut l = Limiter::new();
    let mut woken = Vec::new();
    let p = path(&mut l, "q", Some("k"));
    for _ in 0..2 {
        let permit = l.try_acquire(&p, &b, now).unwrap();
        l.release(permit, &b, now, &mut woken);
    }
    // A retry or a resumption (no token) is not a new admission: it passes.
    l.check(&p, &b, false, false, now).unwrap();
    let blocked = l.check(&p, &b, false, true, now).unwrap_err();
    assert_eq!(blocked.level, Level::L1);
    assert_eq!(
        blocked.quota.map(|(_, _, at)| at),
        Some(11 * hour),
        "the next hour"
    );
    let writes = l.take_use_writes(Measure::Calls);
    assert_eq!(writes.len(), 1);
    assert_eq!((writes[0].0.as_str(), writes[0].1.used), ("q/k", 2));
    assert!(l.take_use_writes(Measure::Calls).is_empty(), "taken once");
    // Gone and back: the counter keeps its use, and shows it while it is gone.
    l.drop_path(p);
    assert!(l.is_empty());
    let idle = l.snapshot(&b, now);
    assert_eq!(idle.len(), 1, "{idle:?}");
    assert_eq!(
        (idle[0].level, idle[0].l1.as_deref(), idle[0].usage),
        (Level::L1, Some("k"), 0)
    );
    assert_eq!(idle[0].controls().quota.map(|(_, used)| used.used), Some(2));
    let p = path(&mut l, "q", Some("k"));
    assert!(l.check(&p, &b, false, true, now).is_err());
    // Another key has its own; the next window starts again.
    let other = path(&mut l, "q", Some("j"));
    l.check(&other, &b, false, true, now).unwrap();
    l.check(&p, &b, false, true, 11 * hour).unwrap();
    // Reset by an operator: at once.
    assert_eq!(
        l.reset_uses(Measure::Calls, &RulePattern::parse("q/*").unwrap()),
        1
    );
    l.check(&p, &b, false, true, now).unwrap();
    assert_eq!(l.take_use_writes(Measure::Calls)[0].1.used, 0);
    // A rejecting quota refuses instead, until the next window.
    let mut reject = Upsert::new(RulePattern::parse("q/*").unwrap(), Limit::Unlimited);
    reject.quota = Some(Quota {
        reject: true,
        ..("1/h".parse().unwrap())
    });
    b.apply_batch(&[reject], 2).unwrap();
    l.on_rules_changed(&b, &mut woken);
    let permit = l.try_acquire(&p, &b, now).unwrap();
    let refusal = l.refusal(&p, &b, now).expect("used up");
    assert_eq!(refusal.retry_after_ms, hour - 5);
    assert!(matches!(refusal.why, RefusalReason::QuotaExhausted { .. }));
    l.release(permit, &b, now, &mut woken);
}

/// A rule with `budget` (and `reserve`, when not 0) on `pattern`.
fn budget_book(pattern: &str, budget: &str, reserve: u64) -> RuleBook {
    let mut b = book(&[]);
    let mut rule = Upsert::new(RulePattern::parse(pattern).unwrap(), Limit::Unlimited);
    let mut parsed: crate::quota::Budget = budget.parse().unwrap();
    parsed.reserve = std::num::NonZeroU64::new(reserve);
    rule.budget = Some(parsed);
    b.apply_batch(&[rule], 1).unwrap();
    b
}

#[test]
fn a_budget_holds_new_calls_once_what_ended_calls_spent_reaches_it() {
    let hour = 3_600_000;
    let now = 10 * hour + 5;
    let b = budget_book("t/*", "100/h", 0);
    let mut l = Limiter::new();
    let mut woken = Vec::new();
    let p = path(&mut l, "t", Some("acme"));
    // Cost is known only when a call ends: two calls admitted at once both run.
    let first = l.try_acquire(&p, &b, now).unwrap();
    let second = l.try_acquire(&p, &b, now).unwrap();
    l.release(first, &b, now, &mut woken);
    l.charge(&p, &b, 70, None, now);
    l.check(&p, &b, false, true, now).unwrap();
    l.release(second, &b, now, &mut woken);
    l.charge(&p, &b, 45, None, now);
    // 115 of 100 spent: the overshoot is what the calls running then spent.
    let blocked = l.check(&p, &b, false, true, now).unwrap_err();
    assert_eq!(blocked.level, Level::L1);
    assert!(matches!(blocked.quota, Some((Measure::Cost, _, at)) if at == 11 * hour));
    // A resumption takes no new share: it passes; another key has its own budget.
    l.check(&p, &b, false, false, now).unwrap();
    let other = path(&mut l, "t", Some("globex"));
    l.check(&other, &b, false, true, now).unwrap();
    // Charged once per end, stored by name, and kept while the counter is gone.
    let writes = l.take_use_writes(Measure::Cost);
    assert_eq!(writes.len(), 1);
    assert_eq!((writes[0].0.as_str(), writes[0].1.used), ("t/acme", 115));
    assert!(
        l.take_use_writes(Measure::Calls).is_empty(),
        "no quota here"
    );
    l.drop_path(p);
    l.drop_path(other);
    let idle = l.snapshot(&b, now);
    assert_eq!(idle.len(), 1, "{idle:?}");
    assert_eq!(
        idle[0].controls().budget.map(|(_, used, _)| used.used),
        Some(115)
    );
    let p = path(&mut l, "t", Some("acme"));
    assert!(
        l.check(&p, &b, false, true, now).is_err(),
        "back with its use"
    );
    l.check(&p, &b, false, true, 11 * hour).unwrap();
    // An operator's reset lets it go at once.
    let pattern = RulePattern::parse("t/*").unwrap();
    assert_eq!(l.reset_uses(Measure::Cost, &pattern), 1);
    l.check(&p, &b, false, true, now).unwrap();
}

#[test]
fn a_reservation_bounds_what_runs_against_a_budget_and_settles_at_the_end() {
    let hour = 3_600_000;
    let now = 10 * hour;
    // 1000 per hour, 300 reserved per call: three calls may run at once, never a fourth.
    let b = budget_book("t", "1000/h", 300);
    let mut l = Limiter::new();
    let mut woken = Vec::new();
    let p = path(&mut l, "t", None);
    let mut running = Vec::new();
    for _ in 0..3 {
        let mut permit = l.try_acquire(&p, &b, now).unwrap();
        let reserved = permit.take_reserved().expect("reserved");
        assert_eq!(*reserved, [300, 0, 0]);
        l.release(permit, &b, now, &mut woken);
        running.push(reserved);
    }
    let blocked = l.check(&p, &b, false, true, now).unwrap_err();
    assert!(matches!(blocked.quota, Some((Measure::Cost, _, _))));
    assert_eq!(
        l.snapshot(&b, now)[0].controls().budget.map(|(_, _, r)| r),
        Some(900)
    );
    // One ends having spent 250: 250 spent and 600 held leave 150, less than a reservation.
    l.charge(&p, &b, 250, Some(&running.pop().unwrap()), now);
    assert!(l.check(&p, &b, false, true, now).is_err());
    // Another spends 10: 260 spent and 300 held leave room for one more.
    l.charge(&p, &b, 10, Some(&running.pop().unwrap()), now);
    l.check(&p, &b, false, true, now).unwrap();
    // A permit given back before its call took the reservation returns it.
    let permit = l.try_acquire(&p, &b, now).unwrap();
    assert_eq!(
        l.snapshot(&b, now)[0].controls().budget.map(|(_, _, r)| r),
        Some(600)
    );
    l.release(permit, &b, now, &mut woken);
    assert_eq!(
        l.snapshot(&b, now)[0].controls().budget.map(|(_, _, r)| r),
        Some(300)
    );
    // Calls that held reservations keep the counter while they run; at recovery a call that
    // ran before reserves again.
    l.drop_path(p);
    assert!(!l.is_empty(), "a reservation keeps the counter");
    let p = path(&mut l, "t", None);
    assert_eq!(l.reserve(&p, &b).as_deref(), Some(&[300, 0, 0]));
    l.charge(&p, &b, 0, Some(&running.pop().unwrap()), now);
    l.charge(&p, &b, 0, Some(&[300, 0, 0]), now);
    l.drop_path(p);
    assert_eq!(
        l.snapshot(&b, now)[0]
            .controls()
            .budget
            .map(|(_, u, r)| (u.used, r)),
        Some((260, 0))
    );
}

#[test]
fn a_waiter_held_by_a_reservation_is_woken_when_a_call_settles() {
    let now = 5_000;
    let b = budget_book("t", "10/h", 10);
    let mut l = Limiter::new();
    let mut woken = Vec::new();
    let p = path(&mut l, "t", None);
    let mut permit = l.try_acquire(&p, &b, now).unwrap();
    let reserved = permit.take_reserved().unwrap();
    l.release(permit, &b, now, &mut woken);
    let blocked = l.check(&p, &b, false, true, now).unwrap_err();
    l.park_for_token(blocked.counter, 7, &p, Priority::default(), None);
    assert!(!l.token_wake_due(now + 1), "parked until the window ends");
    // The call ends having spent nothing: its reservation back, the whole budget is free.
    l.charge(&p, &b, 0, Some(&reserved), now + 1);
    assert!(l.token_wake_due(now + 1));
    l.wake_due(now + 1, &b, &mut woken);
    assert_eq!(woken, [7]);
}

#[test]
fn a_stored_quota_use_comes_back_unless_its_window_ended() {
    let hour = 3_600_000;
    let mut b = book(&[]);
    let mut rule = Upsert::new(RulePattern::parse("q").unwrap(), Limit::Unlimited);
    rule.quota = Some("5/h".parse().unwrap());
    b.apply_batch(&[rule], 1).unwrap();
    let mut l = Limiter::new();
    let used = crate::quota::QuotaUse {
        window_start: 2 * hour,
        window_end: 3 * hour,
        used: 5,
    };
    assert!(
        !l.restore_use(Measure::Calls, "q".into(), used, 3 * hour),
        "ended"
    );
    assert!(l.restore_use(Measure::Calls, "q".into(), used, 2 * hour + 1));
    let p = path(&mut l, "q", None);
    assert!(
        l.check(&p, &b, false, true, 2 * hour + 2).is_err(),
        "used up before the restart"
    );
    l.check(&p, &b, false, true, 3 * hour).unwrap();
}

#[test]
fn a_scope_at_its_idle_count_bound_leaves_other_scopes_fresh_keys_admitted() {
    let mut b = book(&[]);
    let mut rules = Vec::new();
    for scope in ["q", "r"] {
        let pattern = RulePattern::parse(&format!("{scope}/*")).unwrap();
        let mut rule = Upsert::new(pattern, Limit::Unlimited);
        rule.quota = Some("5/h".parse().unwrap());
        rules.push(rule);
    }
    b.apply_batch(&rules, 1).unwrap();
    let mut l = Limiter::new();
    l.set_idle_quota_cap(10, 2);
    let mut woken = Vec::new();
    let now = 5;
    let mut run = |l: &mut Limiter, scope: &str, key: &str| -> Option<Refusal> {
        let p = path(l, scope, Some(key));
        if let Some(refused) = l.refusal(&p, &b, now) {
            l.drop_path(p);
            return Some(refused);
        }
        let permit = l.try_acquire(&p, &b, now).unwrap();
        l.drop_path(p);
        l.release(permit, &b, now, &mut woken);
        None
    };
    assert!(run(&mut l, "q", "k0").is_none());
    assert!(run(&mut l, "q", "k1").is_none());
    // Scope q keeps two idle counts (its L1 keys; the scope's own counter has no quota):
    // a third key of q is refused by q's bound, while r's fresh keys still come in.
    let refused = run(&mut l, "q", "k2").expect("q at its bound");
    assert_eq!(
        refused.why,
        RefusalReason::IdleQuotasFull {
            bound: IdleBound::Scope(2)
        }
    );
    assert!(
        run(&mut l, "r", "k0").is_none(),
        "another scope is not held"
    );
    assert!(run(&mut l, "r", "k1").is_none());
    assert!(run(&mut l, "r", "k2").is_some(), "r has its own bound");
    // A key of q already counting goes on.
    assert!(run(&mut l, "q", "k1").is_none());
}

#[test]
fn fresh_quota_keys_are_refused_while_the_idle_counts_are_at_their_bound() {
    let hour = 3_600_000;
    let mut b = book(&[]);
    let mut rule = Upsert::new(RulePattern::parse("q/*").unwrap(), Limit::Unlimited);
    rule.quota = Some("5/h".parse().unwrap());
    b.apply_batch(&[rule], 1).unwrap();
    let mut l = Limiter::new();
    l.set_idle_quota_cap(3, 3);
    let mut woken = Vec::new();
    let now = 5;
    let mut run = |l: &mut Limiter, key: &str, at: u64| -> Option<Refusal> {
        let p = path(l, "q", Some(key));
        if let Some(refused) = l.refusal(&p, &b, at) {
            l.drop_path(p);
            return Some(refused);
        }
        let permit = l.try_acquire(&p, &b, at).unwrap();
        l.drop_path(p);
        l.release(permit, &b, at, &mut woken);
        None
    };
    for key in ["k0", "k1", "k2"] {
        assert!(run(&mut l, key, now).is_none());
    }
    assert!(l.is_empty(), "all three are idle, their counts kept");
    // A fourth key would be a fourth count to keep: refused until the first window ends.
    let refused = run(&mut l, "k3", now).expect("at the bound");
    assert!(matches!(
        refused.why,
        RefusalReason::IdleQuotasFull {
            bound: IdleBound::Partition(3)
        }
    ));
    assert_eq!(refused.retry_after_ms, hour - now);
    // A key that is counting already goes on, and stays counted.
    assert!(run(&mut l, "k1", now).is_none());
    let k1 = l
        .snapshot(&b, now)
        .into_iter()
        .find(|c| c.l1.as_deref() == Some("k1"))
        .and_then(|c| c.controls().quota)
        .map(|(_, used)| used.used);
    assert_eq!(k1, Some(2), "its count was not reset");
    // Once the window ended, the kept counts are forgotten, in the store too, and a fresh
    // key gets in.
    l.take_use_writes(Measure::Calls);
    assert!(run(&mut l, "k3", hour).is_none());
    let writes = l.take_use_writes(Measure::Calls);
    let forgotten: Vec<&str> = writes
        .iter()
        .filter(|(_, used)| used.used == 0)
        .map(|(key, _)| key.as_str())
        .collect();
    assert_eq!(forgotten.len(), 3, "{writes:?}");
    assert!(
        writes
            .iter()
            .any(|(key, used)| key == "q/k3" && used.used == 1)
    );
}

/// A counter is three cache lines: what every admission reads in the first two, the rest in
/// the third (a fourth line costs every admission about a fifth more, measured).
#[test]
fn a_counter_is_three_cache_lines() {
    assert_eq!(std::mem::size_of::<Option<Node>>(), 192);
    assert!(std::mem::offset_of!(Node, waiters) + 24 <= 128);
    assert!(std::mem::offset_of!(Node, bucket) < 128);
}

#[test]
fn one_call_charges_at_most_its_reserve_and_the_cut_is_kept_as_an_overrun() {
    let now = 10 * 3_600_000;
    let b = budget_book("t", "1000/h", 100);
    let mut l = Limiter::new();
    let mut woken = Vec::new();
    let p = path(&mut l, "t", None);
    let mut permit = l.try_acquire(&p, &b, now).unwrap();
    let reserved = permit.take_reserved().unwrap();
    l.release(permit, &b, now, &mut woken);
    l.charge(&p, &b, u64::MAX, Some(&reserved), now);
    let shown = |l: &mut Limiter| {
        let c = &l.snapshot(&b, now)[0];
        (
            c.controls().budget.map(|(_, u, r)| (u.used, r)),
            c.controls().budget_overrun,
        )
    };
    assert_eq!(shown(&mut l), (Some((100, 0)), u64::MAX - 100));
    // Still room for the tenant's next call.
    l.check(&p, &b, false, true, now).unwrap();
    // Kept while the counter is gone, and back with it.
    l.drop_path(p);
    assert_eq!(shown(&mut l), (Some((100, 0)), u64::MAX - 100));
    let p = path(&mut l, "t", None);
    assert_eq!(shown(&mut l), (Some((100, 0)), u64::MAX - 100));
    // A charge dropped before it was stored takes back the same cut.
    l.uncharge(&p, &b, u64::MAX, now);
    assert_eq!(shown(&mut l), (Some((0, 0)), 0));
}

#[test]
fn a_burst_budget_raises_the_limit_until_its_time_above_is_spent_then_per_window() {
    let hour = 3_600_000;
    let t0 = 10 * hour;
    let mut b = RuleBook::new();
    let mut scope = Upsert::new(
        RulePattern::parse("bb").unwrap(),
        Limit::Concurrency(NonZeroU32::new(2).unwrap()),
    );
    // Twice the limit, for 1 s above it per hour.
    scope.burst_budget = Some(crate::quota::BurstBudget {
        factor_pct: NonZeroU32::new(200).unwrap(),
        budget: "1000/h".parse().unwrap(),
    });
    // A key's own limit still holds during the burst.
    let key = Upsert::new(
        RulePattern::parse("bb/*").unwrap(),
        Limit::Concurrency(NonZeroU32::new(3).unwrap()),
    );
    b.apply_batch(&[scope, key], 1).unwrap();
    let mut l = Limiter::new();
    let (a, c) = (path(&mut l, "bb", Some("a")), path(&mut l, "bb", Some("c")));
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(l.try_acquire(&a, &b, t0).unwrap());
    }
    let blocked = l.try_acquire(&a, &b, t0).unwrap_err();
    assert_eq!(
        blocked.level,
        Level::L1,
        "the key's 3 holds under the burst"
    );
    held.push(l.try_acquire(&c, &b, t0).unwrap());
    let blocked = l.try_acquire(&c, &b, t0).unwrap_err();
    assert_eq!(blocked.level, Level::Scope, "4 = 2 x 2 at the scope");
    // 600 ms above: 400 left, still 4.
    let snap = l.snapshot(&b, t0 + 600);
    let scope_row = snap.iter().find(|s| s.level == Level::Scope).unwrap();
    assert_eq!(
        scope_row.limit,
        Limit::Concurrency(NonZeroU32::new(4).unwrap())
    );
    assert_eq!(
        scope_row.controls().burst_budget.map(|(_, used)| used.used),
        Some(600)
    );
    // Back to 2 at once: the time below the limit is not counted.
    let mut woken = Vec::new();
    for permit in held.drain(..2) {
        l.release(permit, &b, t0 + 600, &mut woken);
    }
    let snap = l.snapshot(&b, t0 + 5_000);
    let scope_row = snap.iter().find(|s| s.level == Level::Scope).unwrap();
    assert_eq!(
        scope_row.controls().burst_budget.map(|(_, used)| used.used),
        Some(600)
    );
    // Above again for 400 ms: spent, and the limit is 2 again (nothing running is stopped).
    held.push(l.try_acquire(&a, &b, t0 + 5_000).unwrap());
    held.push(l.try_acquire(&c, &b, t0 + 5_000).unwrap());
    let blocked = l.check(&a, &b, false, true, t0 + 5_400).unwrap_err();
    assert_eq!(blocked.level, Level::Scope);
    let snap = l.snapshot(&b, t0 + 5_400);
    let scope_row = snap.iter().find(|s| s.level == Level::Scope).unwrap();
    assert_eq!(
        scope_row.limit,
        Limit::Concurrency(NonZeroU32::new(2).unwrap())
    );
    assert_eq!(scope_row.usage, 4);
    assert_eq!(
        scope_row.controls().burst_budget.map(|(_, used)| used.used),
        Some(1_000)
    );
    // Stored as it changed; the next hour has a fresh budget.
    let writes = l.take_use_writes(Measure::Burst);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!((writes[0].0.as_str(), writes[0].1.used), ("bb", 1_000));
    for permit in held.drain(..) {
        l.release(permit, &b, 11 * hour, &mut woken);
    }
    let permits: Vec<_> = (0..3)
        .map(|_| l.try_acquire(&a, &b, 11 * hour).unwrap())
        .collect();
    assert_eq!(permits.len(), 3, "above 2 again in the next hour");
}

#[test]
fn a_bounded_view_keeps_the_busiest_of_its_scope_and_counts_the_rest() {
    let b = book(&[("a/*", 1)]);
    let mut l = Limiter::new();
    let mut paths = Vec::new();
    // Key kN of scope a has N waiting; scope b has one key with 50.
    for n in 1..=20u32 {
        let p = path(&mut l, "a", Some(&format!("k{n}")));
        for _ in 0..n {
            l.count_queued(&p, true);
        }
        paths.push(p);
    }
    let other = path(&mut l, "b", Some("x"));
    for _ in 0..50 {
        l.count_queued(&other, true);
    }
    let everything = l.view(&b, 0, &ReadView::ALL);
    assert_eq!(everything.total, 23, "two scopes and 21 keys");
    assert_eq!(everything.counters.len(), 23);
    let view = ReadView {
        scope: Some("a".into()),
        limit: Some(3),
    };
    let page = l.view(&b, 0, &view);
    assert_eq!(page.total, 21, "scope a and its 20 keys");
    let shown: Vec<(Option<&str>, u32)> = page
        .counters
        .iter()
        .map(|c| (c.l1.as_deref(), c.queued))
        .collect();
    assert_eq!(
        shown,
        vec![(None, 210), (Some("k20"), 20), (Some("k19"), 19)],
        "the busiest first"
    );
    // Another partition's page: totals add up, the busiest of both stay.
    let mut elsewhere = Limiter::new();
    let c = path(&mut elsewhere, "c", None);
    for _ in 0..50 {
        elsewhere.count_queued(&c, true);
    }
    let theirs = elsewhere.view(&b, 0, &ReadView::ALL);
    let merged = CounterPage::merge([page, theirs], Some(2));
    assert_eq!(merged.total, 22);
    let busiest: Vec<u32> = merged.counters.iter().map(|c| c.queued).collect();
    assert_eq!(busiest, vec![210, 50]);
}

#[test]
fn an_unbounded_merge_keeps_the_largest_page_where_it_is_and_a_counter_without_controls_boxes_none()
{
    let b = book(&[("a/*", 1)]);
    let mut l = Limiter::new();
    for n in 0..100 {
        let p = path(&mut l, "a", Some(&format!("k{n}")));
        l.count_queued(&p, true);
    }
    let mut small = Limiter::new();
    let p = path(&mut small, "b", None);
    small.count_queued(&p, true);
    let large = l.view(&b, 0, &ReadView::ALL);
    let kept = large.counters.as_ptr();
    // Other partitions with none: the largest page is the merged one, not moved.
    let none = Limiter::new().view(&b, 0, &ReadView::ALL);
    let merged = CounterPage::merge([none, large], None);
    assert_eq!((merged.total, merged.counters.len()), (101, 101));
    assert_eq!(
        merged.counters.as_ptr(),
        kept,
        "not moved into a new vector"
    );
    // With some: theirs follow it.
    let merged = CounterPage::merge([small.view(&b, 0, &ReadView::ALL), merged], None);
    assert_eq!((merged.total, merged.counters.len()), (102, 102));
    assert!(
        merged.counters.iter().take(101).all(|c| c.scope == "a"),
        "the largest page's counters first, as they were"
    );
    // A concurrency limit and a weight are no controls to box; a queue bound is.
    assert!(merged.counters.iter().all(|c| c.controls.is_none()));
    assert!(
        std::mem::size_of::<CounterSnapshot>() <= 128,
        "{}",
        std::mem::size_of::<CounterSnapshot>()
    );
    let mut bounded = RuleBook::new();
    let rule = Upsert {
        max_queued: NonZeroU32::new(5),
        ..Upsert::new(RulePattern::parse("a/*").unwrap(), Limit::Unlimited)
    };
    bounded.apply_batch(&[rule], 1).unwrap();
    let mut l = Limiter::new();
    let p = path(&mut l, "a", Some("k0"));
    l.count_queued(&p, true);
    let mut bound: Vec<Option<u32>> = l
        .view(&bounded, 0, &ReadView::ALL)
        .counters
        .iter()
        .map(|c| c.controls().max_queued)
        .collect();
    bound.sort();
    assert_eq!(bound, [None, Some(5)], "the scope's and its key's");
}

#[test]
fn sums_by_rule_and_level_add_up_what_every_snapshot_shows() {
    let b = book(&[("a/*", 2), ("b", 5)]);
    let mut l = Limiter::new();
    let mut held = Vec::new();
    for n in 1..=6u32 {
        let p = path(&mut l, "a", Some(&format!("k{n}")));
        for _ in 0..n {
            l.count_queued(&p, true);
        }
        if let Ok(permit) = l.try_acquire(&p, &b, 0) {
            held.push(permit);
        }
    }
    let p = path(&mut l, "b", None);
    for _ in 0..4 {
        l.count_queued(&p, true);
    }
    held.push(l.try_acquire(&p, &b, 0).unwrap());
    let sums = l.sums(&b, 0);
    let snapshots = l.snapshot(&b, 0);
    let mut expected: Vec<(String, Level, u64, u64, u64)> = Vec::new();
    for c in &snapshots {
        let rule = c.rule.as_ref().map_or("none".to_owned(), |r| r.to_string());
        match expected.iter_mut().find(|e| e.0 == rule && e.1 == c.level) {
            Some(e) => {
                e.2 += 1;
                e.3 += u64::from(c.usage);
                e.4 += u64::from(c.queued);
            }
            None => expected.push((rule, c.level, 1, c.usage.into(), c.queued.into())),
        }
    }
    let mut got: Vec<(String, Level, u64, u64, u64)> = sums
        .rules
        .iter()
        .map(|s| {
            let rule = s.rule.as_ref().map_or("none".to_owned(), |r| r.to_string());
            (rule, s.level, s.counters, s.running, s.waiting)
        })
        .collect();
    expected.sort();
    got.sort();
    assert_eq!(got, expected);
    assert!(got.iter().any(|g| g.0 == "a/*" && g.2 == 6 && g.3 == 6));
    let scopes: Vec<(&str, u64)> = sums.scopes.iter().map(|(s, n)| (s.as_str(), *n)).collect();
    assert_eq!(scopes, vec![("a", 21), ("b", 4)], "waiting per scope");
    // Two partitions' sums merge by pattern.
    let twice = FlowSums::merge([sums.clone(), sums]);
    let a = twice
        .rules
        .iter()
        .find(|s| s.rule.as_ref().is_some_and(|r| r.to_string() == "a/*"))
        .unwrap();
    assert_eq!((a.counters, a.waiting), (12, 42));
    drop(held);
}
