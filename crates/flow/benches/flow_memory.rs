//! Bytes per held entry and per live counter, counted by an instrumented allocator.
//! `cargo bench -p sluice-flow --bench flow_memory` prints them.

mod common;

use std::alloc::System;
use std::num::NonZeroU32;
use std::sync::Arc;

use sluice_flow::limiter::{CounterPath, Limiter};
use sluice_flow::scheduler::{EntryKind, QueueKey, Scheduler};
use sluice_flow::{Limit, RuleBook, RulePattern, Upsert};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const QUEUES: usize = 10_000;
const ENTRIES: u64 = 1_000_000;
const COUNTER_KEYS: usize = 100_000;

fn live_bytes(region: &Region<'_, System>) -> i64 {
    let stats = region.change();
    stats.bytes_allocated as i64 - stats.bytes_deallocated as i64 + stats.bytes_reallocated as i64
}

fn held_entries() {
    // One slot per scope: everything past the first entry of each scope is held in its queue.
    let mut book = RuleBook::new();
    let one = Limit::Concurrency(NonZeroU32::MIN);
    book.apply_batch(&[Upsert::new(RulePattern::parse("*").unwrap(), one)], 0)
        .unwrap();
    let keys = common::queue_keys(QUEUES);
    let region = Region::new(GLOBAL);
    let mut sched = Scheduler::new(Arc::new(book), u32::MAX);
    for id in 0..ENTRIES {
        sched.enqueue(&keys[id as usize % QUEUES], id, EntryKind::New, None, 0);
    }
    let dispatched = sched.poll_runnable(0).len() as u64;
    let held = ENTRIES - dispatched;
    let bytes = live_bytes(&region);
    println!(
        "held entries: {held} in {QUEUES} queues, {bytes} bytes live => {:.1} bytes per held entry (queues, counters and locks amortized)",
        bytes as f64 / held as f64
    );
    std::hint::black_box(sched);
}

/// One waiting call per limit key, every key of one scope held to one call at a time: what a
/// key of its own costs the scheduler (its queue, its counter, their index entries), as
/// `proxy/benches/load/keys.sh` fills a million of them.
fn one_call_per_key() {
    let mut book = RuleBook::new();
    let one = Limit::Concurrency(NonZeroU32::MIN);
    book.apply_batch(&[Upsert::new(RulePattern::parse("*").unwrap(), one)], 0)
        .unwrap();
    let scope = sluice_flow::Scope::parse("held").unwrap();
    let keys: Vec<QueueKey> = (0..COUNTER_KEYS)
        .map(|i| QueueKey {
            scope: Some(scope.clone()),
            limit_key: Some(sluice_flow::LimitKey::parse(&format!("k{i}")).unwrap()),
            service: "Meter".into(),
            object_key: None,
            priority: Default::default(),
        })
        .collect();
    let region = Region::new(GLOBAL);
    let mut sched = Scheduler::new(Arc::new(book), u32::MAX);
    for (id, key) in keys.iter().enumerate() {
        sched.enqueue(key, id as u64, EntryKind::New, None, 0);
    }
    let held = (COUNTER_KEYS - sched.poll_runnable(0).len()) as f64;
    let bytes = live_bytes(&region);
    println!(
        "one call per key: {held} waiting under {COUNTER_KEYS} keys, {bytes} bytes live => {:.1} bytes per waiting call",
        bytes as f64 / held
    );
    std::hint::black_box(sched);
}

fn live_counters() {
    let region = Region::new(GLOBAL);
    let mut limiter = Limiter::new();
    let paths: Vec<CounterPath> = (0..COUNTER_KEYS)
        .map(|i| {
            let (scope, key) = common::parsed(common::scattered(i));
            limiter.path(&scope, Some(&key))
        })
        .collect();
    let bytes =
        live_bytes(&region) - (paths.capacity() * std::mem::size_of::<CounterPath>()) as i64;
    println!(
        "live counters: {} for {COUNTER_KEYS} keys, {bytes} bytes => {:.1} bytes per live counter",
        limiter.len(),
        bytes as f64 / limiter.len() as f64
    );
    std::hint::black_box((limiter, paths));
}

fn main() {
    // `cargo bench` passes `--bench`; a filter-only run (`cargo test --benches`) skips the work.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    held_entries();
    one_call_per_key();
    live_counters();
}
