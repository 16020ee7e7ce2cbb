//! What a read of the live flow state (counters, queues) asks for: every one, or a bounded
//! view — one scope's, the busiest `limit` — that the partition picks from numbers it holds,
//! building a snapshot only of what it picked. With a million keys live, a page of a thousand
//! costs a walk of memory in order, not a million snapshots.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Which counters or queues a read wants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadView {
    /// Only those of this scope (for counters: its own and its keys').
    pub scope: Option<String>,
    /// At most this many: the busiest, by calls waiting, then running (or scheduled).
    pub limit: Option<usize>,
}

impl ReadView {
    /// Every one.
    pub const ALL: ReadView = ReadView {
        scope: None,
        limit: None,
    };
}

/// The greatest `limit` of `items`, in no order, kept in a heap whose top is the least kept:
/// memory for `limit` of them whatever the number walked.
pub(crate) fn greatest<T: Ord>(items: impl IntoIterator<Item = T>, limit: usize) -> Vec<T> {
    let mut kept = BinaryHeap::with_capacity(limit.min(1 << 16) + 1);
    for item in items {
        kept.push(Reverse(item));
        if kept.len() > limit {
            kept.pop();
        }
    }
    kept.into_iter().map(|Reverse(item)| item).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_greatest_few_are_kept_whatever_the_order_walked() {
        let mut kept = greatest([5, 1, 9, 3, 7, 9, 2], 3);
        kept.sort_unstable();
        assert_eq!(kept, vec![7, 9, 9]);
        assert!(greatest([1, 2], 0).is_empty());
        assert_eq!(greatest([4], 10), vec![4]);
    }
}
