//! Throughput and latency of the flow core. `cargo bench -p sluice-flow --bench flow`.

mod common;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_flow::ReadView;
use sluice_flow::limiter::{CounterPath, Limiter};
use sluice_flow::scheduler::{EntryKind, Scheduler};
use sluice_flow::{Level, LimitKey, RateLimit, Scope};

/// Paths held for this many distinct keys (as queues hold them in a partition).
const HELD_PATHS: usize = 100_000;

fn admit_release(c: &mut Criterion) {
    let book = common::book();
    let mut limiter = Limiter::new();
    let paths: Vec<CounterPath> = (0..HELD_PATHS)
        .map(|i| {
            let (scope, key) = common::parsed(common::scattered(i));
            limiter.path(&scope, Some(&key))
        })
        .collect();
    let mut woken = Vec::new();
    let mut i = 0;
    c.bench_function("limiter/admit+release (held path, 3 levels)", |b| {
        b.iter(|| {
            let path = &paths[i % HELD_PATHS];
            i += 1;
            let permit = limiter.try_acquire(black_box(path), &book, 0).unwrap();
            limiter.release(permit, &book, 0, &mut woken);
        })
    });

    // Every rule also rate limited: a million a second with a burst of a million, time moving
    // 1 ms per admission, so no token runs out and the bucket's cost is what is measured.
    let rated = common::book_with_rate(Some(RateLimit {
        rate: "1000000/s".parse().unwrap(),
        burst: NonZeroU32::new(1_000_000).unwrap(),
        reject: false,
    }));
    let mut rate_limiter = Limiter::new();
    let rated_paths: Vec<CounterPath> = (0..HELD_PATHS)
        .map(|i| {
            let (scope, key) = common::parsed(common::scattered(i));
            rate_limiter.path(&scope, Some(&key))
        })
        .collect();
    let mut k = 0u64;
    c.bench_function(
        "limiter/admit+release with rates (held path, 3 levels)",
        |b| {
            b.iter(|| {
                let path = &rated_paths[k as usize % HELD_PATHS];
                k += 1;
                let permit = rate_limiter
                    .try_acquire(black_box(path), &rated, k)
                    .unwrap();
                rate_limiter.release(permit, &rated, 0, &mut woken);
            })
        },
    );

    // Every control on every rule (issue 39's target: at least 4 M pairs a second).
    let every = common::book_with_every_control();
    let mut every_limiter = Limiter::new();
    let every_paths: Vec<CounterPath> = (0..HELD_PATHS)
        .map(|i| {
            let (scope, key) = common::parsed(common::scattered(i));
            every_limiter.path(&scope, Some(&key))
        })
        .collect();
    let mut t = 0u64;
    c.bench_function(
        "limiter/admit+release with every control (held path, 3 levels)",
        |b| {
            b.iter(|| {
                let path = &every_paths[t as usize % HELD_PATHS];
                t += 1;
                let permit = every_limiter
                    .try_acquire(black_box(path), &every, t)
                    .unwrap();
                every_limiter.release(permit, &every, t, &mut woken);
            })
        },
    );

    let keys: Vec<(Scope, LimitKey)> = (0..HELD_PATHS)
        .map(|i| common::parsed(common::scattered(i + HELD_PATHS)))
        .collect();
    let mut fresh = Limiter::new();
    let mut j = 0;
    c.bench_function("limiter/path+admit+release+drop (by name, cold key)", |b| {
        b.iter(|| {
            let (scope, key) = &keys[j % HELD_PATHS];
            j += 1;
            let path = fresh.path(scope, Some(key));
            let permit = fresh.try_acquire(&path, &book, 0).unwrap();
            fresh.release(permit, &book, 0, &mut woken);
            fresh.drop_path(path);
        })
    });
}

fn resolve(c: &mut Criterion) {
    let book = common::book();
    let names: Vec<(String, String, String)> = (0..4096)
        .map(|i| common::names(common::scattered(i)))
        .collect();
    for level in Level::ALL {
        let mut i = 0;
        c.bench_function(&format!("rules/resolve {level} (1,000 rules)"), |b| {
            b.iter(|| {
                let (s, a, r) = &names[i % names.len()];
                i += 1;
                black_box(book.resolve(level, s, Some(a), Some(r)))
            })
        });
    }
}

fn scheduler(c: &mut Criterion) {
    let book = Arc::new(common::book());
    let mut sched = Scheduler::new(book, u32::MAX);
    let keys = common::queue_keys(10_000);
    let mut id = 0u64;
    c.bench_function("scheduler/enqueue+dispatch+release (10k queues)", |b| {
        b.iter(|| {
            id += 1;
            let key = &keys[id as usize % keys.len()];
            sched.enqueue(key, id, EntryKind::New, None, id);
            for dispatch in sched.poll_runnable(id) {
                sched.release(dispatch.permit, id);
            }
        })
    });
}

/// Reading the counters with 700,000 keys live in one scope, each with a call waiting (the
/// case `proxy/benches/load/keys.sh` builds): all of them, against the busiest thousand.
fn counter_reads(c: &mut Criterion) {
    let book = common::book();
    let mut limiter = Limiter::new();
    let scope = Scope::parse("held").unwrap();
    let paths: Vec<CounterPath> = (0..700_000)
        .map(|i| {
            let key = LimitKey::parse(&format!("k{i}")).unwrap();
            let path = limiter.path(&scope, Some(&key));
            limiter.count_queued(&path, true);
            path
        })
        .collect();
    let mut group = c.benchmark_group("limiter/read counters (700k keys)");
    group.sample_size(10);
    group.bench_function("every counter", |b| {
        b.iter(|| black_box(limiter.view(&book, 0, &ReadView::ALL).counters.len()))
    });
    let busiest = ReadView {
        scope: Some("held".into()),
        limit: Some(1_000),
    };
    group.bench_function("the busiest 1,000 of the scope", |b| {
        b.iter(|| black_box(limiter.view(&book, 0, &busiest).counters.len()))
    });
    group.bench_function("sums by rule and level (gauges, history)", |b| {
        b.iter(|| black_box(limiter.sums(&book, 0).rules.len()))
    });
    group.finish();
    black_box(paths.len());
}

criterion_group!(benches, admit_release, resolve, scheduler, counter_reads);
criterion_main!(benches);
