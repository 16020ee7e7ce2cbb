//! What flow-control counters used of their quotas (`quota = "10000/day"`), budgets
//! (`budget = "1000000/day"`) and burst budgets (ms above their concurrency), per partition, so a restart or a leader change does not hand out
//! a fresh quota or budget. A quota's use is written with the admissions that use it
//! (`partition/admission.rs`), a budget's with the ends of the calls that spent it
//! (`partition/charges.rs`); both are read back at recovery.

use redb::ReadableDatabase;

use super::store::storage;
use crate::storage::writer::WriteSet;
use sluice_core::errors::{Code, CodedError};
use sluice_flow::{Measure, QuotaUse};

use crate::schema::{FLOW_BUDGETS, FLOW_BURSTS, FLOW_QUOTAS};

/// The table holding the uses of `m`.
fn table(m: Measure) -> crate::schema::BytesTable {
    match m {
        Measure::Calls => FLOW_QUOTAS,
        Measure::Cost => FLOW_BUDGETS,
        Measure::Burst => FLOW_BURSTS,
    }
}

/// Longest counter name stored: three names, each bounded where it is parsed.
const MAX_KEY: usize = 1024;

fn row(partition: u32, counter: &str) -> Vec<u8> {
    let mut out = partition.to_be_bytes().to_vec();
    out.extend_from_slice(counter.as_bytes());
    out
}

/// Stores what `counter` (`scope[/l1[/l2]]`) of `partition` used of `m`; a use of 0 is
/// forgotten.
pub fn put(writes: &mut WriteSet, m: Measure, partition: u32, counter: &str, used: QuotaUse) {
    if used.used == 0 {
        writes.delete(table(m), &row(partition, counter));
    } else {
        writes.put(table(m), &row(partition, counter), used.encode().to_vec());
    }
}

/// Forgets what `counter` of `partition` used of `m` (its window ended).
pub fn forget(writes: &mut WriteSet, m: Measure, partition: u32, counter: &str) {
    writes.delete(table(m), &row(partition, counter));
}

/// What the counters of `partition` used of `m`, by name.
pub fn load(
    db: &redb::Database,
    m: Measure,
    partition: u32,
) -> Result<Vec<(String, QuotaUse)>, CodedError> {
    let txn = db.begin_read().map_err(storage)?;
    let Ok(table) = txn.open_table(table(m)) else {
        return Ok(Vec::new());
    };
    let start = partition.to_be_bytes();
    let mut out = Vec::new();
    for row in table.range(start.as_slice()..).map_err(storage)? {
        let (key, value) = row.map_err(storage)?;
        let raw = key.value();
        if raw[..4.min(raw.len())] != start {
            break;
        }
        let bad = |why: &str| {
            CodedError::new(
                Code::STO0002,
                format!(
                    "a stored {} use of partition {partition} does not decode: {why}",
                    m.as_str()
                ),
            )
        };
        let name = std::str::from_utf8(&raw[4..])
            .ok()
            .filter(|n| !n.is_empty() && n.len() <= MAX_KEY)
            .ok_or_else(|| bad("its counter name is not a name"))?;
        let used = QuotaUse::decode(value.value()).ok_or_else(|| bad("not 24 bytes"))?;
        out.push((name.to_owned(), used));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_use_is_stored_per_partition_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("q.redb")).unwrap();
        let used = QuotaUse {
            window_start: 10,
            window_end: 20,
            used: 7,
        };
        let mut writes = WriteSet::default();
        put(&mut writes, Measure::Calls, 1, "acme/gold", used);
        put(&mut writes, Measure::Calls, 2, "other", used);
        put(
            &mut writes,
            Measure::Calls,
            1,
            "zero",
            QuotaUse { used: 0, ..used },
        );
        put(
            &mut writes,
            Measure::Cost,
            1,
            "acme",
            QuotaUse { used: 9, ..used },
        );
        let txn = db.begin_write().unwrap();
        writes.apply(&txn).unwrap();
        txn.commit().unwrap();
        assert_eq!(
            load(&db, Measure::Calls, 1).unwrap(),
            vec![("acme/gold".to_owned(), used)]
        );
        assert_eq!(
            load(&db, Measure::Cost, 1).unwrap(),
            vec![("acme".to_owned(), QuotaUse { used: 9, ..used })]
        );
        assert_eq!(load(&db, Measure::Calls, 3).unwrap(), Vec::new());
    }
}
