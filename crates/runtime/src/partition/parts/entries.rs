//! Which invocation holds each of the scheduler's entries: the scheduler queues entries, the
//! partition drives invocations, and this is the one way between them.

use std::collections::HashMap;

use sluice_core::ids::InvocationId;
use sluice_flow::scheduler::EntryId;

/// The entries issued and not yet given back, each with its invocation.
#[derive(Debug, Default)]
pub struct Entries {
    holders: HashMap<EntryId, InvocationId>,
    /// The last entry issued (entries are never reused).
    last: EntryId,
}

impl Entries {
    /// A new entry, held by `id`.
    pub fn issue(&mut self, id: InvocationId) -> EntryId {
        self.last += 1;
        self.holders.insert(self.last, id);
        self.last
    }

    /// The invocation holding `entry`, if it is still held.
    pub fn holder(&self, entry: EntryId) -> Option<InvocationId> {
        self.holders.get(&entry).copied()
    }

    /// `entry` is given back (its invocation left the scheduler).
    pub fn remove(&mut self, entry: EntryId) {
        self.holders.remove(&entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_names_its_invocation_until_given_back_and_is_never_reused() {
        let mut entries = Entries::default();
        let (a, b) = (InvocationId::generate(1), InvocationId::generate(2));
        let first = entries.issue(a);
        let second = entries.issue(b);
        assert_ne!(first, second);
        assert_eq!(entries.holder(first), Some(a));
        entries.remove(first);
        assert_eq!(entries.holder(first), None);
        assert_eq!(entries.holder(second), Some(b));
        assert_ne!(
            entries.issue(a),
            first,
            "a given-back entry is not issued again"
        );
    }
}
