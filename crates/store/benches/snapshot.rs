//! What a whole snapshot of one partition costs to read from a store holding 24 partitions'
//! rows: keyed by the cluster's partition count (the partition's rows are a range), and keyed
//! by another count (every row of every partition is read to find the partition's: what every
//! snapshot cost before rows were keyed by partition). `cargo bench -p sluice-store --bench
//! snapshot`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_core::ids::InvocationId;
use sluice_store::schema;
use sluice_store::storage::Store;
use sluice_store::storage::changes::Changes;
use sluice_store::storage::fencing::Position;
use sluice_store::storage::snapshot;
use sluice_store::storage::writer::WriteSet;

const PARTITIONS: u32 = 24;
/// Completed invocations held, over all partitions: a record and three journal entries each.
const INVOCATIONS: u64 = 48_000;

fn filled(partitions: u32) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.use_partitions(partitions).unwrap();
    for chunk in 0..INVOCATIONS / 1_000 {
        let mut writes = WriteSet::default();
        for n in chunk * 1_000..(chunk + 1) * 1_000 {
            let id = InvocationId::new(n, u128::from(n));
            writes.put(schema::INVOCATIONS, &id.to_bytes(), vec![7u8; 600]);
            for entry in 0..3u32 {
                let key = [&id.to_bytes()[..], &entry.to_be_bytes()].concat();
                writes.put(schema::JOURNAL, &key, vec![1u8; 130]);
            }
        }
        for p in 0..PARTITIONS {
            Position {
                next: 1,
                ..Position::default()
            }
            .save(p, &mut writes);
        }
        store
            .with_db(|db| {
                let txn = db.begin_write().unwrap();
                writes.apply(&txn).unwrap();
                txn.commit().unwrap();
            })
            .unwrap();
    }
    (dir, store)
}

fn whole_snapshot(c: &mut Criterion) {
    let mut group = c.benchmark_group("whole snapshot of 1 of 24 partitions");
    group.sample_size(20);
    for (name, keyed_by) in [
        ("rows keyed by partition", PARTITIONS),
        ("every row read", 1),
    ] {
        let (_dir, store) = filled(keyed_by);
        let changes = Changes::new(1 << 20);
        group.bench_function(name, |b| {
            b.iter(|| {
                let exported = store
                    .with_db(|db| snapshot::export(db, 5, PARTITIONS, 1 << 20, 0, &changes, true))
                    .unwrap()
                    .unwrap()
                    .unwrap();
                black_box(exported.chunks.len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, whole_snapshot);
criterion_main!(benches);
