//! What applying the log to the view costs: one applier batch of invocations that were created,
//! ran and completed within it, into a view already holding many. `cargo bench -p sluice-store
//! --bench apply`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_store::schema;
use sluice_store::storage::Store;
use sluice_store::storage::writer::WriteSet;

/// Invocations per applied batch: 2 ms of calls at 10 k/s.
const BATCH: u64 = 20;

/// A scoped call's stored record, with a limit key of its own (as `keys.sh` sends them): what
/// the view's applier reads to index it by scope and key.
fn record(id: u64) -> Vec<u8> {
    use sluice_store::invocation::{InvocationRecord, Target};
    let mut record = InvocationRecord::new(
        sluice_core::ids::InvocationId::generate(id),
        Target {
            service: "Meter".into(),
            handler: "hold".into(),
            key: None,
        },
        1_800_000_000_000 + id,
    );
    record.scope = Some(sluice_flow::Scope::parse("held").unwrap());
    record.limit_key = Some(sluice_flow::LimitKey::parse(&format!("k{id}")).unwrap());
    record.idempotency_key = Some(format!("request-{id}"));
    record.encode()
}

/// The writes one call leaves across its groups: its record put as it is created, runs and
/// completes; three journal entries; its output.
fn lifecycle(id: u64) -> Vec<WriteSet> {
    let key = id.to_be_bytes();
    let record = record(id);
    let mut sets = Vec::new();
    let mut created = WriteSet::default();
    created.put(schema::INVOCATIONS, &key, record.clone());
    created.put(schema::JOURNAL, &[&key[..], &[0]].concat(), vec![1u8; 100]);
    sets.push(created);
    let mut running = WriteSet::default();
    running.put(schema::INVOCATIONS, &key, record.clone());
    running.put(schema::JOURNAL, &[&key[..], &[1]].concat(), vec![2u8; 100]);
    sets.push(running);
    let mut completed = WriteSet::default();
    completed.put(schema::INVOCATIONS, &key, record);
    completed.put(schema::JOURNAL, &[&key[..], &[2]].concat(), vec![3u8; 100]);
    sets.push(completed);
    sets
}

fn apply_batch(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    // A view holding 50,000 invocations already.
    for chunk in 0..50 {
        let mut set = WriteSet::default();
        for id in chunk * 1000..(chunk + 1) * 1000 {
            for mut part in lifecycle(id) {
                set.append(&mut part);
            }
        }
        store
            .with_db(|db| {
                let txn = db.begin_write().unwrap();
                set.apply(&txn).unwrap();
                txn.commit().unwrap();
            })
            .unwrap();
    }
    let mut next = 1_000_000u64;
    c.bench_function(
        "view/apply a batch of 20 calls' groups (3 sets each)",
        |b| {
            b.iter(|| {
                // Groups interleave as calls do: every call's first set, then every second...
                let calls: Vec<Vec<WriteSet>> = (next..next + BATCH).map(lifecycle).collect();
                next += BATCH;
                let mut ordered = Vec::new();
                for step in 0..3 {
                    for call in &calls {
                        ordered.push(&call[step]);
                    }
                }
                store
                    .with_db(|db| {
                        let mut txn = db.begin_write().unwrap();
                        txn.set_durability(redb::Durability::None).unwrap();
                        WriteSet::apply_all(black_box(ordered.iter().copied()), &txn).unwrap();
                        txn.commit().unwrap();
                    })
                    .unwrap();
            })
        },
    );
}

criterion_group!(benches, apply_batch);
criterion_main!(benches);
