//! What the order of store keys costs a group commit: `sets` invocations per commit (a 300-byte
//! record and two 60-byte journal rows each), keyed by a prefix and a time-ordered id, where the
//! prefix is one value (`seq`: a scope's ids), one of 16 (`lanes16`), random (`random`: spread
//! unkeyed ids at first), or time above 16 random bits (`timed`: spread unkeyed ids now). Prints
//! wall and CPU time per commit.
//!
//! `cargo run --release -p sluice-store --example key_locality -- random 8 4000`
use redb::{Database, TableDefinition};
use std::time::Instant;
const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
const JOURNAL: TableDefinition<&[u8], &[u8]> = TableDefinition::new("journal");
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: key_locality seq|lanes16|random|timed <sets per commit> <commits>";
    let mode = args.get(1).expect(usage).as_str();
    let sets: u64 = args.get(2).and_then(|a| a.parse().ok()).expect(usage);
    let commits: u64 = args.get(3).and_then(|a| a.parse().ok()).expect(usage);
    let dir = std::env::temp_dir().join(format!("key-locality-{mode}-{}", std::process::id()));
    let db = Database::builder()
        .set_cache_size(64 << 20)
        .create(&dir)
        .unwrap();
    let mut x: u64 = 0x9e3779b97f4a7c15;
    let mut seq: u64 = 0;
    let value = vec![7u8; 300];
    let entry = vec![3u8; 60];
    let started = Instant::now();
    let cpu0 = cpu();
    for commit in 0..commits {
        let txn = db.begin_write().unwrap();
        {
            let mut records = txn.open_table(RECORDS).unwrap();
            let mut journal = txn.open_table(JOURNAL).unwrap();
            for _ in 0..sets {
                seq += 1;
                // xorshift: a cheap, repeatable stand-in for random partition keys.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let prefix = match mode {
                    "seq" => 42u64,
                    "lanes16" => 42 + (x % 16),
                    // Spread ids as `InvocationId::spread` makes them: time (one ms per
                    // commit) above 16 spread bits.
                    "timed" => ((1_700_000_000_000 + commit) << 16) | (x & 0xffff),
                    _ => x,
                };
                let mut key = Vec::with_capacity(24);
                key.extend_from_slice(&prefix.to_be_bytes());
                key.extend_from_slice(&(seq as u128).to_be_bytes());
                records.insert(key.as_slice(), value.as_slice()).unwrap();
                for i in 0u32..2 {
                    let mut k = key.clone();
                    k.extend_from_slice(&i.to_be_bytes());
                    journal.insert(k.as_slice(), entry.as_slice()).unwrap();
                }
            }
        }
        txn.commit().unwrap();
    }
    let wall = started.elapsed();
    let cpu = cpu() - cpu0;
    println!(
        "{mode:8} sets/commit {sets:3}: {:7.1} us wall, {:7.1} us cpu per commit ({} rows stored)",
        wall.as_secs_f64() * 1e6 / commits as f64,
        cpu * 1e6 / commits as f64,
        seq
    );
    let _ = std::fs::remove_file(&dir);
}
fn cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}
