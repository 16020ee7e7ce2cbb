//! Which partitions' rows a query reads. Embedded, every partition is here. In cluster mode a
//! node's store keeps only the partitions it leads or stands by for, and a partition's live
//! state (queues, counters, locks) exists only on its leader: so a query asked of one node
//! reads each partition's rows from its leader, this node's own and the others' fetched from
//! them (`docs/cluster.md`, "Reads").

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use datafusion::arrow::array::{Array, BooleanArray, RecordBatch, StringArray, UInt64Array};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::error::{DataFusionError, Result};

/// What a cluster-wide scan asks of the other leading nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// The table.
    pub table: &'static str,
    /// The columns wanted, in order (never empty).
    pub columns: Vec<String>,
    /// Only this scope's rows (the query's `scope = '…'`), when set.
    pub scope: Option<String>,
    /// Only this limit key's rows (the query's `limit_key = '…'`), when set.
    pub limit_key: Option<String>,
    /// Any this many rows will do (the query's `LIMIT`, with no filter in between), when set.
    pub limit: Option<usize>,
}

/// One node's answer to an [`Ask`].
#[derive(Debug)]
pub struct Share {
    /// Who answered (for errors).
    pub node: String,
    /// The partitions it led when it read them: its rows are theirs.
    pub led: Vec<usize>,
    /// Its rows, of the asked columns.
    pub batches: Vec<RecordBatch>,
}

/// Fetches a table's rows from every other node leading partitions; an error says which node
/// or partition could not be read (the query fails with it, to be retried).
pub type Gather = Arc<
    dyn Fn(Ask) -> Pin<Box<dyn Future<Output = std::result::Result<Vec<Share>, String>> + Send>>
        + Send
        + Sync,
>;

/// How far a query reaches.
#[derive(Clone, Default)]
pub enum Reach {
    /// This node's rows (embedded: all of them).
    #[default]
    Here,
    /// One node's share of a cluster-wide query: the rows of the partitions it leads, as
    /// `led` (a snapshot taken once for the whole query) says.
    Led(Arc<Vec<bool>>),
    /// Cluster-wide: the partitions led here, the others' rows through the gather.
    Cluster(Gather),
}

impl std::fmt::Debug for Reach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Here => f.write_str("Here"),
            Self::Led(led) => f.debug_tuple("Led").field(led).finish(),
            Self::Cluster(_) => f.write_str("Cluster"),
        }
    }
}

/// Whose rows a table holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// The cluster's (the rule book, the registry) or this node's view (`sys_cluster`): the
    /// same wherever read.
    Everywhere,
    /// Read from the partitions running here, which are the ones led here.
    Live,
    /// Read from the store, which also keeps the partitions this node stands by for: the
    /// column that places each row (an invocation id, or a partition key).
    Stored(Placed),
}

/// The column that says which partition a stored row belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placed {
    /// An invocation id, as text.
    ById(&'static str),
    /// A partition key.
    ByKey(&'static str),
}

/// The partition each row of `batch` belongs to, of `partitions`; `None` for a row whose
/// column does not say (it is kept nowhere else either, so it is dropped).
fn partition_of_rows(batch: &RecordBatch, placed: Placed, partitions: usize) -> Vec<Option<usize>> {
    let n = partitions.max(1) as u64;
    let index = |key: u64| usize::try_from(key % n).ok();
    match placed {
        Placed::ById(name) => {
            let Some(ids) = batch
                .column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            else {
                return vec![None; batch.num_rows()];
            };
            ids.iter()
                .map(|id| {
                    id.and_then(|id| id.parse::<sluice_core::ids::InvocationId>().ok())
                        .and_then(|id| index(id.partition_key()))
                })
                .collect()
        }
        Placed::ByKey(name) => {
            let Some(keys) = batch
                .column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
            else {
                return vec![None; batch.num_rows()];
            };
            keys.iter().map(|key| key.and_then(index)).collect()
        }
    }
}

/// The rows of `batch` whose partition is marked in `led`.
pub fn only_led(batch: &RecordBatch, placed: Placed, led: &[bool]) -> Result<RecordBatch> {
    let keep: BooleanArray = partition_of_rows(batch, placed, led.len())
        .into_iter()
        .map(|p| Some(p.is_some_and(|p| led.get(p).copied().unwrap_or(false))))
        .collect();
    filter_record_batch(batch, &keep).map_err(DataFusionError::from)
}

/// Checks that `here` (the partitions led here) and the shares cover each of the partitions
/// exactly once: leadership that moved while the query read could otherwise miss a
/// partition's rows or count them twice.
pub fn check_cover(here: &[bool], shares: &[Share]) -> Result<()> {
    let mut by: Vec<Option<&str>> = here.iter().map(|&led| led.then_some("this node")).collect();
    for share in shares {
        for &p in &share.led {
            let Some(slot) = by.get_mut(p) else {
                return Err(moved(format!(
                    "{} answered for partition {p}, which does not exist here",
                    share.node
                )));
            };
            if let Some(other) = slot {
                return Err(moved(format!(
                    "partition {p} was answered by both {other} and {}",
                    share.node
                )));
            }
            *slot = Some(&share.node);
        }
    }
    if let Some(p) = by.iter().position(Option::is_none) {
        return Err(moved(format!("no node answered for partition {p}")));
    }
    Ok(())
}

fn moved(why: String) -> DataFusionError {
    DataFusionError::Execution(format!(
        "[CLU0001] leadership moved while the query read the partitions ({why}); retry"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use sluice_core::ids::InvocationId;

    fn share(node: &str, led: &[usize]) -> Share {
        Share {
            node: node.into(),
            led: led.to_vec(),
            batches: Vec::new(),
        }
    }

    #[test]
    fn every_partition_once_is_a_cover_and_a_gap_or_a_twice_is_not() {
        let here = [true, false, false, true];
        assert!(check_cover(&here, &[share("b", &[1]), share("c", &[2])]).is_ok());
        let gap = check_cover(&here, &[share("b", &[1])]).unwrap_err();
        assert!(
            gap.to_string().contains("no node answered for partition 2"),
            "{gap}"
        );
        let twice = check_cover(&here, &[share("b", &[1, 2]), share("c", &[2])]).unwrap_err();
        assert!(
            twice
                .to_string()
                .contains("partition 2 was answered by both b and c"),
            "{twice}"
        );
        let ours = check_cover(&here, &[share("b", &[0, 1, 2])]).unwrap_err();
        assert!(ours.to_string().contains("both this node and b"), "{ours}");
        let beyond = check_cover(&here, &[share("b", &[1, 2, 9])]).unwrap_err();
        assert!(beyond.to_string().contains("CLU0001"), "{beyond}");
    }

    #[test]
    fn stored_rows_are_kept_by_the_partition_their_id_or_key_names() {
        let ids: Vec<InvocationId> = (0..8u64).map(InvocationId::generate).collect();
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("partition_key", DataType::UInt64, false),
        ]));
        let mut text: Vec<Option<String>> = ids.iter().map(|id| Some(id.to_string())).collect();
        text.push(Some("not an id".into()));
        text.push(None);
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(text)),
                Arc::new(UInt64Array::from_iter_values((0..10u64).map(|k| k + 4))),
            ],
        )
        .unwrap();
        // Four partitions, this node leads 1 and 2.
        let led = [false, true, true, false];
        let kept = only_led(&batch, Placed::ById("id"), &led).unwrap();
        let kept_ids: Vec<String> = kept
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .iter()
            .map(|s| s.unwrap().to_owned())
            .collect();
        let wanted: Vec<String> = ids
            .iter()
            .filter(|id| matches!(id.partition_key() % 4, 1 | 2))
            .map(ToString::to_string)
            .collect();
        assert_eq!(kept_ids, wanted);
        let by_key = only_led(&batch, Placed::ByKey("partition_key"), &led).unwrap();
        let keys: Vec<u64> = by_key
            .column(1)
            .as_any()
            .downcast_ref::<UInt64Array>()
            .unwrap()
            .values()
            .to_vec();
        assert_eq!(keys, vec![5, 6, 9, 10, 13]);
    }
}
